"""Decoders lent per read (``mqtt.decoders``): an idle connection holds none of its
own, a connection with input left over keeps one, and nothing read is lost."""

from __future__ import annotations

from compiled import COMPILED
from fakes import ManualStore
from mqtt_memory import ACCEPTED, Harness

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.decoders import IDLE, SpareDecoders
from mqttamqp.mqtt.packets import Connect, Pingreq, Pingresp


def test_idle_connection_holds_no_decoder() -> None:
    """After CONNACK with nothing more read, the connection holds the shared IDLE decoder."""
    h = Harness()
    c = h.client()
    assert c.proto.decoder is IDLE
    assert c.connect("a") == [ACCEPTED]
    assert c.proto.decoder is IDLE
    assert IDLE.buffered == 0


def test_partial_packet_keeps_its_decoder_until_complete() -> None:
    """Half a PINGREQ keeps a decoder of the connection's own; the other half completes it."""
    h = Harness()
    c = h.client()
    assert c.connect("a") == [ACCEPTED]
    frame = encode(Pingreq())
    c.proto.dataReceived(frame[:1])
    own = c.proto.decoder
    assert own is not IDLE and own.buffered == 1
    # Another connection's read meanwhile borrows another decoder, not this one.
    d = h.client()
    assert d.connect("b") == [ACCEPTED]
    assert c.proto.decoder is own and own.buffered == 1
    c.proto.dataReceived(frame[1:])
    assert c.received() == [Pingresp()]
    assert c.proto.decoder is IDLE


def test_input_held_while_connecting_stays_with_the_connection() -> None:
    """A PINGREQ pipelined behind a CONNECT that waits for its commit is answered after CONNACK."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.send(Connect("MQTT", 4, "p", False, 0), Pingreq())
    assert c.proto.decoder is not IDLE and c.proto.decoder.buffered > 0
    other = h.client()    # (reads in between use a decoder of their own)
    other.proto.dataReceived(encode(Connect("MQTT", 4, "q", True, 0)))
    store.commit_all()
    assert c.received() == [ACCEPTED, Pingresp()]
    assert c.proto.decoder is IDLE


def test_level_follows_connect() -> None:
    """A 3.1 client's later read is decoded at level 3: a QoS 0 PUBLISH with DUP set
    (allowed in 3.1, refused in 3.1.1) keeps the connection open and is routed."""
    h = Harness()
    seen = h.watcher("t")
    c = h.client()
    assert c.connect("x", level=3) == [ACCEPTED]
    c.proto.dataReceived(bytes([0x38, 4, 0, 1]) + b"tp")   # PUBLISH, DUP, QoS 0: "t" "p"
    assert c.open and c.received() == []
    assert seen.sent == [("t", b"p", 0, False)]
    assert c.proto.decoder is IDLE


def test_spares_one_per_level_and_emptied() -> None:
    """A decoder given back empty is the next one taken, one spare per level."""
    spares = SpareDecoders(1024, IDLE.property_limits)
    d = spares.take("")
    d.feed(encode(Pingreq()))
    assert d.next_packet() == Pingreq()
    spares.give(d)
    assert spares.take("3.1.1") is d and d.buffered == 0
    assert spares.take("3.1.1") is not d   # (one spare: taken, none left)


def test_connect_times_share_the_read_time() -> None:
    """CONNACK in the turn that read CONNECT: connected since and last seen are the read time."""
    h = Harness()
    h.clock.advance(100.0)
    c = h.client()
    h.clock.advance(2.5)
    assert c.connect("a") == [ACCEPTED]
    proto = c.proto
    assert proto.session is not None
    assert proto.connected_since == proto.session.last_seen == proto._last_activity == 102.5
    # One float, not three; in the compiled build a native session keeps the double
    # itself, and each read of it is a new float (24 bytes a connection more).
    if not COMPILED:
        assert proto.connected_since is proto.session.last_seen


def test_connected_since_after_a_commit_is_the_connack_time() -> None:
    """A CONNACK that waited for a commit says connected since the commit, not the read."""
    store = ManualStore()
    h = Harness(store)
    c = h.client()
    c.send(Connect("MQTT", 4, "p", False, 0))
    h.clock.advance(3.0)
    store.commit_all()
    assert c.received() == [ACCEPTED]
    assert c.proto.connected_since == 3.0
    assert c.proto.session is not None and c.proto.session.last_seen == 0.0


def test_packets_behind_a_connect_accepted_at_once_are_handled_in_order() -> None:
    """CONNECT, PINGREQ and PINGREQ in one read: CONNACK then both PINGRESPs, at once."""
    h = Harness()
    c = h.client()
    c.send(Connect("MQTT", 4, "a", True, 0), Pingreq(), Pingreq())
    assert c.received() == [ACCEPTED, Pingresp(), Pingresp()]
    assert c.proto.decoder is IDLE
