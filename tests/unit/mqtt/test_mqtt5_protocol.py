"""Unit tests for MQTT 5 on the connection: StringTransport, Clock, no reactor.

Each test sends MQTT 5 packets to one ``MQTTProtocol`` and asserts the exact
packets (reason codes, properties) that come back.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakes import timers_left
from mqtt_memory import Client5, Harness, client5, closed_with, connected

from mqttamqp.core.auth import Credentials
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from mqttamqp.mqtt.v5 import RECEIVE_MAXIMUM, TOPIC_ALIAS_MAXIMUM
from mqttamqp.store.models import message_to_record, record_to_message

# --------------------------------------------------------------------------
# CONNECT / CONNACK


def test_connack_announces_the_broker_limits() -> None:
    """CONNACK carries receive maximum, topic alias maximum, maximum packet size and
    leaves shared subscriptions out (absent: available)."""
    h = Harness(max_packet_size=5000)
    ack = client5(h).connect5()
    assert ack == Connack(False, 0, Properties(
        receive_maximum=RECEIVE_MAXIMUM, topic_alias_maximum=TOPIC_ALIAS_MAXIMUM,
        maximum_packet_size=5000))


def test_empty_client_id_is_assigned_and_told() -> None:
    """An empty client id gets one, named in CONNACK, even with clean start 0."""
    h = Harness()
    c = client5(h)
    ack = c.connect5("", clean=False, session_expiry_interval=60)
    assert ack.return_code == 0 and ack.properties is not None
    assigned = ack.properties.assigned_client_identifier
    assert assigned and assigned in h.broker.sessions


def test_server_keep_alive_caps_the_client() -> None:
    """--max-keepalive replaces a longer or zero keepalive (server keep alive), and
    the connection is held to it."""
    h = Harness(max_keepalive=10)
    c = client5(h)
    ack = c.connect5(keepalive=0)
    assert ack.properties is not None and ack.properties.server_keep_alive == 10
    h.clock.advance(15 - 0.001)
    assert c.open
    h.clock.advance(0.002)
    closed_with(c, 0x8D)


def test_unknown_authentication_method_is_refused_0x8c() -> None:
    """No enhanced authentication method is offered: CONNACK 0x8C."""
    h = Harness()
    c = client5(h)
    ack = c.connect5(authentication_method="SCRAM-SHA-1")
    assert ack.return_code == 0x8C
    assert not c.open


class _Refuses:
    def authenticate(self, credentials: Credentials) -> bool:
        return False


def test_bad_credentials_get_reason_code_0x86() -> None:
    """A 3.1.1 refusal reaches an MQTT 5 client as its reason code."""
    h = Harness(authenticator=_Refuses())
    c = client5(h)
    c.send(Connect("MQTT", 5, "c", True, 0, None, "user", b"wrong"))
    got = c.received()
    assert isinstance(got[0], Connack) and got[0].return_code == 0x86


def test_request_response_information() -> None:
    """--response-information PREFIX answers a client that asks, with its id."""
    h = Harness(response_information="reply/")
    ack = client5(h).connect5("dev", request_response_information=1)
    assert ack.properties is not None and ack.properties.response_information == "reply/dev"


# --------------------------------------------------------------------------
# malformed and illegal properties


def test_duplicate_property_disconnects_0x82() -> None:
    """A property given twice is a Protocol Error: DISCONNECT 0x82 with a reason."""
    h = Harness()
    c = connected(h)
    props = b"\x0a\x02\x00\x00\x00\x05\x02\x00\x00\x00\x06"   # expiry twice
    c.send_raw(b"\x30" + bytes((3 + len(props) + 1,)) + b"\x00\x01t" + props + b"x")
    d = closed_with(c, 0x82)
    assert d.properties is not None and "more than once" in (d.properties.reason_string or "")


def test_property_not_allowed_disconnects_0x81() -> None:
    """Session expiry interval in a PUBLISH is malformed: DISCONNECT 0x81."""
    h = Harness()
    c = connected(h)
    c.send_raw(b"\x30\x0a\x00\x01t\x05\x11\x00\x00\x00\x01x")
    closed_with(c, 0x81)


def test_packet_too_large_disconnects_0x95() -> None:
    """A packet over --max-packet-size: DISCONNECT 0x95."""
    h = Harness(max_packet_size=100)
    c = connected(h)
    c.send(Publish("t", b"x" * 200))
    closed_with(c, 0x95)


def test_malformed_connect_properties_get_connack() -> None:
    """Before CONNACK the reason goes in a CONNACK: receive maximum 0 is 0x82."""
    h = Harness()
    c = client5(h)
    c.send_raw(b"\x10\x10\x00\x04MQTT\x05\x02\x00\x00\x03\x21\x00\x00\x00\x01c")
    [ack] = c.received()
    assert not c.open
    assert isinstance(ack, Connack) and ack.return_code == 0x82


# --------------------------------------------------------------------------
# PUBLISH properties


def test_properties_travel_to_mqtt5_subscribers_in_order() -> None:
    """Content type, response topic, correlation data, user properties (order and
    repeats kept) and payload format reach an MQTT 5 subscriber unchanged."""
    h = Harness()
    sub = connected(h, "sub")
    sub.send(Subscribe(1, (("a/#", 1),)))
    assert sub.received() == [Suback(1, (1,))]
    pub = connected(h, "pub")
    users = (("z", "1"), ("a", "2"), ("z", "3"))
    props = Properties(payload_format_indicator=1, content_type="text/plain",
                       response_topic="reply/x", correlation_data=b"\x00id",
                       user_properties=users)
    pub.send(Publish("a/b", b"hello", 1, False, False, 7, props))
    assert pub.received() == [Puback(7)]
    [got] = sub.received()
    assert isinstance(got, Publish) and got.topic == "a/b" and got.payload == b"hello"
    assert got.properties == props


def test_mqtt311_subscriber_gets_the_message_without_properties() -> None:
    """A 3.1.1 subscriber gets MQTT 5 messages in 3.1.1 form."""
    h = Harness()
    old = h.client()
    old.connect("old")
    old.send(Subscribe(1, (("t", 0),)))
    old.received()
    pub = connected(h, "pub")
    pub.send(Publish("t", b"x", properties=Properties(user_properties=(("k", "v"),))))
    assert old.received() == [Publish("t", b"x")]


def test_mqtt5_publishes_count_as_messages_in() -> None:
    """Routed MQTT 5 PUBLISHes count in the connection's messages in (the console's
    figure), as 3.1.1 ones do; one refused at once (0x99 here: a bad payload format)
    does not."""
    h = Harness()
    pub = connected(h, "pub")
    pub.send(Publish("t", b"x"), Publish("t", b"y", 1, False, False, 3))
    assert pub.received() == [Puback(3)]
    assert pub.proto.messages_in == 2
    pub.send(Publish("t", b"\xff", 1, False, False, 4,
                     Properties(payload_format_indicator=1)))
    [ack] = pub.received()
    assert isinstance(ack, Puback) and ack.reason_code == 0x99
    assert pub.proto.messages_in == 2


def test_message_expiry_forwards_the_remaining_interval() -> None:
    """A queued message goes out with what is left of its expiry interval."""
    h = Harness()
    sub = connected(h, "sub", session_expiry_interval=100)
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    sub.send(Disconnect())
    sub.lost()
    pub = connected(h, "pub")
    pub.send(Publish("t", b"x", 1, False, False, 1,
                     Properties(message_expiry_interval=30)))
    h.clock.advance(10)
    sub2 = client5(h)
    ack = sub2.connect5("sub", clean=False, session_expiry_interval=100)
    assert ack.session_present
    [got] = sub2.received()
    assert isinstance(got, Publish)
    assert got.properties == Properties(message_expiry_interval=20)


def test_expired_message_is_not_sent() -> None:
    """A queued message past its expiry interval is dropped, not delivered."""
    h = Harness()
    sub = connected(h, "sub", session_expiry_interval=100)
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    sub.send(Disconnect())
    sub.lost()
    pub = connected(h, "pub")
    pub.send(Publish("t", b"old", 1, False, False, 1, Properties(message_expiry_interval=5)))
    pub.send(Publish("t", b"new", 1, False, False, 2))
    h.clock.advance(6)
    sub2 = client5(h)
    sub2.connect5("sub", clean=False, session_expiry_interval=100)
    h.clock.advance(0)
    got = [p for p in sub2.received() if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"new"]
    assert h.broker.registry.drops.dropped_total() >= 1


def test_expired_retained_message_is_not_sent() -> None:
    """A retained message past its expiry is not given to a new subscriber."""
    h = Harness()
    pub = connected(h, "pub")
    pub.send(Publish("r", b"x", 0, True, properties=Properties(message_expiry_interval=5)))
    h.clock.advance(6)
    sub = connected(h, "sub")
    sub.send(Subscribe(1, (("r", 0),)))
    assert sub.received() == [Suback(1, (0,))]
    assert list(h.broker.retained.match("r")) == []   # and it left the store


def test_payload_format_invalid() -> None:
    """Payload declared UTF-8 that is not: PUBACK 0x99 at QoS 1, DISCONNECT 0x99 at QoS 0."""
    h = Harness()
    watcher = h.watcher("t")
    c = connected(h)
    utf8 = Properties(payload_format_indicator=1)
    c.send(Publish("t", b"\xff\xfe", 1, False, False, 3, utf8))
    [ack] = c.received()
    assert isinstance(ack, Puback) and ack.packet_id == 3 and ack.reason_code == 0x99
    c.send(Publish("t", b"\xff", 0, properties=utf8))
    closed_with(c, 0x99)
    assert watcher.sent == []


def test_inbound_topic_alias() -> None:
    """A topic alias set with a topic stands in for it later; one never set is a
    Protocol Error (0x82), one above the maximum is DISCONNECT 0x94."""
    h = Harness()
    watcher = h.watcher("#")
    c = connected(h)
    c.send(Publish("long/topic", b"1", properties=Properties(topic_alias=3)))
    c.send(Publish("", b"2", properties=Properties(topic_alias=3)))
    assert watcher.sent == [("long/topic", b"1", 0, False), ("long/topic", b"2", 0, False)]
    c.send(Publish("", b"3", properties=Properties(topic_alias=4)))
    closed_with(c, 0x82)
    c2 = connected(h, "c2")
    c2.send(Publish("x", b"", properties=Properties(topic_alias=TOPIC_ALIAS_MAXIMUM + 1)))
    closed_with(c2, 0x94)


def test_the_inbound_alias_table_is_made_at_the_first_alias_set() -> None:
    """An MQTT 5 connection has no inbound alias table until a PUBLISH sets an alias
    (most clients never do); then the alias works, QoS 0 and 1 alike."""
    h = Harness()
    watcher = h.watcher("#")
    c = connected(h)
    c.send(Publish("plain", b"0"), Publish("plain", b"1", qos=1, packet_id=1))
    v5 = c.proto._v5
    assert v5 is not None and v5.aliases_in is None
    c.send(Publish("t/a", b"2", qos=1, packet_id=2, properties=Properties(topic_alias=1)),
           Publish("", b"3", properties=Properties(topic_alias=1)))
    assert v5.aliases_in is not None and v5.aliases_in._topics == {1: "t/a"}
    assert [p for _, p, _, _ in watcher.sent] == [b"0", b"1", b"2", b"3"]
    assert [t for t, _, _, _ in watcher.sent][2:] == ["t/a", "t/a"]


def test_outbound_topic_alias_up_to_the_client_maximum() -> None:
    """The broker sends a topic once with an alias, then the alias alone; beyond the
    client's maximum, topics go in full."""
    h = Harness()
    sub = connected(h, "sub", topic_alias_maximum=1)
    sub.send(Subscribe(1, (("#", 0),)))
    sub.received()
    pub = connected(h, "pub")
    for topic in ("a", "a", "b"):
        pub.send(Publish(topic, b"x"))
    got = sub.received()
    assert [(p.topic, p.properties) for p in got if isinstance(p, Publish)] == [
        ("a", Properties(topic_alias=1)), ("", Properties(topic_alias=1)), ("b", None)]


