"""Shared subscriptions: ``$share/<group>/<filter>`` (MQTT 5 §4.8.2; Mosquitto and
EMQX accept it from 3.1.1 clients too).

Every session subscribed to ``$share/g/f`` is a member of the group ``(g, f)``;
each message matching ``f`` goes to one member, chosen by the strategy
(``--share-strategy``): ``round-robin`` (the default), ``random``, ``sticky`` (the
same member while it is online) or ``hash-client`` (by the publisher's client id,
so one publisher's messages stay in order on one member).

A QoS 1/2 message goes only to a member *with room* (``Session.has_room``: online,
and what it has in flight and queued below its in-flight window, its queue below
the high-water mark): a member that does not acknowledge is skipped, not fed until
its queue drops messages.  The strategy picks among the members with room
(``sticky`` and ``hash-client`` move on to the next member with room when theirs
has none).  When no member has room and the group has a persistent member, that
member *keeps* the message for the group: it is stored in its queue (committed
before the publisher's acknowledgement, as any persistent delivery) as a *loan*,
moved to the first member with room (``SharedGroups.keeper``, ``SharedGroups.drain``).  Else
the group holds the message in its *backlog*, in memory (bounded like a session's
queue, ``--max-queued-messages`` and ``--max-queued-bytes``, counting the QoS 2
messages promised to it at their PUBREC, ``pending``); past half of that bound the
group is congested and its publishers are not read (``core.flow``), and a new
message that still finds it full is dropped and counted (never one already
PUBREC'd).  As members acknowledge, the backlog goes to them, oldest first.  A QoS
0 message is never held (with no member with room it goes to the strategy's pick,
which drops it at its bound as usual).

When a member goes away its messages stay in the group:

* a session that ends (a clean one disconnecting, an AMQP receiver detaching, an
  expired or cleared session) gives back its QoS 1 messages, queued or unacknowledged,
  and its QoS 2 messages not yet sent: a persistent member keeps them (stored, in
  the commit that takes them from the leaving one), else they go to the front of
  the backlog (beyond its bound, which only new messages respect).  A QoS 2 message
  already sent never goes to another member (MQTT 5 §4.8.2): it is dropped and
  counted;
* a persistent session going offline keeps them, stored, as *loans* to the group: as
  other members have room they move there (removed from it and stored with the new
  member in one commit), its QoS 1 messages and its QoS 2 messages not yet sent; a
  QoS 2 message already sent stays with it, to be completed when it reconnects, as
  MQTT 5 §4.8.2 asks (so no QoS 2 message reaches two members).  What is left when it
  comes back is delivered to it;
* a member that unsubscribes gives back what it has queued for the group (what it
  has in flight it may still acknowledge), kept as above.

Retained messages are never sent on a shared subscription.

What this module owns: parsing, the groups, the choice of a member and the group's
backlog and loans.  The router owns the trie and the deliveries.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from mqttamqp.core.message import Message

__all__ = ["SHARE_PREFIX", "STRATEGIES", "SharedGroup", "parse_share", "route_filter",
           "Member"]


class Member(Protocol):
    """What a group needs of a member (a ``core.sessions.session.Session``)."""

    client_id: str
    persistent: bool

    @property
    def link(self) -> Any: ...

    def has_room(self, qos: int) -> bool: ...


M = TypeVar("M", bound=Member)

SHARE_PREFIX = "$share/"
STRATEGIES = ("round-robin", "random", "sticky", "hash-client")


def parse_share(topic_filter: str) -> tuple[str, str] | str | None:
    """``$share/g/f`` → ``(g, f)``; a filter that is not shared → None; a malformed
    shared filter → why (a str)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, sep, inner = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not group or not sep or not inner:
        return "a shared subscription is $share/<group>/<filter>"
    if "+" in group or "#" in group:
        return "a share group name may not hold + or #"
    if inner.startswith("$"):
        # ($SYS, $dynamic/ reply nodes, control addresses: never shared)
        return "a shared subscription's filter may not start with $"
    return group, inner


def route_filter(topic_filter: str) -> str:
    """The filter that topics are matched against: ``f`` of ``$share/g/f``."""
    if topic_filter.startswith(SHARE_PREFIX):
        shared = parse_share(topic_filter)
        if isinstance(shared, tuple):
            return shared[1]
    return topic_filter


