"""The MQTT connection's rules, sans-IO: packets and time in, decisions out.

What it owns:

* ``ConnectionState`` and every transition of it (``_TRANSITIONS``): awaiting
  CONNECT → (authenticating: an MQTT 5 AUTH exchange) → connecting
  (authentication and the session's commit pending) → connected → closed;
* which packet a client may send in which state (``ConnectionRules.check``), as
  the reason for the one disconnect when it may not;
* the keepalive rule (``Keepalive``): silent for 1.5 × keepalive means gone, and
  silence while the broker itself is not reading does not count;
* the acknowledgement order (``AckQueue``): an acknowledgement that promises
  durability waits for its commit, and acknowledgements leave in the order their
  packets arrived, with a bound past which the client is not read;
* the string rules beyond the wire format (``StringRules``): control characters,
  topic levels and length, and which topic filters are valid — each broken one
  is a protocol violation.

What it must not do: touch a transport, a timer or the broker (it imports no
Twisted: ``.importlinter`` checks it).  ``protocol.py`` owns the socket, arms the
timers these rules ask for (on ``deadlines.Deadlines``), and turns their decisions
into writes and closes; everything here is tested without either.
"""

from __future__ import annotations

import re
from collections.abc import Callable, MutableSequence
from enum import Enum
from typing import Any, cast

from mqttamqp.core.limits import Limits
from mqttamqp.core.topics import topic_size_problem, validate_topic_filter
from mqttamqp.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingresp,
    Suback,
    Unsuback,
)
from mqttamqp.native import mypyc_attr

__all__ = [
    "ConnectionState", "ConnectionRules", "IllegalTransition", "Keepalive", "AckQueue",
    "MAX_PENDING_ACKS", "StringRules",
]

# C0 and C1 control characters (U+0000 is the codec's: malformed under 3.1.1).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

# Acknowledgements one connection may have waiting on commits before it is not read.
MAX_PENDING_ACKS = 1000

# Packets only a server sends: a client sending one breaks the protocol.
_SERVER_ONLY = (Connack, Suback, Unsuback, Pingresp)


class ConnectionState(Enum):
    AWAITING_CONNECT = "awaiting-connect"  # socket open, no CONNECT yet (timer running)
    AUTHENTICATING = "authenticating"      # MQTT 5 CONNECT with a method: AUTH exchange
    CONNECTING = "connecting"              # CONNECT read; auth and session commit pending
    CONNECTED = "connected"                # CONNACK sent; packets flow
    CLOSED = "closed"                      # closing or closed; input is ignored

    # Members are singletons compared by identity: hash them by identity in C.
    # (``Enum.__hash__`` is Python, ``hash(self._name_)``: two calls per transition,
    # ~1.5 % of a connect storm's CPU under cProfile.)
    __hash__ = object.__hash__


# (event, from) -> to.  "close" is allowed from every state (and again once closed).
_TRANSITIONS: dict[tuple[str, ConnectionState], ConnectionState] = {
    ("connect", ConnectionState.AWAITING_CONNECT): ConnectionState.CONNECTING,
    ("authenticate", ConnectionState.AWAITING_CONNECT): ConnectionState.AUTHENTICATING,
    ("connect", ConnectionState.AUTHENTICATING): ConnectionState.CONNECTING,
    ("accepted", ConnectionState.CONNECTING): ConnectionState.CONNECTED,
    **{("close", state): ConnectionState.CLOSED for state in ConnectionState},
}


@mypyc_attr(native_class=False, allow_interpreted_subclasses=True)
class IllegalTransition(RuntimeError):
    """A transition the table does not allow: a bug in the caller, not the client."""


