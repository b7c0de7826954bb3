"""The message as AMQP receivers get it: of a received message, the header fields
the sender set that the broker keeps and its own sections after the annotations
(``native_sections``), ``to`` set to the topic it was routed to; stored that way
with retained and queued messages (``native_flag``, ``native_header``).

What it must not do: import proton, Twisted or the core.
"""

from __future__ import annotations

from mqttamqp.amqp.codec.encode import PROPERTIES_PREFIX, amqp_string, compound
from mqttamqp.amqp.codec.values import CACHE_SIZE, DecodeError, ValueDecoder, unpack_uint

__all__ = ["native_sections", "native_flag", "native_header", "native_parts"]

_native_props: dict[tuple[bytes, str], bytes] = {}


def native_sections(data: bytes, bare_start: int, props_end: int, to: str | None,
                    topic: str, durable: bool, priority: int | None = None,
                    keep_to: bool = False) -> bytes:
    """What an AMQP receiver gets of a received message as it was sent: the
    header fields the sender set that the broker keeps (``native_flag``), then its
    properties, application properties, body and footer.  ``to`` is set to the topic
    the message was routed to, unless ``keep_to`` (a durable queue keeps the bare
    message exactly as sent, AMQP 1.0 §3.2).  The rest of the header and the
    annotations are the broker's own (``encode_native``)."""
    head, cut = native_parts(data, bare_start, props_end, to, topic, durable, priority,
                             keep_to)
    return head + data[cut:]


def native_flag(durable: bool, priority: int | None) -> bytes:
    """The first bytes of a native message: 0 or 1 (``durable``), or, when the
    sender gave a priority other than the default 4, 2 or 3 followed by it.  (Stored
    with retained and queued messages: records made before priority was kept start
    with 0 or 1, and still read.)"""
    if priority is None or priority == 4:
        return b"\x01" if durable else b"\x00"
    return bytes((3 if durable else 2, priority))


def native_header(native: bytes) -> tuple[bool, int | None, int]:
    """``native``'s durable flag, its priority (None: the default) and where its
    sections begin."""
    flag = native[0]
    if flag & 2:
        return bool(flag & 1), native[1], 2
    return flag == 1, None, 1


def native_parts(data: bytes, bare_start: int, props_end: int, to: str | None,
                 topic: str, durable: bool, priority: int | None = None,
                 keep_to: bool = False) -> tuple[bytes, int]:
    """``native_sections`` as ``head + data[cut:]``: the same for every message with
    the same sections before the body (a sender's memo), so a sender keeps them."""
    flag = native_flag(durable, priority)
    if keep_to:
        return flag, bare_start if bare_start >= 0 else len(data)
    if props_end >= 0 and to == topic:
        return flag, bare_start
    cut = props_end if props_end >= 0 else (bare_start if bare_start >= 0 else len(data))
    raw = data[bare_start:props_end] if props_end >= 0 else b""
    key = (raw, topic)
    props = _native_props.get(key)
    if props is None:
        items = _raw_list_items(raw) if raw else []
        while len(items) < 3:
            items.append(b"\x40")
        items[2] = amqp_string(topic)
        while items and items[-1] == b"\x40" and len(items) > 3:
            items.pop()
        props = PROPERTIES_PREFIX + compound(0xC0, 0xD0, len(items), b"".join(items))
        if len(_native_props) >= CACHE_SIZE:
            _native_props.clear()
        _native_props[key] = props
    return flag + props, cut


def _raw_list_items(section: bytes) -> list[bytes]:
    """The encoded elements of a described list section (already validated)."""
    return _raw_items(section, 0xC0, 0xD0)


def _raw_items(section: bytes, small: int, large: int) -> list[bytes]:
    """The encoded elements of a described list (``small``/``large`` 0xC0/0xD0) or
    map (0xC1/0xD1, keys and values in turn) section (already validated)."""
    decoder = ValueDecoder(section)
    end = len(section)
    _, pos = decoder.value(1, end, 1)         # the descriptor
    code = section[pos] if pos < end else 0
    if code == 0x45 or code == 0x40:
        return []
    if code not in (small, large) or pos + (3 if code == small else 9) > end:
        raise DecodeError("section is not a " + ("list" if small == 0xC0 else "map"))
    if code == small:
        count, pos = section[pos + 2], pos + 3
    else:
        count, pos = unpack_uint(section, pos + 5)[0], pos + 9
    items = []
    for _ in range(count):
        _, stop = decoder.value(pos, end, 1)
        items.append(section[pos:stop])
        pos = stop
    return items
