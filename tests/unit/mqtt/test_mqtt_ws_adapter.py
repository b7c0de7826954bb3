"""MQTT over WebSockets in memory: autobahn's server protocol on a fake socket, the
in-memory broker of ``support/mqtt_memory.py`` behind it, a ``Clock``.  What the adapter
promises the MQTT protocol: the socket's back-pressure, its pausing, its address.
The Origin rule is pure and tested here too."""

from __future__ import annotations

from typing import Any

from fakes import ManualStore
from mqtt_memory import ACCEPTED, Client, Harness, TcpLikeTransport
from twisted.internet.address import IPv4Address
from wsclient import BINARY, CLOSE, FrameReader, client_frame, request

from mqttamqp.core.message import Message
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connect, Packet, Puback, Publish, Suback, Subscribe
from mqttamqp.mqtt.protocol import MQTTProtocol
from mqttamqp.mqtt.websocket import MQTTWebSocketFactory, OriginRule


class Socket(TcpLikeTransport):
    """A TCP-like fake socket with an address."""

    def __init__(self) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))


class WsClient:
    """One WebSocket connection to the adapter, opened, with MQTT in and out."""

    def __init__(self, h: Harness) -> None:
        factory = MQTTWebSocketFactory(h.factory, h.clock, OriginRule(), reactor=h.clock)
        self.ws: Any = factory.buildProtocol(None)
        self.socket = Socket()
        self.ws.makeConnection(self.socket)
        self.ws.dataReceived(request())
        assert self.socket.value().startswith(b"HTTP/1.1 101"), self.socket.value()
        self.socket.clear()
        self.frames = FrameReader()
        self.decoder = Decoder()

    @property
    def mqtt(self) -> MQTTProtocol:
        assert self.ws.mqtt is not None
        return self.ws.mqtt  # type: ignore[no-any-return]

    def send(self, *packets: Packet) -> None:
        self.ws.dataReceived(client_frame(b"".join(encode(p) for p in packets)))

    def received(self) -> list[Packet]:
        frames = self.frames.feed(self.socket.value())
        self.socket.clear()
        assert all(f.opcode == BINARY for f in frames), frames
        for f in frames:
            self.decoder.feed(f.payload)
        return list(self.decoder)


def test_the_mqtt_protocol_is_the_sockets_producer_and_sees_its_address() -> None:
    """Once open, the MQTT protocol is registered as the streaming producer of the
    socket itself (so the socket's write buffer pauses it) and sees the socket's
    peer (the loopback rule and connect rate use it)."""
    h = Harness()
    c = WsClient(h)
    assert c.socket.producer is c.mqtt and c.socket.streaming
    assert c.mqtt.peer == "127.0.0.1:40000"
    c.send(Connect("MQTT", 4, "a", True, 0))
    assert c.received() == [ACCEPTED]


def test_connect_in_progress_pauses_the_socket() -> None:
    """While a persistent session's CONNECT waits for its commit, the socket is not
    read (as on TCP), and it is read again after the CONNACK."""
    store = ManualStore()
    h = Harness(store)
    c = WsClient(h)
    c.send(Connect("MQTT", 4, "p", False, 0))
    assert c.received() == []
    assert c.socket.producerState == "paused"
    store.commit_all()
    assert c.received() == [ACCEPTED]
    assert c.socket.producerState == "producing"


def test_a_full_socket_buffer_congests_the_subscriber_and_pauses_the_replay() -> None:
    """3,000 retained QoS 0 messages (about 330 KB) for one SUBSCRIBE: the socket's
    buffer pauses the MQTT protocol in time, so the retained replay waits for it
    (issue #26: nothing dropped, nothing piled up); what was written is whole
    WebSocket messages."""
    h = Harness(congested_qos0_bytes=16 * 1024)
    for i in range(3000):
        h.broker.retained.put(Message(f"r/{i}", b"x" * 100, 0, True))
    c = WsClient(h)
    c.send(Connect("MQTT", 4, "sub", True, 0))
    c.send(Subscribe(1, (("r/#", 0),)))
    for _ in range(20):     # (the replay goes on a slice per reactor turn)
        h.clock.advance(0)
    got = c.received()
    assert got[:2] == [ACCEPTED, Suback(1, (0,))]
    assert c.mqtt.congested
    assert h.broker.sessions["sub"].dropped == 0 and len(got) - 2 < 3000


