"""Shared fixtures: a real broker process per test module or per test."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from brokerproc import BrokerProcess

_ids = itertools.count(1)


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
