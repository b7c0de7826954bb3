"""The tiers, and the fixtures every tier may use.

Tests live by tier: ``tests/unit/<package>/`` (in process, no child process: fakes,
``task.Clock``, ``StringTransport``, StubTreq), ``tests/integration/<area>/`` (a real
broker process, real clients and tools, Spark's JVM) and ``tests/browser/`` (Chromium
through Playwright).  Their helpers are modules in ``tests/support/`` (on ``sys.path``
here); no test module imports another.  The markers come from the folder:
``integration`` for ``tests/integration/`` and ``tests/browser/``, and ``browser`` for
the latter, so ``pytest tests/unit`` and ``pytest -m "not integration"`` run the same
in-process tests.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "support"))


# Hypothesis' default deadline (200 ms per example) is an assertion on wall-clock
# speed: on two shared cores the codec properties fail at random with
# DeadlineExceeded.  Tests assert on behaviour, not on speed (bench/ measures).
settings.register_profile("mqttamqp", deadline=None)
settings.load_profile("mqttamqp")

_ids = itertools.count(1)


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


# -- tiers: markers from the folder ---------------------------------------------------

# tests/unit/: in process (fakes, a Clock, StringTransport, StubTreq); no child process.
# tests/integration/: a real broker process, real clients and tools, Spark's JVM.
# tests/browser/: Chromium through Playwright (and a real broker): integration too.
_TIER_MARKS = {"integration": ("integration",), "browser": ("browser", "integration")}


def pytest_report_header(config: pytest.Config) -> str:
    """Which build the tests import: a compiled module left in a checkout
    (``bench/mypyc_build.py``; ``.gitignore`` hides it) wins over its ``.py``."""
    from compiled import COMPILED

    import mqttamqp

    return (f"mqttamqp: {os.path.dirname(mqttamqp.__file__)}, "
            + ("COMPILED hot modules (mypyc)" if COMPILED else "pure Python"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by the tier folder it is in (``tests/<tier>/...``)."""
    for item in items:
        try:
            tier = item.path.relative_to(_HERE).parts[0]
        except ValueError:          # not under tests/
            continue
        for mark in _TIER_MARKS.get(tier, ()):
            item.add_marker(mark)


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


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A CA, a server certificate and two client certificates as PEM files, made for
    this test module (``support/pki.py``)."""
    from pki import make_pki

    return make_pki(str(tmp_path_factory.mktemp("pki")))
