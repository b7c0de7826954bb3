"""The gateway's MQTT side on a ``StringTransport`` and ``task.Clock`` with a fake
channel: CONNECT waits for the upstream's answer (packets after it wait too),
"server unavailable" without an upstream, acknowledgements only after the core's
outcome and in packet order, deliveries with packet ids, keepalive, and which close
is clean and which is brute."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqttamqp.core.limits import Limits
from mqttamqp.gateway.channel import Outcome, Refused
from mqttamqp.gateway.frontend import GatewayFactory, GatewayProtocol
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Unsubscribe,
    Will,
)


class FakeChannel:
    """Records what the frontend asks; the test answers."""

    def __init__(self, conn: Any, client_id: str, owner: Any, clock: Any, credit: int,
                 timeout: float) -> None:
        self.conn = conn
        self.client_id = client_id
        self.owner = owner
        self.opened: Deferred[bool] = Deferred()
        self.open_args: tuple[bool, Any] | None = None
        self.persistent: bool | None = None
        self.published: list[tuple[str, bytes, int, Any]] = []
        self.subscribed: list[tuple[int, dict[str, int], Deferred[Outcome]]] = []
        self.sub_options: list[dict[str, int] | None] = []
        self.finished_: list[Any] = []
        self.closed: tuple[bool, bool] | None = None
        self.blocked = False
        FakePool.made.append(self)

    async def open(self, clean: bool, will: Any, persistent: bool | None = None) -> bool:
        self.open_args = (clean, will)
        self.persistent = persistent
        return await self.opened

    def publish_message(self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                        then: Any, props: Any = None) -> None:
        self.published.append((topic, payload, qos, then))

    def subscribe(self, packet_id: int, requests: dict[str, int],
                  options: dict[str, int] | None = None) -> Deferred[Outcome]:
        d: Deferred[Outcome] = Deferred()
        self.subscribed.append((packet_id, requests, d))
        self.sub_options.append(options)
        return d

    def finished(self, dlv: Any) -> None:
        self.finished_.append(dlv)

    def close(self, brute: bool, clean_session: bool, reason: str) -> None:
        self.closed = (brute, clean_session)

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass


class FakePool:
    made: list[FakeChannel] = []

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.conn = object()

    def pick(self, prefer: Any = None) -> Any:
        return self.conn if self.up else None


def connected(up: bool = True) -> tuple[GatewayProtocol, StringTransport, Clock]:
    clock = Clock()
    FakePool.made = []
    factory = GatewayFactory(FakePool(up), clock, Limits(), 8)  # type: ignore[arg-type]
    factory.make_channel = FakeChannel  # type: ignore[assignment]
    proto = factory.buildProtocol(None)
    assert proto is not None
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport, clock


def packets(transport: StringTransport) -> list[Any]:
    decoder = Decoder()
    decoder.feed(transport.value())
    transport.clear()
    return list(decoder)


CONNECT = encode(Connect("MQTT", 4, "c1", False, 10, Will("w/t", b"bye", 1, False)))


def test_connack_waits_for_the_upstream_and_says_session_present() -> None:
    """CONNECT: the channel's flow runs with clean flag and will; CONNACK after it."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    assert channel.open_args == (False, ("w/t", b"bye", 1, False, None))
    assert transport.value() == b""
    channel.opened.callback(True)
    assert packets(transport) == [Connack(True, 0)]


def test_no_upstream_is_server_unavailable() -> None:
    """No open upstream connection: CONNACK 3 and the socket closed."""
    proto, transport, _ = connected(up=False)
    proto.dataReceived(CONNECT)
    assert packets(transport) == [Connack(False, 3)]
    assert transport.disconnecting
    assert proto.factory.refused_unavailable == 1


def test_refused_by_the_core_is_server_unavailable_and_leaves_no_will() -> None:
    """The flow failing (no answer, a refused link) is CONNACK 3; the channel is
    closed without the will (not brute)."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.errback(Refused("no answer"))
    assert packets(transport) == [Connack(False, 3)]
    assert channel.closed == (False, False)


def test_packets_after_connect_wait_for_connack() -> None:
    """A SUBSCRIBE sent with CONNECT is handled only after CONNACK; SUBACK after the
    core accepted it, with the QoS asked for."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT + encode(Subscribe(7, (("a/#", 1), ("b", 2)))))
    (channel,) = FakePool.made
    assert channel.subscribed == []
    channel.opened.callback(False)
    assert packets(transport) == [Connack(False, 0)]
    ((pid, requests, d),) = channel.subscribed
    assert (pid, requests) == (7, {"a/#": 1, "b": 2})
    d.callback(Outcome(True))
    assert packets(transport) == [Suback(7, (1, 2))]


