"""The executor of the MQTT connection's actions (``mqtt.executor``), on a
StringTransport and a Clock: each action does what it names, acknowledgements
leave in order once durable, and nothing outside the closed set is carried out."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import ManualStore
from mqtt_memory import Harness, connected
from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.mqtt import actions
from mqttamqp.mqtt.actions import Ack, Arm, Close, Send
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    ReasonCode,
    Subscribe,
)
from mqttamqp.mqtt.protocol import MQTTProtocol


def test_an_action_outside_the_closed_set_is_refused() -> None:
    """Anything but the actions of ``mqtt.actions`` is a bug: TypeError, nothing sent."""
    c = connected(Harness())
    with pytest.raises(TypeError):
        c.proto._carry_out(object())
    assert c.received() == [] and c.open


def test_send_writes_and_close_disconnects_with_its_code() -> None:
    """``Send`` writes its frame now; ``Close`` is the one disconnect, with its
    reason code for an MQTT 5 client."""
    c = connected(Harness())
    c.proto._carry_out(actions.PINGRESP)
    c.proto._carry_out(Send(actions.ack_frame(0x40, 3)))
    assert c.received() == [Pingresp(), Puback(3)]
    c.proto._carry_out(Close("bad alias", ReasonCode.TOPIC_ALIAS_INVALID))
    got = c.received()
    assert isinstance(got[-1], Disconnect)
    assert got[-1].reason_code == ReasonCode.TOPIC_ALIAS_INVALID and not c.open


def test_acknowledgements_wait_for_durable_and_keep_their_order() -> None:
    """An ``Ack`` after a pending Deferred holds the ones behind it; once it fires
    both go out in order, and a releasing one gives the quota back only then."""
    c = connected(Harness())
    v5 = c.proto._v5
    assert v5 is not None
    v5.took(Publish("t", b"", 1, packet_id=7))
    durable: Deferred[None] = Deferred()
    c.proto._acknowledge(actions.PUBACK_RELEASE, 7, durable)
    c.proto._acknowledge(actions.PUBACK, 8, None)
    assert c.received() == [] and 7 in v5._quota
    durable.callback(None)
    assert c.received() == [Puback(7), Puback(8)] and 7 not in v5._quota


def test_ack_with_its_own_frame_and_what_follows_the_write() -> None:
    """An ``Ack`` carrying a frame writes that frame; ``then`` runs once written."""
    c = connected(Harness())
    done: list[str] = []
    c.proto._acknowledge(Ack(0x40, actions.ack_frame(0x40, 9)), 1, None,
                         lambda: done.append("then"))
    assert c.received() == [Puback(9)] and done == ["then"]


def test_arm_starts_the_keepalive_and_connect_deadlines() -> None:
    """``Arm("keepalive")`` sets the keepalive rule and its check; ``Arm("connect")``
    the CONNECT deadline, which closes the connection when it passes."""
    h = Harness()
    c = connected(h)
    c.proto._carry_out(Arm("keepalive", 10))
    assert c.proto._keepalive is not None and c.proto._keepalive_timer is not None
    c.proto._carry_out(Arm("connect", 2.0))
    assert c.proto._connect_timer is not None
    h.clock.advance(2.5)
    assert not c.open


class _Recording(MQTTProtocol):
    """An MQTT connection that records every action handed to its executor."""

    def __init__(self, factory: Any) -> None:
        super().__init__(factory)
        self.done: list[object] = []

    def _carry_out(self, action: Any, packet_id: int = 0) -> None:
        self.done.append(action)
        super()._carry_out(action, packet_id)


def _recording(h: Harness) -> tuple[_Recording, StringTransport]:
    proto = _Recording(h.factory)
    transport = StringTransport()
    proto.makeConnection(transport)  # type: ignore[no-untyped-call]
    return proto, transport


def test_deadlines_and_their_expiry_go_through_the_executor() -> None:
    """The first CONNECT deadline is an ``Arm`` carried out by the executor (a turn
    after the accept: ``SoonDeadlines``), and its expiry, like a keepalive's, is a
    ``Close`` handed to it."""
    h = Harness(connect_timeout=2.0)
    proto, transport = _recording(h)
    assert proto.done == []
    h.clock.advance(0)
    [arm] = proto.done
    assert isinstance(arm, Arm) and (arm.deadline, arm.seconds) == ("connect", 2.0)
    h.clock.advance(2.5)
    assert isinstance(proto.done[-1], Close) and "no CONNECT" in proto.done[-1].reason
    assert transport.disconnecting
    proto, transport = _recording(h)
    proto.dataReceived(encode(Connect("MQTT", 4, "k", True, 1)))
    h.clock.advance(10)
    assert isinstance(proto.done[-1], Close) and "keepalive" in proto.done[-1].reason
    assert transport.disconnecting


def test_a_packet_before_connect_is_a_close_carried_out_by_the_executor() -> None:
    """A packet the connection's rules refuse (PINGREQ before CONNECT) closes the
    connection through a ``Close`` action."""
    proto, transport = _recording(Harness())
    proto.dataReceived(encode(Pingreq()))
    assert [type(a) for a in proto.done] == [Close] and transport.disconnecting


def test_a_malformed_mqtt5_connect_is_refused_by_the_executor() -> None:
    """An MQTT 5 CONNECT the codec refuses (too many user properties) is one
    ``Close`` carrying the refusing CONNACK, written before the connection closes."""
    proto, transport = _recording(Harness(max_user_properties=2))
    users = Properties(user_properties=(("a", "1"), ("b", "2"), ("c", "3")))
    proto.dataReceived(encode(Connect("MQTT", 5, "c", True, 0, properties=users), 5))
    close = proto.done[-1]
    assert isinstance(close, Close) and close.frame is not None
    d = Decoder(protocol_level=5)
    d.feed(transport.value())
    [connack] = list(d)
    assert isinstance(connack, Connack) and connack.return_code == 0x97
    assert transport.value() == close.frame and transport.disconnecting


def test_an_unknown_deadline_is_refused() -> None:
    """``Arm`` with a name other than "connect" or "keepalive" is a bug: ValueError,
    and no deadline is armed (it used to start a keepalive)."""
    c = connected(Harness())
    before = (c.proto._keepalive, c.proto._keepalive_timer, c.proto._connect_timer)
    with pytest.raises(ValueError):
        c.proto._carry_out(Arm("keepalve", 10))
    assert (c.proto._keepalive, c.proto._keepalive_timer, c.proto._connect_timer) == before
    assert c.open


@pytest.mark.parametrize("action", [
    actions.PUBACK, actions.PUBACK_RELEASE, actions.PUBREC, actions.PUBREC_OPENS,
    actions.PUBCOMP, actions.PUBCOMP_RELEASE, actions.PINGRESP,
    Close("x"), actions.Refuse(5, "x"), Arm("connect", 1.0), actions.Goodbye(False, None),
], ids=repr)
def test_actions_are_immutable(action: object) -> None:
    """The actions are values: the shared ones of the hot path (every connection's
    PUBACK) and the others refuse any change of an attribute, new or existing."""
    name = next(iter(type(action).__slots__))   # type: ignore[attr-defined]
    was = getattr(action, name)
    with pytest.raises(AttributeError):
        setattr(action, name, 1)
    with pytest.raises(AttributeError):
        delattr(action, name)
    with pytest.raises(AttributeError):
        action.other = 1   # type: ignore[attr-defined]
    assert getattr(action, name) == was


def _persistent_subscriber(h: Harness, store: Any) -> Any:
    sub = h.client()
    sub.connect("s", clean=False)
    sub.send(Subscribe(1, (("t", 1),)))
    store.commit_all()
    sub.received()
    return sub


def test_a_failed_commit_sends_neither_puback_of_one_read() -> None:
    """Two QoS 1 publishes to a persistent subscriber in one read share the batch's
    waiter; its commit fails (one subscriber PUBACK came first): no PUBACK is sent,
    the publisher is closed so that it retries."""
    store = ManualStore()
    h = Harness(store)
    sub = _persistent_subscriber(h, store)
    pub = h.client()
    pub.connect("p")
    pub.send(Publish("t", b"a", 1, False, False, 1), Publish("t", b"b", 1, False, False, 2))
    delivered = [p for p in sub.received() if isinstance(p, Publish)]
    assert len(delivered) == 2 and len(store.pending) == 1
    sub.send(Puback(delivered[0].packet_id))
    assert pub.received() == []
    _ops, commit = store.pending.pop(0)
    commit.errback(Failure(OSError(28, "No space left on device")))
    assert pub.received() == [] and not pub.open


def test_pubacks_of_one_read_go_once_every_delivery_is_acknowledged() -> None:
    """The promise holds early: once the persistent subscriber acknowledged both
    messages of the read, both PUBACKs go, in order, before the commit."""
    store = ManualStore()
    h = Harness(store)
    sub = _persistent_subscriber(h, store)
    pub = h.client()
    pub.connect("p")
    pub.send(Publish("t", b"a", 1, False, False, 1), Publish("t", b"b", 1, False, False, 2))
    delivered = [p for p in sub.received() if isinstance(p, Publish)]
    sub.send(Puback(delivered[0].packet_id))
    assert pub.received() == []
    sub.send(Puback(delivered[1].packet_id))
    assert pub.received() == [Puback(1), Puback(2)] and not store.pending[0][1].called
    store.commit_all()
    assert pub.received() == [] and pub.open


def test_pubacks_of_one_read_go_at_the_commit() -> None:
    """Without the subscriber's acknowledgements the PUBACKs wait for the commit."""
    store = ManualStore()
    h = Harness(store)
    sub = _persistent_subscriber(h, store)
    pub = h.client()
    pub.connect("p")
    pub.send(Publish("t", b"a", 1, False, False, 1), Publish("t", b"b", 1, False, False, 2))
    assert len([p for p in sub.received() if isinstance(p, Publish)]) == 2
    assert pub.received() == []
    store.commit_all()
    assert pub.received() == [Puback(1), Puback(2)]
