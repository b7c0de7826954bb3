"""Storage engines (``--storage URI``): what each URI opens, and what a broker on each
says and refuses at start.

The durability promises themselves (kill -9, restart, nothing acknowledged lost) are
``test_durability.py``'s, run there on every engine; here: URI resolution (pure),
the store's round trip and a kill -9 right after a commit fired on SQLite and
PostgreSQL, and start-up: the log names the engine, a second broker on the same
PostgreSQL database stops with one line, an unreachable database or an unknown
scheme is one line too, ``memory://`` warns that nothing survives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from brokerproc import TWISTD, BrokerProcess

from mqttamqp.store.engines import FILENAME

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]
LOOPBACK_0 = "tcp:0:interface=127.0.0.1"


# -- resolve (pure) -------------------------------------------------------------------


# -- the store on each RelStorage engine ----------------------------------------------

_KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from mqttamqp.core.message import Message
    from mqttamqp.core.persistence import PutRetained, PutSession, PutQueued, StoredQueued
    from mqttamqp.store import ZODBStore, resolve_engine

    class InlineReactor:
        def callFromThread(self, f, *args):
            f(*args)

    store = ZODBStore(sys.argv[1], InlineReactor(),
                      engine=resolve_engine(sys.argv[2], sys.argv[1]))
    store.load()
    ops = [PutSession("c", 42.0)]
    ops += [PutQueued("c", i, StoredQueued(Message("q", b"%d" % i, 1), 1)) for i in range(300)]
    ops.append(PutRetained(Message("last", b"acknowledged", 1, True)))

    def fired(_):
        sys.stdout.write("fired\\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    store.submit(ops).addCallback(fired)
    i = 0
    while True:   # keep committing while the kill lands
        store.submit([PutRetained(Message("late/%d" % i, b"l"))])
        i += 1
    """
)


class _InlineReactor:
    """Runs what the writer thread hands over at once (load() needs no more)."""

    def callFromThread(self, f: object, *args: object) -> None:
        f(*args)  # type: ignore[operator]


def _engine_uri(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return "sqlite://"
    return str(request.getfixturevalue("postgres_cluster").create_database())


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_kill_right_after_a_commit_fired_keeps_it(tmp_path: Path, kind: str,
                                                  request: pytest.FixtureRequest) -> None:
    """What a fired submit() promised is there after kill -9, on SQLite and PostgreSQL."""
    uri = _engine_uri(kind, request)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, str(tmp_path), uri],
                          capture_output=True, timeout=120, env=env, cwd=str(ROOT))
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert proc.stdout == b"fired\n"

    from mqttamqp.store import ZODBStore, resolve_engine

    store = ZODBStore(str(tmp_path), _InlineReactor(),
                      engine=resolve_engine(uri, str(tmp_path)))
    try:
        snap = store.load()
    finally:
        store.close()
    assert snap.retained["last"].payload == b"acknowledged"
    assert snap.sessions["c"].last_seen == 42.0
    assert [seq for seq, _ in snap.sessions["c"].queue] == list(range(300))


# -- start-up -------------------------------------------------------------------------


def _twistd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TWISTD, "-n", "--pidfile=", "--logfile=-", "mqttamqp", "--data", str(tmp_path / "d"),
         "--mqtt", LOOPBACK_0, "--amqp", "none", "--web", "none", "--mqtt-ws", "none",
         "--metrics", "none", *args], capture_output=True, text=True, timeout=60)


def test_the_log_names_the_engine_and_sqlite_keeps_its_files_in_data(tmp_path: Path) -> None:
    """A broker on sqlite:// says so at start and writes DATA/sqlite, not mqttamqp.fs."""
    data = tmp_path / "data"
    proc = BrokerProcess(str(data), "--storage", "sqlite://").start()
    proc.stop()
    assert f"storage sqlite://{data}/sqlite" in proc.output()
    assert any(p.name.endswith(".sqlite3") for p in (data / "sqlite").iterdir())
    assert not (data / FILENAME).exists()


def test_memory_storage_warns_that_nothing_survives(tmp_path: Path) -> None:
    """memory:// starts, and warns once that a restart keeps nothing."""
    proc = BrokerProcess(str(tmp_path / "data"), "--storage", "memory://").start()
    proc.stop()
    warnings = [line for line in proc.output().splitlines() if "#warn]" in line]
    assert len(warnings) == 1 and "memory:// keeps nothing across a restart" in warnings[0]


def test_an_unknown_engine_is_a_usage_error(tmp_path: Path) -> None:
    """--storage mysql://… stops before anything starts, with one line naming the engines."""
    out = _twistd(tmp_path, "--storage", "mysql://h/db")
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "unknown engine 'mysql'" in text and "postgresql://" in text
    assert "Traceback" not in text


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    """A PostgreSQL URI whose server is not there: one critical line, no traceback."""
    import socket

    with socket.socket() as s:    # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _twistd(tmp_path, "--storage", f"postgresql://u:pw@127.0.0.1:{port}/db")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    critical = [line for line in text.splitlines() if "#critical]" in line]
    assert len(critical) == 1, text
    assert "cannot reach the database postgresql://u:***@127.0.0.1" in critical[0], text
    assert "pw@" not in text and "Traceback" not in text


def test_a_second_broker_on_one_database_is_refused(tmp_path: Path,
                                                    postgres_cluster: object) -> None:
    """Two brokers (separate data directories, as on two boxes) on one PostgreSQL
    database: the second stops with one line, the first keeps serving."""
    import socket

    uri = postgres_cluster.create_database()  # type: ignore[attr-defined]
    first = BrokerProcess(str(tmp_path / "a"), "--storage", uri).start()
    try:
        out = _twistd(tmp_path, "--storage", uri)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        critical = [line for line in text.splitlines() if "#critical]" in line]
        assert len(critical) == 1 and "another mqttamqp serves the database" in critical[0]
        assert "backend pid" in critical[0], text
        with socket.create_connection(("127.0.0.1", first.mqtt_port), timeout=10):
            pass
        assert first.proc is not None and first.proc.poll() is None
    finally:
        first.stop()


def test_two_brokers_on_one_sqlite_directory_are_refused(tmp_path: Path) -> None:
    """Two data directories (as two brokers started with other --data) on one
    sqlite:///DIR: the second stops with one line naming DIR, the first serves on
    (the lock was only the data directory's, so both opened the database)."""
    shared = tmp_path / "shared-sqlite"
    first = BrokerProcess(str(tmp_path / "a"), "--storage", f"sqlite://{shared}").start()
    try:
        out = _twistd(tmp_path, "--storage", f"sqlite://{shared}")
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        critical = [line for line in text.splitlines() if "#critical]" in line]
        assert len(critical) == 1 and f"another mqttamqp is using {shared}" in critical[0], text
        assert first.proc is not None and first.proc.poll() is None
    finally:
        first.stop()