def test_pubacks_follow_the_cores_outcomes_in_packet_order() -> None:
    """Two QoS 1 PUBLISHes answered in reverse order: no PUBACK until the first is
    accepted, then both, in order."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    packets(transport)
    proto.dataReceived(encode(Publish("t", b"1", 1, packet_id=1))
                       + encode(Publish("t", b"2", 1, packet_id=2)))
    first, second = (p[3] for p in channel.published)
    second(Outcome(True))
    assert transport.value() == b""
    first(Outcome(True))
    assert packets(transport) == [Puback(1), Puback(2)]


def test_released_publish_closes_without_puback() -> None:
    """An outcome that is neither Accepted nor Rejected: no PUBACK (the client sends
    it again), the client closed brute."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    packets(transport)
    proto.dataReceived(encode(Publish("t", b"1", 1, packet_id=1)))
    channel.published[0][3](Outcome(False, "released"))
    assert packets(transport) == []
    assert channel.closed == (True, False)


def test_delivery_gets_a_packet_id_and_is_finished_on_puback() -> None:
    """A QoS 1 message of the session goes out with the core's packet id; the client's
    PUBACK settles it upstream."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    packets(transport)
    proto.deliver("x/y", b"hi", 1, False, False, "dlv-1", None, 41)
    (sent,) = packets(transport)
    assert (sent.topic, sent.payload, sent.qos, sent.packet_id) == ("x/y", b"hi", 1, 41)
    proto.dataReceived(encode(Puback(sent.packet_id)))
    assert channel.finished_ == ["dlv-1"]


def test_no_credit_stops_reading_until_the_core_gives_more() -> None:
    """The core's credit for PUBLISH used up: the client is not read; credit again
    resumes it."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    channel.blocked = True
    proto.dataReceived(encode(Publish("t", b"1", 0)) + encode(Publish("t", b"2", 0)))
    assert [p[1] for p in channel.published] == [b"1"]
    assert transport.producerState == "paused"
    channel.blocked = False
    proto.writable()
    assert [p[1] for p in channel.published] == [b"1", b"2"]
    assert transport.producerState == "producing"


def test_keepalive_expiry_is_a_brute_close() -> None:
    """Silent for 1.5 x keepalive: closed, and the will goes (brute)."""
    proto, _, clock = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    clock.advance(14.9)
    assert channel.closed is None
    clock.advance(0.2)
    assert channel.closed == (True, False)
    assert clock.getDelayedCalls() == []


def test_disconnect_is_a_clean_close() -> None:
    """DISCONNECT: the channel closes clean (no will); a clean session is removed."""
    proto, _, _ = connected()
    proto.dataReceived(encode(Connect("MQTT", 4, "c2", True, 0)))
    (channel,) = FakePool.made
    channel.opened.callback(False)
    proto.dataReceived(encode(Disconnect()))
    assert channel.closed == (False, True)


def test_takeover_closes_the_old_client_clean() -> None:
    """A second CONNECT with the same client id resuming the session closes the first
    one's channel clean (no will) before the new one opens."""
    proto, _, _ = connected()
    proto.dataReceived(CONNECT)
    (old,) = FakePool.made
    old.opened.callback(False)
    second = proto.factory.buildProtocol(None)
    assert second is not None
    second.makeConnection(StringTransport())
    second.dataReceived(CONNECT)
    assert old.closed == (False, False)
    assert len(FakePool.made) == 2


class Authenticator:
    """Answers with ``ok``, at once or through a Deferred the test fires."""

    def __init__(self, ok: bool, deferred: bool = False) -> None:
        self.ok = ok
        self.deferred: Deferred[bool] | None = Deferred() if deferred else None
        self.asked: list[Any] = []

    def authenticate(self, credentials: Any) -> bool | Deferred[bool]:
        self.asked.append(credentials)
        return self.deferred if self.deferred is not None else self.ok


def test_bad_password_is_refused_with_4_and_reaches_no_core() -> None:
    """A CONNECT the authenticator refuses: CONNACK 4 (a user name was given), and no
    channel is opened toward the core."""
    proto, transport, _ = connected()
    proto.factory.authenticator = Authenticator(False)
    proto.dataReceived(encode(Connect("MQTT", 4, "c3", True, 0, username="u",
                                      password=b"bad")))
    assert packets(transport) == [Connack(False, 4)]
    assert FakePool.made == []
    cred = proto.factory.authenticator.asked[0]
    assert (cred.client_id, cred.username, cred.password) == ("c3", "u", b"bad")


