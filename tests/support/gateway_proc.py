"""Gateway processes for the tests: ``twistd mqttamqp --upstream`` in front of a core
broker process, on loopback port 0 (the gateway tests' fixtures and modules import
it; test modules never import a conftest).

The broker's MQTT test suites through a gateway: ``through_gateway`` starts a core
(with the options the tests give their broker, and an AMQP listener) and a gateway in
front of it (``GatewayInFront``, given the options a gateway takes: the MQTT rules it
applies), and hands the tests the gateway as their broker (its MQTT port, its log:
protocol errors are the gateway's to log).  A test module asks for it with the
``through_gateway`` mark (tests/integration/mqtt/conftest.py parametrizes its
``broker`` and ``start_broker``).  ``GATEWAY_DIFFERS`` names the tests that cannot
pass through a gateway, with why (docs/gateway.md, "Conformance through a gateway");
``mark_gateway_differences`` marks them xfail (strict: one that starts passing is
reported) when their broker is the gateway."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from brokerproc import BrokerProcess

from mqttamqp.optiontable import FLAGS, GATEWAY_IGNORES

__all__ = ["GATEWAY_DIFFERS", "GatewayInFront", "UPSTREAM_OPEN", "broker_or_gateway",
           "core_with_gateway", "gateway_takes",
           "mark_gateway_differences", "start_gateway", "through_gateway"]

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


@contextmanager
def core_with_gateway(tmp_path: Path, name: str, core_options: tuple[str, ...],
                      *gateway_options: str, listeners: tuple[str, ...] = ("--mqtt",)
                      ) -> Iterator[tuple[BrokerProcess, BrokerProcess, list[Any]]]:
    """A core (``core_options``, MQTT and AMQP listeners, data in ``name``) and a
    gateway in front of it, started, with a list for the test's clients: on the way
    out, each client's ``close``, then the gateway and the core stopped, whatever
    failed (a gateway that did not start included)."""
    core = BrokerProcess(str(tmp_path / name), *core_options, listeners=("--mqtt", "--amqp"))
    core.start()
    gw = None
    clients: list[Any] = []
    try:
        gw = start_gateway(tmp_path, f"amqp://127.0.0.1:{core.ports['AMQP']}",
                           *gateway_options, listeners=listeners)
        yield core, gw, clients
    finally:
        for client in clients:
            client.close()
        if gw is not None:
            gw.stop()
        core.stop()


_SESSION_PRESENT = ("session present is the seed's: the core's AMQP_SUBSCRIPTIONS map "
                    "is not empty (the broker says 1 for any persistent session it "
                    "resumes, one without subscriptions too)")
_QOS2_IDS = ("the gateway keeps the QoS 2 packet ids awaiting PUBREL per connection only "
             "(it holds no session state): a PUBLISH resent with DUP on a new connection "
             "is routed again")
_USER_PROPERTIES = ("MQTT 5 user properties cross as AMQP application-properties, a map: "
                    "of a repeated name only the first value arrives")
_SESSION_EXPIRY = ("a client's MQTT 5 session expiry is not carried (the core's "
                   "--session-expiry applies) and session present is the seed's")
# test function name (with "[ID]": only its cases with that parameter id) -> why it
# cannot pass through a gateway
GATEWAY_DIFFERS: dict[str, str] = {
    # test_mqtt_raw.py
    "test_session_present_flag_mqtt311": _SESSION_PRESENT,
    "test_qos2_inbound_duplicate_after_reconnect_is_routed_once": _QOS2_IDS,
    # test_mqtt5_clients.py
    "test_paho_properties_pass_through": _USER_PROPERTIES,
    "test_raw_takeover_then_disconnect_expires_on_the_new_interval": _SESSION_EXPIRY,
}


_FLAGS = frozenset(f"--{row[0]}" for row in FLAGS)


def gateway_takes(options: tuple[str, ...]) -> tuple[str, ...]:
    """The ``options`` (``--name value`` pairs and flags) a gateway accepts: all but
    those it refuses as the core's (``GATEWAY_IGNORES``)."""
    taken: list[str] = []
    rest = list(options)
    while rest:
        name = rest.pop(0)
        words = [name] if name in _FLAGS or "=" in name else [name, rest.pop(0)]
        if name.split("=")[0].lstrip("-") not in GATEWAY_IGNORES:
            taken += words
    return tuple(taken)


class GatewayInFront(BrokerProcess):
    """A gateway process in front of its own core; ``core`` is reachable too."""

    def __init__(self, data_dir: str, *core_options: str,
                 gateway_options: tuple[str, ...] = (),
                 listeners: tuple[str, ...] = ("--mqtt",)) -> None:
        super().__init__(os.path.join(data_dir, "gateway"), listeners=listeners)
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


def broker_or_gateway(kind: str, data_dir: str, *options: str,
                      listeners: tuple[str, ...] = ("--mqtt",)) -> BrokerProcess:
    """``direct``: a broker with ``options``; ``gateway``: a gateway (with the
    ``options`` it takes, and ``listeners``) in front of such a broker, except that
    the core keeps its default --max-packet-size (it bounds the AMQP message, which
    is larger than the MQTT PUBLISH by its envelope: docs/gateway.md). Not started."""
    if kind == "direct":
        return BrokerProcess(data_dir, *options, listeners=listeners)
    core = _without(options, "--max-packet-size")
    return GatewayInFront(data_dir, *core, gateway_options=gateway_takes(options),
                          listeners=listeners)


def _without(options: tuple[str, ...], name: str) -> tuple[str, ...]:
    """``options`` less ``name`` and its value."""
    kept = list(options)
    while name in kept:
        at = kept.index(name)
        del kept[at:at + 2]
    return tuple(kept)


def through_gateway(kind: str, data_dir: str, *options: str,
                    listeners: tuple[str, ...] = ("--mqtt",)) -> Iterator[BrokerProcess]:
    """The broker the tests use, started, stopped after: ``direct`` (a broker with
    ``options``) or ``gateway`` (a gateway in front of such a broker)."""
    proc = broker_or_gateway(kind, data_dir, *options, listeners=listeners)
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
