"""A confirmed (0.9.1) publish whose message leaves its queue without being consumed
(dropped or dead-lettered at its own append, expired into a dead-letter exchange,
dropped by x-max-length) is answered by the commit that holds it, never early when
the other messages of its batch are consumed first; and the early-answer entries
(``QueueLog.round_waits``, ``QueueLog.waiters``) of such messages do not pile up."""

from __future__ import annotations

from typing import Any

from exchange_facade import consume
from fakes import ManualStore
from queue_facade import make

from mqttamqp.core.broker import Broker
from mqttamqp.core.commits import CommitRound
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.model import QueueLog, Retention


def _msg(broker: Broker, payload: bytes, expiry: int | None = None) -> Message:
    props = None if expiry is None else MessageProperties(expiry_interval=expiry)
    return Message("", payload, 1, False, "pub", broker.clock.seconds(), props=props)


def _answers(r: Any) -> list[object]:
    assert isinstance(r, CommitRound)
    seen: list[object] = []
    r.when_answered(lambda outcome, _: seen.append(outcome), None)
    return seen


def _warm(broker: Broker, store: ManualStore, queue: str) -> tuple[Any, Any]:
    """A 0.9.1 consumer of ``queue`` (a classic group), its first delivery
    acknowledged and committed, so that what follows starts from a quiet queue."""
    session, link = consume(broker, queue)
    store.commit_all()
    broker.exchanges.publish(_msg(broker, b"warm"), "", queue)
    store.commit_all()
    broker.acknowledged(session, link.published()[-1][2])
    store.commit_all()
    link.calls.clear()
    return session, link


def _ack_all(broker: Broker, session: Any, link: Any) -> None:
    commits = broker.queues.commits
    commits.begin()
    for _, _, packet_id, *_ in link.published():
        broker.acknowledged(session, packet_id)
    commits.end()


def _round(broker: Broker, *messages: Message) -> list[object]:
    """Publish ``messages`` to ``q`` in one batch (one commit round); the round's
    answers, filled as they come."""
    commits = broker.queues.commits
    commits.begin()
    rounds = {id(r): r for _, r in (broker.exchanges.publish(m, "", "q", in_round=True)
                                    for m in messages)}
    assert len(rounds) == 1
    answers = _answers(next(iter(rounds.values())))
    commits.end()
    return answers


def _acked_then_committed(broker: Broker, store: ManualStore, session: Any, link: Any,
                          answers: list[object]) -> None:
    """Every delivery acknowledged: the round is still unanswered while its commit is
    pending, and answered by the commit."""
    _ack_all(broker, session, link)
    assert answers == [] and store.pending
    store.commit_all()
    assert answers == [None]


def test_a_dead_letter_at_its_own_append_keeps_the_round_for_the_commit() -> None:
    """x-max-length-bytes dead-letters a big message at its own append; the small
    one of the same batch is consumed before the commit: the batch's confirms still
    wait for the commit that holds the dead letter."""
    store = ManualStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    ex.declare_queue("dead", "c1", durable=True)
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-max-length-bytes": 100, "x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "dead"})
    session, link = _warm(broker, store, "q")
    answers = _round(broker, _msg(broker, b"B" * 200), _msg(broker, b"s"))
    assert [m.payload for m in broker.queues.queues["dead"].log.values()] == [b"B" * 200]
    assert [m.payload for m, *_ in link.published()] == [b"s"]
    _acked_then_committed(broker, store, session, link, answers)
    assert not broker.queues.queues["q"].round_waits


def test_a_publish_dead_lettered_at_its_own_append_waits_for_its_commit() -> None:
    """Outside a batch too: a publish dead-lettered at its own append has no
    early-answer entry; its Deferred fires at its commit, not once a later message
    is consumed."""
    store = ManualStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    ex.declare_queue("dead", "c1", durable=True)
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-max-length-bytes": 100, "x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "dead"})
    session, link = _warm(broker, store, "q")
    _, d = ex.publish(_msg(broker, b"B" * 200), "", "q")
    assert d is not None
    fired: list[object] = []
    d.addCallback(fired.append)
    ex.publish(_msg(broker, b"s"), "", "q")
    _ack_all(broker, session, link)
    assert fired == [] and store.pending
    store.commit_all()
    assert fired == [None] and broker.queues.queues["q"].waiters == {}


def test_a_round_message_expired_into_a_dead_letter_exchange_keeps_the_round() -> None:
    """A message of the batch expires (its own expiry) into the dead-letter exchange
    before it is delivered, the other is consumed: the confirms wait for the commit."""
    store = ManualStore()
    broker, clock, _ = make(store)
    ex = broker.exchanges
    ex.declare_queue("dead", "c1", durable=True)
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "dead"})
    session, link = _warm(broker, store, "q")
    link.congested = True                     # (takes nothing for now)
    answers = _round(broker, _msg(broker, b"short", expiry=1), _msg(broker, b"long"))
    clock.advance(2)
    link.congested = False
    broker.link_drained(session)
    assert [m.payload for m, *_ in link.published()] == [b"long"]
    assert [m.payload for m in broker.queues.queues["dead"].log.values()] == [b"short"]
    _acked_then_committed(broker, store, session, link, answers)