def test_client_maximum_packet_size_drops_larger_messages() -> None:
    """A message above the client's maximum packet size is not sent to it (counted);
    later smaller ones are."""
    h = Harness()
    sub = connected(h, "sub", maximum_packet_size=50)
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    pub = connected(h, "pub")
    pub.send(Publish("t", b"x" * 100, 1, False, False, 1))
    pub.send(Publish("t", b"small", 1, False, False, 2))
    h.clock.advance(0)
    got = [p for p in sub.received() if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"small"]
    assert sub.proto._v5 is not None and sub.proto._v5.too_large == 1


def test_publish_with_subscription_identifier_from_client_is_protocol_error() -> None:
    """Only the broker sends subscription identifiers in PUBLISH."""
    h = Harness()
    c = connected(h)
    c.send(Publish("t", b"", properties=Properties(subscription_identifiers=(1,))))
    closed_with(c, 0x82)


def test_properties_survive_the_store_records() -> None:
    """A message's MQTT 5 properties survive the ZODB record form."""
    m = Message("t", b"p", 1, True, "c", 5.0,
                props=MessageProperties(1, 60, "ct", "rt", b"cd", (("a", "1"), ("a", "2"))))
    assert record_to_message(message_to_record(m)) == m
    assert record_to_message(message_to_record(m, native=False)) == m


