"""Direct calls into proton-c (``cproton``) for the per-message path: the one
place the broker calls proton's C functions by name.

proton's Python classes wrap every event, link and delivery in fresh objects
(a dozen per message); the hot path — delivery events, reading a transfer,
sending one, reading an outcome — uses the C functions on raw pointers instead.
Raw pointers are only touched while their connection's engine is alive: links
check ``closed`` first, and a delivery answered after a commit is held with
``pn_incref`` until then.  Everything that is not per message uses the classes,
except where the classes would raise on a peer's bytes or keep objects alive:

* error conditions (``condition``, ``describe``): proton's classes decode a
  condition's name and description whole on access and raise
  ``UnicodeDecodeError`` on bytes that are not UTF-8 — a peer's own, or proton's
  text quoting them ("link name already attached: <the peer's bytes>").  Read
  here, they are escaped, never raised;
* closing an endpoint with a condition (``close_with``): through the classes the
  ``Condition`` object stays in the endpoint's Python attributes until proton
  frees it;
* freeing a link (``free_link``) once both ends have closed it: proton keeps every
  link until then, so a connection that attaches and detaches links for ever
  would grow for ever.

The C functions of the per-message path are looked up once, here, as module
names (``link_send``, ``delivery_settle``...): a global read is cheaper than
``lib.pn_...`` (an attribute of the cffi library object) for every message.  The
other modules read them from here; what is not per message may call ``lib``.

These are the C API of python-qpid-proton 0.39 and 0.40 (pyproject.toml pins the range);
``tests/unit/net/test_net_pins.py`` checks each name exists in the installed ``cproton``.

State, module-wide and used on the reactor thread only, kept here because the C
calls that use it are here:

* ``_buf``, one 64 KiB buffer that a transfer or the transport's output is read into
  before it is copied out as bytes (a buffer per call would be an allocation per
  message);
* the delivery tags of packet ids (``packet_id_tag``, ``tag_blocks``): ready
  ``pn_bytes_t`` values, a block of 1,024 made at the first use of an id in it and
  kept for the process's life, at most 64 blocks (every packet id, ~1.4 MB), and
  the one tag of every pre-settled delivery (``SETTLED_TAG``).  A tag made per
  transfer cost ~2,650 instructions more.

What it must not do: anything but thin calls and those; no other state; no
import of the broker.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from cproton import ffi, lib  # type: ignore[import-untyped]
from proton import Event

__all__ = [
    "EV_LINK_FLOW", "EV_TRANSPORT", "ffi", "next_event", "pop_event", "event_type",
    "event_delivery", "event_link", "delivery_link", "recv", "output", "tick", "lib",
    "NULL", "condition", "describe", "close_with", "free_link",
    "decref", "incref", "from_buffer", "new_delivery", "delivery_aborted",
    "delivery_partial", "delivery_pending", "delivery_readable", "delivery_remote",
    "delivery_remote_state", "delivery_settle", "delivery_settled", "delivery_update",
    "disposition_is_failed", "link_advance", "link_send", "link_credit", "link_flow",
    "link_queued", "packet_id_tag", "tag_blocks", "SETTLED_TAG",
]

EV_LINK_FLOW: int = Event.LINK_FLOW.number
EV_TRANSPORT: int = Event.TRANSPORT.number
NULL: Any = ffi.NULL

next_event = lib.pn_collector_peek
pop_event = lib.pn_collector_pop
event_type = lib.pn_event_type
event_delivery = lib.pn_event_delivery
event_link = lib.pn_event_link
delivery_link = lib.pn_delivery_link

# Deliveries and links, for the adapters' per-message path.
decref = lib.pn_decref
incref = lib.pn_incref
from_buffer = ffi.from_buffer
new_delivery = lib.pn_delivery
delivery_aborted = lib.pn_delivery_aborted
delivery_partial = lib.pn_delivery_partial
delivery_pending = lib.pn_delivery_pending
delivery_readable = lib.pn_delivery_readable
delivery_remote = lib.pn_delivery_remote
delivery_remote_state = lib.pn_delivery_remote_state
delivery_settle = lib.pn_delivery_settle
delivery_settled = lib.pn_delivery_settled
delivery_update = lib.pn_delivery_update
disposition_is_failed = lib.pn_disposition_is_failed
link_advance = lib.pn_link_advance
link_send = lib.pn_link_send
link_credit = lib.pn_link_credit
link_flow = lib.pn_link_flow
link_queued = lib.pn_link_queued

_unpack: Callable[[Any, int], bytes] = ffi.unpack
_link_recv = lib.pn_link_recv
_EOS: int = lib.PN_EOS
_transport_peek = lib.pn_transport_peek
_transport_pending = lib.pn_transport_pending
_transport_pop = lib.pn_transport_pop
_transport_tick = lib.pn_transport_tick

# One buffer for what is copied out of the engine (the reactor thread is the only
# caller): a transfer or the pending output is copied once, into the bytes returned.
_BUF_SIZE = 1 << 16
_buf = ffi.new("char[]", _BUF_SIZE)


# The delivery tags of packet ids (b"1" ... b"65535", the tag of a QoS 1/2 delivery),
# as ready ``pn_bytes_t`` values: a tag made per message (its bytes, a buffer view and a
# tuple cffi converts) cost ~2,650 instructions more per transfer.  A block of 1,024
# ids is made when an id in it is first used (``packet_id_tag``): ~21 KB of C memory
# (16 KB of structs, then the digits).  64 blocks at most (~1.37 MB; ~1.6 MB of RSS
# measured), reached once a session's packet ids have wrapped through 1..65535; a
# broker with no AMQP QoS 1/2 receiver makes none.
_TAG_BLOCK_BITS = 10
_TAG_BLOCK = 1 << _TAG_BLOCK_BITS
# (``OutgoingLink.transfer`` reads a made block here itself: a call less per message)
tag_blocks: list[Any] = [None] * (65536 >> _TAG_BLOCK_BITS)
_tag_chars: list[Any] = [None] * len(tag_blocks)   # (what each block points into)

# The tag of a delivery settled when sent (b"s"), ready: a settled delivery's tag need
# not be unique (AMQP 1.0 2.6.12: unique among the unsettled), so one serves every
# pre-settled transfer of the broker, the gateway and the bridges.
_settled_chars = ffi.new("char[]", b"s")
_settled_tag = ffi.new("pn_bytes_t[]", [(1, _settled_chars)])
SETTLED_TAG: Any = _settled_tag[0]

# A block's structs are packed at C speed by ``struct`` (native ``size_t`` then a
# pointer; a cdata attribute set per field costs ten times as much), but only where
# ``pn_bytes_t`` has that layout: checked here, once, against what cffi says of the
# installed ``cproton``.  Elsewhere each field is set one by one.
_C_LAYOUT: tuple[int, int, int] = (
    ffi.sizeof("pn_bytes_t"), ffi.offsetof("pn_bytes_t", "size"),
    ffi.offsetof("pn_bytes_t", "start"))
_PACKED_LAYOUT: tuple[int, int, int] = (struct.calcsize("@NP"), 0, struct.calcsize("@N"))


def _tag_packer() -> Callable[..., bytes] | None:
    """``struct``'s packer of a block's structs, or None if ``pn_bytes_t`` is not laid
    out as it packs (then the fields are set one by one)."""
    if _C_LAYOUT != _PACKED_LAYOUT:
        return None
    return struct.Struct("@" + "NP" * _TAG_BLOCK).pack


_pack_tags = _tag_packer()


def packet_id_tag(packet_id: int) -> Any:
    """The delivery tag ``b"%d" % packet_id`` (0 <= packet_id < 65536) as a
    ``pn_bytes_t`` for ``new_delivery``."""
    block = tag_blocks[packet_id >> _TAG_BLOCK_BITS]
    if block is None:
        block = _tag_block(packet_id >> _TAG_BLOCK_BITS)
    return block[packet_id & (_TAG_BLOCK - 1)]


def _tag_block(index: int) -> Any:
    chars, block = _make_tag_block(index)
    _tag_chars[index] = chars
    tag_blocks[index] = block
    return block


def _make_tag_block(index: int) -> tuple[Any, Any]:
    """The digits of block ``index``'s packet ids, and its ``pn_bytes_t`` array
    pointing into them (the digits must live as long as the array)."""
    first = index << _TAG_BLOCK_BITS
    tags = [b"%d" % pid for pid in range(first, first + _TAG_BLOCK)]
    chars = ffi.new("char[]", b"".join(tags))
    block = ffi.new("pn_bytes_t[]", _TAG_BLOCK)
    pack = _pack_tags
    if pack is None:
        at = ffi.cast("char *", chars)
        for i, tag in enumerate(tags):
            entry = block[i]
            entry.size = len(tag)
            entry.start = at
            at += len(tag)
        return chars, block
    base = int(ffi.cast("uintptr_t", chars))
    fields: list[int] = []
    for tag in tags:
        fields.append(len(tag))
        fields.append(base)
        base += len(tag)
    packed = pack(*fields)
    if len(packed) != ffi.sizeof(block):
        # (never reached while the layout check holds; never copy a wrong size)
        raise RuntimeError(f"packed delivery tags: {len(packed)} bytes for a block of "
                           f"{ffi.sizeof(block)}")
    ffi.memmove(block, packed, len(packed))
    return chars, block


def recv(link: Any, dlv: Any) -> bytes | None:
    """The current delivery ``dlv`` of ``link``, whole (not partial), copied out of
    the engine; None if it was aborted.  One proton call for the usual message:
    its size and an abort are asked only when the read says so (a full buffer, an
    error code)."""
    n = _link_recv(link, _buf, _BUF_SIZE)
    if n <= 0:
        return b"" if n == _EOS or n == 0 else None   # (PN_ABORTED: aborted)
    data = _unpack(_buf, n)
    if n < _BUF_SIZE:
        return data
    rest = delivery_pending(dlv)
    if rest <= 0:
        return data
    big = ffi.new("char[]", rest)
    m = _link_recv(link, big, rest)
    return data + _unpack(big, m) if m > 0 else data


def output(transport: Any) -> bytes | None:
    """All the transport's pending output, taken out of it (b"" if there is none);
    None once its output side is closed (close sent, or a transport error)."""
    pending = _transport_pending(transport)
    if pending <= 0:
        return b"" if pending == 0 else None
    buf = _buf if pending <= _BUF_SIZE else ffi.new("char[]", pending)
    n = _transport_peek(transport, buf, pending)
    if n < 0:
        return None
    _transport_pop(transport, pending)
    return _unpack(buf, pending)


def tick(transport: Any, now: float) -> float:
    """``Transport.tick``: the deadline of the transport's next timer (0: none)."""
    return float(_transport_tick(transport, int(now * 1000))) / 1000.0