def test_a_round_message_dropped_by_max_length_keeps_the_round() -> None:
    """A later publish pushes the batch's first message out (x-max-length), the
    other is consumed: the batch's confirms wait for its commit."""
    store = ManualStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-max-length": 2})
    session, link = _warm(broker, store, "q")
    link.congested = True
    answers = _round(broker, _msg(broker, b"first"), _msg(broker, b"second"))
    ex.publish(_msg(broker, b"third"), "", "q")
    queue = broker.queues.queues["q"]
    assert [m.payload for m in queue.log.values()] == [b"second", b"third"]
    link.congested = False
    broker.link_drained(session)
    assert [m.payload for m, *_ in link.published()] == [b"second", b"third"]
    _acked_then_committed(broker, store, session, link, answers)


def test_a_round_purged_before_it_is_consumed_keeps_the_round() -> None:
    """queue.purge takes the batch's messages before any consumer had them; a later
    message is consumed: the batch's confirms wait for its commit."""
    store = ManualStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    session, link = _warm(broker, store, "q")
    link.congested = True
    answers = _round(broker, _msg(broker, b"first"), _msg(broker, b"second"))
    count, _ = broker.queues.purge_ready("q")
    assert count == 2
    ex.publish(_msg(broker, b"later"), "", "q")
    link.congested = False
    broker.link_drained(session)
    assert [m.payload for m, *_ in link.published()] == [b"later"]
    _acked_then_committed(broker, store, session, link, answers)


def test_round_entries_stay_bounded_when_every_append_is_dropped() -> None:
    """x-max-length 0 with a consumer group: a round per publish, each dropped at
    its append, leaves no early-answer entry behind, and each round is answered by
    its commit."""
    store = ManualStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-max-length": 0})
    consume(broker, "q")
    store.commit_all()
    commits = broker.queues.commits
    queue = broker.queues.queues["q"]
    for _ in range(200):
        commits.begin()
        _, r = ex.publish(_msg(broker, b"x"), "", "q", in_round=True)
        answers = _answers(r)
        commits.end()
        assert answers == []
        store.commit_all()
        assert answers == [None]
    assert len(queue.round_waits) == 0 and len(queue.log) == 0


def test_publish_waiters_stay_bounded_when_every_append_is_dropped() -> None:
    """The same outside a batch: no ``waiters`` entry per publish dropped at its
    append."""
    store = ManualStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-max-length": 0})
    consume(broker, "q")
    store.commit_all()
    for _ in range(200):
        ex.publish(_msg(broker, b"x"), "", "q")
        store.commit_all()
    assert broker.queues.queues["q"].waiters == {}


def test_unwait_takes_back_only_the_entry_covering_the_offset() -> None:
    """``unwait`` drops the one entry whose range (after the previous entry's last
    offset, up to its own) holds the offset, wherever it is (front, middle, back),
    none past the last; ``consumed_below`` releases from the front in order."""
    store = ManualStore()
    broker, _, _ = make(store)
    queue = QueueLog("q", Retention())
    rounds = [CommitRound(broker.queues.commits.log_failure) for _ in range(5)]
    for n, r in enumerate(rounds):
        queue.round_waits.append([n * 10 + 9, r])      # covers (n*10 - 1, n*10 + 9]
    queue.unwait(50)                     # (past every entry: nothing)
    assert [r for _, r in queue.round_waits] == rounds
    queue.unwait(25)                     # (the middle: the third round's)
    queue.unwait(0)                      # (the front)
    queue.unwait(49)                     # (the back, its last offset)
    assert [r for _, r in queue.round_waits] == [rounds[1], rounds[3]]
    early: list[Any] = []
    queue.consumed_below(19, early)      # (not past 19: nothing)
    assert early == []
    queue.consumed_below(40, early)
    assert early == [rounds[1], rounds[3]] and not queue.round_waits


def test_consumed_below_answers_each_waiter_below_once_either_walk() -> None:
    """``consumed_below`` hands ``early`` every ``waiters`` entry below ``upto``, in
    offset order, and keeps the others, whether it walks the trimmed offsets (waiters
    many) or the waiters (fewer waiters than offsets trimmed)."""
    for first, waiting, upto in ((0, [3, 1000, 7], 5000), (0, [0, 1, 2, 3, 9], 4),
                                 (10, [12, 15, 40], 20)):
        queue = QueueLog("q", Retention())
        queue.first = first
        made = {o: object() for o in waiting}
        queue.waiters.update(made)  # type: ignore[arg-type]
        early: list[Any] = []
        queue.consumed_below(upto, early)
        below = sorted(o for o in waiting if o < upto)
        assert early == [made[o] for o in below]
        assert sorted(queue.waiters) == sorted(o for o in waiting if o >= upto)