def test_the_stream_says_disconnected_once_its_socket_is() -> None:
    """The close grace asks the MQTT protocol's transport whether it is gone (a cut
    then is no cut): over a WebSocket, that is the socket's own flag."""
    h = Harness()
    c = WsClient(h)
    stream = c.mqtt.transport
    assert stream.disconnected is False
    c.socket.disconnected = True
    assert stream.disconnected is True


def test_origin_rule_default_is_same_host_or_no_origin() -> None:
    """By default a WebSocket upgrade may come without an Origin or from the broker's own
    host."""
    rule = OriginRule()
    assert rule.problem(None, "broker.example") is None
    assert rule.problem("https://broker.example:8443", "broker.example") is None
    assert rule.problem("http://BROKER.example", "broker.example") is None
    assert rule.problem("http://[::1]:8080", "[::1]") is None
    assert rule.problem("http://evil.example", "broker.example") is not None
    assert rule.problem("null", "broker.example") is not None


def test_origin_rule_with_allowed_origins_takes_only_those() -> None:
    """With allowed origins given, only those (case-insensitive, or * for any) and no
    Origin at all are accepted."""
    rule = OriginRule.from_options(["https://app.example", "http://127.0.0.1:8000/"])
    assert rule.problem("https://APP.example", "broker.example") is None
    assert rule.problem("http://127.0.0.1:8000", "127.0.0.1") is None
    # the same host is no longer enough once origins are given
    assert rule.problem("http://127.0.0.1:9000", "127.0.0.1") is not None
    assert rule.problem(None, "broker.example") is None
    assert OriginRule.from_options(["*"]).problem("http://any.example", "x") is None


def _unopened(h: Harness) -> tuple[Any, Socket]:
    factory = MQTTWebSocketFactory(h.factory, h.clock, OriginRule(), reactor=h.clock)
    ws = factory.buildProtocol(None)
    socket = Socket()
    ws.makeConnection(socket)
    return ws, socket


def test_no_handshake_within_the_connect_timeout_drops_the_socket(log_lines: list[str]
                                                                  ) -> None:
    """A socket that never completes the opening handshake is dropped at
    --connect-timeout, as a silent MQTT socket is, with one line saying so."""
    h = Harness(connect_timeout=5)
    ws, socket = _unopened(h)
    ws.dataReceived(b"GET /mqtt HTTP/1.1\r\n")
    h.clock.advance(4.9)
    assert not socket.disconnecting and not socket.disconnected
    h.clock.advance(0.2)
    assert socket.disconnected or socket.disconnecting
    assert [line for line in log_lines if "no WebSocket handshake within 5s" in line]
    assert h.clock.getDelayedCalls() == []


