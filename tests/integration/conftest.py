"""Fixtures of the integration tier (every test under ``tests/integration/`` is marked
``integration`` by ``tests/conftest.py``): raw sockets and mosquitto_sub processes on
the module broker, brokers of a module or of a test's own, and the storage engines a
broker runs on."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from brokerproc import BrokerProcess
from mosquitto import Sub
from rawclient import RawClient


@pytest.fixture
def sockets(broker: BrokerProcess) -> Iterator[Callable[..., RawClient]]:
    """Open raw sockets (not yet CONNECTed) to the module broker, or to ``port``."""
    made: list[RawClient] = []

    def open_socket(level: int = 4, port: int | None = None) -> RawClient:
        c = RawClient(port if port is not None else broker.mqtt_port, level)
        made.append(c)
        return c

    yield open_socket
    for c in made:
        c.close()


@pytest.fixture
def start_broker(tmp_path: os.PathLike[str]) -> Iterator[Callable[..., BrokerProcess]]:
    """Start a broker of this test's own with extra options; stopped at the end."""
    started: list[BrokerProcess] = []

    def start(*options: str) -> BrokerProcess:
        proc = BrokerProcess(os.path.join(str(tmp_path), f"data{len(started)}"), *options)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def subs(broker: BrokerProcess) -> Iterator:  # type: ignore[type-arg]
    """``subs(version, *args)`` starts a mosquitto_sub against the module broker."""
    started: list[Sub] = []

    def start(version: str, *args: str, wait_secs: int = 10) -> Sub:
        s = Sub(broker.mqtt_port, version, *args, wait_secs=wait_secs)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a whole test module (tests use distinct client ids and topics)."""
    proc = BrokerProcess(str(tmp_path_factory.mktemp("data")), "--sys-interval", "1")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_broker(tmp_path: os.PathLike[str]) -> Iterator[BrokerProcess]:
    """A broker of this test's own, for tests that restart or kill it."""
    proc = BrokerProcess(os.path.join(str(tmp_path), "data"), "--will-grace", "2")
    proc.start()
    yield proc
    proc.stop()


# -- storage engines -----------------------------------------------------------------

# The engines every durability promise is tested on: the default FileStorage,
# RelStorage on SQLite and RelStorage on PostgreSQL (a throw-away cluster).
ENGINES = ("file", "sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Any]:
    """A PostgreSQL server on 127.0.0.1 for this run (started on first use).  Without
    PostgreSQL installed the tests that need it are skipped, except under CI, where
    .ci/setup installs it and a missing server is a failure."""
    from pgcluster import PostgresCluster, pg_bin

    if pg_bin() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed (.ci/setup installs it)")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    cluster = PostgresCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=ENGINES)
def storage_option(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """``--storage`` arguments for a broker on each engine in turn (none for the
    default file storage); PostgreSQL gets a fresh database per test."""
    engine = request.param
    if engine == "file":
        return ()
    if engine == "sqlite":
        return ("--storage", "sqlite://")
    cluster = request.getfixturevalue("postgres_cluster")
    return ("--storage", cluster.create_database())
