"""AMQP 1.0 values (AMQP 1.0 §1.6): the types a decoded value is made of, and the
decoder of one value from bytes, with limits on depth and element count so that
any bytes either decode or raise ``DecodeError`` with a reason.

What it must not do: know what a message section or the MQTT-over-AMQP contract
is (``sections``, ``contract``), or import proton, Twisted or the core.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NamedTuple

__all__ = ["DecodeError", "Symbol", "Described", "decode_value", "ValueDecoder", "MAX_DEPTH",
           "CACHE_SIZE"]

MAX_DEPTH = 32


class DecodeError(Exception):
    """The bytes are not a message this broker can use; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Symbol(str):
    """An AMQP symbol (kept apart from strings so a caller can tell them apart)."""

    __slots__ = ()


class Described(NamedTuple):
    descriptor: Any
    value: Any


# The most entries each of the codec's caches (by the bytes of a sender's
# sections, by a publisher's header fields) holds before it starts again.
CACHE_SIZE = 256

_unpack_b = struct.Struct(">b").unpack_from
_unpack_h = struct.Struct(">h").unpack_from
_unpack_H = struct.Struct(">H").unpack_from
_unpack_i = struct.Struct(">i").unpack_from
unpack_uint = struct.Struct(">I").unpack_from
_unpack_q = struct.Struct(">q").unpack_from
_unpack_Q = struct.Struct(">Q").unpack_from
_unpack_f = struct.Struct(">f").unpack_from
_unpack_d = struct.Struct(">d").unpack_from

# Width in bytes of the fixed-width encodings, by format code.
_FIXED = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}


