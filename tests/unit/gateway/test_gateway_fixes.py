"""Regression tests of the gateway review (issue #29 §1), on the frontend's fakes
(``test_gateway_frontend``): packet ids are the core's, a paused client is not
expired, MQTT 5 failure reason codes and maximum packet size, SUBSCRIBE bounded by
the acknowledgement rule, the core ending a channel, CONNECT's one deadline."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqp_memory import Net
from gateway_memory import Gateway
from test_gateway_frontend import CONNECT, FakePool, connected, packets
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from mqttamqp.amqp.codec.encode import encode_publish
from mqttamqp.amqp.codec.publish import decode_publish
from mqttamqp.gateway.channel import ChannelState, ClientChannel, Outcome
from mqttamqp.gateway.wire import message_id
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connect,
    Disconnect,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Will,
)
from mqttamqp.mqtt.v5 import TOPIC_ALIAS_MAXIMUM


def test_message_id_of_a_publish_delivery_is_read_in_place() -> None:
    """The core's packet id (message-id, small and large ulong) is read from the
    properties section of a ``.publish`` delivery; none without one."""
    for pid in (1, 255, 256, 65535):
        data = encode_publish("a/b", b"x", 1, False, 0, None, pid)
        assert message_id(data, decode_publish(data, False).bare_start) == pid
    data = encode_publish("a/b", b"x", 0, False, 0, None)
    assert message_id(data, decode_publish(data, True).bare_start) is None


def test_qos2_delivery_and_pubrel_use_the_cores_packet_id() -> None:
    """A QoS 2 delivery goes out with the core's packet id (not one the gateway
    makes up), the client's PUBREC names it, and PUBREL/PUBCOMP use it too."""
    proto, transport, _ = connected()
    proto.dataReceived(CONNECT)
    (channel,) = FakePool.made
    channel.opened.callback(False)
    packets(transport)
    released: list[tuple[int, object]] = []
    channel.released = lambda pid, dlv: released.append((pid, dlv))  # type: ignore[attr-defined]
    proto.deliver("x/y", b"two", 2, False, False, "dlv-9", None, 9)
    (sent,) = packets(transport)
    assert sent.packet_id == 9
    proto.dataReceived(encode(Pubrec(9)))
    assert released == [(9, "dlv-9")]
    proto.release(9, "rel-9")
    assert packets(transport) == [Pubrel(9)]
    proto.dataReceived(encode(Pubcomp(9)))
    assert channel.finished_ == ["rel-9"]


def test_takeover_through_another_gateway_leaves_the_session_to_the_newcomer() -> None:
    """A clean-session client taken over through a second gateway: the first gateway
    closes its client without AMQP_CLOSE or a forced detach, so the newcomer keeps
    the session (its subscription works) and stays connected."""
    net = Net()
    gw1, gw2 = Gateway(net), Gateway(net)
    first = gw1.client("tk", will=Will("w/tk", b"old-will", 1, False))
    second = gw2.client("tk", clean=False)
    net.pump()
    assert first.proto.rules.closed
    assert not second.proto.rules.closed
    second.send(Subscribe(1, (("t", 1),)))
    assert second.take(Suback) == [Suback(1, (1,))]
    net.mqtt("p").publish("t", b"hello", qos=1)
    assert [m.payload for m in second.take(Publish)] == [b"hello"]
    assert not second.proto.rules.closed
    assert "tk" in net.broker.sessions


class _Owner:
    """A channel's owner that records why it was ended."""

    def __init__(self) -> None:
        self.gone: list[str] = []
        self.causes: list[str] = []

    def upstream_gone(self, reason: str, cause: str = "upstream-gone") -> None:
        self.gone.append(reason)
        self.causes.append(cause)


class _Link:
    """A link as ``on_link_closed`` sees it."""

    name = "gw1:pubrel"
    _impl = object()


class _Conn:
    serial = 1

    def flush_now(self) -> None:
        pass


def test_refused_pubrel_link_ends_the_client_brute() -> None:
    """The core refusing the lazily attached ``.pubrel`` link while READY ends the
    client (not silently), as a refusal, not as the core ending the session; the
    attach's Deferred is consumed, not errbacked unawaited."""
    owner = _Owner()
    channel = ClientChannel(_Conn(), "c", owner, Clock(), 8, 5.0)  # type: ignore[arg-type]
    channel.state = ChannelState.READY
    attach: Deferred[None] = Deferred()
    channel._opened[_Link._impl] = attach
    channel.on_link_closed(_Link(), "amqp:unauthorized-access")
    assert owner.gone == ["the core detached gw1:pubrel: amqp:unauthorized-access"]
    assert not channel.ended_by_core
    assert not attach.called