def _text(ptr: Any) -> str:
    """A C string of proton's, with any bytes that are not UTF-8 escaped."""
    if ptr == NULL:
        return ""
    raw: bytes = ffi.string(ptr)
    return raw.decode("utf-8", "backslashreplace")


def condition(cond: Any) -> tuple[str, str] | None:
    """``(name, description)`` of a proton ``pn_condition_t``, or None if it is not
    set; never raises on bytes that are not UTF-8 (they are escaped)."""
    if cond == NULL or not lib.pn_condition_is_set(cond):
        return None
    return _text(lib.pn_condition_get_name(cond)), _text(lib.pn_condition_get_description(cond))


def describe(cond: Any) -> str | None:
    """``name: description`` of a condition (``condition``), or None if not set."""
    both = condition(cond)
    if both is None:
        return None
    name, description = both
    return f"{name}: {description}" if description else name


def close_with(endpoint: Any, cond: Any, close: Callable[[Any], None], name: str,
               description: str) -> None:
    """Close a proton endpoint (``close`` of ``endpoint``, e.g. ``pn_link_close``)
    with an error condition set straight in the engine (``cond``, its
    ``pn_..._condition``)."""
    lib.pn_condition_set_name(cond, name.encode())
    lib.pn_condition_set_description(cond, description.encode())
    close(endpoint)


def free_link(link: Any) -> None:
    """Let proton free ``link`` (a raw ``pn_link_t``) once it is closed at both ends;
    the engine keeps it until its last frame is written."""
    lib.pn_link_free(link)
