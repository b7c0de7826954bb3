"""A blocking MQTT client on a plain socket (packets built with the project's codec, or by
hand where a test must send what a library would not), for the tests against a real
broker process."""

from __future__ import annotations

import itertools
import socket
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator

from mqttamqp.mqtt.codec import Decoder, encode, encode_remaining_length
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
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

TIMEOUT = 5.0


_ids = itertools.count(1)


def uid(prefix: str = "r") -> str:
    """A client id / topic segment unique in this run, at most 23 characters (MQTT 3.1)."""
    return f"{prefix}{next(_ids)}-{uuid.uuid4().hex[:10]}"[:23]


class ConnectionClosed(Exception):
    """The broker closed (or reset) the connection."""


class RawClient:
    """A blocking MQTT client on a plain socket, packets built with the project's codec
    (or by hand, for malformed input).  ``recv`` returns packets in arrival order;
    ``expect`` may skip ahead to a packet of a given type and keeps the ones it
    skipped for the next ``recv``."""

    def __init__(self, port: int, level: int = 4) -> None:
        self.level = level
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = Decoder(protocol_level=level)
        self.backlog: deque[Packet] = deque()
        self.eof = False
        self._pid = 0

    # -- bytes ------------------------------------------------------------------

    def next_pid(self) -> int:
        self._pid = self._pid % 65535 + 1
        return self._pid

    def send(self, data: bytes | Packet) -> None:
        self.sock.sendall(data if isinstance(data, bytes) else encode(data, self.level))

    def _read(self, deadline: float) -> Packet:
        while True:
            packet = self.decoder.next_packet()
            if packet is not None:
                return packet
            if self.eof:
                raise ConnectionClosed()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no packet before the deadline")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no packet before the deadline") from None
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                self.eof = True
                raise ConnectionClosed()
            self.decoder.feed(data)

    def recv(self, timeout: float = TIMEOUT) -> Packet:
        """The next packet from the broker (ConnectionClosed on EOF, TimeoutError)."""
        if self.backlog:
            return self.backlog.popleft()
        return self._read(time.monotonic() + timeout)

    def expect(self, kind: type, packet_id: int | None = None,
               timeout: float = TIMEOUT) -> Packet:
        """The first packet of type ``kind`` (and id); others are kept for ``recv``."""
        for i, packet in enumerate(self.backlog):
            if isinstance(packet, kind) and (packet_id is None
                                             or packet.packet_id == packet_id):  # type: ignore[union-attr]
                del self.backlog[i]
                return packet
        deadline = time.monotonic() + timeout
        while True:
            try:
                packet = self._read(deadline)
            except TimeoutError:
                raise AssertionError(f"no {kind.__name__} (id {packet_id}) within {timeout}s; "
                                     f"got meanwhile {list(self.backlog)!r}") from None
            if isinstance(packet, kind) and (packet_id is None
                                             or packet.packet_id == packet_id):  # type: ignore[union-attr]
                return packet
            self.backlog.append(packet)

    def assert_silent(self, timeout: float) -> None:
        """Nothing arrives and the connection stays open for ``timeout`` seconds."""
        try:
            packet = self.recv(timeout)
        except TimeoutError:
            return
        except ConnectionClosed:
            raise AssertionError("the broker closed the connection") from None
        raise AssertionError(f"expected silence, got {packet!r}")

    def wait_closed(self, timeout: float = TIMEOUT) -> list[Packet]:
        """Wait for the broker to close the connection; return what arrived before."""
        got = list(self.backlog)
        self.backlog.clear()
        deadline = time.monotonic() + timeout
        while True:
            try:
                got.append(self._read(deadline))
            except ConnectionClosed:
                return got
            except TimeoutError:
                raise AssertionError(f"connection still open after {timeout}s; "
                                     f"received {got!r}") from None

    def close(self) -> None:
        self.sock.close()

    # -- MQTT -------------------------------------------------------------------

    def connect(self, client_id: str, clean: bool = True, keepalive: int = 60,
                will: Will | None = None) -> Connack:
        name = "MQIsdp" if self.level == 3 else "MQTT"
        self.send(Connect(name, self.level, client_id, clean, keepalive, will))
        packet = self.recv()
        assert isinstance(packet, Connack), f"expected CONNACK, got {packet!r}"
        return packet

    def subscribe(self, *filters: tuple[str, int]) -> tuple[int, ...]:
        pid = self.next_pid()
        self.send(Subscribe(pid, tuple(filters)))
        ack = self.expect(Suback, pid)
        return ack.return_codes  # type: ignore[union-attr]

    def unsubscribe(self, *filters: str) -> None:
        pid = self.next_pid()
        self.send(Unsubscribe(pid, tuple(filters)))
        self.expect(Unsuback, pid)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        """Publish with the full flow: returns once PUBACK / PUBCOMP came back."""
        pid = self.next_pid() if qos else None
        self.send(Publish(topic, payload, qos, retain, False, pid))
        if qos == 1:
            self.expect(Puback, pid)
        elif qos == 2:
            assert pid is not None
            self.expect(Pubrec, pid)
            self.send(Pubrel(pid))
            self.expect(Pubcomp, pid)

    def receive(self, timeout: float = TIMEOUT) -> Publish:
        packet = self.expect(Publish, timeout=timeout)
        assert isinstance(packet, Publish)
        return packet

    def ack(self, message: Publish) -> None:
        """Complete the receiver's side of the flow for ``message``."""
        if message.qos == 1:
            assert message.packet_id is not None
            self.send(Puback(message.packet_id))
        elif message.qos == 2:
            assert message.packet_id is not None
            self.send(Pubrec(message.packet_id))
            self.expect(Pubrel, message.packet_id)
            self.send(Pubcomp(message.packet_id))

    def receive_acked(self, timeout: float = TIMEOUT) -> Publish:
        message = self.receive(timeout)
        self.ack(message)
        return message

    def disconnect(self) -> None:
        self.send(Disconnect())
        self.wait_closed()