# --------------------------------------------------------------------------
# flow control


def test_receive_maximum_exceeded_disconnects_0x93() -> None:
    """More QoS 2 publishes awaiting PUBREL than the broker's receive maximum: 0x93."""
    h = Harness()
    c = connected(h)
    for pid in range(1, RECEIVE_MAXIMUM + 1):
        c.send(Publish("t", b"", 2, False, False, pid))
    assert c.open
    c.send(Pubrel(1))
    assert c.open
    c.send(Publish("t", b"", 2, False, False, RECEIVE_MAXIMUM + 1))
    assert c.open
    c.send(Publish("t", b"", 2, False, False, RECEIVE_MAXIMUM + 2))
    closed_with(c, 0x93)


def test_client_receive_maximum_bounds_messages_in_flight() -> None:
    """The broker has at most the client's receive maximum QoS 1 messages unacknowledged."""
    h = Harness()
    sub = connected(h, "sub", receive_maximum=2)
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    pub = connected(h, "pub")
    for pid in range(1, 5):
        pub.send(Publish("t", str(pid).encode(), 1, False, False, pid))
    got = [p for p in sub.received() if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"1", b"2"]
    assert got[0].packet_id is not None
    sub.send(Puback(got[0].packet_id))
    assert [p.payload for p in sub.received() if isinstance(p, Publish)] == [b"3"]


