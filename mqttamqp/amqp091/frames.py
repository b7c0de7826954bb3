"""AMQP 0.9.1 frames, sans-IO: bytes in, frames out, and content assembled.

What it owns: cutting the input into frames (``FrameReader``: the 7-byte frame
header, the frame end octet, the negotiated frame size as the bound) and decoding
each with pamqp; assembling a content-bearing method (``basic.publish``) with its
content header and body frames into one ``Content`` (``ContentAssembler``: the body
size bounded by ``max_body``); and the frames the broker sends (``method_frame``,
``content_frames``, ``HEARTBEAT``).  A frame error is a ``FrameError`` carrying the
spec's reply code (501 frame-error, 502 syntax-error, 503 command-invalid, 505
unexpected-frame) and a reason; the connection turns it into ``connection.close``.

What it must not do: touch sockets or clocks, or decide what a method means.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.constants import DOMAIN_REGEX
from pamqp.exceptions import PAMQPException
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

__all__ = [
    "BodyTooLarge", "FrameError", "FrameReader", "Header", "Content", "ContentAssembler",
    "method_frame",
    "content_frames", "deliver_frame", "deliver_frames", "HEARTBEAT", "FRAME_ERROR", "SYNTAX_ERROR",
    "COMMAND_INVALID", "CHANNEL_ERROR", "UNEXPECTED_FRAME", "FRAME_MIN_SIZE",
]

FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_MIN_SIZE = 4096        # the spec's frame-min-size: every peer accepts this much
_header = struct.Struct(">BHI")
_content_header = struct.Struct(">BHIHHQ")   # frame header, class, weight, body size
_body_start = struct.Struct(">BBHI")         # the end octet before, a body frame's header
_frame_header = struct.Struct(">BHI")
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


class FrameError(Exception):
    """The peer broke the framing or sent a method it may not: close the connection
    with ``code`` and ``text``."""

    def __init__(self, code: int, text: str, channel: int = 0) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.channel = channel


class BodyTooLarge(Exception):
    """A content header announced a body over ``max_body`` (--amqp091-max-body):
    a channel error (406), not a frame error; the body frames that follow are
    discarded with the closing channel."""

    def __init__(self, size: int, bound: int) -> None:
        super().__init__(f"PRECONDITION_FAILED - message size {size} is larger than "
                         f"configured max size {bound}")
        self.size = size
        self.bound = bound


class FrameReader:
    """Cuts input into frames: ``feed`` returns ``(channel, frame)`` pairs, each
    frame a pamqp method, ``ContentHeader``, ``ContentBody`` or ``Heartbeat``.
    A frame larger than ``frame_max`` (the negotiated bound) is a frame error;
    the buffer never holds more than one frame and a read."""

    __slots__ = ("_buffer", "frame_max")

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        buffer = self._buffer + data if self._buffer else data
        out: list[tuple[int, Any]] = []
        start, end = 0, len(buffer)
        frame_max = self.frame_max
        while end - start >= 7:
            kind, channel, size = _frame_header.unpack_from(buffer, start)
            if size + 8 > frame_max:
                raise FrameError(FRAME_ERROR, f"frame of {size + 8} bytes is over the "
                                 f"negotiated frame_max {frame_max}")
            stop = start + 7 + size
            if stop >= end:
                break
            if buffer[stop] != FRAME_END:
                raise FrameError(FRAME_ERROR, "frame does not end with 0xCE")
            payload = buffer[start + 7:stop]
            # (a body frame is its bytes, pamqp's ``ContentBody``: one a publish,
            # without the call to ``_decode``)
            out.append((channel, ContentBody(payload) if kind == FRAME_BODY
                        else _decode(kind, channel, payload)))
            start = stop + 1
        self._buffer = buffer[start:] if start < end else b""
        return out


# Decoded by pamqp once, by the frame's bytes: a publisher's basic.publish frames
# are usually byte for byte the same (exchange, routing key, flags), and so are its
# content headers' property sections.  The objects are shared, so nothing may change
# them (the channel only reads them).  Bounded: frames of at most DECODE_CACHE_ITEM
# bytes, DECODE_CACHE_MAX of each kind, cleared when full (a publisher whose every
# frame differs costs one insertion a frame).
#
# Why fixed bounds and no option, counter or log line (the project's rule for
# buffers, queues and caches): these are pure memos of a decode (a value is a
# function of its key alone; a miss, or a clear, costs one pamqp decode and changes
# nothing a client or an operator can see), shared by every connection of the
# process, so their memory is fixed whatever the load: at most DECODE_CACHE_MAX
# keys of DECODE_CACHE_ITEM bytes and their decoded objects, a few MiB in all.
# Nothing an operator would tune, and "reached" is no event worth a log line (a
# publisher whose frames all differ reaches it every 1024 frames).  As the router's
# match cache (core/topics.py) and the topic exchanges' (core/exchanges/routes.py).
_PUBLISH = 0x003C0028
_PUBLISH_CACHE: dict[bytes, Any] = {}
_PROPERTIES_CACHE: dict[bytes, Any] = {}
DECODE_CACHE_MAX = 1024
DECODE_CACHE_ITEM = 512
_body_size = struct.Struct(">HHQ")


def _decode(kind: int, channel: int, payload: bytes) -> Any:
    if kind == FRAME_METHOD:
        method = _PUBLISH_CACHE.get(payload)
        if method is not None:
            return method
    elif kind == FRAME_HEADER and len(payload) >= 14:
        properties = _PROPERTIES_CACHE.get(payload[12:])
        if properties is not None:
            class_id, weight, body_size = _body_size.unpack_from(payload)
            if class_id == 60 and not weight:
                header = Header.__new__(Header)
                header.class_id = 60  # type: ignore[assignment]  # (pamqp types it None)
                header.weight = 0
                header.body_size, header.properties = body_size, properties
                header.raw = payload[12:]
                return header
    try:
        if kind == FRAME_METHOD:
            if len(payload) < 4:
                raise FrameError(SYNTAX_ERROR, "method frame without a method id")
            index = int.from_bytes(payload[:4], "big")
            cls = commands.INDEX_MAPPING.get(index)
            if cls is None:
                raise FrameError(COMMAND_INVALID, f"unknown method 0x{index:08x}", channel)
            method = cls()
            method.unmarshal(payload[4:])
            _check_names(method, channel)
            if index == _PUBLISH and len(payload) <= DECODE_CACHE_ITEM:
                if len(_PUBLISH_CACHE) >= DECODE_CACHE_MAX:
                    _PUBLISH_CACHE.clear()
                _PUBLISH_CACHE[payload] = method
            return method
        if kind == FRAME_HEADER:
            header = Header()
            header.unmarshal(payload)
            header.raw = payload[12:]
            if header.class_id != 60:
                raise FrameError(FRAME_ERROR, f"content header of class {header.class_id}")
            if not header.weight and len(header.raw) <= DECODE_CACHE_ITEM:
                if len(_PROPERTIES_CACHE) >= DECODE_CACHE_MAX:
                    _PROPERTIES_CACHE.clear()
                _PROPERTIES_CACHE[header.raw] = header.properties
            return header
        if kind == FRAME_BODY:
            return ContentBody(payload)
        if kind == FRAME_HEARTBEAT:
            if channel != 0:
                raise FrameError(FRAME_ERROR, "heartbeat on a channel other than 0")
            return Heartbeat()
    except FrameError:
        raise
    except (PAMQPException, struct.error, ValueError, TypeError, KeyError, IndexError,
            UnicodeDecodeError, OverflowError) as exc:
        raise FrameError(SYNTAX_ERROR, f"undecodable frame: {exc}"[:200], channel) from None
    raise FrameError(FRAME_ERROR, f"unknown frame type {kind}")


class Header(ContentHeader):
    """A content header with its properties as they came (flags and values)."""

    raw = b""


_NAME_FIELDS = (("exchange", "exchange-name", 127), ("destination", "exchange-name", 127),
                ("source", "exchange-name", 127), ("queue", "queue-name", 256))


def _check_names(method: Any, channel: int) -> None:
    """Exchange and queue names within the spec's domains, as pamqp checks what the
    broker sends: a name the broker could not send back (in a deliver, get-ok,
    return or declare-ok) is refused as it comes (502)."""
    for field, domain, longest in _NAME_FIELDS:
        value = getattr(method, field, None)
        if value is not None and (len(value) > longest or not isinstance(value, str)
                                  or not DOMAIN_REGEX[domain].fullmatch(value)):
            raise FrameError(SYNTAX_ERROR, f"invalid {field} name {value!r:.80} in "
                             f"{method.name}", channel)


class Content:
    """A content-bearing method with its properties and body, assembled."""

    __slots__ = ("body", "method", "properties", "raw_properties")

    def __init__(self, method: Any, properties: Any, raw_properties: bytes,
                 body: bytes) -> None:
        self.method = method
        self.properties = properties
        self.raw_properties = raw_properties
        self.body = body


class ContentAssembler:
    """One channel's content in progress: ``basic.publish``, then its header, then
    body frames until the header's body size.  ``max_body`` bounds the body."""

    __slots__ = ("_body", "_header", "_parts", "max_body", "method")

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.method: Any = None   # the content method in progress (None: none)
        self._header: ContentHeader | None = None
        self._parts: list[bytes] = []
        self._body = 0

    @property
    def busy(self) -> bool:
        return self.method is not None

    def start(self, method: Any) -> None:
        self.method = method
        self._header = None
        if self._parts:   # (left empty by the content before: kept, not a new list)
            self._parts = []
        self._body = 0

    def header(self, header: ContentHeader) -> Content | None:
        if self.method is None or self._header is not None:
            raise FrameError(UNEXPECTED_FRAME, "content header without a content method")
        if header.body_size > self.max_body:
            self.method = None
            raise BodyTooLarge(header.body_size, self.max_body)
        self._header = header
        if header.body_size == 0:
            return self._done()
        return None

    def body(self, part: ContentBody) -> Content | None:
        header = self._header
        if header is None:
            raise FrameError(UNEXPECTED_FRAME, "content body without a content header")
        value = part.value
        if not self._body and len(value) == header.body_size:
            # (the usual whole body in one frame: no parts to keep and join)
            content = Content(self.method, header.properties,
                              header.raw if isinstance(header, Header) else b"", value)
            self.method = None
            self._header = None
            return content
        self._parts.append(part.value)
        self._body += len(part.value)
        if self._body > header.body_size:
            raise FrameError(FRAME_ERROR, "content body longer than its header said")
        if self._body == header.body_size:
            return self._done()
        return None

    def _done(self) -> Content:
        header = self._header
        assert header is not None
        parts = self._parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        content = Content(self.method, header.properties,
                          header.raw if isinstance(header, Header) else b"", body)
        self.method = None
        self._header = None
        self._parts = []
        self._body = 0
        return content


