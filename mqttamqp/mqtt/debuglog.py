"""Per-client debug logging (the console's "Debug log"): every packet in and out
of one MQTT connection, for a while, within a line budget.

The logging wrappers are put in the connection's own ``__dict__`` (shadowing the
class's ``_emit`` and handler table) only while it is debugged, so no other
connection pays a check per packet.  I/O side (a timer, the log); it decides
nothing about the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from twisted.logger import Logger

from mqttamqp.core.clients.clientdebug import MAX_DEBUG_LINES, LineBudget
from mqttamqp.core.clock import Clock

__all__ = ["Debugged", "start", "stop"]

_Handler = Callable[[Any, Any], None]


class Debugged(Protocol):
    """What is logged of an MQTT connection (``protocol.MQTTProtocol``)."""

    client_id: str
    clock: Clock
    log: Logger
    _connected_handlers: ClassVar[dict[type, _Handler]]

    @property
    def peer(self) -> str: ...

    def _emit(self, data: bytes) -> None: ...

    def stop_debug(self) -> None: ...

_FRAME_KINDS = ("reserved", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL",
                "PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ",
                "PINGRESP", "DISCONNECT", "reserved")


def _frame_kind(data: bytes) -> str:
    """The MQTT packet type of an encoded frame (for debug lines)."""
    return _FRAME_KINDS[data[0] >> 4] if data else "empty"


def start(conn: Debugged, until: float) -> None:
    """Log every packet in and out of ``conn`` until ``until`` (a new deadline
    only, if it is logged already)."""
    own = vars(conn)
    timer = own.get("_debug_timer")
    if timer is not None and timer.active():
        timer.cancel()
    own["_debug_timer"] = conn.clock.callLater(
        max(0.0, until - conn.clock.seconds()), conn.stop_debug)
    if "_emit" in own:
        return   # already logging: a new deadline only
    plain_emit = conn._emit
    log = conn.log
    budget = LineBudget()

    def allowed() -> bool:
        if budget.take():
            return True
        if budget.left == -1:   # once: the rest of the window is not logged
            log.info("debug {c} ({peer}): {n} lines logged, the most for one "
                     "window; no more", c=conn.client_id, peer=conn.peer,
                     n=MAX_DEBUG_LINES)
        return False

    def emit(data: bytes) -> None:
        if allowed():
            log.info("debug {c} ({peer}): out {kind} ({n} bytes)", c=conn.client_id,
                     peer=conn.peer, kind=_frame_kind(data), n=len(data))
        plain_emit(data)

    def logged(handler: _Handler) -> _Handler:
        def handle(link: Debugged, packet: Any) -> None:
            if allowed():
                log.info("debug {c} ({peer}): in {packet}", c=link.client_id,
                         peer=link.peer, packet=repr(packet)[:300])
            handler(link, packet)
        return handle

    own["_emit"] = emit
    own["_connected_handlers"] = {kind: logged(handler) for kind, handler
                                  in type(conn)._connected_handlers.items()}
    log.info("debug logging of {c} ({peer}) on for {s:.0f}s", c=conn.client_id,
             peer=conn.peer, s=until - conn.clock.seconds())


def stop(conn: Debugged) -> None:
    """Stop logging ``conn`` (its deadline came, or it closed)."""
    own = vars(conn)
    timer = own.pop("_debug_timer", None)
    if timer is not None and timer.active():
        timer.cancel()
    if own.pop("_emit", None) is not None:
        own.pop("_connected_handlers", None)
        conn.log.info("debug logging of {c} ({peer}) ended", c=conn.client_id,
                      peer=conn.peer)
