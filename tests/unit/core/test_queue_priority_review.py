"""Review findings on queue priorities and selectors (issue 30), each counted, not
timed: basic.get over the memory budget, parked messages looked at again only by
members that have not refused them, level heaps bounded with a true lag, takeovers
within the prefetch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fakes import ManualMemoryStore, MemoryStore
from queue_facade import client, got, join, make, meta, send

from mqttamqp.core.broker import Broker
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import PutQueueGroup
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.queues.dispatch import Dispatch
from mqttamqp.core.queues.memory import READ_MESSAGES
from mqttamqp.core.queues.model import Retention


def _rules(top: int | None, count: int | None = None) -> Any:
    return (("jobs", None, None, count, top),)


def _send(broker: Broker, payload: bytes, priority: int | None) -> Any:
    return broker.publish(Message("$queue/jobs/k", payload, 1, False, "p",
                                  broker.clock.seconds(), priority=priority))


def _payload_is(*wanted: bytes) -> Callable[[Message], bool]:
    return lambda message: message.payload in wanted


def _counting_selects(monkeypatch: Any) -> list[int]:
    """Count every look of a member's selector at an offset."""
    looks = [0]
    real = Dispatch._selects

    def counted(member: Any, selector: Any, group: Any, offset: int) -> bool:
        looks[0] += 1
        return real(member, selector, group, offset)
    monkeypatch.setattr(Dispatch, "_selects", staticmethod(counted))
    return looks


def test_basic_get_on_a_priority_queue_over_the_budget_reads_back_by_level() -> None:
    """basic.get on a priority queue whose bodies are mostly in storage takes every
    message by level, with one empty answer per read-back batch, not one per message
    (what was read back is protected for the getter and not evicted again)."""
    store = MemoryStore()
    broker, _, _ = make(store, queue_memory_budget=32 * 1024, queue_rules=_rules(9))
    sent = [(b"%03d-" % i + b"x" * 1000, (i * 7) % 10) for i in range(200)]
    for payload, priority in sent:
        _send(broker, payload, priority)
    assert len(broker.queues.queues["jobs"].evicted) > 100
    getter, link = client(broker, "getter")
    taken = empties = 0
    for _ in range(1000):
        answer = broker.queues.take_one("jobs", getter, 0)
        assert answer is not None
        if answer[0]:
            taken += 1
        else:
            empties += 1
        if taken == len(sent):
            break
    assert taken == len(sent)
    assert [p for _, p in got(link)] == [p for p, _ in sorted(sent, key=lambda s: -s[1])]
    assert empties <= len(sent) // READ_MESSAGES + 2
    assert len(store.reads) == empties


def test_parked_messages_are_offered_only_to_members_that_have_not_refused_them(
        monkeypatch: Any) -> None:
    """Two selective members, 400 messages neither selects: a member at its prefetch
    while one more is parked is offered only that one when it gains credit, not the
    whole parked list again (each cycle costs a few selector looks)."""
    broker, _, _ = make(queue_prefetch=1)
    red, red_link = client(broker, "red")
    green, _ = client(broker, "green")
    join(broker, red, "$queue/jobs/#", consumer=Consumer("g", selector=_payload_is(b"red")))
    join(broker, green, "$queue/jobs/#",
         consumer=Consumer("g", selector=_payload_is(b"green")))
    for _ in range(400):
        send(broker, "$queue/jobs/k", b"blue")
    looks = _counting_selects(monkeypatch)
    for _ in range(50):
        send(broker, "$queue/jobs/k", b"red")      # (red takes it: no credit left)
        send(broker, "$queue/jobs/k", b"blue")     # (parked while red is full)
        (_, _, pid, _, _) = red_link.published()[-1]
        broker.acknowledged(red, pid)              # (credit again: one new to refuse)
    assert [p for _, p in got(red_link)] == [b"red"] * 50
    assert looks[0] <= 4 * 50
    group = broker.queues.queues["jobs"].groups["g"]
    assert len(group.parked) == 450 and group.lag() == 450