def test_connect_waits_for_a_slow_authenticator() -> None:
    """The authenticator's Deferred: nothing goes upstream until it says yes."""
    proto, transport, _ = connected()
    auth = Authenticator(True, deferred=True)
    proto.factory.authenticator = auth
    proto.dataReceived(CONNECT)
    assert FakePool.made == []
    assert auth.deferred is not None
    auth.deferred.callback(True)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    assert packets(transport) == [Connack(False, 0)]


def test_takeover_by_a_clean_start_publishes_the_old_will() -> None:
    """A takeover by a CONNECT with clean session 1 ends the old client brute: the
    core publishes its will (as the broker does)."""
    proto, _, _ = connected()
    clean = encode(Connect("MQTT", 4, "c9", True, 0, Will("w/t", b"bye", 1, False)))
    proto.dataReceived(clean)
    (old,) = FakePool.made
    old.opened.callback(False)
    second = proto.factory.buildProtocol(None)
    assert isinstance(second, GatewayProtocol)
    second.makeConnection(StringTransport())
    second.dataReceived(clean)
    assert old.closed == (True, True)


def test_mqtt31_connack_has_no_session_present() -> None:
    """MQTT 3.1: the CONNACK's reserved byte stays 0 even when the session was there."""
    proto, transport, _ = connected()
    proto.dataReceived(encode(Connect("MQIsdp", 3, "old31", False, 0)))
    (channel,) = FakePool.made
    channel.opened.callback(True)
    assert transport.value() == b"\x20\x02\x00\x00"


def test_takeover_of_a_clean_session_publishes_the_old_will() -> None:
    """A persistent newcomer taking over a clean session ends the old client brute:
    the session ends with it, so its will is published (as the broker does)."""
    proto, _, _ = connected()
    proto.dataReceived(encode(Connect("MQTT", 4, "c10", True, 0,
                                      Will("w/t", b"bye", 1, False))))
    (old,) = FakePool.made
    old.opened.callback(False)
    second = proto.factory.buildProtocol(None)
    assert isinstance(second, GatewayProtocol)
    second.makeConnection(StringTransport())
    second.dataReceived(encode(Connect("MQTT", 4, "c10", False, 0)))
    assert old.closed == (True, True)


def test_unsubscribe_with_an_invalid_filter_closes() -> None:
    """An UNSUBSCRIBE filter that breaks the rules is a protocol violation, as in
    SUBSCRIBE: the client is closed and nothing goes to the core."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    packets(transport)
    proto.dataReceived(encode(Unsubscribe(3, ("a/#/b",))))
    assert transport.value() == b""
    assert transport.disconnecting or transport.disconnected
    assert channel.closed is not None and channel.closed[0] is True


def test_a_closed_client_that_does_not_close_is_cut_after_the_close_grace() -> None:
    """--close-grace (here 4 s) on a gateway: a client closed after DISCONNECT that
    does not close is still there just before, cut then, and counted in the
    gateway's figures (``cut_after_grace``)."""
    from types import SimpleNamespace

    from mqttamqp.gateway.figures import GatewayFigures

    class Recording(StringTransport):
        aborted = 0

        def abortConnection(self) -> None:
            self.aborted += 1
            super().abortConnection()

    clock = Clock()
    FakePool.made = []
    factory = GatewayFactory(FakePool(), clock, Limits(close_grace=4.0), 8)  # type: ignore[arg-type]
    factory.make_channel = FakeChannel  # type: ignore[assignment]
    proto = factory.buildProtocol(None)
    transport = Recording()
    proto.makeConnection(transport)
    proto.dataReceived(encode(Connect("MQTT", 4, "c2", True, 0)))
    (channel,) = FakePool.made
    channel.opened.callback(False)
    proto.dataReceived(encode(Disconnect()))
    assert transport.disconnecting
    clock.advance(4.0 - 1e-6)
    assert transport.aborted == 0
    clock.advance(2e-6)
    assert transport.aborted == 1 and factory.close_grace.cut == 1
    pool = SimpleNamespace(slots=[], connects=0, losses=0, full=0,
                           upstream=SimpleNamespace(display="core"))
    assert GatewayFigures(factory, pool, clock).counters()["cut_after_grace"] == 1  # type: ignore[arg-type]