# --------------------------------------------------------------------------
# SUBSCRIBE / UNSUBSCRIBE


def test_suback_reason_codes() -> None:
    """Granted QoS, 0x8F for an invalid filter, a shared subscription granted, in order."""
    h = Harness()
    c = connected(h)
    c.send(Subscribe(5, (("a/+", 2), ("a/b#", 1), ("$share/g/x", 1), ("b", 1))))
    assert c.received() == [Suback(5, (2, 0x8F, 1, 1))]
    assert c.open


def test_subscription_identifiers_on_delivery() -> None:
    """Each matching subscription's identifier comes with the message."""
    h = Harness()
    sub = connected(h, "sub")
    sub.send(Subscribe(1, (("a/#", 1),), properties=Properties(subscription_identifiers=(7,))))
    sub.send(Subscribe(2, (("a/b", 0),), properties=Properties(subscription_identifiers=(9,))))
    sub.send(Subscribe(3, (("a/+", 0),)))
    sub.received()
    pub = connected(h, "pub")
    pub.send(Publish("a/b", b"x"))
    [got] = sub.received()
    assert isinstance(got, Publish) and got.properties is not None
    assert sorted(got.properties.subscription_identifiers) == [7, 9]


def test_no_local() -> None:
    """A no-local subscription does not get the client's own messages; others do."""
    h = Harness()
    c = connected(h, "me")
    c.send(Subscribe(1, (("t", 0),), (0x04,)))
    c.received()
    c.send(Publish("t", b"mine"))
    assert c.received() == []
    other = connected(h, "other")
    other.send(Publish("t", b"theirs"))
    assert [p.payload for p in c.received() if isinstance(p, Publish)] == [b"theirs"]


def test_retain_as_published() -> None:
    """Retain as published keeps the retain flag on live deliveries; without it the
    flag is cleared (as in 3.1.1)."""
    h = Harness()
    rap = connected(h, "rap")
    rap.send(Subscribe(1, (("t", 0),), (0x08,)))
    plain = connected(h, "plain")
    plain.send(Subscribe(1, (("t", 0),)))
    rap.received()
    plain.received()
    connected(h, "pub").send(Publish("t", b"x", 0, True))
    [r] = rap.received()
    [p] = plain.received()
    assert isinstance(r, Publish) and r.retain
    assert isinstance(p, Publish) and not p.retain


@pytest.mark.parametrize(("handling", "first", "again"), [(0, True, True), (1, True, False),
                                                           (2, False, False)])
def test_retain_handling(handling: int, first: bool, again: bool) -> None:
    """Retain handling 0 sends retained messages at every SUBSCRIBE, 1 only when the
    subscription is new, 2 never."""
    h = Harness()
    connected(h, "pub").send(Publish("r", b"kept", 0, True))
    c = connected(h, "sub")
    for pid, expect in ((1, first), (2, again)):
        c.send(Subscribe(pid, (("r", 0),), (handling << 4,)))
        got = [p for p in c.received() if isinstance(p, Publish)]
        assert bool(got) is expect, (pid, got)


