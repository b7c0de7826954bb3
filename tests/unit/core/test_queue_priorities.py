"""Priority queues (issue 30) in memory: higher levels first, first in first out
within a level, priorities above the queue's top count as the top, messages without
one take the default, a queue without levels stays first in first out, and the
order is rebuilt from the log after a restart."""

from __future__ import annotations

from typing import Any

from exchange_facade import code_of, consume
from fakes import MemoryStore
from queue_facade import ack, client, got, join, last, make, meta

from mqttamqp.core.broker import Broker
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.queues.model import Retention
from mqttamqp.core.queues.priority import PriorityLevels, level_of
from mqttamqp.store.models import message_to_record, record_to_message


def _rules(top: int | None, pattern: str = "jobs") -> Any:
    return ((pattern, None, None, None, top),)


def _send(broker: Broker, payload: bytes, priority: int | None = None,
          topic: str = "$queue/jobs/k", qos: int = 1, amqp091: bytes | None = None) -> Any:
    return broker.publish(Message(topic, payload, qos, False, "p", broker.clock.seconds(),
                                  amqp091=amqp091, priority=priority))


def _payloads(link: Any) -> list[bytes]:
    return [p for _, p in got(link)]


def test_higher_levels_go_first_and_each_level_in_order() -> None:
    """A backlog comes out by level, highest first, and in publish order within one;
    a message without a priority takes the default 4."""
    broker, _, _ = make(queue_rules=_rules(9))
    for payload, priority in ((b"low-1", 1), (b"mid-1", 5), (b"none", None), (b"top", 9),
                              (b"mid-2", 5), (b"low-2", 1)):
        _send(broker, payload, priority)
    worker, link = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    assert _payloads(link) == [b"top", b"mid-1", b"mid-2", b"none", b"low-1", b"low-2"]


def test_a_priority_above_the_top_counts_as_the_top() -> None:
    """With levels 0..3, priorities 7, 3 and 200 are one level: publish order."""
    broker, _, _ = make(queue_rules=_rules(3))
    for payload, priority in ((b"a", 7), (b"b", 3), (b"c", 200), (b"d", 2)):
        _send(broker, payload, priority)
    worker, link = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    assert _payloads(link) == [b"a", b"b", b"c", b"d"]


def test_a_queue_without_levels_ignores_priorities() -> None:
    """No max-priority: first in first out whatever the messages say, and its groups
    carry no levels at all (nothing to pay on the plain path)."""
    broker, _, _ = make()
    for payload, priority in ((b"a", 1), (b"b", 9), (b"c", None)):
        _send(broker, payload, priority)
    worker, link = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    assert _payloads(link) == [b"a", b"b", b"c"]
    queue = broker.queues.queues["jobs"]
    assert queue.max_priority == 0
    assert all(g.levels is None for g in queue.groups.values())


def test_default_level_by_origin() -> None:
    """Without a priority an MQTT or AMQP 1.0 message is at 4, an AMQP 0.9.1 one at 0
    (as RabbitMQ); both are capped at the queue's top."""
    plain = Message("t", b"")
    from091 = Message("t", b"", amqp091=b"\x00")
    assert level_of(plain, 9) == 4 and level_of(plain, 2) == 2
    assert level_of(from091, 9) == 0
    assert level_of(Message("t", b"", priority=7), 5) == 5


def test_a_late_high_message_overtakes_a_backlog_of_low_ones() -> None:
    """A member with room for one: after each acknowledgement the highest waiting
    level goes next, even one published after the lower ones."""
    broker, _, _ = make(queue_prefetch=1, queue_rules=_rules(9))
    worker, link = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    for i in range(3):
        _send(broker, b"low-%d" % i, 1)
    _send(broker, b"high", 8)
    assert _payloads(link) == [b"low-0"]
    (_, _, pid, _, _), = link.published()
    broker.acknowledged(worker, pid)
    assert _payloads(link) == [b"low-0", b"high"]


def test_a_message_given_back_returns_to_its_level() -> None:
    """A member that leaves gives back its high message: the next member gets it
    before the lower ones waiting; a nack puts it back the same way."""
    broker, _, _ = make(queue_prefetch=1, queue_rules=_rules(9))
    first, first_link = client(broker, "first")
    join(broker, first, "$queue/jobs/#")
    _send(broker, b"high", 9)
    _send(broker, b"low", 1)
    assert _payloads(first_link) == [b"high"]
    broker.router.unsubscribe(first, ["$queue/jobs/#"])
    second, second_link = client(broker, "second", "mqtt5")
    join(broker, second, "$queue/jobs/#", consumer=Consumer(explicit=True))
    assert _payloads(second_link) == [b"high"]
    ack(broker, second, last(second_link), "$nack")
    assert _payloads(second_link)[-1] == b"high"
    assert meta(last(second_link))["delivery-count"] == "2"


