"""Selectors' parking: which member with credit takes an offset, and what no member
with credit selects (a queue member's selector, AMQP 1.0 filters): the base of
``Dispatch``.

An offset that every member with credit refused waits parked, with a sequence
number; each member remembers how far along the parked list it has refused
(``Member.parked_seen``), so that a member that gains credit or joins is offered
only what was parked since, and a refusal is remembered per member and offset
(``Member.skipped``): a parked message costs each member one selector call, not
one per hand-out or per acknowledgement.

What this module must not do: hand anything out (``Dispatch``) or store anything
(parking is in memory only: after a restart every offset is offered again)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from functools import partial

from mqttamqp.core.message import Message
from mqttamqp.core.queues.memory import MemoryBudget
from mqttamqp.core.queues.model import ConsumerGroup, Member
from mqttamqp.core.sessions.session import Session

__all__ = ["Parking"]


class Parking(MemoryBudget):
    """Members' credit and selectors, and the offsets no member with credit selects."""

    def _credit(self, member: Member) -> bool:
        session = member.session
        link = session.link
        if link is None or link.congested or session is self._leaving:
            return False
        prefetch = session.queue_prefetch or (
            min(self.limits.queue_prefetch, session.window) if member.qos
            else self.limits.queue_prefetch)
        if member.outstanding >= prefetch:
            return False   # (an acknowledgement pumps its group again)
        if session.queue:   # (``has_queued``)
            # (passed over while entries wait there: fed again once they are out,
            # ``InflightWindow.queue_waiting``; nothing else would, on a quiet queue)
            if session.queue_waiting is None:
                self._refused_by(session)
            return False
        return True

    def _refused_by(self, session: Session) -> None:
        """``session`` refused a delivery (it would have waited over its bound), or
        was passed over while entries waited there: once its window frees with
        nothing queued there, its groups are pumped again
        (``InflightWindow.queue_waiting``)."""
        if session.queue_waiting is None:
            session.queue_waiting = partial(self._feed_again, session)

    def _window_freed(self, session: Session) -> None:
        """A queue's delivery was taken back from ``session`` (released, rejected,
        given back, timed out): a slot of its window may be free, so what waits in
        its queue goes, then its groups are fed if one refused it or passed it over
        (as ``InflightWindow._finish`` does after an acknowledgement)."""
        if session is not self._leaving:
            session.pump()
            if session.queue_waiting is not None:
                session.feed_queues()

    def _feed_again(self, session: Session) -> None:
        raise NotImplementedError   # (``Dispatch``'s: its groups pumped)

    def _room(self, member: Member) -> int:
        """How many more ``member`` may take now (0: no credit, as ``_credit``)."""
        if not self._credit(member):
            return 0
        session = member.session
        prefetch = session.queue_prefetch or (
            min(self.limits.queue_prefetch, session.window) if member.qos
            else self.limits.queue_prefetch)
        return prefetch - member.outstanding

    def _next_member(self, group: ConsumerGroup, offset: int) -> Member | bool:
        """The next member with credit that takes ``offset`` (round-robin); False
        when no member has credit, True when some have but none selects it."""
        members = group.members
        n = len(members)
        credited = False
        for i in range(n):
            member = members[(group._rr + i) % n]
            if self._credit(member):
                selector = member.selector
                if selector is not None and not self._selects(member, selector, group,
                                                              offset):
                    credited = True
                    continue
                group._rr = (group._rr + i + 1) % n
                return member
        return credited

    def _next_other(self, group: ConsumerGroup, offset: int,
                    refused: list[Member]) -> Member | bool:
        """``_next_member`` past the members whose session refused a delivery in this
        pump (``refused``: offered again, each would refuse again): False when no
        other member has credit."""
        members = group.members
        n = len(members)
        credited = False
        for i in range(n):
            member = members[(group._rr + i) % n]
            if member in refused or not self._credit(member):
                continue
            selector = member.selector
            if selector is not None and not self._selects(member, selector, group, offset):
                credited = True
                continue
            group._rr = (group._rr + i + 1) % n
            return member
        return credited

    def _wanted(self, group: ConsumerGroup, offset: int, refused: list[Member]) -> bool:
        """Does a member that refused a delivery in this pump (``refused``) take
        ``offset``: no selector, or one that selects it?"""
        for member in refused:
            selector = member.selector
            if selector is None or self._selects(member, selector, group, offset):
                return True
        return False

    @staticmethod
    def _selects(member: Member, selector: Callable[[Message], bool], group: ConsumerGroup,
                 offset: int) -> bool:
        """Does ``member``'s selector take ``offset``?  A refusal is remembered (the
        message and the selector never change): a message parked for others is
        tested once per member, not at every pump."""
        skipped = member.skipped
        if offset in skipped:
            return False
        if selector(group.queue.log[offset]):
            return True
        if len(skipped) >= 2 * len(group.parked) + 64:
            # (forget what is no longer parked: acknowledged by others, or gone)
            parked = set(group.parked)
            parked.update(group.ready)
            if group.levels is not None:
                parked.update(group.levels)
            skipped.intersection_update(parked)
        skipped.add(offset)
        return False

    def _parked_unseen(self, group: ConsumerGroup) -> bool:
        """A member with credit has not refused every parked offset (it joined since,
        or had no credit when some were parked).  Not otherwise: a walk over every
        parked offset at each hand-out made 4,000 of them cost seconds."""
        last = group.parked_next
        for member in group.members:
            if member.parked_seen < last and self._credit(member):
                return True
        return False

    def _offer_parked(self, group: ConsumerGroup) -> None:
        """Each member with credit is offered what was parked since it last refused
        all (``parked[seen:]``, by sequence number), as far as it has room: what it
        selects goes through ``ready`` (or its level) again, the rest stays parked
        and is not looked at again by members that refused it (a member that
        selects many parked offsets is offered the next ones as it gains credit,
        not all of them at every acknowledgement).  Offsets no longer there are
        dropped."""
        parked = group.parked
        seqs = group.parked_seqs
        last = group.parked_next
        log = group.queue.log
        done = group.done
        evicted = group.queue.evicted
        out: set[int] = set()     # (indexes into ``parked``)
        for member in group.members:
            seen = member.parked_seen
            if seen >= last:
                continue
            room = self._room(member)
            if not room:
                continue
            selector = member.selector
            seen = last
            for i in range(bisect_left(seqs, member.parked_seen), len(parked)):
                if i in out:
                    continue
                offset = parked[i]
                if offset not in log or offset in done:
                    out.add(i)                   # (gone meanwhile: dropped)
                    continue
                if selector is None:
                    takes = True
                elif evicted and offset in evicted:
                    takes = offset not in member.skipped   # (tested once read back)
                else:
                    takes = self._selects(member, selector, group, offset)
                if takes:
                    out.add(i)
                    group.requeue(offset)
                    room -= 1
                    if not room:
                        seen = seqs[i] + 1   # (what follows: when it has room again)
                        break
            member.parked_seen = seen
        if out:
            group.parked = [o for i, o in enumerate(parked) if i not in out]
            group.parked_seqs = [q for i, q in enumerate(seqs) if i not in out]

    def _park(self, group: ConsumerGroup, offset: int) -> None:
        """Every member with credit refused ``offset``: it waits parked; those
        members, if they had refused all parked before, still have."""
        parked = group.parked
        if len(parked) >= 2 * len(group.queue.log) + 64:
            # (what left the queue while parked, dropped: the list stays bounded)
            log = group.queue.log
            done = group.done
            keep = [i for i, o in enumerate(parked) if o in log and o not in done]
            group.parked = parked = [parked[i] for i in keep]
            seqs = group.parked_seqs
            group.parked_seqs = [seqs[i] for i in keep]
        seq = group.parked_next
        parked.append(offset)
        group.parked_seqs.append(seq)
        group.parked_next = seq + 1
        for member in group.members:
            if member.parked_seen == seq and self._credit(member):
                member.parked_seen = seq + 1
