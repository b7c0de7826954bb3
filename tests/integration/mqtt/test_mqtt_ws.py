"""MQTT over WebSockets against a real broker process (``--mqtt-ws``): paho-mqtt with
``transport="websockets"``, and a raw WebSocket client (``wsclient``) where the test
must choose the frame boundaries or send what a library would not.

Where a test must show that something does *not* arrive, it sends a marker after it
on the same path and checks that the marker comes next, as ``test_mqtt_paho`` does.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pahoclient
import pytest
from brokerproc import BrokerProcess
from pki import Pki
from wsclient import BINARY, CLOSE, TEXT, RawWebSocket, client_frame

from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Packet,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Will,
)

TIMEOUT = 5.0
MAX_PACKET = 4096
_ids = itertools.count(1)


# Against a broker and through a gateway in front of one (the folder conftest's
# ``broker``, with these options and listeners).
pytestmark = [pytest.mark.timeout(60),
              pytest.mark.through_gateway(options=("--max-packet-size", str(MAX_PACKET)),
                                          listeners=("--mqtt", "--mqtt-ws"))]


def uid(prefix: str = "w") -> str:
    return f"{prefix}{next(_ids)}-{uuid.uuid4().hex[:10]}"


class PahoClient(pahoclient.PahoClient):
    timeout = TIMEOUT


Open = Callable[..., PahoClient]


@pytest.fixture
def paho(broker: BrokerProcess) -> Iterator[Open]:
    """``paho(client_id, transport="websockets", will=None)``: a connected client."""
    made: list[PahoClient] = []

    def open_client(client_id: str, transport: str = "websockets",
                    will: tuple[str, bytes, int, bool] | None = None,
                    protocol: int = mqtt.MQTTv311) -> PahoClient:
        port = broker.ports["MQTT-WS" if transport == "websockets" else "MQTT"]
        c = PahoClient(port, client_id, protocol, True, will, transport=transport)
        made.append(c)
        return c

    yield open_client
    for c in made:
        c.stop()


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[Callable[[], RawWebSocket]]:
    made: list[RawWebSocket] = []

    def open_socket() -> RawWebSocket:
        ws = RawWebSocket(broker.ports["MQTT-WS"], timeout=TIMEOUT)
        made.append(ws)
        return ws

    yield open_socket
    for ws in made:
        ws.close()


def packets(ws: RawWebSocket, decoder: Decoder, n: int) -> list[Packet]:
    """The next ``n`` MQTT packets from the broker, across binary messages."""
    got: list[Packet] = []
    while len(got) < n:
        frame = ws.next_frame()
        assert frame.opcode == BINARY, frame
        decoder.feed(frame.payload)
        got += list(decoder)
    return got


def opened(ws: RawWebSocket, **handshake: object) -> None:
    status, headers = ws.handshake(**handshake)
    assert status == 101, (status, headers)


# ==================================================================================
# paho-mqtt over WebSockets


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_round_trip_at_each_qos(paho: Open, qos: int) -> None:
    """WebSocket subscriber, WebSocket and TCP publishers: every message arrives once
    at its QoS, each publisher's in order."""
    topic = uid("rt") + "/x"
    sub = paho(uid("s"))
    assert sub.subscribe((topic, 2)) == [2]
    ws_pub, tcp_pub = paho(uid("p")), paho(uid("t"), transport="tcp")
    for i in range(5):
        ws_pub.publish(topic, b"ws%d" % i, qos)
    tcp_pub.publish(topic, b"tcp", qos)
    got = [sub.get() for _ in range(6)]
    assert {m.qos for m in got} == {qos}
    assert [m.payload for m in got if m.payload != b"tcp"] == [b"ws%d" % i for i in range(5)]
    assert [m.payload for m in got].count(b"tcp") == 1


def test_paho_retained_over_websockets(paho: Open) -> None:
    """A retained message published over WebSockets reaches a later WebSocket
    subscriber flagged retained; an empty one deletes it."""
    topic = uid("ret") + "/state"
    pub = paho(uid("p"))
    pub.publish(topic, b"on", 1, retain=True)
    late = paho(uid("l"))
    late.subscribe((topic, 1))
    m = late.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"on", 1, True)
    pub.publish(topic, b"", 1, retain=True)
    assert late.get().payload == b""
    later = paho(uid("m"))
    later.subscribe((topic, 1), (topic + "/end", 0))
    pub.publish(topic + "/end", b"", 0)
    assert [m.topic for m in later.until(topic + "/end")] == [topic + "/end"]


@pytest.mark.parametrize("qos", [1, 2])
def test_paho_will_on_websocket_socket_loss(paho: Open, qos: int) -> None:
    """A WebSocket client whose TCP connection is cut has its will published, to a
    WebSocket subscriber and a TCP one."""
    topic = uid("will") + "/gone"
    ws_watch, tcp_watch = paho(uid("o")), paho(uid("t"), transport="tcp")
    ws_watch.subscribe((topic, 2))
    tcp_watch.subscribe((topic, 2))
    victim = paho(uid("v"), will=(topic, b"bye", qos, False))
    victim.lose_socket()
    for watcher in (ws_watch, tcp_watch):
        m = watcher.get()
        assert (m.topic, m.payload, m.qos) == (topic, b"bye", qos)


