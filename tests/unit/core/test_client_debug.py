"""Per-client debug logging: the bounded registry of debugged client ids, an MQTT
connection logging its packets until the deadline (and then nothing, with no timer
left), a client that connects during the window, and the console's action."""

from __future__ import annotations

from typing import Any

import pytest
from amqp_memory import ListenerPeer
from console_support import Client as ConsoleClient
from console_support import make_console
from fakes import NullStore, timers_left
from mqtt_memory import ACCEPTED, Client
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher

from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.clientdebug import MAX_DEBUGGED, ClientDebug, LineBudget
from mqttamqp.mqtt.packets import Connect, Pingreq, Pingresp, Publish, Subscribe
from mqttamqp.mqtt.protocol import MQTTFactory


@pytest.fixture
def lines() -> Any:
    got: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        got.append(formatEvent(event))
    globalLogPublisher.addObserver(observe)
    yield got
    globalLogPublisher.removeObserver(observe)


def test_the_registry_is_bounded_and_forgets_expired_ids() -> None:
    """The debugged-clients registry is bounded, caps each window at an hour and forgets
    ids whose window ended."""
    clock = Clock()
    debug = ClientDebug(clock.seconds)
    for i in range(MAX_DEBUGGED):
        debug.enable(f"c{i}", 60)
    with pytest.raises(ValueError, match="being debugged already"):
        debug.enable("one-more", 60)
    assert debug.enable("c0", 7200) == 3600.0        # at most an hour
    clock.advance(61)
    assert debug.until("c1") is None and debug.until("c0") == 3600.0
    debug.enable("one-more", 60)                       # room again
    debug.enable("c0", 0)
    assert set(debug.active()) == {"one-more"}


def test_a_debugged_connection_logs_its_packets_until_the_deadline(lines: list[str]) -> None:
    """A debugged MQTT connection logs its packets both ways until its deadline, then one
    line, and other connections log nothing."""
    clock = Clock()
    broker = Broker(clock, NullStore())
    quiet, loud = Client(MQTTFactory(broker, clock)), Client(MQTTFactory(broker, clock))
    quiet.connect("quiet")
    loud.connect("loud")
    assert broker.commands.debug_client("loud", 60) == (60.0, 1)
    loud.send(Subscribe(1, (("t/#", 0),)), Publish("t/1", b"hi", 0, False, False, None))
    quiet.send(Pingreq())
    debug = [x for x in lines if x.startswith("debug ")]
    assert any(x.startswith("debug loud (") and ": in Subscribe(" in x for x in debug)
    # (its PUBLISH too: ``_process`` calls ``_on_publish`` directly only for the plain
    # class's own handler, never past the debug log's)
    assert any(x.startswith("debug loud (") and ": in Publish(" in x for x in debug)
    assert any(": out SUBACK (5 bytes)" in x for x in debug)
    assert any(": out PUBLISH" in x for x in debug)
    assert not any("quiet" in x for x in debug)
    clock.advance(60)
    assert any("debug logging of loud" in x and "ended" in x for x in lines)
    lines.clear()
    loud.send(Pingreq())
    assert not [x for x in lines if x.startswith("debug ")]
    assert timers_left(clock) == []


def test_a_client_connecting_in_the_window_is_logged(lines: list[str]) -> None:
    """A client that connects while its debug window is open is logged, and its timer goes
    with the connection."""
    clock = Clock()
    broker = Broker(clock, NullStore())
    broker.commands.debug_client("later", 30)
    late = Client(MQTTFactory(broker, clock))
    late.connect("later")
    late.send(Pingreq())
    assert any(x.startswith("debug later (") and "in Pingreq" in x for x in lines)
    late.proto.connectionLost(None)
    assert timers_left(clock) == []          # the debug timer went with it


