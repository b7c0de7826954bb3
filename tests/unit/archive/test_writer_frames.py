"""The archive writer process and the frames it is sent: a batch of events it cannot
read, and a broker whose frames' format is not the writer's (an upgrade in place).

The writer process is real where the test is about it; time is a ``task.Clock``;
tests wait on the archive's progress, never sleep.
"""

from __future__ import annotations

import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from twisted.internet.task import Clock

import mqttamqp.archive.process as process_module
from mqttamqp.archive import CONNECT, Archive
from mqttamqp.archive.columns import pack
from mqttamqp.archive.frames import FORMAT, REFUSED, write_frame
from mqttamqp.archive.writer import Writer

T0 = 1_767_225_600.0   # 2026-01-01 00:00 UTC


def _writer(root: Path) -> Writer:
    return Writer(str(root), payload_bytes=16, roll_seconds=60, roll_bytes=1 << 30,
                  retention_days=0, include=["#"], exclude=[], row_group_rows=1)


def _events(*rows: tuple[float, str, str]) -> tuple[bytes, list[object]]:
    """A batch as ``eventbuffer`` hands it over: times packed, values flat."""
    values: list[object] = []
    for _, kind, client in rows:
        values += (kind, client, ("protocol",), "mqtt5")
    return array("d", [ts for ts, _, _ in rows]).tobytes(), values


def test_a_batch_of_events_it_cannot_read_is_lost_alone(tmp_path: Path) -> None:
    """Review finding: an unreadable batch of events (an old-format frame) raised out
    of ``Writer.step`` and killed the writer process with its open segments; it is
    now counted as lost and an error with one log line, and the other batches and
    the open segments are kept."""
    w = _writer(tmp_path)
    message = [T0, "a/b", 1, False, 1, "dev", "u", "mqtt5", 1, 0]
    w.step(T0, [pack(message, b"x")])
    assert w.report()["open_rows"] == 1
    old = (T0, CONNECT, "a", ("protocol",), "mqtt5")    # before batches: a tuple
    bad = (array("d", [T0, T0]).tobytes(), [CONNECT, "b"])   # two times, half a record
    for _ in range(2):
        w.step(T0 + 1, [], [_events((T0 + 1, CONNECT, "c1")), old, bad,
                            _events((T0 + 2, CONNECT, "c2"))])
    report = w.report()
    assert report["open_rows"] == 1 + 4        # the message and 2 x 2 good events
    assert report["lost"] == 2 * (1 + 2) and report["errors"] == 4
    errors = [text for level, text in report["logs"] if level == "error"]
    assert len(errors) == 1 and "could not be read" in errors[0], report["logs"]
    w.close()
    assert w.report()["events"] == 4 and w.report()["messages"] == 1


@pytest.mark.parametrize("config", [{}, {"format": FORMAT - 1}])
def test_the_writer_process_refuses_another_format_with_one_line(
        tmp_path: Path, config: dict[str, int]) -> None:
    """A configuration frame without this code's format (a broker started before an
    upgrade in place) is refused with one line naming both formats and the exit
    status REFUSED, before any frame of records is read."""
    code = "from mqttamqp.archive.writer import main; main()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdin is not None
    write_frame(child.stdin.fileno(), {**config, "directory": str(tmp_path),
                                       "payload_bytes": 16, "roll_seconds": 60.0,
                                       "roll_bytes": 1 << 20, "retention_days": 0,
                                       "include": ("#",), "exclude": (),
                                       "row_group_rows": 8})
    out, err = child.communicate(timeout=60)
    lines = err.decode().splitlines()
    assert child.returncode == REFUSED and out == b""
    assert lines == [f"archive: the archive writer is format {FORMAT}, the broker sent "
                     f"{config.get('format')}: restart the broker after an upgrade"]


def test_a_refused_broker_logs_once_and_starts_no_new_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_lines: list[str]) -> None:
    """A broker whose frames the writer refuses logs it once, starts no writer again
    (none would take its frames) and drops and counts records until restarted."""
    monkeypatch.setattr(process_module, "FORMAT", FORMAT + 1)   # an older broker
    clock = Clock()
    clock.advance(T0)
    a = Archive(str(tmp_path), clock, buffer_limit=4)
    a.event(T0, CONNECT, "c0")        # (taken by the first step, lost with its writer)
    a.start()
    try:
        assert a.wait_until(lambda: a._writer.refused)
        for i in range(6):
            a.event(T0, CONNECT, f"c{i + 1}")
        assert a.stats()["dropped"] == 2 and a.writer_pid is None
        assert not a._writer.respawn(False) and not a._writer.respawn(True)
    finally:
        a.close()
    refused = [line for line in log_lines if "refused this broker's frames" in line]
    assert len(refused) == 1 and f"(format {FORMAT + 1})" in refused[0]
    assert not [line for line in log_lines if "writer process failed" in line]
    assert a.stats()["lost"] == 1 + 4 and a.writer_pid is None