def test_paho_mqtt31_over_websockets(paho: Open) -> None:
    """MQTT 3.1 (MQIsdp) works over WebSockets too."""
    topic = uid("v31")
    c = paho(uid("a")[:23], protocol=mqtt.MQTTv31)
    c.subscribe((topic, 1))
    c.publish(topic, b"x", 1)
    assert c.get().payload == b"x"


# ==================================================================================
# frame boundaries are not packet boundaries (raw client)


def test_a_packet_split_over_messages_and_packets_packed_in_one(raw: Callable[[], RawWebSocket]
                                                               ) -> None:
    """CONNECT split over two WebSocket messages (the second also carrying all of
    SUBSCRIBE), two PUBLISHes packed in one message, and one PUBLISH sent as a
    message of two frames: the broker answers each packet once, in order."""
    ws = raw()
    opened(ws)
    topic = uid("split")
    connect = encode(Connect("MQTT", 4, uid("c"), True, 60))
    ws.send_message(connect[:3])
    ws.send_message(connect[3:] + encode(Subscribe(1, ((topic, 1),))))
    decoder = Decoder()
    assert packets(ws, decoder, 2) == [Connack(False, 0), Suback(1, (1,))]

    two = encode(Publish(topic, b"one", 1, False, False, 7)) + \
        encode(Publish(topic, b"two", 0, False, False, None))
    ws.send_message(two)
    third = encode(Publish(topic, b"three", 1, False, False, 8))
    ws.send(client_frame(third[:4], BINARY, fin=False) + client_frame(third[4:], 0))
    got = packets(ws, decoder, 5)
    assert [p for p in got if isinstance(p, Puback)] == [Puback(7), Puback(8)]
    assert [(p.payload, p.qos) for p in got if isinstance(p, Publish)] == [
        (b"one", 1), (b"two", 0), (b"three", 1)]


def test_oversize_packet_closes_as_on_tcp(raw: Callable[[], RawWebSocket],
                                          broker: BrokerProcess) -> None:
    """A packet over --max-packet-size, whatever the frames, closes the connection
    with the MQTT listener's own log line."""
    ws = raw()
    opened(ws)
    client = uid("big")
    ws.send_message(encode(Connect("MQTT", 4, client, True, 60)))
    assert packets(ws, Decoder(), 1) == [Connack(False, 0)]
    big = encode(Publish("t", b"x" * MAX_PACKET, 0, False, False, None))
    ws.send_message(big[:100])   # the header already says it is too large
    assert ws.closed_by_peer()
    broker.wait_for_line(rf"protocol error from {client} .*exceeds maximum packet size")


# ==================================================================================
# what the handshake refuses, and text frames


def test_origin_of_another_host_is_refused(raw: Callable[[], RawWebSocket],
                                           broker: BrokerProcess) -> None:
    """A browser page from another host gets 403 and the broker logs why once."""
    ws = raw()
    status, _ = ws.handshake(origin="http://evil.example")
    assert status == 403
    broker.wait_for_line(r"refusing MQTT over WebSocket from 127\.0\.0\.1:\d+: origin "
                            r"'http://evil\.example' is not this host")


def test_origin_of_this_host_and_no_origin_are_accepted(raw: Callable[[], RawWebSocket]
                                                        ) -> None:
    """A page served by this host (any port) and a client without Origin connect."""
    for origin in ("http://127.0.0.1:9", None):
        ws = raw()
        status, headers = ws.handshake(origin=origin)
        assert status == 101 and headers["sec-websocket-protocol"] == "mqtt", origin
        assert "server" not in headers   # (autobahn's would name it and its version)


