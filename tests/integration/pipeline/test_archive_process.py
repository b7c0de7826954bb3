"""The archive with real processes: a broker killed with SIGKILL leaves only complete
files and its restart cleans up; the broker process never loads pyarrow (the writer is
a child process)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

from archive_files import T0, alive, hidden, read
from twisted.internet.task import Clock

from mqttamqp.archive import (
    Archive,
)
from mqttamqp.archive.segments import remove_leftovers


def test_kill_9_leaves_only_complete_files_and_restart_cleans(tmp_path: Path) -> None:
    """A broker process killed with SIGKILL leaves only complete Parquet files and one
    unfinished one, which the next start removes; its writer exits."""
    proc = subprocess.Popen([sys.executable, "-c", _CRASHER, str(tmp_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        writer = int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(30)
    # The writer process sees its stdin close and exits, touching nothing: no orphan.
    assert _exits(writer, 30.0)
    assert not alive(writer)
    assert len(hidden(tmp_path)) == 1
    assert read(tmp_path).column("topic").to_pylist() == ["closed"]
    clock = Clock()
    clock.advance(T0)
    a = Archive(str(tmp_path), clock)
    a.start()
    assert hidden(tmp_path) == []
    a.close()
    assert remove_leftovers(str(tmp_path)) == []


def test_the_broker_process_never_loads_pyarrow() -> None:
    """Only the writer process (and the report job) need Arrow: the service and its
    archive import without it, which saves the broker about 50 MB of RSS."""
    code = ("import sys\n"
            "import mqttamqp.service\n"
            "from mqttamqp.archive import Archive\n"
            "print('pyarrow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"


def _exits(pid: int, timeout: float) -> bool:
    """Wait (bounded) for ``pid`` to end: its pidfd becomes readable when it does."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


_CRASHER = """
import sys, time
from mqttamqp.archive import Archive
class Now:
    def seconds(self): return time.time()
a = Archive(sys.argv[1], Now(), row_group_rows=1, roll_seconds=3600)
a.start()
a.message(1795939170.0, "closed", 0, False, b"x", "c", None, "amqp", 0, 0)
a.close()
a = Archive(sys.argv[1], Now(), row_group_rows=1, roll_seconds=3600)
a.start()
a.message(1795939171.0, "open", 0, False, b"x", "c", None, "amqp", 0, 0)
assert a.wait_until(lambda: a.stats()["buffered"] == 0) and a.wait_step()
print(a.writer_pid, flush=True)
sys.stdin.read()
"""
