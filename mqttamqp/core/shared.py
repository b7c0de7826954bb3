"""Shared subscriptions: ``$share/<group>/<filter>`` (MQTT 5 §4.8.2; Mosquitto and
EMQX accept it from 3.1.1 clients too).

Every session subscribed to ``$share/g/f`` is a member of the group ``(g, f)``;
each message matching ``f`` goes to one member, chosen by the strategy
(``--share-strategy``): ``round-robin`` (the default), ``random``, ``sticky`` (the
same member while it is online) or ``hash-client`` (by the publisher's client id,
so one publisher's messages stay in order on one member).  Online members are
chosen first; only when none is online does a persistent member take QoS 1/2
messages into its queue (a clean or QoS 0 pick with nobody online drops nothing
that was promised: the message has no taker).

When a member goes away, its QoS 1 messages (queued or unacknowledged) and its
QoS 2 messages not yet sent move to another online member (``Router.member_left``);
a QoS 2 message already sent stays with its member, as the specification asks.
Retained messages are never sent on a shared subscription.

What this module owns: parsing, the groups and the choice of a member.  The
router owns the trie and the deliveries.
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["SHARE_PREFIX", "STRATEGIES", "SharedGroup", "parse_share", "route_filter",
           "Member"]


class Member(Protocol):
    """What a group needs of a member (a ``core.session.Session``)."""

    client_id: str
    persistent: bool

    @property
    def link(self) -> Any: ...


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
    """The members of one ``$share/<name>/<filter>`` and who got how many."""

    __slots__ = ("_next", "_sticky", "counts", "filter", "members", "name", "strategy")

    def __init__(self, name: str, topic_filter: str, strategy: str = "round-robin") -> None:
        self.name = name
        self.filter = topic_filter
        self.strategy = strategy
        self.members: dict[M, int] = {}     # member -> granted QoS, join order
        self.counts: dict[str, int] = {}          # client id -> messages given
        self._next = 0
        self._sticky: M | None = None

    @property
    def key(self) -> str:
        return f"{SHARE_PREFIX}{self.name}/{self.filter}"

    def join(self, session: M, qos: int) -> None:
        self.members[session] = qos

    def leave(self, session: M) -> None:
        self.members.pop(session, None)
        self.counts.pop(session.client_id, None)
        if self._sticky is session:
            self._sticky = None

    def pick(self, publisher: str | None, exclude: M | None = None
             ) -> tuple[M, int] | None:
        """The member to give the next message to (and its granted QoS), or None."""
        members = self.members
        online = [s for s in members if s.link is not None and s is not exclude]
        if not online:
            # Nobody online: a persistent member keeps it for later (QoS >= 1).
            online = [s for s in members if s.persistent and s is not exclude]
            if not online:
                return None
        strategy = self.strategy
        if strategy == "sticky":
            chosen = self._sticky
            if chosen is None or chosen not in online:
                chosen = self._sticky = online[self._next % len(online)]
                self._next += 1
        elif strategy == "random":
            chosen = random.choice(online)
        elif strategy == "hash-client" and publisher is not None:
            chosen = online[zlib.crc32(publisher.encode("utf-8", "replace")) % len(online)]
        else:
            chosen = online[self._next % len(online)]
            self._next += 1
        self.counts[chosen.client_id] = self.counts.get(chosen.client_id, 0) + 1
        return chosen, members[chosen]
