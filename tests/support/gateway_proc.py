"""Gateway processes for the tests: ``twistd mqttamqp --upstream`` in front of a core
broker process, on loopback port 0 (the gateway tests' fixtures and modules import
it; test modules never import a conftest).

The broker's MQTT conformance tests through a gateway: ``through_gateway`` starts a
core (with the options the tests give their broker, and an AMQP listener) and a
gateway in front of it (``GatewayInFront``), and hands the tests the gateway as their
broker (its MQTT port, its log: protocol errors are the gateway's to log).
``GATEWAY_DIFFERS`` names the tests that cannot pass through a gateway, with why
(docs/gateway.md, "Conformance through a gateway"); ``mark_gateway_differences``
marks them xfail (strict: one that starts passing is reported) when their broker is
the gateway."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess

__all__ = ["GATEWAY_DIFFERS", "GatewayInFront", "UPSTREAM_OPEN", "mark_gateway_differences",
           "start_gateway", "through_gateway"]

UPSTREAM_OPEN = r"upstream connection \d+ to \S+ is open"


def start_gateway(tmp_path: Path, upstream: str, *extra: str, wait_open: bool = True,
                  env: dict[str, str] | None = None,
                  listeners: tuple[str, ...] = ("--mqtt",)) -> BrokerProcess:
    """A gateway process in front of ``upstream``; once started, it has an open
    upstream connection (unless not ``wait_open``)."""
    n = len(list(tmp_path.glob("gw*")))
    proc = BrokerProcess(str(tmp_path / f"gw{n}"), "--upstream", upstream, *extra,
                         listeners=listeners, env=env)
    proc.start()
    if wait_open:
        proc.wait_for_line(UPSTREAM_OPEN, timeout=15)
    return proc


# test function name (with "[ID]": only its cases with that parameter id) -> why it
# cannot pass through a gateway
GATEWAY_DIFFERS: dict[str, str] = {
}


class GatewayInFront(BrokerProcess):
    """A gateway process in front of its own core; ``core`` is reachable too."""

    def __init__(self, data_dir: str, *core_options: str,
                 gateway_options: tuple[str, ...] = ()) -> None:
        super().__init__(os.path.join(data_dir, "gateway"))
        os.makedirs(data_dir, exist_ok=True)   # (the broker makes its own, not parents)
        self.gateway_options = gateway_options
        self.core = BrokerProcess(os.path.join(data_dir, "core"), "--amqp-max-sessions",
                                  "1000", "--amqp-max-links", "10000", *core_options,
                                  listeners=("--mqtt", "--amqp"))

    def start(self, timeout: float = 30.0, expect: tuple[str, ...] | None = None
              ) -> BrokerProcess:
        self.core.start(timeout)
        self.extra = ("--upstream", f"amqp://127.0.0.1:{self.core.ports['AMQP']}",
                      "--upstream-connections", "1", "--upstream-max-clients", "1000",
                      *self.gateway_options)
        super().start(timeout, expect)
        self.wait_for_line(UPSTREAM_OPEN, timeout=15)
        return self

    def stop(self, timeout: float = 20.0) -> int:
        status = super().stop(timeout)
        self.core.stop(timeout)
        return status


def through_gateway(kind: str, data_dir: str, *options: str) -> Iterator[BrokerProcess]:
    """The broker the tests use: ``direct`` (a broker with ``options``) or ``gateway``
    (a gateway in front of such a broker)."""
    proc = (BrokerProcess(data_dir, *options) if kind == "direct"
            else GatewayInFront(data_dir, *options))
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def mark_gateway_differences(request: pytest.FixtureRequest) -> None:
    """Mark the running test xfail when its broker is the gateway and the test is
    one of ``GATEWAY_DIFFERS``."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or "gateway" not in (callspec.params.get("broker"),
                                             callspec.params.get("start_broker")):
        return
    name = getattr(request.node, "originalname", request.node.name)
    ids = callspec.id.split("-")
    for key, reason in GATEWAY_DIFFERS.items():
        function, _, param = key.partition("[")
        if function == name and (not param or param.rstrip("]") in ids):
            request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
            return


def uid(prefix: str) -> str:
    """A client id of its own for each test (the core keeps sessions across tests)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