def test_a_member_that_joins_is_offered_every_parked_message_in_order() -> None:
    """What two selective members refused waits parked: a plain member that joins
    later gets all of it, in publish order, and nothing stays parked."""
    broker, _, _ = make(queue_prefetch=1000)
    red, _ = client(broker, "red")
    join(broker, red, "$queue/jobs/#", consumer=Consumer("g", selector=_payload_is(b"red")))
    for i in range(20):
        send(broker, "$queue/jobs/k", b"blue-%d" % i)
    plain, plain_link = client(broker, "plain")
    join(broker, plain, "$queue/jobs/#", consumer=Consumer("g"))
    assert [p for _, p in got(plain_link)] == [b"blue-%d" % i for i in range(20)]
    assert broker.queues.queues["jobs"].groups["g"].parked == []


def test_level_heaps_stay_bounded_under_retention_and_lag_counts_what_waits() -> None:
    """A priority queue dropping its oldest (max 10 messages) while its only
    member holds one: the lower level's heap does not keep every dropped offset,
    and the lag is what waits (the log less the one held)."""
    broker, _, _ = make(queue_prefetch=1, queue_rules=_rules(9, count=10))
    worker, _ = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    for i in range(4000):
        _send(broker, b"m%d" % i, 9 if i % 2 else 0)
    queue = broker.queues.queues["jobs"]
    group = next(iter(queue.groups.values()))
    assert group.levels is not None
    assert group.levels.count <= 2 * len(queue.log) + 64
    assert group.levels.compactions > 0
    assert group.lag() == len(queue.log) - len(group.pending) == 10
    assert sum(len(h) for h in group.levels.heaps) == group.levels.count == 10


def test_a_purge_of_ready_messages_leaves_a_true_lag() -> None:
    """After a 0.9.1-style purge of what no consumer holds, a priority group's lag
    is what is left: none, the held message aside."""
    broker, _, _ = make(queue_prefetch=1, queue_rules=_rules(9))
    worker, _ = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    for i in range(30):
        _send(broker, b"m%d" % i, i % 10)
    count, _ = broker.queues.purge_ready("jobs")
    assert count == 29
    group = broker.queues.queues["jobs"].groups[next(iter(broker.queues.queues["jobs"]
                                                          .groups))]
    assert group.lag() == 0 and len(group.pending) == 1


def test_a_takeover_with_selectors_stays_within_the_prefetch() -> None:
    """Idle selective members take over stale deliveries only while they have credit:
    one whose selector takes all four stale messages gets its prefetch (2), not four."""
    broker, clock, _ = make(queue_visibility_timeout=10.0, queue_prefetch=2)
    for name in ("slow-1", "slow-2"):
        slow, _ = client(broker, name, "mqtt5")
        join(broker, slow, "$queue/jobs/#", consumer=Consumer("g"))
    for payload in (b"a-1", b"a-2", b"a-3", b"a-4"):
        send(broker, "$queue/jobs/k", payload)
    taker, taker_link = client(broker, "taker", "mqtt5")
    join(broker, taker, "$queue/jobs/#",
         consumer=Consumer("g", selector=_payload_is(b"a-1", b"a-2", b"a-3", b"a-4")))
    other, _ = client(broker, "other", "mqtt5")
    join(broker, other, "$queue/jobs/#", consumer=Consumer("g", selector=_payload_is(b"z")))
    clock.advance(5.0)    # (half the visibility timeout: the slow ones are stale)
    group = broker.queues.queues["jobs"].groups["g"]
    outstanding = {m.session.client_id: m.outstanding for m in group.members}
    assert outstanding["taker"] == 2 and len(got(taker_link)) == 2
    assert outstanding["other"] == 0
    assert sum(outstanding.values()) == len(group.pending) == 4


