"""Drop and queue counts over every session: what $SYS, the console and the metrics
report as dropped (by protocol family) and queued.

What it owns: the drops of sessions that are gone (``retire``), the labels of drops
when a session changes protocol family (``relabel``: no metrics counter ever goes
down), and the totals, summed when asked (at ``$SYS`` intervals, never on the
publish path).

What it must not do: drop anything (sessions and shared groups count their own).
"""

from __future__ import annotations

from mqttamqp.core.routing.groups import SharedGroups
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import protocol_family

__all__ = ["DropCounts"]


class DropCounts:
    def __init__(self, sessions: dict[str, Session], link_subscribers: dict[str, Session],
                 groups: SharedGroups) -> None:
        self._sessions = sessions
        self._link_subscribers = link_subscribers
        self._groups = groups
        self.dropped_retired = 0  # drops of sessions that no longer exist
        self.congested_retired = 0  # of which QoS 0 dropped for a congested client
        # The same two, by protocol family ("mqtt", "amqp", "console"), for metrics.
        self._retired_by: dict[str, list[int]] = {}

    def congested_total(self) -> int:
        """Of ``dropped_total``: QoS 0 messages dropped for a client that did not read."""
        return (self.congested_retired
                + sum(s.dropped_congested for s in self._sessions.values())
                + sum(s.dropped_congested for s in self._link_subscribers.values()))

    def dropped_by_protocol(self) -> dict[str, tuple[int, int, int]]:
        """(dropped, of which congested, of which rejected) by the session's protocol
        family."""
        out = {k: (v[0], v[1], v[2]) for k, v in self._retired_by.items()}
        for session in (*self._sessions.values(), *self._link_subscribers.values()):
            family = protocol_family(session.protocol)
            dropped, congested, rejected = out.get(family, (0, 0, 0))
            d, c, r = _since_offset(session)
            out[family] = (dropped + d, congested + c, rejected + r)
        return out

    def relabel(self, session: Session, protocol: str) -> None:
        """``session`` is taken up by a client of another protocol family (an MQTT
        session through AMQP's ``.publish`` outlet): its drops so far stay labelled
        with the former one, so no counter of the metrics ever goes down."""
        if not session.protocol:   # (a new session: nothing counted under another)
            return
        old = protocol_family(session.protocol)
        if old == protocol_family(protocol):
            return
        d, c, r = _since_offset(session)
        if d or c or r:
            counts = self._retired_by.setdefault(old, [0, 0, 0])
            counts[0] += d
            counts[1] += c
            counts[2] += r
        session.drop_offset = (session.dropped, session.dropped_congested,
                               session.dropped_rejected)

    def retire(self, session: Session) -> None:
        """``session`` ends (its messages are cleared next): what it still has queued
        is never sent, so it is counted as dropped here, once; ``queued_total`` loses
        it in the same turn and received = sent + dropped + queued keeps holding.  A
        durable queue's deliveries (``receipt``) go back to their queue instead."""
        session.dropped += sum(1 for entry in session.queue if entry.receipt is None)
        self.dropped_retired += session.dropped
        self.congested_retired += session.dropped_congested
        counts = self._retired_by.setdefault(protocol_family(session.protocol), [0, 0, 0])
        d, c, r = _since_offset(session)
        counts[0] += d
        counts[1] += c
        counts[2] += r

    def queued_total(self) -> int:
        """Message copies routed to sessions and not yet written to a connection:
        the queues of every session, online or offline (QoS 1/2 beyond the in-flight
        window or the link's room, held for a commit or a publisher's PUBREC, and
        in-flight ones put back for redelivery).  QoS 0 is never queued (it goes out
        or is dropped at once).  One ``len`` per session: cheap at ``$SYS`` intervals,
        nothing on the publish path."""
        return (sum(len(s.queue) for s in self._sessions.values())
                + sum(len(s.queue) for s in self._link_subscribers.values())
                + self._groups.held())

    def dropped_total(self) -> int:
        return (self.dropped_retired + sum(s.dropped for s in self._sessions.values())
                + sum(s.dropped for s in self._link_subscribers.values())
                + self._groups.dropped())


def _since_offset(session: Session) -> tuple[int, int, int]:
    """A session's (dropped, congested, rejected) since it last changed protocol."""
    d, c, r = session.drop_offset
    return (session.dropped - d, session.dropped_congested - c, session.dropped_rejected - r)