def test_subscription_options_survive_restore() -> None:
    """Options are stored with the subscription and come back at start-up."""
    from fakes import MemoryStore

    from mqttamqp.core.sessions.session import Session
    store = MemoryStore()
    h = Harness(store=store)
    c = connected(h, "keep", session_expiry_interval=100)
    c.send(Subscribe(1, (("t", 1),), (0x04,), Properties(subscription_identifiers=(5,))))
    c.received()
    h.broker.stop()
    h2 = Harness(store=store)
    h2.broker.start()
    session: Session = h2.broker.sessions["keep"]
    assert session.subscriptions == {"t": 1}
    assert session.sub_options == {"t": 0x04 | 5 << 8}


def test_unsuback_reason_codes() -> None:
    """UNSUBACK says which filters had a subscription (0x00) and which not (0x11)."""
    h = Harness()
    c = connected(h)
    c.send(Subscribe(1, (("a", 0),)))
    c.received()
    c.send(Unsubscribe(2, ("a", "b")))
    assert c.received() == [Unsuback(2, (0, 0x11))]


# --------------------------------------------------------------------------
# sessions, DISCONNECT, takeover


def test_session_expiry_zero_ends_with_the_connection() -> None:
    """Clean start 0 with session expiry 0: nothing is kept after the connection."""
    h = Harness()
    c = client5(h)
    c.connect5("s", clean=False)
    c.send(Disconnect())
    c.lost()
    assert "s" not in h.broker.sessions


def test_session_expiry_interval_keeps_then_expires() -> None:
    """A session with an expiry interval is resumed within it and gone after it."""
    h = Harness()
    c = connected(h, "s", session_expiry_interval=10)
    c.send(Disconnect())
    c.lost()
    h.clock.advance(9)
    c2 = client5(h)
    assert c2.connect5("s", clean=False, session_expiry_interval=10).session_present
    c2.send(Disconnect())
    c2.lost()
    h.clock.advance(10.001)
    assert "s" not in h.broker.sessions


def test_disconnect_may_change_session_expiry() -> None:
    """DISCONNECT with a session expiry interval replaces CONNECT's (but not from 0)."""
    h = Harness()
    c = connected(h, "s", session_expiry_interval=10)
    c.send(Disconnect(0, Properties(session_expiry_interval=0)))
    c.lost()
    assert "s" not in h.broker.sessions
    c2 = connected(h, "t")
    c2.send(Disconnect(0, Properties(session_expiry_interval=10)))
    closed_with(c2, 0x82)


def _expiry_deadlines(h: Harness) -> list[float]:
    """When the pending session expiry timers of ``h``'s broker fire."""
    return sorted(call.getTime() for call in h.clock.getDelayedCalls()
                  if getattr(call.func, "__name__", "") == "_expire_one")


def test_disconnect_after_takeover_expires_on_its_own_interval() -> None:
    """Issue #24 item 7: CONNECT (expiry 1), DISCONNECT (expiry 3) overtaken by an
    immediate reconnect, DISCONNECT (expiry 3) again: the session lives 3 s, not 1 s."""
    h = Harness()
    old = connected(h, "s", clean=False, session_expiry_interval=1)
    new = client5(h)
    assert new.connect5("s", clean=False, session_expiry_interval=1).session_present
    closed_with(old, 0x8E)
    old.send(Disconnect(0, Properties(session_expiry_interval=3)))  # too late: ignored
    old.lost()
    assert _expiry_deadlines(h) == []
    h.clock.advance(0.5)
    new.send(Disconnect(0, Properties(session_expiry_interval=3)))
    new.lost()
    assert _expiry_deadlines(h) == [3.5]
    h.clock.advance(3 - 0.001)
    assert "s" in h.broker.sessions
    h.clock.advance(0.002)
    assert "s" not in h.broker.sessions
    assert timers_left(h.clock) == []


def test_takeover_leaves_no_expiry_timer_while_the_session_is_held() -> None:
    """A takeover ends the old connection (which would arm the expiry timer) and
    claims the session at once: no timer is pending while the newcomer holds it."""
    h = Harness()
    connected(h, "s", clean=False, session_expiry_interval=1)
    client5(h).connect5("s", clean=False, session_expiry_interval=1)
    assert _expiry_deadlines(h) == []
    h.clock.advance(5)
    assert h.broker.sessions["s"].connection is not None


def test_reconnect_cancels_a_pending_expiry_timer() -> None:
    """A client back within its session expiry interval: the pending timer is cancelled,
    and the next one counts from the next end, with the new connection's interval."""
    h = Harness()
    c = connected(h, "s", clean=False, session_expiry_interval=2)
    c.send(Disconnect())
    c.lost()
    assert _expiry_deadlines(h) == [2.0]
    h.clock.advance(1.5)
    c2 = client5(h)
    assert c2.connect5("s", clean=False, session_expiry_interval=4).session_present
    assert _expiry_deadlines(h) == []
    c2.transport.loseConnection()
    c2.lost()
    assert _expiry_deadlines(h) == [5.5]
    h.clock.advance(4 - 0.001)
    assert "s" in h.broker.sessions
    h.clock.advance(0.002)
    assert "s" not in h.broker.sessions
    assert timers_left(h.clock) == []


