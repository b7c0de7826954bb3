"""The store in a child process killed right after a commit's Deferred fired: the data
is there when the file is opened again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from store_reactor import FakeReactor

from mqttamqp.store import ZODBStore

ROOT = Path(__file__).resolve().parents[3]


def test_kill_after_deferred_fired_keeps_data(tmp_path: Path) -> None:
    """A child process killed with SIGKILL right after a commit's Deferred fired loses
    nothing that had fired when the store is opened again."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from mqttamqp.core.message import Message
        from mqttamqp.core.persistence import PutRetained, PutSession, PutQueued, StoredQueued
        from mqttamqp.store import ZODBStore

        class InlineReactor:
            def callFromThread(self, f, *args):
                f(*args)

        store = ZODBStore(sys.argv[1], InlineReactor())
        store.load()
        for i in range(50):
            store.submit([PutRetained(Message("early/%d" % i, b"e"))])
        ops = [PutSession("c", 42.0)]
        ops += [PutQueued("c", i, StoredQueued(Message("q", b"%d" % i, 1), 1)) for i in range(500)]
        ops.append(PutRetained(Message("last", b"acknowledged", 1, True)))

        def fired(_):
            sys.stdout.write("fired\\n")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        store.submit(ops).addCallback(fired)
        # Keep submitting while the kill may land mid-commit.
        i = 0
        while True:
            store.submit([PutRetained(Message("late/%d" % i, b"l"))])
            i += 1
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True, timeout=120, env=env, cwd=str(ROOT),
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert proc.stdout == b"fired\n"
    store = ZODBStore(str(tmp_path), FakeReactor())
    try:
        snap = store.load()
    finally:
        store.close()
    assert snap.retained["last"].payload == b"acknowledged"
    assert all(f"early/{i}" in snap.retained for i in range(50))
    assert snap.sessions["c"].last_seen == 42.0
    assert [seq for seq, _ in snap.sessions["c"].queue] == list(range(500))
