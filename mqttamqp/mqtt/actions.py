"""What an MQTT connection's decisions ask for: a small closed set of values.

``decisions`` returns these (or, where a broker call sits between two steps, the
plan for that call: ``Connecting``, ``Subscription``, an AUTH step's data; see
``decisions``), and the connection's own deadlines and read errors make them too;
``executor.ActionExecutor`` is the one place on the Twisted side that carries
them out (a delivery's PUBLISH or PUBREL, and a close the broker asks for, are
not actions: see ``executor``).  The set:

* ``Send(frame)``: write ``frame`` now (PINGRESP, an AUTH challenge);
* ``Ack(kind, frame, release, opens)``: an acknowledgement, sent in the order its
  packet came and once what the step before it made durable is (``after``: the
  Deferred the broker returned, handed to the executor beside the action);
  ``frame`` None is the plain 4-byte acknowledgement of ``kind`` for the packet's
  id; ``release``: it gives the packet id's MQTT 5 receive-maximum quota back
  once written; ``opens``: writing it opens the QoS 2 gate the broker returned
  (done even if the connection closed meanwhile);
* ``Close(reason, code, limit, frame)``: the client broke the protocol (the one
  disconnect, ``closing.Disconnects._violation``; ``frame``, if any, written
  first);
* ``Refuse(code, reason)``: CONNECT answered with a refusing CONNACK;
* ``Arm(deadline, seconds)``: start the connection's CONNECT or keepalive deadline;
* ``Goodbye(with_will, expiry)``: the client said DISCONNECT; its session ends;
* a core ``Message`` is the route action: it goes to the broker as it is (no
  wrapper, since the message is made anyway).

The actions of the hot path are made once here (``PUBACK``, ``PUBREC``,
``PUBCOMP`` and their variants, ``PINGRESP``): a QoS 0/1 PUBLISH and a PUBACK
cost no action object.  Since every connection shares those, every action is
immutable (``_Value``: setting an attribute raises).  What this module must not
do: import Twisted or the broker, or do anything; it only names what is to be done.
"""

from __future__ import annotations

import struct

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Pingresp, ReasonCode

__all__ = [
    "Ack", "Action", "Arm", "Close", "Goodbye", "PINGRESP", "PUBACK", "PUBACK_RELEASE",
    "PUBCOMP", "PUBCOMP_RELEASE", "PUBREC", "PUBREC_OPENS", "Refuse",
    "Send", "ack_frame", "pack_ack",
]


#: ``pack_ack(kind, 2, packet_id)``: ``ack_frame``'s bytes in one C call (half of
#: what ``bytes`` of a tuple of four costs; one per QoS 1 PUBLISH).
pack_ack = struct.Struct(">BBH").pack


def ack_frame(kind: int, packet_id: int) -> bytes:
    """PUBACK (0x40), PUBREC (0x50), PUBREL (0x62), PUBCOMP (0x70) without reason."""
    return pack_ack(kind, 2, packet_id)


_set = object.__setattr__


class _Value:
    """The actions' base: values that nothing may change once made (those of the
    hot path are made once and shared by every connection).  Setting or deleting
    an attribute raises; ``__init__`` sets them with ``object.__setattr__``.  A
    frozen dataclass would do the same; reading an attribute costs nothing more
    either way (a slot), and the shared ones are never made again."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable (setting {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable (deleting {name!r})")


class Send(_Value):
    """Write ``frame`` now."""

    __slots__ = ("frame",)
    frame: bytes

    def __init__(self, frame: bytes) -> None:
        _set(self, "frame", frame)

    def __repr__(self) -> str:
        return f"Send({self.frame!r})"


class Ack(_Value):
    """An acknowledgement in order, after the step's durable (see the module)."""

    __slots__ = ("frame", "kind", "opens", "release")
    kind: int
    frame: bytes | None
    release: bool
    opens: bool

    def __init__(self, kind: int, frame: bytes | None = None, release: bool = False,
                 opens: bool = False) -> None:
        _set(self, "kind", kind)
        _set(self, "frame", frame)
        _set(self, "release", release)
        _set(self, "opens", opens)

    def frame_for(self, packet_id: int) -> bytes:
        """The bytes to write for the packet ``packet_id``."""
        frame = self.frame
        return ack_frame(self.kind, packet_id) if frame is None else frame

    def __repr__(self) -> str:
        return (f"Ack({self.kind:#04x}, {self.frame!r}, release={self.release}, "
                f"opens={self.opens})")


class Close(_Value):
    """The client broke the protocol: close for ``reason`` (MQTT 5: with ``code``);
    ``limit``: the bound it went beyond, if that was it; ``frame``: written first
    (the refusing CONNACK of an MQTT 5 CONNECT that could not be read)."""

    __slots__ = ("code", "frame", "limit", "reason")
    reason: str
    code: int
    limit: str | None
    frame: bytes | None

    def __init__(self, reason: str, code: int = ReasonCode.PROTOCOL_ERROR,
                 limit: str | None = None, frame: bytes | None = None) -> None:
        _set(self, "reason", reason)
        _set(self, "code", code)
        _set(self, "limit", limit)
        _set(self, "frame", frame)

    def __repr__(self) -> str:
        return f"Close({self.reason!r}, {self.code:#04x})"


class Refuse(_Value):
    """Answer CONNECT with a refusal: ``code`` is a 3.1.1 return code or an MQTT 5
    reason code (a 3.1.1 one is translated for an MQTT 5 client); ``logged``: the
    reason was counted and logged already (rate-limited, by the broker)."""

    __slots__ = ("code", "logged", "reason")
    code: int
    reason: str
    logged: bool

    def __init__(self, code: int, reason: str, logged: bool = False) -> None:
        _set(self, "code", code)
        _set(self, "reason", reason)
        _set(self, "logged", logged)

    def __repr__(self) -> str:
        return f"Refuse({self.code:#04x}, {self.reason!r})"


class Arm(_Value):
    """Start the connection's ``deadline`` ("connect": CONNECT and the AUTH
    exchange; "keepalive": the first keepalive check) in ``seconds``."""

    __slots__ = ("deadline", "seconds")
    deadline: str
    seconds: float

    def __init__(self, deadline: str, seconds: float) -> None:
        _set(self, "deadline", deadline)
        _set(self, "seconds", seconds)

    def __repr__(self) -> str:
        return f"Arm({self.deadline!r}, {self.seconds!r})"


class Goodbye(_Value):
    """A client's DISCONNECT: whether its will is published all the same (MQTT 5,
    0x04), and the session expiry interval it set last (None: unchanged)."""

    __slots__ = ("expiry", "with_will")
    with_will: bool
    expiry: float | None

    def __init__(self, with_will: bool, expiry: float | None) -> None:
        _set(self, "with_will", with_will)
        _set(self, "expiry", expiry)

    def __repr__(self) -> str:
        return f"Goodbye(with_will={self.with_will}, expiry={self.expiry!r})"


# -- made once: the actions of the hot path ------------------------------------------

PUBACK = Ack(0x40)
PUBACK_RELEASE = Ack(0x40, release=True)
# Every action (``executor.ActionExecutor._carry_out``'s argument).
Action = Send | Ack | Close | Refuse | Arm | Goodbye

PUBREC = Ack(0x50)
PUBREC_OPENS = Ack(0x50, opens=True)
PUBCOMP = Ack(0x70)
PUBCOMP_RELEASE = Ack(0x70, release=True)
PINGRESP = Send(encode(Pingresp()))