def test_a_publish_over_the_cores_bound_is_logged_under_its_own_cause() -> None:
    """The close for a PUBLISH over the core's max-message-size has its own
    rate-limit cause, so its line is not folded into the core-ended closes'."""
    owner = _Owner()
    channel = ClientChannel(_Conn(), "c", owner, Clock(), 8, 5.0)  # type: ignore[arg-type]
    channel.state = ChannelState.READY
    channel.max_message = 100
    channel.publish_message("t", b"x" * 200, 0, False, False, None)
    channel.on_link_closed(_Link(), None)
    assert owner.causes == ["publish-over-core-max", "upstream-gone"]
    assert owner.gone[0].startswith("a PUBLISH of ")


def test_a_link_detached_by_the_core_is_its_end_of_the_channel() -> None:
    """A link of an open channel detached by the core (a takeover): the client is
    ended and the channel's close sends no AMQP_CLOSE and no forced detach."""
    owner = _Owner()
    channel = ClientChannel(_Conn(), "c", owner, Clock(), 8, 5.0)  # type: ignore[arg-type]
    channel.state = ChannelState.READY
    channel.on_link_closed(_Link(), None)
    assert owner.gone == ["the core detached gw1:pubrel"]
    assert channel.ended_by_core
    channel.close(True, True, "taken over")
    assert channel.state is ChannelState.CLOSED   # (no AMQP_CLOSE awaited)


def test_mqtt5_clean_start_with_session_expiry_opens_a_persistent_session() -> None:
    """MQTT 5 clean start 1 with a session expiry: the channel removes the old session
    and opens a persistent one, CONNACK says no session present, and the session is
    not removed at the end."""
    proto, transport, _ = connected()
    expiry = Properties(session_expiry_interval=300)
    proto.dataReceived(encode(Connect("MQTT", 5, "c5", True, 10, properties=expiry), 5))
    (channel,) = FakePool.made
    assert channel.open_args == (True, None)
    assert channel.persistent is True
    channel.opened.callback(False)
    decoder = Decoder(1 << 20, 5)
    decoder.feed(transport.value())
    ack = next(iter(decoder))
    assert (ack.session_present, ack.return_code) == (False, 0)
    proto.dataReceived(encode(Disconnect(), 5))
    assert channel.closed == (False, False)


def test_mqtt5_connack_announces_what_the_gateway_serves() -> None:
    """An MQTT 5 CONNACK through a gateway announces its receive maximum and maximum
    packet size, the broker's topic alias maximum and no subscription identifiers."""
    proto, transport, _ = connected()
    proto.dataReceived(encode(Connect("MQTT", 5, "c5", True, 10), 5))
    (channel,) = FakePool.made
    channel.opened.callback(False)
    decoder = Decoder(1 << 20, 5)
    decoder.feed(transport.value())
    props = next(iter(decoder)).properties
    assert props.receive_maximum == 1000
    assert props.maximum_packet_size == proto.factory.limits.max_packet_size
    assert props.subscription_identifier_available == 0
    assert props.topic_alias_maximum == TOPIC_ALIAS_MAXIMUM


def test_mqtt5_protocol_error_is_told_with_disconnect_and_its_reason_code() -> None:
    """An MQTT 5 client closed for a protocol error gets DISCONNECT with the reason code
    (0x94 for a topic alias above the maximum announced) before the close."""
    proto, transport, _ = connected()
    proto.dataReceived(encode(Connect("MQTT", 5, "c5", True, 10), 5))
    (channel,) = FakePool.made
    channel.opened.callback(False)
    transport.clear()
    proto.dataReceived(encode(Publish("t", b"x", properties=Properties(
        topic_alias=TOPIC_ALIAS_MAXIMUM + 1)), 5))
    decoder = Decoder(1 << 20, 5)
    decoder.feed(transport.value())
    (told,) = list(decoder)
    assert isinstance(told, Disconnect) and told.reason_code == 0x94
    assert transport.disconnecting


def test_client_paused_for_flow_control_is_not_expired_for_its_silence() -> None:
    """A client not read because the core gives no PUBLISH credit is not closed for
    the silence the pause causes (its PINGREQ waits unread); read again, the
    keepalive rule applies as before."""
    proto, transport, clock = connected()
    proto.dataReceived(CONNECT)          # keepalive 10 s, a will
    (channel,) = FakePool.made
    channel.opened.callback(False)
    channel.blocked = True
    proto.dataReceived(encode(Publish("t", b"1", 0)) + encode(Pingreq()))
    assert transport.producerState == "paused"
    clock.advance(16)
    assert channel.closed is None
    channel.blocked = False
    proto.writable()
    assert transport.producerState == "producing"
    clock.advance(31)
    assert channel.closed == (True, False)