def method_frame(channel: int, method: Any) -> bytes:
    return frame.marshal(method, channel)


# basic.deliver's method frame without its delivery tag, by (channel, consumer tag,
# redelivered, exchange, routing key): marshalled by pamqp once, the 8-byte tag put
# between the two halves per delivery (a consumer's deliveries differ in the tag
# only; pamqp's marshalling is ~15 us a frame).  Bounded: DELIVER_CACHE_MAX
# entries, cleared when full, and only for a consumer tag, exchange and routing key
# of DELIVER_CACHE_ITEM characters in all (longer ones are marshalled each time):
# at most 4096 x (256 characters of key + a frame of about as many bytes), under
# 4 MiB for the process.  A pure memo like the decode caches above: fixed bounds,
# no option, counter or log line, for the reasons said there.
_DELIVER_CACHE: dict[tuple[int, str, bool, str, str], tuple[bytes, bytes]] = {}
DELIVER_CACHE_MAX = 4096
DELIVER_CACHE_ITEM = 256


def deliver_frame(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
                  exchange: str, routing_key: str) -> bytes:
    """The method frame of a ``basic.deliver``, as pamqp marshals it."""
    key = (channel, consumer_tag, redelivered, exchange, routing_key)
    halves = _DELIVER_CACHE.get(key) or _deliver_halves(key)
    return halves[0] + delivery_tag.to_bytes(8, "big") + halves[1]


