"""Shared fixtures (a real broker process per test module or per test) and the
``integration`` marker.

A test is marked ``integration`` when it starts a real process: a broker
(``brokerproc.BrokerProcess``), a client or tool (``subprocess``), Chromium
(Playwright) or Spark's JVM (``pyspark``).  That is found out at collection, not by
hand: the test function and every fixture it uses are read, with the helpers of the
test modules they call (functions and classes under ``tests/``, followed name by
name), and any of them that names ``subprocess``, Playwright, PySpark,
``brokerproc`` or ``BrokerProcess`` (or a subclass) makes the test one.
``pytest -m "not integration"`` then runs the in-process tests only.
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "support"))
# Until every shared helper lives in support/: test modules still import each other
# across the tier folders.
for _dirpath, _dirnames, _files in sorted(os.walk(_HERE)):
    _dirnames[:] = [d for d in _dirnames if d not in ("support", "__pycache__")
                    and not d.startswith(".")]
    if _dirpath != _HERE:
        sys.path.append(_dirpath)

from brokerproc import BrokerProcess  # noqa: E402  (support/ on the path first)

# Hypothesis' default deadline (200 ms per example) is an assertion on wall-clock
# speed: on two shared cores the codec properties fail at random with
# DeadlineExceeded.  Tests assert on behaviour, not on speed (STYLE.md, habit 11).
settings.register_profile("mqttamqp", deadline=None)
settings.load_profile("mqttamqp")

_ids = itertools.count(1)
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# Modules whose use starts a process: a child, Chromium, Spark's JVM.
_PROCESS_MODULES = ("subprocess", "playwright", "pyspark")
# Names that start processes however they are reached (``import`` inside a function
# leaves the module's dotted name in the code, not in the globals).
_PROCESS_NAMES = frozenset({*_PROCESS_MODULES, "brokerproc", "BrokerProcess"})


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """Every log line of this process (twisted.logger's global publisher), as text."""
    from twisted.logger import formatEvent, globalLogPublisher

    got: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        got.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield got
    globalLogPublisher.removeObserver(observe)


@pytest.fixture
def client_id(request: pytest.FixtureRequest) -> str:
    """A client id unique to this test (tests share module brokers)."""
    return f"t{next(_ids)}-{request.node.name[:30]}"


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


# -- the integration marker ----------------------------------------------------------


def _in_tests(obj: Any) -> bool:
    """Defined in a module under tests/ (helpers are followed only there)."""
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:
        return False
    return path is not None and os.path.abspath(path).startswith(_TESTS_DIR + os.sep)


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)   # nested functions, lambdas, comprehensions


def _starts_processes(obj: Any, seen: set[int]) -> bool:
    """Whether ``obj`` (a function or class) starts a process, directly or through the
    helpers of the test modules it names."""
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    if isinstance(obj, type):
        if issubclass(obj, BrokerProcess):
            return True
        if not _in_tests(obj):
            return False
        return any(_starts_processes(member, seen) for member in vars(obj).values()
                   if inspect.isfunction(member) or isinstance(member, type))
    func = inspect.unwrap(obj)
    if not inspect.isfunction(func) or not _in_tests(func):
        return False
    names = {name for code in _code_objects(func.__code__) for name in code.co_names}
    if any(name.split(".")[0] in _PROCESS_NAMES for name in names):
        return True
    for name in names:
        target = func.__globals__.get(name)
        if isinstance(target, types.ModuleType):
            if target.__name__.split(".")[0] in _PROCESS_MODULES:
                return True
        elif (inspect.isfunction(target) or isinstance(target, type)) \
                and _starts_processes(target, seen):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``integration`` every test that (or whose fixtures) start a real process."""
    for item in items:
        if item.get_closest_marker("integration") is not None:
            continue
        if not isinstance(item, pytest.Function):
            continue
        seen: set[int] = set()
        fixtures = [defs[-1].func for name, defs in item._fixtureinfo.name2fixturedefs.items()
                    if defs and name in item.fixturenames]
        if any(_starts_processes(obj, seen) for obj in [item.function, *fixtures]):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def audit() -> Iterator[list[dict[str, Any]]]:
    """The console's audit log lines (namespace mqttamqp.console.audit) while the
    test runs."""
    from twisted.logger import globalLogPublisher

    events: list[dict[str, Any]] = []

    def observer(event: dict[str, Any]) -> None:
        if event.get("log_namespace") == "mqttamqp.console.audit":
            events.append(event)
    globalLogPublisher.addObserver(observer)
    yield events
    globalLogPublisher.removeObserver(observer)


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