class ValueDecoder:
    __slots__ = ("budget", "buf")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        # Bounds the work a hostile message can cause (e.g. an array of a billion
        # zero-width nulls): every decoded value costs one.
        self.budget = 64 + 2 * len(buf)

    def need(self, pos: int, n: int, end: int) -> None:
        if pos + n > end:
            raise DecodeError("truncated AMQP value")

    def value(self, pos: int, end: int, depth: int) -> tuple[Any, int]:
        if pos >= end:
            raise DecodeError("truncated AMQP value")
        buf = self.buf
        code = buf[pos]
        pos += 1
        # The common scalars first, inline (this is the per-message path).
        if code == 0x40:
            self.budget -= 1
            return None, pos
        if code == 0xA1 or code == 0xA3 or code == 0xA0:
            self.budget -= 1
            if pos >= end:
                raise DecodeError("truncated AMQP value")
            stop = pos + 1 + buf[pos]
            if stop > end:
                raise DecodeError("truncated AMQP value")
            raw = bytes(buf[pos + 1:stop])
            if code == 0xA0:
                return raw, stop
            try:
                if code == 0xA1:
                    return raw.decode("utf-8"), stop
                return Symbol(raw.decode("ascii")), stop
            except UnicodeDecodeError:
                return self.variable(code, pos + 1, stop - pos - 1), stop
        if code == 0x41 or code == 0x42:
            self.budget -= 1
            return code == 0x41, pos
        if code == 0x43 or code == 0x44:
            self.budget -= 1
            return 0, pos
        if code == 0x50 or code == 0x52 or code == 0x53:
            self.budget -= 1
            if pos >= end:
                raise DecodeError("truncated AMQP value")
            return buf[pos], pos + 1
        if code == 0x00:
            if depth >= MAX_DEPTH:
                raise DecodeError("AMQP value nested too deeply")
            descriptor, pos = self.value(pos, end, depth + 1)
            inner, pos = self.value(pos, end, depth + 1)
            return Described(descriptor, inner), pos
        return self.body(code, pos, end, depth)

    def body(self, code: int, pos: int, end: int, depth: int) -> tuple[Any, int]:
        self.budget -= 1
        if self.budget < 0:
            raise DecodeError("AMQP value has too many elements")
        buf = self.buf
        width = _FIXED.get(code)
        if width is not None:
            self.need(pos, width, end)
            return self.fixed(code, pos), pos + width
        if code in (0xA0, 0xA1, 0xA3):
            self.need(pos, 1, end)
            size = buf[pos]
            pos += 1
            self.need(pos, size, end)
            return self.variable(code, pos, size), pos + size
        if code in (0xB0, 0xB1, 0xB3):
            self.need(pos, 4, end)
            size = unpack_uint(buf, pos)[0]
            pos += 4
            self.need(pos, size, end)
            return self.variable(code, pos, size), pos + size
        if code in (0xC0, 0xC1, 0xD0, 0xD1):
            if depth >= MAX_DEPTH:
                raise DecodeError("AMQP value nested too deeply")
            if code < 0xD0:
                self.need(pos, 2, end)
                size, count = buf[pos], buf[pos + 1]
                start = pos + 1
            else:
                self.need(pos, 8, end)
                size, count = unpack_uint(buf, pos)[0], unpack_uint(buf, pos + 4)[0]
                start = pos + 4
            stop = start + size
            if size < (1 if code < 0xD0 else 4) or stop > end:
                raise DecodeError("AMQP compound value overruns its buffer")
            pos = start + (1 if code < 0xD0 else 4)
            items: list[Any] = []
            for _ in range(count):
                item, pos = self.value(pos, stop, depth + 1)
                items.append(item)
            if pos != stop:
                raise DecodeError("AMQP compound value size does not match its content")
            if code in (0xC0, 0xD0):
                return items, pos
            if count % 2:
                raise DecodeError("AMQP map with an odd number of elements")
            result: dict[Any, Any] = {}
            try:
                for i in range(0, count, 2):
                    result[items[i]] = items[i + 1]
            except TypeError:
                raise DecodeError("AMQP map key is not a scalar") from None
            return result, pos
        if code in (0xE0, 0xF0):
            if depth >= MAX_DEPTH:
                raise DecodeError("AMQP value nested too deeply")
            if code == 0xE0:
                self.need(pos, 2, end)
                size, count = buf[pos], buf[pos + 1]
                start, pos = pos + 1, pos + 2
            else:
                self.need(pos, 8, end)
                size, count = unpack_uint(buf, pos)[0], unpack_uint(buf, pos + 4)[0]
                start, pos = pos + 4, pos + 8
            stop = start + size
            if stop > end or pos > stop:
                raise DecodeError("AMQP array overruns its buffer")
            self.need(pos, 1, stop)
            element = buf[pos]
            pos += 1
            descriptor: Any = None
            described = element == 0x00
            if described:
                descriptor, pos = self.value(pos, stop, depth + 1)
                self.need(pos, 1, stop)
                element = buf[pos]
                pos += 1
            elements: list[Any] = []
            for _ in range(count):
                item, pos = self.body(element, pos, stop, depth + 1)
                elements.append(Described(descriptor, item) if described else item)
            if pos != stop:
                raise DecodeError("AMQP array size does not match its content")
            return elements, pos
        raise DecodeError(f"unknown AMQP format code 0x{code:02x}")

    def fixed(self, code: int, pos: int) -> Any:
        buf = self.buf
        if code == 0x40:
            return None
        if code == 0x41:
            return True
        if code == 0x42:
            return False
        if code in (0x43, 0x44):
            return 0
        if code == 0x45:
            return []
        if code in (0x50, 0x52, 0x53):
            return buf[pos]
        if code in (0x51, 0x54, 0x55):
            return _unpack_b(buf, pos)[0]
        if code == 0x56:
            if buf[pos] > 1:
                raise DecodeError("AMQP boolean is neither 0 nor 1")
            return buf[pos] == 1
        if code == 0x60:
            return _unpack_H(buf, pos)[0]
        if code == 0x61:
            return _unpack_h(buf, pos)[0]
        if code == 0x70:
            return unpack_uint(buf, pos)[0]
        if code == 0x71:
            return _unpack_i(buf, pos)[0]
        if code == 0x72:
            return _unpack_f(buf, pos)[0]
        if code == 0x73:
            point = unpack_uint(buf, pos)[0]
            if point > 0x10FFFF:
                raise DecodeError("AMQP char out of range")
            return chr(point)
        if code in (0x80,):
            return _unpack_Q(buf, pos)[0]
        if code in (0x81, 0x83):
            return _unpack_q(buf, pos)[0]
        if code == 0x82:
            return _unpack_d(buf, pos)[0]
        if code == 0x98:
            return uuid.UUID(bytes=bytes(buf[pos:pos + 16]))
        return bytes(buf[pos:pos + _FIXED[code]])  # decimals: kept raw

    def variable(self, code: int, pos: int, size: int) -> Any:
        raw = bytes(self.buf[pos:pos + size])
        if code in (0xA0, 0xB0):
            return raw
        try:
            if code in (0xA1, 0xB1):
                return raw.decode("utf-8")
            return Symbol(raw.decode("ascii"))
        except UnicodeDecodeError:
            kind = "string" if code in (0xA1, 0xB1) else "symbol"
            raise DecodeError(f"AMQP {kind} is not valid "
                              f"{'UTF-8' if kind == 'string' else 'ASCII'}") from None


def decode_value(data: bytes) -> Any:
    """Decode exactly one AMQP value (for tests and control bodies)."""
    decoder = ValueDecoder(data)
    value, pos = decoder.value(0, len(data), 0)
    if pos != len(data):
        raise DecodeError("trailing bytes after the AMQP value")
    return value
