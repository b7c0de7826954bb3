"""A 0.9.1 channel's publisher confirms (``confirm.select``): which publishes are
kept, and the ``basic.ack``/``basic.nack`` frames that say so.

What it owns: the confirm state of each publish number (waiting, kept, refused),
sent in order, a run of kept ones as one ``basic.ack`` with ``multiple`` (a
commit of 100 publishes is one frame), a refused one as a ``basic.nack``; and
how a publish waits: on the Deferred of its durable copies, or, for a copy to
one queue inside a batch, on the batch's ``CommitRound`` (``core.commits``),
one callback per round and channel for all of that round's publishes.  A
confirm never goes before the commit that holds the message, unless every
consumer finished it first (the queue's early answer: its Deferred, or the
round's ``when_answered`` once every append of the round was finished).

What it must not do: route or store (``Channel.published``, the core), or send
anything while the channel closes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pamqp import commands
from twisted.python.failure import Failure

from mqttamqp.amqp091.hosts import ChannelHost
from mqttamqp.core.commits import CommitRound

__all__ = ["PublisherConfirms"]

B = commands.Basic


class PublisherConfirms:
    """The confirm half of ``Channel`` (a base of it)."""

    connection: ChannelHost
    closing: bool
    confirms: OrderedDict[int, bool | None]
    _ack_due: int
    _round: CommitRound | None
    _round_seqs: list[int]

    def _send(self, method: Any) -> None:
        raise NotImplementedError   # (``Channel._send``)

    def _confirm_failed(self, failure: Failure, seq: int) -> None:
        self._confirmed(None, seq, False)

    def _confirm_in_round(self, r: CommitRound, seq: int) -> None:
        """Publish ``seq`` waits on commit round ``r``: one callback per round and
        channel for all of the round's publishes, not a Deferred each."""
        if r is self._round:
            self._round_seqs.append(seq)
            return
        self._round = r
        seqs = self._round_seqs = [seq]
        r.when_answered(self._round_confirmed, seqs)

    def _round_confirmed(self, outcome: Failure | None, seqs: list[int]) -> None:
        """The commit holding publishes ``seqs`` succeeded (``outcome`` None) or
        failed: every one of them is kept, or none."""
        if self._round_seqs is seqs:
            self._round = None
        confirms = self.confirms
        if self.closing:
            return
        ok = outcome is None
        if (ok and confirms and seqs[-1] - seqs[0] + 1 == len(seqs)
                and next(iter(confirms)) == seqs[0]):
            # (the usual case: the round's publishes, in a row, are the oldest not
            # confirmed — the keys are every number from the oldest on, since only
            # ``_send_confirms`` takes them, from the front — so they go at once)
            popitem = confirms.popitem
            for _ in seqs:
                popitem(False)
            self._send_confirms(seqs[-1])
            return
        for seq in seqs:
            if seq in confirms:
                confirms[seq] = ok
        self._send_confirms()

    def _confirmed(self, _: object, seq: int, ok: bool) -> None:
        """Publish ``seq`` is kept (``ok``) or not (``_send_confirms``)."""
        confirms = self.confirms
        if seq not in confirms or self.closing:
            return
        confirms[seq] = ok
        self._send_confirms()

    def _send_confirms(self, acked: int = 0) -> None:
        """Confirms go in order: one ``basic.ack`` with ``multiple`` for the run
        done in a row, sent once the commit's other waits have fired too
        (``_ack_later``: a commit of 100 messages is one ack, not 100); a failed
        one is a ``basic.nack`` at once, after the acks before it.  ``acked``: the
        publishes up to it were kept and taken off already."""
        confirms = self.confirms
        while confirms:
            first, state = confirms.popitem(False)
            if state is None:
                confirms[first] = None
                confirms.move_to_end(first, False)   # (back in front: still waiting)
                break
            if state:
                acked = first
                continue
            self._send_ack_due()
            if acked:
                self._send(B.Ack(acked, multiple=True))
                acked = 0
            self._send(B.Nack(first, multiple=False, requeue=False))
        if acked:
            if not self._ack_due:
                self.connection.call_soon(self._send_ack_due)
            self._ack_due = acked

    def _send_ack_due(self) -> None:
        acked, self._ack_due = self._ack_due, 0
        if acked and not self.closing:
            self._send(B.Ack(acked, multiple=True))