def test_an_overlong_request_head_is_cut_off() -> None:
    """The opening request's head is bounded (16 KB): more without its end closes
    the socket before autobahn buffers it, counted as a refused connection and as
    the ws_request_head limit."""
    h = Harness()
    ws, socket = _unopened(h)
    ws.dataReceived(b"GET /mqtt HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 16_000 + b"\r\n")
    assert not socket.disconnected
    ws.dataReceived(b"X-More: " + b"b" * 1_000)
    assert socket.disconnected
    stats = h.broker.stats
    assert stats.connections_refused == 1 and stats.limits["ws_request_head"] == 1


def test_deliveries_after_the_clients_close_frame_are_dropped_not_raised() -> None:
    """Between the client's close frame and the socket's end, messages routed to the
    connection are dropped (autobahn refuses to send them); the publisher's
    processing never sees an exception."""
    h = Harness()
    c = WsClient(h)
    c.send(Connect("MQTT", 4, "sub", True, 0))
    c.send(Subscribe(1, (("t", 0),)))
    assert c.received() == [ACCEPTED, Suback(1, (0,))]
    c.ws.dataReceived(client_frame(b"\x03\xe8", CLOSE))
    c.socket.clear()
    h.broker.publish(Message("t", b"late", 0, False))
    assert c.socket.value() == b""


def test_options_default_listener_none_and_origins() -> None:
    """--mqtt-ws defaults to loopback port 8083, 'none' turns it off, and
    --ws-allowed-origin repeats; makeService builds one listener per description."""
    from mqttamqp.options import Options
    from mqttamqp.service import makeService

    default = Options()
    default.parseOptions(["--no-archive"])
    assert default["mqtt-ws"] == ["tcp:8083:interface=127.0.0.1"]
    off = Options()
    off.parseOptions(["--mqtt-ws", "none"])
    assert off["mqtt-ws"] == []
    two = Options()
    two.parseOptions(["--no-archive", "--mqtt", "none", "--amqp", "none", "--web", "none",
                      "--metrics", "none",
                      "--mqtt-ws", "tcp:0:interface=127.0.0.1", "--mqtt-ws", "tcp:0",
                      "--ws-allowed-origin", "https://a.example",
                      "--ws-allowed-origin", "https://b.example"])
    svc = makeService(two)
    assert [(ls.kind, ls.description) for ls in svc.listeners] == [
        ("MQTT-WS", "tcp:0:interface=127.0.0.1"), ("MQTT-WS", "tcp:0")]
    assert svc.mqtt_ws_factory.origins.allowed == ("https://a.example", "https://b.example")
    assert svc.mqtt_ws_factory.mqtt is svc.mqtt_factory


def _frame_header(length: int) -> bytes:
    """A masked binary frame's header announcing ``length`` bytes (64-bit length),
    with none of its payload."""
    import struct

    return bytes([0x82, 0x80 | 127]) + struct.pack("!Q", length) + b"\x01\x02\x03\x04"


def test_a_frame_announcing_more_than_the_bound_closes_at_its_header(
        log_lines: list[str]) -> None:
    """A frame header announcing 100 MB (over 4 x --max-packet-size) closes the
    connection at once, before any payload: close code 1009 with the reason, the
    socket closed, counted, one log line; bytes that follow reach nothing."""
    h = Harness()
    c = WsClient(h)
    c.send(Connect("MQTT", 4, "big", True, 0))
    assert c.received() == [ACCEPTED]
    errors = h.broker.stats.protocol_errors
    c.ws.dataReceived(_frame_header(100 << 20))
    (frame,) = c.frames.feed(c.socket.value())
    assert frame.opcode == CLOSE and frame.payload[:2] == (1009).to_bytes(2, "big")
    assert b"a WebSocket frame of 104857600 bytes" in frame.payload
    assert c.socket.disconnecting
    assert h.broker.stats.protocol_errors == errors + 1
    assert h.broker.stats.limits["ws_frame_size"] == 1
    c.socket.clear()
    c.ws.dataReceived(b"\x30" * 1000)   # what the peer still sends is not read
    assert c.socket.value() == b""
    assert len([line for line in log_lines if "a WebSocket frame of" in line]) == 1


def test_a_frame_just_within_the_bound_is_read() -> None:
    """4 x --max-packet-size is allowed: the header alone closes nothing."""
    h = Harness()
    c = WsClient(h)
    c.send(Connect("MQTT", 4, "ok", True, 0))
    assert c.received() == [ACCEPTED]
    c.ws.dataReceived(_frame_header(4 * h.broker.limits.max_packet_size))
    assert not c.socket.disconnecting and c.socket.value() == b""


def test_a_frame_length_of_2_63_closes_at_once(log_lines: list[str]) -> None:
    """A 64-bit length with its top bit set is a protocol error (RFC 6455 5.2): the
    close frame says so and the socket closes then, not after a close handshake
    while the peer streams its "payload"."""
    h = Harness()
    c = WsClient(h)
    c.send(Connect("MQTT", 4, "huge", True, 0))
    assert c.received() == [ACCEPTED]
    c.ws.dataReceived(_frame_header(1 << 63))
    (frame,) = c.frames.feed(c.socket.value())
    assert frame.opcode == CLOSE and frame.payload[:2] == (1002).to_bytes(2, "big")
    assert c.socket.disconnecting
    c.socket.clear()
    c.ws.dataReceived(b"\x00" * 1000)
    assert c.socket.value() == b""
    assert len([line for line in log_lines if "WebSocket protocol error" in line]) == 1


def _subscriber_and_ws_publisher(h: Harness, qos: int) -> tuple[Client, WsClient,
                                                                  list[int]]:
    """A TCP subscriber of ``t``, a WebSocket publisher, and the list that gets, at each
    write to the subscriber, the bytes the publisher had been given by then."""
    sub = h.client()
    sub.connect("sub")
    sub.send(Subscribe(1, (("t", qos),)))
    assert sub.received() == [Suback(1, (qos,))]
    pub = WsClient(h)
    pub.send(Connect("MQTT", 4, "pub", True, 0))
    assert pub.received() == [ACCEPTED]
    writes: list[int] = []
    real = sub.transport.write

    def counted(data: bytes) -> None:
        writes.append(pub.mqtt.bytes_out)
        real(data)

    sub.transport.write = counted  # type: ignore[method-assign]
    return sub, pub, writes


def test_one_socket_read_of_several_publish_frames_is_one_write_per_subscriber() -> None:
    """A WebSocket read of three frames, one QoS 0 PUBLISH each, reaches a TCP
    subscriber in one transport write (the read is one batch), not one per frame."""
    h = Harness()
    sub, pub, writes = _subscriber_and_ws_publisher(h, 0)
    pub.ws.dataReceived(b"".join(
        client_frame(encode(Publish("t", b"%d" % i, 0, False, False, None)))
        for i in range(3)))
    assert [p.payload for p in sub.received()] == [b"0", b"1", b"2"]  # type: ignore[attr-defined]
    assert len(writes) == 1


def test_a_read_of_one_frame_of_one_publish_is_sent_before_the_puback() -> None:
    """A WebSocket read of one whole frame holding one QoS 1 PUBLISH is handled as a
    TCP read of one PUBLISH: the subscriber's frame is written before the publisher's
    PUBACK is even handed out; a frame of two PUBLISHes waits for the batch's end."""
    h = Harness()
    sub, pub, writes = _subscriber_and_ws_publisher(h, 1)
    before = pub.mqtt.bytes_out
    pub.send(Publish("t", b"1", 1, False, False, 7))
    assert writes == [before] and pub.received() == [Puback(7)]
    pub.send(Publish("t", b"2", 1, False, False, 8), Publish("t", b"3", 1, False, False, 9))
    assert writes == [before, before + 12] and pub.received() == [Puback(8), Puback(9)]
    assert [p.payload for p in sub.received()] == [b"1", b"2", b"3"]  # type: ignore[attr-defined]


def _split_so_the_tail_looks_like_one_frame(pubs_after: int) -> tuple[bytes, bytes]:
    """A frame of one PUBLISH split over two reads, its mask chosen so that the second
    read (the payload's tail and ``pubs_after`` one-PUBLISH frames) starts with 0x82
    and a length that makes it look like one whole frame."""
    payload = encode(Publish("t", b"A" * 40, 0, False, False, None))
    after = b"".join(client_frame(encode(Publish("t", b"%d" % i, 0, False, False, None)))
                     for i in range(pubs_after))
    cut = 8   # (a multiple of 4: the mask's first two bytes mask the tail's first two)
    size = len(payload) - cut + len(after)
    mask = bytes([payload[cut] ^ 0x82, payload[cut + 1] ^ (0x80 | (size - 6)), 0x11, 0x22])
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    first = bytes([0x82, 0x80 | len(payload)]) + mask + masked[:cut]
    second = masked[cut:] + after
    assert second[:2] == bytes([0x82, 0x80 | (size - 6)])
    return first, second


def test_the_rest_of_a_frame_split_over_reads_is_not_taken_for_one_frame() -> None:
    """A read that continues a frame begun in the previous one (autobahn holds no bytes
    of it, only the frame's state) is one batch, whatever its first bytes look like:
    the three frames after the tail reach the subscriber in one write with it."""
    h = Harness()
    sub, pub, writes = _subscriber_and_ws_publisher(h, 0)
    first, second = _split_so_the_tail_looks_like_one_frame(3)
    pub.ws.dataReceived(first)
    writes.clear()
    pub.ws.dataReceived(second)
    assert [p.payload for p in sub.received()] == [  # type: ignore[attr-defined]
        b"A" * 40, b"0", b"1", b"2"]
    assert len(writes) == 1
