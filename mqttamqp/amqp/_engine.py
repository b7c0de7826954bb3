"""Direct calls into proton-c (``cproton``) for the per-message path.

proton's Python classes wrap every event, link and delivery in fresh objects
(a dozen per message); the hot path — delivery events, reading a transfer,
sending one, reading an outcome — uses the C functions on raw pointers instead.
Raw pointers are only touched while their connection's engine is alive: links
check ``closed`` first, and a delivery answered after a commit is held with
``pn_incref`` until then.  Everything that is not per message uses the classes.

What it must not do: anything but thin calls; no state.
"""

from __future__ import annotations

from typing import Any

from cproton import ffi, lib  # type: ignore[import-untyped]
from proton import Event

__all__ = [
    "EV_DELIVERY", "EV_LINK_FLOW", "EV_TRANSPORT", "next_event", "pop_event", "event_type",
    "event_delivery", "event_link", "delivery_link", "recv", "send", "lib", "NULL",
]

EV_DELIVERY: int = Event.DELIVERY.number
EV_LINK_FLOW: int = Event.LINK_FLOW.number
EV_TRANSPORT: int = Event.TRANSPORT.number
NULL: Any = ffi.NULL

next_event = lib.pn_collector_peek
pop_event = lib.pn_collector_pop
event_type = lib.pn_event_type
event_delivery = lib.pn_event_delivery
event_link = lib.pn_event_link
delivery_link = lib.pn_delivery_link

_from_buffer = ffi.from_buffer
_link_recv = lib.pn_link_recv
_link_send = lib.pn_link_send
_new_delivery = lib.pn_delivery


def recv(link: Any, size: int) -> bytes:
    """The ``size`` bytes of the current delivery, copied out of the engine."""
    buf = bytearray(size)
    n = _link_recv(link, _from_buffer(buf), size)
    if n < 0:
        return b""
    return bytes(buf) if n == size else bytes(buf[:n])


def send(link: Any, tag: bytes, data: bytes) -> Any:
    """A new delivery with ``tag`` holding ``data``; returns the delivery pointer."""
    dlv = _new_delivery(link, (len(tag), _from_buffer(tag)))
    _link_send(link, _from_buffer(data), len(data))
    lib.pn_link_advance(link)
    return dlv