@pytest.mark.parametrize("interval", [1, 3])
def test_disconnect_restarts_the_expiry_timer_on_its_interval(interval: int) -> None:
    """DISCONNECT with a session expiry interval (shorter or longer than CONNECT's):
    the one expiry timer runs on the DISCONNECT's interval."""
    h = Harness()
    c = connected(h, "s", clean=False, session_expiry_interval=2)
    h.clock.advance(10)
    c.send(Disconnect(0, Properties(session_expiry_interval=interval)))
    c.lost()
    assert _expiry_deadlines(h) == [10.0 + interval]
    h.clock.advance(interval - 0.001)
    assert "s" in h.broker.sessions
    h.clock.advance(0.002)
    assert "s" not in h.broker.sessions
    assert timers_left(h.clock) == []


def test_clearing_an_offline_session_cancels_its_expiry_timer() -> None:
    """The console clears an offline session: its expiry timer goes with it."""
    h = Harness()
    c = connected(h, "s", clean=False, session_expiry_interval=100)
    c.send(Disconnect())
    c.lost()
    assert _expiry_deadlines(h) == [100.0]
    h.broker.commands.clear_session("s", "cleared by test")
    assert "s" not in h.broker.sessions
    assert _expiry_deadlines(h) == []


def test_disconnect_with_will_publishes_it() -> None:
    """DISCONNECT 0x04 publishes the will; a plain DISCONNECT does not."""
    h = Harness()
    watcher = h.watcher("will/#")
    c = client5(h)
    c.connect5("w", will=Will("will/w", b"gone", 0, False))
    c.send(Disconnect(0x04))
    c.lost()
    assert watcher.sent == [("will/w", b"gone", 0, False)]


def test_will_properties_travel_with_the_will() -> None:
    """Will properties (content type, user properties) are on the published will."""
    h = Harness()
    sub = connected(h, "sub")
    sub.send(Subscribe(1, (("will/#", 0),)))
    sub.received()
    c = client5(h)
    wprops = Properties(content_type="text/plain", user_properties=(("k", "v"),))
    c.connect5("w", will=Will("will/w", b"gone", 0, False, wprops))
    c.transport.loseConnection()
    c.lost()
    [got] = sub.received()
    assert isinstance(got, Publish) and got.properties == wprops


def test_takeover_sends_0x8e_to_the_old_connection() -> None:
    """A second connection with the same client id: the first gets DISCONNECT 0x8E."""
    h = Harness()
    old = connected(h, "dup")
    connected(h, "dup")
    closed_with(old, 0x8E)


def test_console_disconnect_sends_0x98() -> None:
    """An administrator's disconnect reaches an MQTT 5 client as 0x98."""
    h = Harness()
    c = connected(h, "victim")
    assert h.broker.commands.disconnect_client("victim", False, "console")
    closed_with(c, 0x98)


@pytest.mark.parametrize("code", [0x00, 0x04])
def test_qos2_inbound_flow_at_level_5(code: int) -> None:
    """The QoS 2 flow of a level 5 publisher: PUBREC, PUBREL, PUBCOMP with codes 0."""
    h = Harness()
    c = connected(h)
    c.send(Publish("t", b"x", 2, False, False, 9))
    assert c.received() == [Pubrec(9)]
    c.send(Pubrel(9))
    assert c.received() == [Pubcomp(9)]


# --------------------------------------------------------------------------
# will delay interval


def _will_client(h: Harness, delay: int, expiry: int) -> Client5:
    c = client5(h)
    c.connect5("w", will=Will("will/w", b"gone", 0, False,
                              Properties(will_delay_interval=delay)),
               session_expiry_interval=expiry)
    return c


def test_will_delay_holds_the_will() -> None:
    """The will goes out after its delay, not at the disconnect."""
    h = Harness()
    watcher = h.watcher("will/#")
    c = _will_client(h, 5, 100)
    c.transport.loseConnection()
    c.lost()
    h.clock.advance(4.9)
    assert watcher.sent == []
    h.clock.advance(0.2)
    assert watcher.sent == [("will/w", b"gone", 0, False)]


