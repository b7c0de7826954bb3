"""What routing answers: ``Published`` (what a publish did), the ``Gate`` that holds
an inbound QoS 2 message's deliveries until the publisher has its PUBREC, and the
SUBACK failure code.

What it owns: these value types and ``release_held`` (a commit stored QoS 2
deliveries: they may go out).  What it must not do: route.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqttamqp.core.commits import CommitRound
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Refusal
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.flow import Congestible
from mqttamqp.core.sessions.session import Session
from mqttamqp.records import final_record

__all__ = ["Gate", "Published", "ROUTED", "SUBSCRIBE_FAILURE", "release_held"]

SUBSCRIBE_FAILURE = 0x80

_NO_SESSIONS: tuple[Session, ...] = ()


class Gate:
    """The deliveries of one message routed with ``hold``: queued (and stored in
    the publish's commit) but not sent until ``open``, which the publisher's
    adapter calls once its acknowledgement (MQTT PUBREC) is out.  ``cancel`` (the
    commit failed) takes them back instead.  Whichever comes first wins."""

    __slots__ = ("_done", "_entries", "_later", "_message", "_qos0", "_undo")

    def __init__(self, message: Message) -> None:
        self._message = message
        self._entries: list[tuple[Session, OutEntry]] = []
        self._qos0: list[tuple[Session, bool, tuple[int, ...]]] = []
        self._later: list[Callable[[], None]] = []   # shared groups' backlogs
        self._undo: list[Callable[[], None]] = []
        self._done = False

    def later(self, call: Callable[[], None], undo: Callable[[], None]) -> None:
        """Call ``call`` at the opening (a shared group holds the message then), or
        ``undo`` if the gate is cancelled instead."""
        self._later.append(call)
        self._undo.append(undo)

    def add(self, session: Session, entry: OutEntry | None, retain: bool = False,
            subscription_ids: tuple[int, ...] = ()) -> None:
        """A gated QoS 1/2 ``entry`` of ``session``, or (None) a QoS 0 delivery with
        its retain flag (MQTT 5 retain as published) and subscription identifiers
        (the entry carries its own)."""
        if entry is None:
            self._qos0.append((session, retain, subscription_ids))
        else:
            self._entries.append((session, entry))

    def open(self) -> None:
        if self._done:
            return
        self._done = True
        for session, entry in self._entries:
            session.ungate(entry)
        message = self._message
        for session, retain, ids in self._qos0:
            session.deliver(message, 0, retain, ids)
        for call in self._later:
            call()
        self._entries = []
        self._qos0 = []
        self._later = []
        self._undo = []

    def cancel(self, failure: Failure) -> Failure:
        if not self._done:
            self._done = True
            for session, entry in self._entries:
                session.withdraw(entry)
            for undo in self._undo:
                undo()
            self._entries = []
            self._qos0 = []
            self._later = []
            self._undo = []
        return failure


@final_record
class Published:
    """What a publish did.

    ``durable``: fires once everything the publisher may be told is safe (None:
    nothing to wait for).  ``congested``: online subscribers it fed that are past
    their high-water mark (the publisher should stop being read for a while).
    ``denied``: the publisher may not publish there; nothing was routed.
    ``gate``: with ``hold``, what sends the deliveries (see ``Gate``).
    ``dropped``: deliveries refused by a subscriber's queue bound (counted only
    when asked, ``count_drops``, or while recording).
    ``refusal``: a durable queue refused the message or acknowledgement (why, and
    the MQTT 5 reason code); nothing was stored for it.
    ``blocked``: the durable queues are full on disk (``--queue-max-total-bytes``,
    ``--disk-free-limit``) or their appends wait for the writer past a bound: stop
    reading the publisher (AMQP: no more credit) and resume it through
    ``Broker.when_queues_writable``.
    ``waiter``: with ``early`` (MQTT QoS 1), what the acknowledgement waits for
    instead of ``durable`` (which is then None): the batch's ``CommitRound``
    (its ``when_answered``).
    """

    durable: Final[Deferred[None] | None]
    congested: Final[Sequence[Congestible]]
    denied: Final[bool]
    gate: Final[Gate | None]
    dropped: Final[int]
    refusal: Final[Refusal | None]
    blocked: Final[bool]
    waiter: Final[CommitRound | None]

    def __init__(self, durable: Deferred[None] | None = None,
                 congested: Sequence[Congestible] = _NO_SESSIONS, denied: bool = False,
                 gate: Gate | None = None, dropped: int = 0, refusal: Refusal | None = None,
                 blocked: bool = False, waiter: CommitRound | None = None) -> None:
        self.durable = durable
        self.congested = congested
        self.denied = denied
        self.gate = gate
        self.dropped = dropped
        self.refusal = refusal
        self.blocked = blocked
        self.waiter = waiter


#: Routed, nothing to wait for, nobody congested, nothing dropped: the one answer
#: ``Router.publish`` gives every such publish (most QoS 0 ones), so that callers
#: can tell it by identity, without reading its fields.
ROUTED: Final = Published()


def release_held(result: object, held: list[tuple[Session, int]]) -> object:
    for session, seq in held:
        session.release_held(seq)
    return result