def _connected5(props: Properties | None = None) -> tuple[Any, Any, Any]:
    """An MQTT 5 client past CONNACK, its transport cleared, and its fake channel."""
    proto, transport, _ = connected()
    proto.dataReceived(encode(Connect("MQTT", 5, "c5", True, 10, properties=props), 5))
    (channel,) = FakePool.made
    channel.opened.callback(False)
    transport.clear()
    return proto, transport, channel


def test_mqtt5_publish_the_core_refused_gets_a_failure_reason_code() -> None:
    """MQTT 5: a QoS 1 PUBLISH the core refused as not authorized gets PUBACK 0x87, a
    QoS 2 one refused otherwise PUBREC 0x80, and its id no longer awaits PUBREL."""
    proto, transport, channel = _connected5()
    proto.dataReceived(encode(Publish("t", b"1", 1, packet_id=7), 5)
                       + encode(Publish("t", b"2", 2, packet_id=8), 5))
    first, second = (p[3] for p in channel.published)
    first(Outcome(False, "amqp:unauthorized-access: denied", "amqp:unauthorized-access"))
    second(Outcome(False, "amqp:internal-error: full", "amqp:internal-error"))
    decoder = Decoder(protocol_level=5)
    decoder.feed(transport.value())
    assert list(decoder) == [Puback(7, 0x87), Pubrec(8, 0x80)]
    assert 8 not in proto.awaiting_rel


def test_delivery_over_the_clients_maximum_packet_size_is_settled_not_sent() -> None:
    """MQTT 5 maximum packet size: a larger delivery is not written, but settled
    (Accepted) upstream and counted, as a broker does."""
    proto, transport, channel = _connected5(Properties(maximum_packet_size=64))
    proto.deliver("x/y", b"z" * 100, 1, False, False, "big", None, 5)
    assert transport.value() == b""
    assert channel.finished_ == ["big"]
    assert proto.factory.too_large == 1
    assert proto.outbound.inflight == {}
    proto.deliver("x/y", b"small", 1, False, False, "small", None, 6)
    assert transport.value() != b""


def test_unanswered_subscribes_beyond_the_bound_stop_reading_the_client() -> None:
    """SUBSCRIBEs the core has not answered count toward the acknowledgements' bound
    (``AckQueue``): beyond it the client is not read, as for PUBLISH."""
    proto, transport, channel = _connected5()
    burst = b"".join(encode(Subscribe(i, (("a", 1),)), 5) for i in range(1, 1100))
    proto.dataReceived(burst)
    assert transport.producerState == "paused"
    assert proto.factory.reading_pauses == 1
    assert len(channel.subscribed) < 1099


class _FakeLink:
    """A proton link as the connect flow handles it (attach only)."""

    SND_MIXED, SND_UNSETTLED, RCV_FIRST = 0, 1, 0

    def __init__(self, name: str, is_sender: bool) -> None:
        self.name = name
        self.is_sender = is_sender
        self._impl = object()
        self.target = SimpleNamespace(address=None)
        self.source = SimpleNamespace(address=None)
        self.remote_target = self.remote_source = SimpleNamespace(address="granted")

    def open(self) -> None:
        pass

    def flow(self, credit: int) -> None:
        pass


class _FakeSession:
    def __init__(self) -> None:
        self.links: list[_FakeLink] = []

    def sender(self, name: str) -> _FakeLink:
        self.links.append(_FakeLink(name, True))
        return self.links[-1]

    def receiver(self, name: str) -> _FakeLink:
        self.links.append(_FakeLink(name, False))
        return self.links[-1]


class _FlowConn(_Conn):
    def __init__(self) -> None:
        self.session = _FakeSession()

    def begin(self, channel: object) -> _FakeSession:
        return self.session

    def register(self, link: object, channel: object) -> None:
        pass

    def flush(self) -> None:
        pass


def test_connect_flow_has_one_deadline_not_one_per_step() -> None:
    """The core answering each step of the connect flow just under the connect
    timeout does not stretch it: the flow fails once the one deadline passed."""
    clock = Clock()
    conn = _FlowConn()
    channel = ClientChannel(conn, "c", _Owner(), clock, 8, 5.0)  # type: ignore[arg-type]
    opened = Deferred.fromCoroutine(channel.open(False, None))
    failures: list[Any] = []
    opened.addErrback(failures.append)
    will = conn.session.links[0]
    clock.advance(3)
    channel.on_link_open(will)
    clock.advance(2.5)   # (5.5 s in all: past the deadline, 2.5 s into this step)
    assert len(failures) == 1
    assert "connect timeout (5 s)" in failures[0].getErrorMessage()
