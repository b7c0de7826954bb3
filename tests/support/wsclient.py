"""A WebSocket client for tests that must choose frame boundaries (no tests here).

Client libraries hide where one WebSocket message ends; the tests of MQTT over
WebSockets need to split a packet over two messages, pack two in one, send a text
frame or a handshake a browser would not.  ``request`` and ``client_frame`` build
the bytes (RFC 6455: client frames masked), ``FrameReader`` parses what the server
sends (unmasked frames), and ``RawWebSocket`` does both on a real socket with
bounded waits.  The broker's side is autobahn, not this.
"""

from __future__ import annotations

import base64
import os
import socket
import struct
from typing import NamedTuple

__all__ = ["BINARY", "CLOSE", "TEXT", "Frame", "FrameReader", "RawWebSocket",
           "client_frame", "request"]

TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA
TIMEOUT = 10.0


def request(host: str = "127.0.0.1", path: str = "/mqtt",
            protocols: tuple[str, ...] = ("mqtt",), origin: str | None = None,
            version: int = 13) -> bytes:
    """The opening handshake's request."""
    key = base64.b64encode(os.urandom(16)).decode("ascii")
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
             "Connection: Upgrade", f"Sec-WebSocket-Key: {key}",
             f"Sec-WebSocket-Version: {version}"]
    if protocols:
        lines.append("Sec-WebSocket-Protocol: " + ", ".join(protocols))
    if origin is not None:
        lines.append(f"Origin: {origin}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def client_frame(payload: bytes, opcode: int = BINARY, fin: bool = True) -> bytes:
    """One masked frame (``fin`` False: a message continues in the next frame,
    whose opcode must then be 0)."""
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


class Frame(NamedTuple):
    opcode: int
    payload: bytes


class FrameReader:
    """Server frames out of a byte stream (fed in any pieces)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while True:
            frame = self._next()
            if frame is None:
                return frames
            frames.append(frame)

    def _next(self) -> Frame | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        if buf[1] & 0x80:
            raise AssertionError("the server masked a frame")
        n, at = buf[1] & 0x7F, 2
        if n == 126:
            if len(buf) < 4:
                return None
            n, at = struct.unpack("!H", buf[2:4])[0], 4
        elif n == 127:
            if len(buf) < 10:
                return None
            n, at = struct.unpack("!Q", buf[2:10])[0], 10
        if len(buf) < at + n:
            return None
        self._buffer = buf[at + n:]
        return Frame(buf[0] & 0x0F, buf[at:at + n])


class RawWebSocket:
    """A socket to the broker's WebSocket listener.  ``handshake`` returns the
    response's status and headers; an accepted one leaves the socket open for
    frames."""

    def __init__(self, port: int, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.reader = FrameReader()
        self._frames: list[Frame] = []
        self._rest = b""

    def handshake(self, **kw: object) -> tuple[int, dict[str, str]]:
        self.sock.sendall(request(**kw))  # type: ignore[arg-type]
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            data += chunk
        head, _, self._rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if lines and lines[0] else 0
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:])}
        if self._rest:
            self._frames += self.reader.feed(self._rest)
        return status, headers

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_message(self, payload: bytes, opcode: int = BINARY) -> None:
        self.sock.sendall(client_frame(payload, opcode))

    def next_frame(self) -> Frame:
        """The next frame from the server; ``AssertionError`` if the socket closes
        (or nothing comes within the timeout) first."""
        while not self._frames:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError("the server closed the connection")
            self._frames += self.reader.feed(chunk)
        return self._frames.pop(0)

    def read_stream(self, n: int) -> bytes:
        """At least ``n`` bytes of binary message payload, across messages."""
        got = b""
        while len(got) < n:
            frame = self.next_frame()
            assert frame.opcode == BINARY, frame
            got += frame.payload
        return got

    def closed_by_peer(self) -> bool:
        """Whether the server ends the TCP connection (frames before it are dropped)."""
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except TimeoutError:
            return False
        except OSError:   # reset
            return True

    def close(self) -> None:
        self.sock.close()