def test_will_delay_cancelled_by_reconnect() -> None:
    """A client back within its will delay: no will."""
    h = Harness()
    watcher = h.watcher("will/#")
    c = _will_client(h, 5, 100)
    c.transport.loseConnection()
    c.lost()
    h.clock.advance(3)
    client5(h).connect5("w", clean=False, session_expiry_interval=100)
    h.clock.advance(10)
    assert watcher.sent == []


def test_will_delay_longer_than_session_fires_at_expiry() -> None:
    """A will delay longer than the session expiry fires when the session ends
    (at once for session expiry 0)."""
    h = Harness()
    watcher = h.watcher("will/#")
    c = _will_client(h, 50, 10)
    c.transport.loseConnection()
    c.lost()
    h.clock.advance(10.001)
    assert watcher.sent == [("will/w", b"gone", 0, False)]
    c2 = _will_client(h, 50, 0)
    c2.transport.loseConnection()
    c2.lost()
    assert len(watcher.sent) == 2


def test_server_stopping_sends_0x8b() -> None:
    """The broker stopping tells an MQTT 5 client 0x8B."""
    h = Harness()
    c = connected(h)
    c.proto.server_stopping()
    closed_with(c, 0x8B)


def test_server_stopping_leaves_no_timer_behind() -> None:
    """Review finding: the broker stopping put the close grace in the turn timer's
    slot without cancelling the turn held there, nor the keepalive; once the
    connection is lost no timer of it is left, and the grace cuts nothing."""
    h = Harness(close_grace=3.0)
    c = client5(h)
    assert c.connect5("c", keepalive=10).return_code == 0
    c.proto._yield_turn()   # (its input held until a later turn)
    turn = c.proto._turn_timer
    assert turn is not None and turn.active()
    c.proto.server_stopping()
    closed_with(c, 0x8B)
    assert not turn.active()
    c.lost()
    assert timers_left(h.clock) == []
    h.clock.advance(60)
    assert h.broker.stats.limits.get("close_grace", 0) == 0


def test_invalid_client_id_gets_connack_0x85() -> None:
    """A client id with a control character: CONNACK 0x85, then close."""
    h = Harness()
    c = client5(h)
    assert c.connect5("bad\x01id").return_code == 0x85
    assert not c.open


def test_pubrel_for_unknown_packet_id_gets_pubcomp_0x92() -> None:
    """PUBREL for an id the broker does not hold: PUBCOMP 0x92."""
    h = Harness()
    c = connected(h)
    c.send(Pubrel(77))
    assert c.received() == [Pubcomp(77, 0x92)]


def test_pubrec_with_error_ends_the_qos2_exchange() -> None:
    """A subscriber refusing a QoS 2 message (PUBREC 0x80) frees its window slot:
    no PUBREL, and the next message goes out."""
    h = Harness()
    sub = connected(h, "sub", receive_maximum=1)
    sub.send(Subscribe(1, (("t", 2),)))
    sub.received()
    pub = connected(h, "pub")
    pub.send(Publish("t", b"1", 2, False, False, 1), Publish("t", b"2", 2, False, False, 2))
    [first] = [p for p in sub.received() if isinstance(p, Publish)]
    assert first.packet_id is not None
    sub.send(Pubrec(first.packet_id, 0x80))
    got = sub.received()
    assert [p.payload for p in got if isinstance(p, Publish)] == [b"2"]
    assert not any(isinstance(p, Pubrel) for p in got)


def test_queue_bound_gives_puback_0x97() -> None:
    """A QoS 1 message a subscriber's queue bound refuses: PUBACK 0x97 to an MQTT 5
    publisher (a 3.1.1 publisher still gets a plain PUBACK)."""
    h = Harness(max_queued_messages=1, max_inflight=1)
    sub = connected(h, "sub", session_expiry_interval=60)
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    sub.send(Disconnect())
    sub.lost()
    pub = connected(h, "pub")
    acks = []
    for pid in (1, 2):
        pub.send(Publish("t", b"x", 1, False, False, pid))
        acks.extend(pub.received())
    assert acks == [Puback(1), Puback(2, 0x97, Properties(
        reason_string="1 subscriber(s) had no room for it"))]
    old = h.client()
    old.connect("old")
    old.send(Publish("t", b"x", 1, False, False, 3))
    assert old.received() == [Puback(3)]


def test_session_expiry_survives_a_restart() -> None:
    """A session's expiry interval is stored: after a restart it still expires then."""
    from fakes import MemoryStore
    store = MemoryStore()
    h = Harness(store=store)
    c = connected(h, "s", session_expiry_interval=20)
    c.send(Disconnect())
    c.lost()
    h.broker.stop()
    h2 = Harness(store=store)
    h2.broker.start()
    assert h2.broker.sessions["s"].expiry == 20
    h2.clock.advance(20.001)
    assert "s" not in h2.broker.sessions