def test_streams_read_a_priority_queue_in_log_order() -> None:
    """A stream group ignores priorities: it reads the log as it was appended."""
    broker, _, _ = make(queue_rules=_rules(9))
    for payload, priority in ((b"a", 1), (b"b", 9), (b"c", 5)):
        _send(broker, payload, priority)
    reader, link = client(broker, "r")
    join(broker, reader, "$queue/jobs/#",
         consumer=Consumer("s", mode="stream", stream_offset="first"))
    assert _payloads(link) == [b"a", b"b", b"c"]


def test_the_order_is_rebuilt_after_a_restart() -> None:
    """The levels are not stored: a restart rebuilds them from the log, and a
    message delivered but not acknowledged before it comes back at its level."""
    store = MemoryStore()
    broker, _, _ = make(store, queue_rules=_rules(9), queue_prefetch=1)
    worker, link = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    for payload, priority in ((b"low", 1), (b"mid", 5), (b"top", 9), (b"mid-2", 5)):
        _send(broker, payload, priority)
    assert _payloads(link) == [b"low"]   # (the first, alone in the queue then)
    broker.stop()
    again, _, _ = make(store, queue_rules=_rules(9))
    worker, link = client(again, "w")
    join(again, worker, "$queue/jobs/#")
    assert _payloads(link) == [b"top", b"mid", b"mid-2", b"low"]


def test_the_stored_retention_keeps_the_levels_over_a_changed_rule() -> None:
    """A queue keeps the levels it was made with (stored with its retention), as it
    keeps its retention, when the --queues rule changes before the restart."""
    store = MemoryStore()
    broker, _, _ = make(store, queue_rules=_rules(9))
    for payload, priority in ((b"low", 1), (b"top", 9)):
        _send(broker, payload, priority)
    broker.stop()
    again, _, _ = make(store)
    assert again.queues.queues["jobs"].max_priority == 9
    worker, link = client(again, "w")
    join(again, worker, "$queue/jobs/#")
    assert _payloads(link) == [b"top", b"low"]


def test_the_console_setting_reorders_what_waits() -> None:
    """Levels set on a live queue (the console's retention form) take in what waits
    already; taken away again, what waits goes out first in first out."""
    broker, _, _ = make(queue_prefetch=1)
    worker, link = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    for payload, priority in ((b"a", 1), (b"b", 2), (b"c", 9), (b"d", 5)):
        _send(broker, payload, priority)
    broker.queues.set_retention("jobs", Retention(None, None, None, 9))
    assert broker.queues.queues["jobs"].max_priority == 9
    for expected in (b"c", b"d", b"b"):
        (_, _, pid, _, _) = link.published()[-1]
        broker.acknowledged(worker, pid)
        assert _payloads(link)[-1] == expected
    _send(broker, b"e", 1)
    _send(broker, b"f", 9)
    broker.queues.set_retention("jobs", Retention())
    for expected in (b"e", b"f"):
        (_, _, pid, _, _) = link.published()[-1]
        broker.acknowledged(worker, pid)
        assert _payloads(link)[-1] == expected


def test_retention_and_dead_letters_work_on_a_priority_queue() -> None:
    """x-max-length style retention drops the oldest whatever its level; a rejected
    high message goes to the dead-letter queue."""
    broker, _, _ = make(queue_rules=(("jobs", None, None, 2, 9),))
    for payload, priority in ((b"old-top", 9), (b"low", 1), (b"mid", 5)):
        _send(broker, payload, priority)
    worker, link = client(broker, "w", "mqtt5")
    join(broker, worker, "$queue/jobs/#", consumer=Consumer(explicit=True))
    assert _payloads(link) == [b"mid", b"low"]
    ack(broker, worker, link.published()[0][0], "$reject")
    assert [m.payload for m in broker.queues.queues["$dlq/jobs"].log.values()] == [b"mid"]


def test_levels_hand_out_highest_then_lowest_offset() -> None:
    """The structure alone: peek skips what is gone or done; pop takes the peeked."""
    levels = PriorityLevels(3)
    log = {o: Message("t", b"", priority=p) for o, p in ((0, 1), (1, 3), (2, 3), (3, 0))}
    for offset, message in log.items():
        levels.add(message, offset)
    order = []
    done = {2}
    while (offset := levels.peek(log, done)) is not None:
        order.append(offset)
        levels.pop()
    assert order == [1, 0, 3]
    assert levels.peek(log, done) is None and levels.high == -1


