"""Per-client debug logging (the console's "Debug log"): every packet in and out
of one MQTT connection, for a while, within a line budget.

While it is debugged the connection's class is a subclass of its own whose
handler table logs (``__class__`` assignment: the connection has no ``__dict__``
to hold wrappers), and whose type its ``_emit`` tells from its own to call ``sent``
(not an ``_emit`` of the subclass: in the compiled build a connection is a native
instance, whose compiled methods call each other through the table of the class it
was made with, whatever ``__class__`` says later), so no other connection pays
more than a type check per packet out.
I/O side (a timer, the log); it decides nothing about the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from twisted.logger import Logger

from mqttamqp.core.clients.clientdebug import MAX_DEBUG_LINES, LineBudget
from mqttamqp.core.clock import Clock

__all__ = ["Debugged", "sent", "start", "stop"]

_Handler = Callable[[Any, Any], None]


class Debugged(Protocol):
    """What is logged of an MQTT connection (``protocol.MQTTProtocol``)."""

    client_id: str
    clock: Clock
    log: Logger
    _connected_handlers: ClassVar[dict[type, _Handler]]

    @property
    def peer(self) -> str: ...

    def stop_debug(self) -> None: ...

_FRAME_KINDS = ("reserved", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL",
                "PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ",
                "PINGRESP", "DISCONNECT", "reserved")


def _frame_kind(data: bytes) -> str:
    """The MQTT packet type of an encoded frame (for debug lines)."""
    return _FRAME_KINDS[data[0] >> 4] if data else "empty"


class _Logging:
    """One debugged connection's window: its deadline and line budget."""

    __slots__ = ("budget", "timer")

    def __init__(self, timer: Any) -> None:
        self.timer = timer
        self.budget = LineBudget()


# The connections being debugged (a handful at most: the console turns it on one
# client at a time) and their windows.
_windows: dict[Any, _Logging] = {}
# class -> its logging subclass, and back (bounded: one per connection class)
_logging_classes: dict[type, type] = {}
_plain_classes: dict[type, type] = {}


def _allowed(conn: Debugged) -> bool:
    window = _windows.get(conn)
    if window is None:
        return False
    budget = window.budget
    if budget.take():
        return True
    if budget.left == -1:   # once: the rest of the window is not logged
        conn.log.info("debug {c} ({peer}): {n} lines logged, the most for one "
                      "window; no more", c=conn.client_id, peer=conn.peer,
                      n=MAX_DEBUG_LINES)
    return False


def _logging_class(cls: type) -> type:
    """``cls`` with the packet handlers logged (no new slots: a
    connection changes class to it and back, ``__class__`` assignment)."""
    made = _logging_classes.get(cls)
    if made is not None:
        return made
    def logged(handler: _Handler) -> _Handler:
        def handle(link: Debugged, packet: Any) -> None:
            if _allowed(link):
                link.log.info("debug {c} ({peer}): in {packet}", c=link.client_id,
                              peer=link.peer, packet=repr(packet)[:300])
            handler(link, packet)
        return handle

    handlers = {kind: logged(handler) for kind, handler
                in cls._connected_handlers.items()}  # type: ignore[attr-defined]
    made = type(cls.__name__, (cls,), {"__slots__": (),
                                       "_connected_handlers": handlers,
                                       "__module__": cls.__module__})
    _logging_classes[cls] = made
    _plain_classes[made] = cls
    return made


def sent(conn: Debugged, data: bytes) -> None:
    """``data`` is written to ``conn`` (called by its ``_emit`` when its class is
    not its own: a subclass, this module's while it is logged)."""
    if _allowed(conn):
        conn.log.info("debug {c} ({peer}): out {kind} ({n} bytes)", c=conn.client_id,
                      peer=conn.peer, kind=_frame_kind(data), n=len(data))


def debugged(conn: Debugged) -> bool:
    """``conn`` is being logged."""
    return conn in _windows


def start(conn: Debugged, until: float) -> None:
    """Log every packet in and out of ``conn`` until ``until`` (a new deadline
    only, if it is logged already)."""
    window = _windows.get(conn)
    timer = conn.clock.callLater(max(0.0, until - conn.clock.seconds()), conn.stop_debug)
    if window is not None:
        if window.timer.active():
            window.timer.cancel()
        window.timer = timer
        return   # already logging: a new deadline only
    _windows[conn] = _Logging(timer)
    conn.__class__ = _logging_class(type(conn))
    conn.log.info("debug logging of {c} ({peer}) on for {s:.0f}s", c=conn.client_id,
                  peer=conn.peer, s=until - conn.clock.seconds())


def stop(conn: Debugged) -> None:
    """Stop logging ``conn`` (its deadline came, or it closed)."""
    window = _windows.pop(conn, None)
    if window is None:
        return
    if window.timer.active():
        window.timer.cancel()
    conn.__class__ = _plain_classes[type(conn)]
    conn.log.info("debug logging of {c} ({peer}) ended", c=conn.client_id, peer=conn.peer)
