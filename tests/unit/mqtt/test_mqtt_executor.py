"""The executor of the MQTT connection's actions (``mqtt.executor``), on a
StringTransport and a Clock: each action does what it names, acknowledgements
leave in order once durable, and nothing outside the closed set is carried out."""

from __future__ import annotations

import pytest
from mqtt_memory import Harness, connected
from twisted.internet.defer import Deferred

from mqttamqp.mqtt import actions
from mqttamqp.mqtt.actions import Ack, Arm, Close, Send
from mqttamqp.mqtt.packets import Disconnect, Pingresp, Puback, Publish, ReasonCode


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