def test_a_priority_survives_the_stored_record() -> None:
    """The store keeps a message's priority (a twelfth field) and reads older
    records without one as none."""
    for message in (Message("t", b"x", 1, priority=7),
                    Message("t", b"x", 1, props=MessageProperties(content_type="a/b"),
                            amqp091=b"\x01", priority=0),
                    Message("t", b"x", 1, native=b"\x00\x53", priority=200)):
        assert record_to_message(message_to_record(message)) == message
    plain = Message("t", b"x", 1)
    assert len(message_to_record(plain)) == 7
    assert record_to_message(message_to_record(plain)).priority is None


def _091(broker: Broker, payload: bytes, priority: int | None) -> Message:
    return Message("", payload, 1, False, "pub", broker.clock.seconds(), amqp091=b"\x00",
                   priority=priority)


def test_x_max_priority_gives_a_091_queue_levels_and_streams_refuse_it() -> None:
    """x-max-priority 5: a 0.9.1 consumer gets the highest first, a message without
    a priority last (0, as RabbitMQ), one above 5 as 5; 0 means none; a stream
    queue with it is refused (406); x-max-priority 256 is refused too."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-max-priority": 5})
    for payload, priority in ((b"none", None), (b"two", 2), (b"nine", 9), (b"five", 5)):
        ex.publish(_091(broker, payload, priority), "", "q")
    _, link = consume(broker, "q")
    assert [p for _, p in got(link)] == [b"nine", b"five", b"two", b"none"]
    ex.declare_queue("fifo", "c1", durable=True, arguments={"x-max-priority": 0})
    assert broker.queues.queues["fifo"].max_priority == 0
    for bad in ({"x-queue-type": "stream", "x-max-priority": 3}, {"x-max-priority": 256}):
        assert code_of(ex.declare_queue, "s", "c1", durable=True, arguments=bad) == 406
    ex.declare_queue("s", "c1", durable=True,
                     arguments={"x-queue-type": "stream", "x-max-priority": 0})


def test_a_091_queues_levels_come_back_after_a_restart() -> None:
    """The declared x-max-priority is stored with the queue: after a restart its
    backlog still comes out by level."""
    store = MemoryStore()
    broker, _, _ = make(store)
    broker.exchanges.declare_queue("q", "c1", durable=True,
                                   arguments={"x-max-priority": 9})
    for payload, priority in ((b"low", 1), (b"top", 9), (b"mid", 4)):
        broker.exchanges.publish(_091(broker, payload, priority), "", "q")
    broker.stop()
    again, _, _ = make(store)
    assert again.queues.queues["q"].max_priority == 9
    _, link = consume(again, "q")
    assert [p for _, p in got(link)] == [b"top", b"mid", b"low"]


def test_evicted_bodies_come_back_in_priority_order() -> None:
    """Over the memory budget, a priority queue's bodies are evicted and read back as
    its levels reach them: every message once, by level, each level in order."""
    store = MemoryStore()
    store.hold_reads = True
    broker, _, _ = make(store, queue_memory_budget=32 * 1024,
                        queue_rules=_rules(9))
    sent = [(b"%03d-" % i + b"x" * 1000, (i * 7) % 10) for i in range(200)]
    for payload, priority in sent:
        _send(broker, payload, priority)
    assert broker.queues.queues["jobs"].evicted, "some bodies are in storage only"
    worker, link = client(broker, "w")
    join(broker, worker, "$queue/jobs/#")
    seen: list[bytes] = []
    for _ in range(10_000):
        published = link.published()
        if len(seen) < len(published):
            message, _, pid, *_ = published[len(seen)]
            seen.append(message.payload)
            broker.acknowledged(worker, pid)
            continue
        if not store.finish_reads():
            break
    expected = [p for p, _ in sorted(sent, key=lambda s: -s[1])]   # (a stable sort)
    assert seen == expected
    assert broker.queues.read_backs > 0 and broker.queues.views()[0].depth == 0


def test_each_group_has_its_own_order_and_a_timed_out_message_keeps_its_level() -> None:
    """Two groups both get the backlog by level; a message whose visibility timeout
    passes goes back before the lower levels."""
    broker, clock, _ = make(queue_prefetch=1, queue_visibility_timeout=10.0,
                            queue_rules=_rules(9))
    for payload, priority in ((b"low", 1), (b"top", 9), (b"mid", 5)):
        _send(broker, payload, priority)
    audit, audit_link = client(broker, "audit-1")
    join(broker, audit, "$queue/jobs/#")
    silent, silent_link = client(broker, "work-1")
    join(broker, silent, "$queue/jobs/#")
    assert _payloads(audit_link) == [b"top"] and _payloads(silent_link) == [b"top"]
    clock.advance(10.0)       # (work-1 never acknowledges: top is visible again)
    assert _payloads(silent_link) == [b"top", b"top"]    # (before mid and low)
    for expected in (b"mid", b"low"):
        (_, _, pid, _, _) = audit_link.published()[-1]
        broker.acknowledged(audit, pid)
        assert _payloads(audit_link)[-1] == expected