def _deliver_halves(key: tuple[int, str, bool, str, str]) -> tuple[bytes, bytes]:
    channel, consumer_tag, redelivered, exchange, routing_key = key
    whole = frame.marshal(commands.Basic.Deliver(
        consumer_tag, 0, redelivered, exchange, routing_key), channel)
    # (frame header 7, class and method 4, the consumer tag as a short string)
    cut = 11 + 1 + len(consumer_tag.encode("utf-8"))
    halves = (whole[:cut], whole[cut + 8:])
    if len(consumer_tag) + len(exchange) + len(routing_key) <= DELIVER_CACHE_ITEM:
        if len(_DELIVER_CACHE) >= DELIVER_CACHE_MAX:
            _DELIVER_CACHE.clear()
        _DELIVER_CACHE[key] = halves
    return halves


def deliver_frames(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
                   exchange: str, routing_key: str, properties: bytes, body: bytes,
                   frame_max: int) -> bytes:
    """``content_frames`` of a ``basic.deliver`` (``deliver_frame``): the usual
    one body frame in one join, the method's halves from the same cache."""
    key = (channel, consumer_tag, redelivered, exchange, routing_key)
    halves = _DELIVER_CACHE.get(key) or _deliver_halves(key)
    size = len(body)
    if 0 < size <= frame_max - 8:
        return b"".join((halves[0], delivery_tag.to_bytes(8, "big"), halves[1],
                         _content_header.pack(FRAME_HEADER, channel, 12 + len(properties),
                                              60, 0, size),
                         properties, _body_start.pack(FRAME_END, FRAME_BODY, channel, size),
                         body, b"\xce"))
    return content_frames(channel, halves[0] + delivery_tag.to_bytes(8, "big") + halves[1],
                          properties, body, frame_max)


def content_frames(channel: int, method: Any, properties: bytes, body: bytes,
                   frame_max: int) -> bytes:
    """A content-bearing method (deliver, get-ok, return) with its content header
    (``properties``: the encoded property flags and values) and body frames cut to
    ``frame_max``.  ``method`` may be its method frame already (``deliver_frame``)."""
    if type(method) is not bytes:
        method = frame.marshal(method, channel)
    size = len(body)
    if 0 < size <= frame_max - 8:
        # (a delivery's usual shape, one body frame: one join of six parts)
        return b"".join((method, _content_header.pack(FRAME_HEADER, channel,
                                                      12 + len(properties), 60, 0, size),
                         properties, _body_start.pack(FRAME_END, FRAME_BODY, channel, size),
                         body, b"\xce"))
    out = [method]
    header = struct.pack(">HHQ", 60, 0, size) + properties
    out.append(_header.pack(FRAME_HEADER, channel, len(header)) + header + b"\xce")
    room = frame_max - 8
    for start in range(0, len(body), room):
        part = body[start:start + room]
        out.append(_header.pack(FRAME_BODY, channel, len(part)) + part + b"\xce")
    return b"".join(out)
