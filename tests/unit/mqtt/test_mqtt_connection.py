"""Unit tests of the MQTT connection's sans-IO rules (``mqttamqp.mqtt.connection``):
no transport, no clock, no broker."""

from __future__ import annotations

import pytest

from mqttamqp.mqtt.connection import (
    MAX_PENDING_ACKS,
    AckQueue,
    ConnectionRules,
    ConnectionState,
    IllegalTransition,
    Keepalive,
)
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Publish,
    Suback,
    Unsuback,
)

CONNECT = Connect("MQTT", 4, "c", True, 30)


def test_lifecycle_follows_the_table() -> None:
    """awaiting CONNECT -> connecting -> connected -> closed, each by its event."""
    rules = ConnectionRules()
    assert rules.state is ConnectionState.AWAITING_CONNECT and rules.reading
    assert rules.advance("connect") is ConnectionState.CONNECTING
    assert not rules.reading  # no packet is taken while authentication runs
    assert rules.advance("accepted") is ConnectionState.CONNECTED and rules.reading
    assert rules.advance("close") is ConnectionState.CLOSED and rules.closed
    assert rules.advance("close") is ConnectionState.CLOSED  # closing twice is harmless


@pytest.mark.parametrize("events", [("accepted",), ("connect", "connect"),
                                    ("close", "connect"), ("close", "accepted")])
def test_transitions_outside_the_table_are_bugs(events: tuple[str, ...]) -> None:
    """An event the table does not allow raises instead of silently moving on."""
    rules = ConnectionRules()
    *before, last = events
    for event in before:
        rules.advance(event)
    with pytest.raises(IllegalTransition):
        rules.advance(last)


def test_first_packet_must_be_connect() -> None:
    """Before CONNECT, anything else is a protocol error naming the packet."""
    rules = ConnectionRules()
    assert rules.check(Pingreq()) == "first packet must be CONNECT, got PINGREQ"
    assert rules.check(CONNECT) is None


def test_second_connect_and_server_packets_are_refused() -> None:
    """Once connected: a second CONNECT, and packets only servers send, are errors."""
    rules = ConnectionRules()
    rules.advance("connect")
    rules.advance("accepted")
    assert rules.check(CONNECT) == "second CONNECT on one connection"
    for packet, name in ((Connack(False, 0), "CONNACK"), (Suback(1, (0,)), "SUBACK"),
                         (Unsuback(1), "UNSUBACK"), (Pingresp(), "PINGRESP")):
        assert rules.check(packet) == f"a client may not send {name}"
    assert rules.check(Publish("t", b"", 0, False, False, None)) is None
    assert rules.check(Disconnect()) is None


def test_keepalive_deadline_is_one_and_a_half_periods() -> None:
    """Silent for 1.5 k - e: check again at the deadline; silent for 1.5 k: expired."""
    keepalive = Keepalive(10)
    assert keepalive.next_check(100.0, 100.0, False) == 15.0
    assert keepalive.next_check(114.9, 100.0, False) == pytest.approx(0.1)
    assert keepalive.next_check(115.0, 100.0, False) is None
    assert "no packet for 15.0s, limit 15s" in keepalive.expired_reason(115.0, 100.0)


def test_keepalive_does_not_count_silence_while_not_reading() -> None:
    """While the broker is not reading (back-pressure), the check waits a full period."""
    assert Keepalive(10).next_check(500.0, 100.0, True) == 15.0


def test_acks_leave_in_arrival_order_once_ready() -> None:
    """A ready acknowledgement waits behind an earlier one still pending its commit."""
    acks = AckQueue()
    first = acks.add(b"1", None, ready=False)
    acks.add(b"2", None, ready=True)
    assert acks.take() == []
    AckQueue.ready(first)
    assert [frame for frame, _ in acks.take()] == [b"1", b"2"]
    assert acks.empty


def test_ack_queue_bound_and_resume_mark() -> None:
    """Past MAX_PENDING_ACKS the client is not read; at half of it, it is again."""
    acks = AckQueue()
    entries = [acks.add(b"x", None, ready=False) for _ in range(MAX_PENDING_ACKS + 1)]
    assert acks.over_bound and not acks.under_resume_mark
    for entry in entries[:MAX_PENDING_ACKS // 2 + 1]:
        AckQueue.ready(entry)
    acks.take()
    assert not acks.over_bound and acks.under_resume_mark


def test_acks_waiting_on_one_waiter_join_one_entry_and_count_in_the_bound() -> None:
    """Consecutive acknowledgements on the same waiter are one entry (one frame of
    them all, in order); another waiter or a plain entry starts a new one; the bound
    counts every acknowledgement."""
    acks = AckQueue()
    one, two = object(), object()
    first = acks.add_waiting(b"1", one)
    assert first is not None and acks.add_waiting(b"2", one) is None
    second = acks.add_waiting(b"3", two)
    plain = acks.add(b"4", None, ready=False)
    assert second is not None and acks.add_waiting(b"5", two) is not None
    assert len(acks) == 5
    AckQueue.ready(first)
    assert acks.take() == [(b"12", None)] and len(acks) == 3
    AckQueue.ready(second)
    AckQueue.ready(plain)
    assert acks.take() == [(b"3", None), (b"4", None)] and len(acks) == 1
    for _ in range(MAX_PENDING_ACKS):
        acks.add_waiting(b"x", two)
    assert acks.over_bound


def test_idle_ack_queues_share_one_empty_list() -> None:
    """No list of its own until an acknowledgement waits, and none once all left."""
    a, b = AckQueue(), AckQueue()
    assert a._entries is b._entries and a.empty and len(a) == 0
    entry = a.add(b"1", None, ready=False)
    assert not a.empty and b.empty
    AckQueue.ready(entry)
    assert a.take() == [(b"1", None)]
    assert a._entries is b._entries


def test_keepalive_rules_are_shared_per_value() -> None:
    """One Keepalive rule per keepalive value, with its limit at 1.5 times it."""
    assert Keepalive.of(600) is Keepalive.of(600)
    assert Keepalive.of(600).limit == 900.0 and Keepalive.of(600).seconds == 600
    assert Keepalive.of(60) is not Keepalive.of(600)
