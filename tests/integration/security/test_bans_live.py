"""Bans against the real broker: set in the console over HTTP, enforced at MQTT
CONNECT (paho gets CONNACK 5) and AMQP open (proton gets amqp:unauthorized-access),
kept across a restart, lifted again."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import TIMEOUT, Paho
from console_support import ConsoleHTTP, initial_password, web_broker_process
from proton import ConnectionException
from proton.reactor import Container
from proton.utils import BlockingConnection

pytestmark = pytest.mark.timeout(120)

LISTENERS = ("--mqtt", "--amqp", "--web")


@pytest.fixture
def data(tmp_path: Any) -> str:
    return os.path.join(str(tmp_path), "data")


@pytest.fixture
def running(data: str) -> Iterator[Any]:
    proc = web_broker_process(data, listeners=LISTENERS).start()
    yield proc
    proc.stop()


def _console(proc: Any, data: str) -> ConsoleHTTP:
    console = ConsoleHTTP(proc.ports["WEB"])
    assert console.login(initial_password(data)) == 303
    return console


def _amqp(proc: Any, container_id: str) -> BlockingConnection:
    return BlockingConnection(f"127.0.0.1:{proc.ports['AMQP']}", timeout=TIMEOUT,
                              container=Container(container_id=container_id))


def _amqp_refused(proc: Any, container_id: str) -> str:
    with pytest.raises(ConnectionException) as err:
        _amqp(proc, container_id).close()
    return str(err.value)


def test_client_id_ban_refuses_mqtt_and_amqp_until_lifted(running: Any, data: str) -> None:
    """A client id ban set in the console closes the client, refuses it over MQTT and AMQP
    with the reason until lifted, and lets others in."""
    console = _console(running, data)
    online = Paho(running.mqtt_port, "plc-13")
    try:
        reply = console.post("/bans/add", kind="client_id", value="plc-13", seconds="",
                             reason="stolen device", disconnect="1")
        assert reply.code == 303
        assert online.disconnected.wait(TIMEOUT)          # closed by the ban
    finally:
        online.stop()
    Paho(running.mqtt_port, "plc-13", expect_rc=5).stop()
    assert "amqp:unauthorized-access" in _amqp_refused(running, "plc-13")
    assert "stolen device" in _amqp_refused(running, "plc-13")
    _amqp(running, "plc-14").close()                      # others are let in
    Paho(running.mqtt_port, "plc-14").stop()
    line = running.wait_for_line(r"refusing MQTT connection .*plc-13", TIMEOUT)
    assert "is banned (stolen device)" in line

    assert console.post("/bans/remove", kind="client_id", value="plc-13").code == 303
    Paho(running.mqtt_port, "plc-13").stop()
    _amqp(running, "plc-13").close()


def test_address_ban_is_kept_across_a_restart(data: str) -> None:
    """An address ban is kept across a restart and refuses MQTT and AMQP, but not the
    console."""
    proc = web_broker_process(data, listeners=LISTENERS).start()
    try:
        console = _console(proc, data)
        assert console.post("/bans/add", kind="address", value="127.0.0.1",
                            seconds="3600").code == 303
        Paho(proc.mqtt_port, "anyone", expect_rc=5).stop()
    finally:
        proc.stop()
    proc = web_broker_process(data, listeners=LISTENERS).start()
    try:
        Paho(proc.mqtt_port, "anyone", expect_rc=5).stop()
        assert "amqp:unauthorized-access" in _amqp_refused(proc, "some-app")
        console = _console(proc, data)                 # the console is not banned
        items = console.get("/api/bans").json()["items"]
        assert [(b["kind"], b["value"]) for b in items] == [("address", "127.0.0.1")]
        assert console.post("/bans/remove", kind="address", value="127.0.0.1").code == 303
        Paho(proc.mqtt_port, "anyone").stop()
    finally:
        proc.stop()
