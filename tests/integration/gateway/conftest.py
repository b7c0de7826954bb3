"""Fixtures of the gateway tests: a core broker process with its AMQP listener, and
gateway processes (``--upstream``) in front of it, all on loopback port 0."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from gateway_proc import start_gateway
from pahoclient import PahoClient


@pytest.fixture
def core(tmp_path: Path) -> Iterator[BrokerProcess]:
    """The core: MQTT and AMQP listeners, room for many gateway sessions."""
    proc = BrokerProcess(str(tmp_path / "core"), "--amqp-max-sessions", "500",
                         "--will-grace", "2", listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def gateways(tmp_path: Path, core: BrokerProcess) -> Iterator[Callable[..., BrokerProcess]]:
    """``gateways(*extra)`` starts a gateway in front of ``core``; all stopped at the end."""
    started: list[BrokerProcess] = []

    def start(*extra: str) -> BrokerProcess:
        proc = start_gateway(tmp_path, f"amqp://127.0.0.1:{core.ports['AMQP']}", *extra)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., PahoClient]]:
    """``clients(port, client_id, **kw)``: paho clients, stopped at the end."""
    made: list[PahoClient] = []

    def connect(port: int, client_id: str, **kw: object) -> PahoClient:
        c = PahoClient(port, client_id, **kw)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield connect
    for c in made:
        c.stop()