@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectionRules:
    """The state of one MQTT connection and what the client may send in it."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = ConnectionState.AWAITING_CONNECT

    def advance(self, event: str) -> ConnectionState:
        new = _TRANSITIONS.get((event, self.state))
        if new is None:
            raise IllegalTransition(f"{event} is not allowed while {self.state.value}")
        self.state = new
        return new

    @property
    def reading(self) -> bool:
        """Packets are taken from the decoder (not while connecting or closed)."""
        state = self.state
        return state in (ConnectionState.CONNECTED, ConnectionState.AWAITING_CONNECT,
                         ConnectionState.AUTHENTICATING)

    @property
    def closed(self) -> bool:
        return self.state is ConnectionState.CLOSED

    def check(self, packet: Any) -> str | None:
        """Why ``packet`` breaks the protocol in this state, or None if it may come."""
        kind = type(packet)
        if self.state is ConnectionState.AWAITING_CONNECT:
            if kind is not Connect:
                return f"first packet must be CONNECT, got {kind.__name__.upper()}"
            return None
        if self.state is ConnectionState.AUTHENTICATING and kind not in (Auth, Disconnect):
            return (f"{kind.__name__.upper()} during the authentication exchange (only AUTH "
                    "may follow a CONNECT with an authentication method)")
        if kind is Connect:
            return "second CONNECT on one connection"
        if kind in _SERVER_ONLY:
            return f"a client may not send {kind.__name__.upper()}"
        return None


class Keepalive:
    """MQTT keepalive: a client silent for 1.5 × ``keepalive`` seconds is gone."""

    __slots__ = ("limit", "seconds")

    def __init__(self, keepalive: int) -> None:
        self.seconds = keepalive
        self.limit = keepalive * 1.5

    @staticmethod
    def of(keepalive: int) -> Keepalive:
        """The one shared ``Keepalive`` for ``keepalive`` seconds (it is immutable:
        one per value, not one of 40 bytes per connection)."""
        rule = _KEEPALIVES.get(keepalive)
        if rule is None:
            rule = _KEEPALIVES[keepalive] = Keepalive(keepalive)
        return rule

    def next_check(self, now: float, last_activity: float, reading_paused: bool
                   ) -> float | None:
        """Seconds until the next check, or None if the client has been silent too
        long.  While the broker does not read (back-pressure) the client's packets
        wait in the socket, so its silence is the broker's: check a full period
        later."""
        if reading_paused:
            return self.limit
        idle = now - last_activity
        if idle >= self.limit:
            return None
        return self.limit - idle

    def expired_reason(self, now: float, last_activity: float) -> str:
        return (f"keepalive expired (no packet for {now - last_activity:.1f}s, "
                f"limit {self.limit:g}s)")


# (bounded: MQTT's keepalive is a 16-bit number of seconds)
_KEEPALIVES: dict[int, Keepalive] = {}

# (typed a ``MutableSequence``, not a ``list``: a build compiled with mypyc checks
# that a value typed ``list`` is one; the tuple is not)
_NO_ENTRIES = cast("MutableSequence[list[Any]]", ())


class AckQueue:
    """Acknowledgements in the order their packets arrived, each sent only once
    whatever it promises is durable.

    ``add`` returns a handle for an acknowledgement that must wait; ``ready``
    marks it durable.  ``take`` hands out, in order, every acknowledgement whose
    turn has come (all before it are ready too), with what to do once it is
    written (``after``) and whether that must be done even if the connection is
    closed by then (``essential``: delivering a committed QoS 2 message).
    ``add_waiting`` joins consecutive acknowledgements that wait on the same
    batch ``CommitRound`` (one socket read's QoS 1 PUBACKs) into one entry: one frame
    of them all, made ready once.  The bound counts acknowledgements, joined ones
    included.
    """

    __slots__ = ("_entries", "_waiter", "count")

    def __init__(self) -> None:
        # A list, not a deque: an empty deque is 760 bytes, one per connection, and
        # ``take_flagged`` removes its run of ready entries in one slice anyway.
        # The shared empty tuple until the first entry (an empty list is 56 bytes,
        # and most connections never wait for a commit).
        self._entries: MutableSequence[list[Any]] = _NO_ENTRIES
        # Acknowledgements waiting (an entry may hold several); 0 exactly when
        # ``empty`` (read on the hot path instead of the properties).
        self.count = 0
        self._waiter: object = None   # what the last entry joins on (``add_waiting``)

    def __len__(self) -> int:
        return self.count

    @property
    def empty(self) -> bool:
        return not self._entries

    @property
    def over_bound(self) -> bool:
        """Too many waiting: stop reading the client until commits catch up."""
        return self.count > MAX_PENDING_ACKS

    @property
    def under_resume_mark(self) -> bool:
        return self.count <= MAX_PENDING_ACKS // 2

    def add(self, frame: bytes, after: Callable[[], None] | None, ready: bool,
            essential: bool = False) -> list[Any]:
        entry: list[Any] = [ready, frame, after, essential, 1]
        if self._entries is _NO_ENTRIES:
            self._entries = [entry]
        else:
            self._entries.append(entry)
        self.count += 1
        self._waiter = None
        return entry

    def add_waiting(self, frame: bytes, waiter: object) -> list[Any] | None:
        """An acknowledgement (no ``after``) that waits on ``waiter``: joined to the
        last entry if that waits on the same one and is not ready (None: that
        entry's readiness covers it), else a new entry, returned."""
        entries = self._entries
        if waiter is self._waiter and entries and not entries[-1][0]:
            last = entries[-1]
            last[1] += frame
            last[4] += 1
            self.count += 1
            return None
        entry = self.add(frame, None, False)
        self._waiter = waiter
        return entry

    @staticmethod
    def ready(entry: list[Any]) -> None:
        entry[0] = True

    def take(self) -> list[tuple[bytes, Callable[[], None] | None]]:
        return [(frame, after) for frame, after, _ in self.take_flagged()]

    def take_flagged(self) -> list[tuple[bytes, Callable[[], None] | None, bool]]:
        """``take``, with each entry's ``essential`` flag."""
        entries = self._entries
        n = 0
        count = 0
        for entry in entries:
            if not entry[0]:
                break
            n += 1
            count += entry[4]
        if not n:
            return []
        out = [(frame, after, essential)
               for _, frame, after, essential, _ in entries[:n]]
        self.count -= count
        if n == len(entries):
            self._entries = _NO_ENTRIES
            self._waiter = None
        else:
            del entries[:n]
        return out

    def clear(self) -> None:
        self._entries = _NO_ENTRIES
        self.count = 0
        self._waiter = None


# The one empty queue every connection starts with (most never wait for a commit: an
# AckQueue of their own would be 48 bytes each); ``add`` is never called on it: the
# connection makes its own first (``executor._ack``).
NO_ACKS = AckQueue()


class StringRules:
    """What MQTT strings the broker accepts beyond the wire format; each method
    returns why a string breaks the rules (a protocol violation), or None.

    * control characters U+0001-U+001F and U+007F-U+009F in client ids, user names,
      will topics, topic names and filters (unless ``allow_control_chars``);
    * topic names and filters of more than ``max_topic_levels`` levels or
      ``max_topic_length`` UTF-8 bytes;
    * topic filters with misplaced wildcards (``a/+b``, ``a/#/b``).
    """

    __slots__ = ("_control", "_length", "_levels", "short_topic")

    def __init__(self, limits: Limits) -> None:
        self._control = not limits.allow_control_chars
        self._levels = limits.max_topic_levels
        self._length = limits.max_topic_length
        # A printable topic name of at most this many characters breaks no rule of
        # ``topic`` (its guards, below): a caller may skip the call for one.
        self.short_topic = min(self._levels - 1, self._length // 4)

    def text(self, value: str, what: str) -> str | None:
        """A client id or user name."""
        if self._control and not value.isprintable():
            m = _CONTROL.search(value)
            if m is not None:
                return f"{what} contains control character U+{ord(m.group()):04X}"
        return None

    def topic(self, topic: str, what: str) -> str | None:
        """A topic name (PUBLISH, will): control characters, levels, length."""
        if self._control and not topic.isprintable():
            m = _CONTROL.search(topic)
            if m is not None:
                return f"{what} contains control character U+{ord(m.group()):04X}"
        n = len(topic)   # (the guards, inline: this runs for every PUBLISH)
        if n >= self._levels or n * 4 > self._length:
            return topic_size_problem(topic, self._levels, self._length, what)
        return None

    def filter(self, topic_filter: str, what: str) -> str | None:
        """A topic filter (SUBSCRIBE, UNSUBSCRIBE): the topic rules and wildcards."""
        problem = self.topic(topic_filter, what)
        if problem is not None:
            return problem
        problem = validate_topic_filter(topic_filter)
        if problem is not None:
            return f"{what} {topic_filter!r} is invalid: {problem}"
        return None
