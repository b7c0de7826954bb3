"""Regression tests of the gateway review (issue #29 §1), end to end: a core broker
process, gateway processes in front of it, paho and raw socket clients on loopback.
QoS 2 toward a client uses the core's packet ids (also after a resumed session), a
session taken over through another gateway is left to the newcomer, and MQTT 5 clean
start with a session expiry keeps the new session."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

import pytest
from brokerproc import BrokerProcess
from gateway_proc import uid
from paho.mqtt.packettypes import PacketTypes
from pahoclient import Paho5, PahoClient, props

Gateways = Callable[..., BrokerProcess]


def _packet(kind: int, body: bytes) -> bytes:
    size, length = len(body), b""
    while True:
        byte, size = size % 128, size // 128
        length += bytes([byte | (0x80 if size else 0)])
        if not size:
            return bytes([kind]) + length + body


def _read(sock: socket.socket) -> tuple[int, bytes]:
    """One MQTT packet from ``sock`` (its socket time-out bounds the wait)."""
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "the gateway closed the connection"
            buf += chunk
        return buf
    head = exact(1)[0]
    mult, length = 1, 0
    while True:
        byte = exact(1)[0]
        length += (byte & 127) * mult
        mult *= 128
        if not byte & 128:
            return head, exact(length)


def _used_two_core_ids(core: BrokerProcess, gw: BrokerProcess, cid: str, topic: str,
                       clients: Callable[..., PahoClient]) -> PahoClient:
    """A persistent session through ``gw`` that received two QoS 1 messages (the
    core's session used packet ids 1 and 2), then left; the publisher."""
    pub = clients(core.mqtt_port, uid("pub"))
    sub = clients(gw.mqtt_port, cid, clean=False)
    assert sub.subscribe((topic, 2)) == [2]
    pub.publish(topic, b"a", qos=1)
    pub.publish(topic, b"b", qos=1)
    assert [sub.get().payload for _ in range(2)] == [b"a", b"b"]
    sub.disconnect()
    return pub


def _connect_raw(port: int, cid: str) -> socket.socket:
    """A raw MQTT 3.1.1 client resuming ``cid``'s session (CONNACK read)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    name = cid.encode()
    sock.sendall(_packet(0x10, b"\x00\x04MQTT\x04\x00\x00\x3c"
                         + struct.pack("!H", len(name)) + name))
    kind, body = _read(sock)
    assert kind == 0x20 and body[1] == 0, body
    return sock


def _qos2_publish(sock: socket.socket) -> tuple[bytes, int]:
    """The next packet: a QoS 2 PUBLISH; its payload and packet id."""
    kind, body = _read(sock)
    assert kind >> 4 == 3 and (kind >> 1) & 3 == 2, hex(kind)
    size = struct.unpack("!H", body[:2])[0]
    return body[4 + size:], struct.unpack("!H", body[2 + size:4 + size])[0]


def test_qos2_after_a_resumed_session_is_released_by_the_cores_packet_id(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient]) -> None:
    """Resumed through a gateway whose ids would restart at 1 while the core's are
    ahead: the QoS 2 delivery carries the core's id, PUBREC of it brings PUBREL of it,
    and after PUBCOMP the message is not sent again."""
    gw = gateways()
    cid = uid("q2r")
    topic = f"{cid}/t"
    pub = _used_two_core_ids(core, gw, cid, topic, clients)
    with _connect_raw(gw.mqtt_port, cid) as sock:
        pub.publish(topic, b"two", qos=2)
        payload, pid = _qos2_publish(sock)
        assert (payload, pid) == (b"two", 3)   # the core's id, after 1 and 2
        sock.sendall(_packet(0x50, struct.pack("!H", pid)))
        assert _read(sock) == (0x62, struct.pack("!H", pid))
        sock.sendall(_packet(0x70, struct.pack("!H", pid)) + b"\xe0\x00")
        assert sock.recv(1) == b""   # (DISCONNECT: the gateway closes)
    back = clients(core.mqtt_port, cid, clean=False)
    pub.publish(topic, b"end", qos=2)
    assert [(x.payload, x.dup) for x in back.until(topic)] == [(b"end", False)]


def test_pubrec_of_one_qos2_delivery_releases_that_one_only(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient]) -> None:
    """Three QoS 2 deliveries go out with the core's packet ids; the client's PUBREC
    of the third releases the third, and the two unanswered ones come again."""
    gw = gateways()
    cid = uid("q2x")
    topic = f"{cid}/t"
    pub = _used_two_core_ids(core, gw, cid, topic, clients)
    for payload in (b"m1", b"m2", b"m3"):
        pub.publish(topic, payload, qos=2)
    with _connect_raw(gw.mqtt_port, cid) as sock:
        ids = dict(_qos2_publish(sock) for _ in range(3))
        assert sorted(ids.values()) == [3, 4, 5]   # the core's ids, after 1 and 2
        sock.sendall(_packet(0x50, struct.pack("!H", ids[b"m3"])))
        kind, body = _read(sock)   # the core released it: PUBREL of that id
        assert (kind, body) == (0x62, struct.pack("!H", ids[b"m3"]))
    back = clients(core.mqtt_port, cid, clean=False)
    got = sorted(back.get().payload for _ in range(2))
    assert got == [b"m1", b"m2"], got


@pytest.mark.parametrize("first_clean", [True, False])
def test_session_taken_over_through_another_gateway_stays_with_the_newcomer(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient],
        first_clean: bool) -> None:
    """A client id taken over through a second gateway: the first gateway closes its
    client without ending the session, and the newcomer keeps subscribing and
    receiving."""
    gw1, gw2 = gateways(), gateways()
    cid = uid("tk")
    topic = f"{cid}/t"
    first = clients(gw1.mqtt_port, cid, clean=first_clean,
                    will=(f"{cid}/will", b"old-will", 1, False))
    second = clients(gw2.mqtt_port, cid, clean=False)
    assert first.disconnected.wait(10), "the first client was not closed"
    assert second.subscribe((topic, 1)) == [1]
    clients(core.mqtt_port, uid("pub")).publish(topic, b"hello", qos=1)
    assert second.get().payload == b"hello"
    assert not second.disconnected.is_set()


def test_mqtt5_clean_start_with_session_expiry_keeps_the_new_session(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient]) -> None:
    """MQTT 5 clean start 1 with a session expiry: CONNACK says no session, and the
    new session (its subscription, a message queued while away) is there next time."""
    gw = gateways()
    cid = uid("x5")
    topic = f"{cid}/t"
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    first = Paho5(gw.mqtt_port, cid, clean=True, properties=expiry)
    try:
        assert first.session_present is False
        assert first.subscribe((topic, 1)) == [1]
        first.disconnect()
    finally:
        first.stop()
    clients(core.mqtt_port, uid("pub")).publish(topic, b"kept", qos=1)
    again = Paho5(gw.mqtt_port, cid, clean=False, properties=expiry)
    try:
        assert again.session_present is True
        assert again.get().payload == b"kept"
    finally:
        again.stop()