OpenClient = Callable[..., RawClient]


def closed_at_once(port: int, send: bytes = b"", timeout: float = TIMEOUT) -> bool:
    """A socket to ``port`` that the broker should close at its accept (a refusal:
    --max-connections): True when it is closed before anything arrives, by EOF or
    by a reset.  The reset may come before ``connect()`` returns (the broker accepts
    and aborts the socket while the client's connect is still waiting for its
    result, as it may on a loaded machine): ``connect`` then fails with
    ECONNRESET, which is that refusal too.  ``send``: bytes written first."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except ConnectionResetError:
        return True
    with sock:
        try:
            if send:
                sock.sendall(send)
            return sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True


def client_factory(default_port: Callable[[], int]) -> Iterator[OpenClient]:
    """Yields ``open(client_id, level=4, clean=True, keepalive=60, will=None, port=...)``
    that connects (CONNACK 0 asserted); closes every socket at the end."""
    made: list[RawClient] = []

    def open_client(client_id: str, level: int = 4, clean: bool = True, keepalive: int = 60,
                    will: Will | None = None, port: int | None = None) -> RawClient:
        c = RawClient(port if port is not None else default_port(), level)
        made.append(c)
        ack = c.connect(client_id, clean, keepalive, will)
        assert ack.return_code == 0, f"CONNACK {ack.return_code} for {client_id!r}"
        return c

    yield open_client
    for c in made:
        c.close()


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(body)) + body


def mstr(value: str | bytes) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else value
    return struct.pack(">H", len(data)) + data


def u16(value: int) -> bytes:
    return struct.pack(">H", value)


def raw_connect(name: str, level: int, client_id: str | bytes, flags: int = 0x02,
                keepalive: int = 60, tail: bytes = b"") -> bytes:
    return frame(0x10, mstr(name) + bytes((level, flags)) + u16(keepalive)
                 + mstr(client_id) + tail)