class SharedGroup(Generic[M]):
    """The members of one ``$share/<name>/<filter>``, who got how many, and the
    messages the group holds (``backlog``) or has lent to offline members (``loans``)."""

    __slots__ = ("_next", "_sticky", "backlog", "backlog_bytes", "counts", "dropped",
                 "filter", "loans", "max_bytes", "max_messages", "members", "name",
                 "pending", "stalled", "strategy")

    def __init__(self, name: str, topic_filter: str, strategy: str = "round-robin",
                 max_messages: int = 1_000, max_bytes: int = 16 << 20) -> None:
        self.name = name
        self.filter = topic_filter
        self.strategy = strategy
        self.members: dict[M, int] = {}     # member -> granted QoS, join order
        self.counts: dict[str, int] = {}          # client id -> messages given
        self._next = 0
        self._sticky: M | None = None
        # Messages no member had room for, oldest first: (message, its QoS).
        self.backlog: deque[tuple[Message, int]] = deque()
        self.backlog_bytes = 0
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        # Entries (``core.sessions.entries.OutEntry``)
        # still held, stored, by offline persistent members, oldest first.
        self.loans: deque[tuple[M, Any]] = deque()
        self.dropped = 0          # new messages refused by a full backlog
        # Messages promised to the backlog once their publisher's PUBREC is out (a
        # gated QoS 2 publish): counted against its bound already.
        self.pending = 0
        self.stalled = False      # see ``over_high_water``

    @property
    def key(self) -> str:
        return f"{SHARE_PREFIX}{self.name}/{self.filter}"

    @property
    def client_id(self) -> str:
        """(What the flow control names a congested subscriber by.)"""
        return self.key

    def join(self, session: M, qos: int) -> None:
        self.members[session] = qos

    def leave(self, session: M) -> None:
        self.members.pop(session, None)
        self.counts.pop(session.client_id, None)
        if self._sticky is session:
            self._sticky = None

    # -- the backlog ----------------------------------------------------------------

    def over_high_water(self) -> bool:
        """The backlog is past half its bound: publishers feeding it should wait.
        Not while ``stalled``: no member took anything during a whole pause (the
        flow control's stall rule), so the backlog drops at its bound instead until
        a member takes a message again."""
        return not self.stalled and (
            (len(self.backlog) + self.pending) * 2 > self.max_messages
            or self.backlog_bytes * 2 > self.max_bytes)

    def full(self, message: Message) -> bool:
        """Would the backlog (with what is ``pending``) refuse ``message``?"""
        return (len(self.backlog) + self.pending >= self.max_messages
                or self.backlog_bytes + len(message.payload) > self.max_bytes)

    def hold(self, message: Message, qos: int, promised: bool = False) -> bool:
        """Keep a new message for later; False (counted) when the backlog is full.
        A ``promised`` one (counted in ``pending`` until now) is never refused: its
        publisher was told it is taken."""
        size = len(message.payload)
        if promised:
            self.pending -= 1
        elif self.full(message):
            self.dropped += 1
            return False
        self.backlog.append((message, qos))
        self.backlog_bytes += size
        return True

    def give_back(self, message: Message, qos: int) -> None:
        """A leaving member's message: first in line, whatever the bound (it was
        within the member's bound; only new messages are refused)."""
        self.backlog.appendleft((message, qos))
        self.backlog_bytes += len(message.payload)

    def take(self) -> tuple[Message, int]:
        """The oldest held message, out of the backlog."""
        message, qos = self.backlog.popleft()
        self.backlog_bytes -= len(message.payload)
        self.stalled = False
        return message, qos

    def put_back(self, message: Message, qos: int) -> None:
        """``take`` undone (nobody could have it after all)."""
        self.backlog.appendleft((message, qos))
        self.backlog_bytes += len(message.payload)

    # -- choosing a member ------------------------------------------------------------

    def pick(self, publisher: str | None, qos: int = 0, exclude: M | None = None,
             eligible: set[M] | None = None) -> tuple[M, int] | None:
        """The member to give the next message (of QoS ``qos``) to, and its granted
        QoS; None when the message must wait in the backlog (QoS 1/2 that no member
        has room for) or has no taker at all.  ``eligible``: only these sessions
        may take it (a message with no MQTT form: AMQP receivers)."""
        members = self.members
        online = [s for s in members if s.link is not None and s is not exclude
                  and (eligible is None or s in eligible)]
        if online:
            ready = [s for s in online if s.has_room(min(qos, members[s]))]
            if not ready:
                if qos:
                    return None    # held by the group until a member has room
                ready = online     # (QoS 0 is never held: the pick drops it at its bound)
            chosen = self._choose(publisher, online, ready)
        else:
            # Nobody online: a persistent member keeps it for later (QoS >= 1).
            ready = [s for s in members if s.persistent and s is not exclude
                     and (eligible is None or s in eligible)]
            if not ready:
                return None
            chosen = self._choose(publisher, ready, ready)
        self.counts[chosen.client_id] = self.counts.get(chosen.client_id, 0) + 1
        return chosen, members[chosen]

    def _choose(self, publisher: str | None, online: list[M], ready: list[M]) -> M:
        """The strategy's member among ``ready`` (a non-empty part of ``online``)."""
        strategy = self.strategy
        if strategy == "random":
            return random.choice(ready)
        if strategy == "sticky":
            chosen = self._sticky
            if chosen is None or chosen not in ready:
                chosen = self._sticky = _next_ready(online, ready, self._next)
                self._next += 1
            return chosen
        if strategy == "hash-client" and publisher is not None:
            start = zlib.crc32(publisher.encode("utf-8", "replace"))
            return _next_ready(online, ready, start)
        chosen = _next_ready(online, ready, self._next)
        self._next = online.index(chosen) + 1 if len(ready) < len(online) else self._next + 1
        return chosen


def _next_ready(online: list[M], ready: list[M], start: int) -> M:
    """The first member of ``ready`` in ``online`` from position ``start`` on
    (wrapping round)."""
    if len(ready) == len(online):
        return online[start % len(online)]
    wanted = set(ready)
    n = len(online)
    for i in range(n):
        candidate = online[(start + i) % n]
        if candidate in wanted:
            return candidate
    return ready[0]