def test_packets_read_with_the_connect_of_a_debugged_client_are_logged(
        lines: list[str]) -> None:
    """A debugged client's PUBLISH and PINGREQ in the same read as its CONNECT are logged
    (in, in order), as those of later reads are."""
    clock = Clock()
    broker = Broker(clock, NullStore())
    broker.commands.debug_client("d", 60)
    c = Client(MQTTFactory(broker, clock))
    c.send(Connect("MQTT", 4, "d", True, 0), Publish("t", b"p", 0), Pingreq())
    assert c.received() == [ACCEPTED, Pingresp()]
    debug = [x.split(": ", 1)[1] for x in lines if x.startswith("debug d (")]
    inbound = [x for x in debug if x.startswith("in ")]
    assert [x.split("(")[0] for x in inbound] == ["in Publish", "in Pingreq"], debug
    assert "out PINGRESP (2 bytes)" in debug
    c.send(Pingreq())                        # (and the next read, as before)
    assert [x for x in lines if x.startswith("debug d (")][-1].endswith(
        "out PINGRESP (2 bytes)")


def test_the_console_switches_it_on_and_off(tmp_path: Any, lines: list[str]) -> None:
    """The console's API switches a client's debug logging on and off (audited) and refuses
    windows beyond the bound."""
    console, service, clock = make_console(tmp_path)
    client = ConsoleClient(console)
    assert client.login().code == 303
    csrf = {"X-CSRF-Token": client.get("/api/whoami").json()["csrf_token"]}
    reply = client.post_json("/api/clients/debug", {"client_id": "dev-7", "minutes": 5}, csrf)
    assert reply.code == 200, reply.text
    assert reply.json()["until"] == clock.seconds() + 300
    assert "dev-7" in service.broker.client_debug.active()
    assert any("action=debug-log" in x and "'dev-7'" in x for x in lines)
    assert client.post_json("/api/clients/debug", {"client_id": "dev-7", "minutes": 0},
                            csrf).code == 200
    assert service.broker.client_debug.active() == {}
    assert client.post_json("/api/clients/debug", {"client_id": "dev-7", "minutes": 600},
                            csrf).code == 400


def test_an_amqp_connection_logs_its_frames_until_the_deadline(lines: list[str]) -> None:
    """For AMQP the client id is the container id; proton's frame trace is the log."""
    peer = ListenerPeer(idle=60.0)
    peer.conn.open()
    peer.exchange()
    assert peer.broker.commands.debug_client("unit", 30)[1] == 1
    session = peer.conn.session()
    session.open()
    peer.exchange()
    frames = [x for x in lines if x.startswith("debug unit (")]
    assert any("<- @begin" in x for x in frames) and any("-> @begin" in x for x in frames)
    peer.clock.advance(30)
    assert any("debug logging of unit" in x and "ended" in x for x in lines)
    lines.clear()
    session.close()
    peer.exchange()
    assert not [x for x in lines if x.startswith("debug unit (")]
    peer.server.connectionLost(None)
    assert [c for c in peer.clock.getDelayedCalls() if c.active()] == []


def test_a_flooding_client_spends_its_line_budget(lines: list[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Debug lines per connection and window are bounded; one line says when it ends."""
    import mqttamqp.mqtt.debuglog as debuglog

    monkeypatch.setattr(debuglog, "LineBudget", lambda: LineBudget(5))
    clock = Clock()
    broker = Broker(clock, NullStore())
    flood = Client(MQTTFactory(broker, clock))
    flood.connect("flood")
    broker.commands.debug_client("flood", 60)
    for _ in range(50):
        flood.send(Pingreq())
    debug = [x for x in lines if x.startswith("debug flood (")]
    assert len(debug) == 6 and "the most for one window" in debug[-1]
    flood.proto.connectionLost(None)


def test_debugging_swaps_the_connection_class_and_back() -> None:
    """The MQTT connection has no instance dict; the debug log is a subclass it
    takes on while debugged (the same slots) and drops when the window ends."""
    from mqttamqp.mqtt.protocol import MQTTProtocol

    clock = Clock()
    broker = Broker(clock, NullStore())
    client = Client(MQTTFactory(broker, clock))
    client.connect("swapped")
    proto = client.proto
    assert type(proto) is MQTTProtocol and not hasattr(proto, "__dict__")
    broker.commands.debug_client("swapped", 30)
    assert type(proto) is not MQTTProtocol and isinstance(proto, MQTTProtocol)
    broker.commands.debug_client("swapped", 60)       # a new deadline only
    clock.advance(30)
    assert type(proto) is not MQTTProtocol
    clock.advance(30)
    assert type(proto) is MQTTProtocol and timers_left(clock) == []