def test_after_a_restart_only_what_a_level_may_have_handed_out_counts_a_delivery() -> None:
    """5,000 low messages wait under a high one that went out (pending at the stop):
    after a restart the high one is a redelivery, the low ones, never handed out,
    are first deliveries (each level has its own watermark, stored with the group)."""
    store = MemoryStore()
    broker, _, _ = make(store, queue_prefetch=1, queue_rules=_rules(9))
    for i in range(5000):
        _send(broker, b"low-%d" % i, 1)
    _send(broker, b"high", 9)
    worker, link = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    assert [p for _, p in got(link)] == [b"high"]
    broker.stop()
    again, _, _ = make(store, queue_prefetch=3, queue_rules=_rules(9))
    worker, link = client(again, "w", "mqtt5")
    join(again, worker, "$queue/jobs/#")
    counts = [(m.payload, meta(m)["delivery-count"]) for m, *_ in link.published()]
    assert counts == [(b"high", "2"), (b"low-0", "1"), (b"low-1", "1")]
    group = again.queues.queues["jobs"].groups[next(iter(again.queues.queues["jobs"].groups))]
    assert group.redelivered == 1


def test_a_member_selecting_many_parked_messages_is_offered_them_as_it_has_room(
        monkeypatch: Any) -> None:
    """400 messages only a busy member selects wait parked (the other member refuses
    them); as the busy one acknowledges it gets them one by one, in order, each
    acknowledgement costing a few selector looks, not a walk over all that wait."""
    broker, _, _ = make(queue_prefetch=1)
    red, red_link = client(broker, "red")
    green, _ = client(broker, "green")
    join(broker, red, "$queue/jobs/#", consumer=Consumer("g", selector=_payload_is(
        *(b"red-%d" % i for i in range(401)))))
    join(broker, green, "$queue/jobs/#",
         consumer=Consumer("g", selector=_payload_is(b"green")))
    for i in range(401):
        send(broker, "$queue/jobs/k", b"red-%d" % i)   # (red-0 goes, the rest park)
    looks = _counting_selects(monkeypatch)
    for _ in range(50):
        (_, _, pid, _, _) = red_link.published()[-1]
        broker.acknowledged(red, pid)
    assert [p for _, p in got(red_link)] == [b"red-%d" % i for i in range(51)]
    assert looks[0] <= 4 * 50


def test_a_group_record_from_before_the_level_watermarks_counts_as_it_did() -> None:
    """A priority group's record stored without level watermarks (an older broker):
    every offset below its watermark still counts a delivery, and each level starts
    from that watermark (so the next restart counts them again too)."""
    store = MemoryStore()
    broker, _, _ = make(store, queue_prefetch=1, queue_rules=_rules(9))
    for i in range(20):
        _send(broker, b"low-%d" % i, 1)
    _send(broker, b"high", 9)
    worker, _ = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    broker.stop()
    for queue in store.queues.values():
        for key, state in list(queue.groups.items()):
            assert state.levels
            queue.groups[key] = replace(state, levels=())
    again, _, _ = make(store, queue_prefetch=2, queue_rules=_rules(9))
    group = next(iter(again.queues.queues["jobs"].groups.values()))
    assert set(group.level_marks) == set(range(10))
    assert set(group.level_marks.values()) == {group.watermark}
    worker, link = client(again, "w", "mqtt5")
    join(again, worker, "$queue/jobs/#")
    counts = [(m.payload, meta(m)["delivery-count"]) for m, *_ in link.published()]
    assert counts == [(b"high", "2"), (b"low-0", "2")]


def test_levels_given_while_the_dispatch_watermark_is_stored_do_not_stall() -> None:
    """A queue given priority levels while its group's watermark commit is in flight
    delivers everything once the commits land (the levels' marks, taken from that
    watermark, become safe with it)."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "worker")
    join(broker, worker, "$queue/jobs/#")
    for i in range(3):
        send(broker, "$queue/jobs/k", b"%d" % i)
    for _ in range(20):   # the appends durable; the watermark's commit waits
        if not store.pending or any(isinstance(op, PutQueueGroup)
                                    for op in store.pending[0][0]):
            break
        store.commit_next()
    assert store.pending
    broker.queues.set_retention("jobs", Retention(max_priority=5))
    for _ in range(10):
        store.commit_all()
    assert [p for _, p in got(link)] == [b"0", b"1", b"2"]