def test_a_plain_http_get_gets_426_and_no_status_page(raw: Callable[[], RawWebSocket],
                                                      broker: BrokerProcess) -> None:
    """A GET without Upgrade (someone opening the URL in a browser) gets 426 with no
    body, not autobahn's page naming its version, and one log line."""
    ws = raw()
    ws.send(b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while chunk := ws.sock.recv(4096):
        answer += chunk
    assert answer == b"HTTP/1.1 426 HTTP Upgrade header missing\r\n\r\n"
    broker.wait_for_line("refusing MQTT over WebSocket from .*HTTP Upgrade header missing")


def test_a_websocket_version_other_than_13_gets_426_naming_13(
        raw: Callable[[], RawWebSocket], broker: BrokerProcess) -> None:
    """RFC 6455 4.2.2: a version the server does not speak (the draft's 8, which
    autobahn would accept) gets 426 Upgrade Required with the version it does."""
    ws = raw()
    status, headers = ws.handshake(version=8)
    assert status == 426 and headers["sec-websocket-version"] == "13"
    broker.wait_for_line("refusing MQTT over WebSocket from .*WebSocket version 8 "
                            "not supported")


def test_a_frame_header_announcing_100_mb_closes_before_its_payload(
        raw: Callable[[], RawWebSocket], broker: BrokerProcess) -> None:
    """A frame header announcing 100 MB, and nothing after it: the broker closes
    the connection at the header (close code 1009) instead of waiting for it."""
    import struct

    ws = raw()
    opened(ws)
    client = uid("hugeframe")
    ws.send_message(encode(Connect("MQTT", 4, client, True, 60)))
    assert packets(ws, Decoder(), 1) == [Connack(False, 0)]
    ws.send(bytes([0x82, 0x80 | 127]) + struct.pack("!Q", 100 << 20) + b"\x01\x02\x03\x04")
    frame = ws.next_frame()
    assert frame.opcode == CLOSE and frame.payload[:2] == (1009).to_bytes(2, "big")
    assert ws.closed_by_peer()
    broker.wait_for_line(r"closing MQTT over WebSocket from 127\.0\.0\.1:\d+: a "
                            r"WebSocket frame of 104857600 bytes")


@pytest.mark.parametrize(("protocols", "chosen"), [
    (("mqtt",), "mqtt"), (("mqttv3.1",), "mqttv3.1"), (("foo", "mqttv3.1", "mqtt"), "mqtt")])
def test_mqtt_subprotocols_are_negotiated(raw: Callable[[], RawWebSocket],
                                          protocols: tuple[str, ...], chosen: str) -> None:
    """The WebSocket upgrade chooses the MQTT subprotocol the client offers (mqtt preferred
    over mqttv3.1)."""
    ws = raw()
    status, headers = ws.handshake(protocols=protocols)
    assert status == 101 and headers["sec-websocket-protocol"] == chosen


@pytest.mark.parametrize(("kw", "status", "logged"), [
    ({"protocols": ()}, 400, "no MQTT subprotocol offered"),
    # (the same cause again within a minute: counted, its line held back)
    ({"protocols": ("wamp.2.json",)}, 400, None),
    ({"path": "/"}, 404, "path '/' \\(MQTT is at /mqtt\\)"),
], ids=["no-subprotocol", "other-subprotocol", "other-path"])
def test_handshake_without_mqtt_is_refused(raw: Callable[[], RawWebSocket],
                                           broker: BrokerProcess, kw: dict[str, object],
                                           status: int, logged: str | None) -> None:
    """A handshake for another subprotocol or path gets an HTTP error; the broker
    logs the cause (once a minute per cause)."""
    ws = raw()
    assert ws.handshake(**kw)[0] == status
    if logged is not None:
        broker.wait_for_line("refusing MQTT over WebSocket from .*" + logged)


def test_text_frame_closes_with_1003_and_fires_the_will(raw: Callable[[], RawWebSocket],
                                                       paho: Open,
                                                       broker: BrokerProcess) -> None:
    """A text frame gets a close frame 1003 with the reason; the MQTT connection
    ends as lost (its will is published) and the broker logs it."""
    topic = uid("tx") + "/will"
    watcher = paho(uid("o"))
    watcher.subscribe((topic, 1))
    ws = raw()
    opened(ws)
    ws.send_message(encode(Connect("MQTT", 4, uid("c"), True, 60,
                                   Will(topic, b"text", 1, False))))
    assert packets(ws, Decoder(), 1) == [Connack(False, 0)]
    ws.send_message(b"hello", TEXT)
    frame = ws.next_frame()
    assert frame.opcode == CLOSE
    assert int.from_bytes(frame.payload[:2], "big") == 1003
    assert b"binary frames only" in frame.payload[2:]
    ws.send(client_frame(frame.payload[:2], CLOSE))
    assert ws.closed_by_peer()
    assert watcher.get().payload == b"text"
    broker.wait_for_line("closing MQTT over WebSocket from .*binary frames only")


# ==================================================================================
# wss: an ssl: endpoint, with a client certificate as the user (--tls-cert-as-user)


# Direct only: a gateway refuses --tls-ca (client certificates are the core's).
def test_wss_with_a_client_certificate_as_the_user(tmp_path: Path, pki: Pki) -> None:
    """An ssl: --mqtt-ws listener speaks wss; the client certificate a browser or
    library presents there is seen by the MQTT protocol as on TCP TLS."""
    proc = BrokerProcess(str(tmp_path / "data"), "--no-archive", "--tls-ca", pki.ca,
                         "--tls-cert-as-user", listeners=("--mqtt", "--mqtt-ws"),
                         descriptions={"--mqtt-ws": pki.ssl()})
    proc.start()
    try:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=uid("tls"),
                             transport="websockets", reconnect_on_failure=False)
        client.ws_set_options(path="/mqtt")
        client.tls_set(ca_certs=pki.ca, certfile=pki.alice[0], keyfile=pki.alice[1])
        connected = threading.Event()
        client.on_connect = lambda *a: connected.set()
        client.connect("127.0.0.1", proc.ports["MQTT-WS"], 30)
        client.loop_start()
        try:
            assert connected.wait(TIMEOUT)
            proc.wait_for_line(r"is user 'alice' by its TLS client certificate")
        finally:
            client.disconnect()
            client.loop_stop()
    finally:
        proc.stop()