def test_expired_messages_make_room_in_a_full_queue() -> None:
    """At the queue bound, queued messages past their expiry are dropped (and their
    stored copies deleted) to make room for a new one."""
    from fakes import MemoryStore
    store = MemoryStore()
    h = Harness(store=store, max_queued_messages=2)
    sub = connected(h, "sub", session_expiry_interval=100)
    sub.send(Subscribe(1, (("t", 1),)))
    sub.received()
    sub.send(Disconnect())
    sub.lost()
    pub = connected(h, "pub")
    short = Properties(message_expiry_interval=5)
    pub.send(Publish("t", b"a", 1, False, False, 1, short),
             Publish("t", b"b", 1, False, False, 2, short))
    h.clock.advance(6)
    pub.send(Publish("t", b"c", 1, False, False, 3))
    assert pub.received()[-1] == Puback(3)         # room was made: no 0x97
    assert [e.message.payload for _, e in store.state.sessions["sub"].queue] == [b"c"]
    sub2 = client5(h)
    sub2.connect5("sub", clean=False, session_expiry_interval=100)
    got = [p.payload for p in sub2.received() if isinstance(p, Publish)]
    assert got == [b"c"]


class _DenySecret:
    """Access rules for the test: nobody publishes or subscribes under secret/."""

    def may_publish(self, identity: Any, topic: str, retain: bool) -> bool:
        return not topic.startswith("secret/")

    def may_subscribe(self, identity: Any, topic_filter: str) -> bool:
        return not topic_filter.startswith("secret/")

    def may_use_session(self, identity: Any, client_id: str) -> bool:
        return True


def test_core_verdicts_become_reason_codes() -> None:
    """A publish the core denies: PUBACK/PUBREC 0x87 for MQTT 5 (a plain PUBACK for
    3.1.1, as before); a subscription the authorizer refuses: SUBACK 0x87 (3.1.1
    still gets 0x80)."""
    from mqttamqp.core.broker import Broker
    from mqttamqp.mqtt.protocol import MQTTFactory
    h = Harness()
    h.broker = Broker(h.clock, h.store, h.broker.limits, authorizer=_DenySecret())
    h.factory = MQTTFactory(h.broker, h.clock)
    c = connected(h)
    c.send(Publish("secret/a", b"x", 1, False, False, 1),
           Publish("secret/b", b"x", 2, False, False, 2),
           Publish("open/a", b"x", 1, False, False, 3))
    got = c.received()
    assert [(type(p).__name__, p.reason_code) for p in got] == [  # type: ignore[union-attr]
        ("Puback", 0x87), ("Pubrec", 0x87), ("Puback", 0)]
    c.send(Subscribe(4, (("secret/#", 1), ("open/#", 1))))
    assert c.received() == [Suback(4, (0x87, 1))]
    old = h.client()
    old.connect("old")
    old.send(Publish("secret/a", b"x", 1, False, False, 1))
    assert old.received() == [Puback(1)]


def test_protocol_error_lines_are_rate_limited(log_lines: list[str]) -> None:
    """Many clients closed for the same MQTT 5 reason code: one log line a minute,
    the next one saying how many were held back."""
    h = Harness()
    for i in range(3):
        c = connected(h, f"bad{i}")
        c.send(Publish("", b"x"))      # no topic and no alias: 0x82
        closed_with(c, 0x82)
    lines = [line for line in log_lines if "reason code 0x82" in line]
    assert len(lines) == 1 and "0 more" in lines[0]
    h.clock.advance(61)
    c = connected(h, "bad-later")
    c.send(Publish("", b"x"))
    closed_with(c, 0x82)
    lines = [line for line in log_lines if "reason code 0x82" in line]
    assert len(lines) == 2 and "2 more" in lines[1]


def test_retain_as_published_survives_the_qos2_gate_for_qos0_subscribers() -> None:
    """A retained QoS 2 publish released by PUBREL reaches a QoS 0 Retain As Published
    subscriber with its retain flag set."""
    from amqp_memory import Net

    retain_as_published = 0x08
    net = Net()
    sub = net.mqtt("sub", level=5)
    sub.send(Subscribe(1, (("r/#", 0),), options=(retain_as_published,)))
    sub.take()
    pub = net.mqtt("pub", level=5)
    pub.send(Publish("r/x", b"kept", 2, True, False, 7))
    pub.take()
    pub.send(Pubrel(7))
    [got] = sub.publishes()
    assert got.retain
