"""The durable queues' aggregate bounds (issue 26, section 2) through the broker's
façade, with fake links, ``task.Clock`` and the in-memory stores: the memory budget
(bodies evicted once durable, read back in order and delivered exactly once), the
total stored bytes and the free-disk watermark (publishers blocked, resumed when
there is room; MQTT 5 QoS 1/2 refused with 0x97), and what ``$SYS``, the metrics and
the read model show of them."""

from __future__ import annotations

from typing import Any

from fakes import FakeLink, ManualMemoryStore, MemoryStore, NullStore, timers_left
from queue_facade import client, join
from twisted.internet.task import Clock
from twisted.logger import LogLevel, globalLogPublisher

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker, Outcome
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, body_size
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.queues.budget import StorageAlarm
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.systopics import queue_topics

KB = 1024


def make(store: NullStore, free: Any = None, **limits: Any) -> tuple[Broker, Clock]:
    clock = Clock()
    clock.advance(1000.0)
    limits.setdefault("sys_interval", 0)
    broker = Broker(clock, store, Limits(**limits), free_space=free)
    broker.start()
    return broker, clock


def publish(broker: Broker, queue: str, payload: bytes, qos: int = 1,
            protocol: str = "mqtt3.1.1") -> Any:
    return broker.publish(Message(f"$queue/{queue}/k", payload, qos, False, "p",
                                  broker.clock.seconds()),
                          Identity("p", None, protocol))


def in_memory(broker: Broker, queue: str) -> int:
    """Payload bytes of ``queue`` held in memory."""
    return sum(len(m.payload) for m in broker.queues.queues[queue].log.values())


def drain(broker: Broker, session: Session, link: FakeLink, store: MemoryStore,
          limit: int = 10_000) -> list[bytes]:
    """Acknowledge every delivery (answering reads from storage as they come) until
    nothing more arrives; the payloads in delivery order."""
    seen: list[bytes] = []
    done = 0
    for _ in range(limit):
        published = link.published()
        if done < len(published):
            message, _, pid, *_ = published[done]
            seen.append(message.payload)
            done += 1
            broker.acknowledged(session, pid)
            continue
        if not store.finish_reads():
            break
    return seen


def payloads(n: int, size: int = KB) -> list[bytes]:
    return [bytes([65 + i % 26]) * (size - 8) + b"%08d" % i for i in range(n)]


# -- memory budget ------------------------------------------------------------------


def test_bodies_past_the_budget_stay_in_storage_only() -> None:
    """A queue nobody consumes keeps no more bodies in memory than the budget."""
    store = MemoryStore()
    broker, _ = make(store, queue_memory_budget=32 * KB)
    for body in payloads(200):
        assert publish(broker, "jobs", body).refusal is None
    assert in_memory(broker, "jobs") <= 32 * KB
    assert broker.queues.resident <= 32 * KB
    assert len(store.queues["jobs"].messages) == 200      # all of them durable
    view = broker.queues.views()[0]
    assert view.depth == 200 and view.bytes == 200 * KB   # counted whole
    assert view.in_storage_only >= 200 - 32


def test_evicted_bodies_are_read_back_in_order_and_delivered_exactly_once() -> None:
    """A consumer that comes later gets every message once, in order, with its body."""
    store = MemoryStore()
    store.hold_reads = True
    broker, _ = make(store, queue_memory_budget=32 * KB)
    sent = payloads(300)
    for body in sent:
        publish(broker, "jobs", body)
    worker, link = client(broker, "worker-1")
    join(broker, worker, "$queue/jobs/#")
    got = drain(broker, worker, link, store)
    assert got == sent
    assert store.reads, "some bodies came from storage"
    assert broker.queues.read_backs >= 300 - 32
    assert broker.queues.views()[0].depth == 0
    assert broker.queues.resident == 0


def test_a_delivery_waits_for_its_body_and_goes_out_once_it_is_read() -> None:
    """The group stops at an evicted message until the read returns (no gap, no skip)."""
    store = MemoryStore()
    store.hold_reads = True
    broker, _ = make(store, queue_memory_budget=8 * KB, queue_prefetch=1000)
    sent = payloads(64)
    for body in sent:
        publish(broker, "jobs", body)
    worker, link = client(broker, "worker-1")
    join(broker, worker, "$queue/jobs/#", qos=0)   # (acknowledged on send)
    first = [m.payload for m, *_ in link.published()]
    assert first == sent[:len(first)] and len(first) < len(sent)
    assert len(store.reads) == 1
    name, offsets = store.reads[0]
    assert name == "jobs" and offsets[0] == len(first)
    store.finish_reads()
    for _ in range(100):
        if not store.finish_reads():
            break
    assert [m.payload for m, *_ in link.published()] == sent


def test_only_durable_bodies_are_evicted() -> None:
    """A message whose append is not committed yet keeps its body in memory."""
    store = ManualMemoryStore()
    broker, _ = make(store, queue_memory_budget=4 * KB)
    for body in payloads(20):
        publish(broker, "jobs", body)
    assert broker.queues.evicted_messages == 0
    assert in_memory(broker, "jobs") == 20 * KB
    store.commit_all()
    assert broker.queues.evicted_messages > 0
    assert in_memory(broker, "jobs") <= 4 * KB


def test_two_groups_and_a_stream_each_read_every_message_back() -> None:
    """Read-backs serve every group: two classic groups and a stream, all complete."""
    store = MemoryStore()
    broker, _ = make(store, queue_memory_budget=16 * KB)
    members = []
    for cid, consumer in (("a-1", None), ("b-1", None),
                          ("s-1", Consumer(mode="stream", stream_offset="first"))):
        session, link = client(broker, cid)
        join(broker, session, "$queue/jobs/#", consumer=consumer)
        members.append((session, link))
    sent = payloads(120)
    for body in sent:
        publish(broker, "jobs", body)
    results = [drain(broker, session, link, store) for session, link in members]
    assert results == [sent, sent, sent]


def test_a_stream_replay_keeps_to_the_budget() -> None:
    """Bodies read back for a replay are evicted again: resident stays within the
    budget and one read batch (64 messages) all along, and every message arrives."""
    store = MemoryStore()
    broker, _ = make(store, queue_memory_budget=16 * KB)
    sent = payloads(400)
    for body in sent:
        publish(broker, "jobs", body)
    store.finish_reads()
    queues = broker.queues
    session, link = client(broker, "s-1")
    join(broker, session, "$queue/jobs/#",
         consumer=Consumer(mode="stream", stream_offset="first"))
    bound = 16 * KB + 64 * body_size(Message("$queue/jobs/k", sent[0], 1, False, "p", 0.0))
    seen: list[bytes] = []
    most = 0
    for _ in range(10_000):
        most = max(most, queues.resident)
        published = link.published()
        if len(seen) < len(published):
            message, _, pid, *_ = published[len(seen)]
            seen.append(message.payload)
            broker.acknowledged(session, pid)
        elif not store.finish_reads():
            break
    assert seen == sent
    assert queues.read_backs >= 300
    assert most <= bound, f"{most} bytes resident, bound {bound}"


def test_a_restart_with_a_big_queue_keeps_to_the_budget() -> None:
    """After a restart the bodies past the budget stay in storage and are read back."""
    store = MemoryStore()
    broker, _ = make(store, queue_memory_budget=0)     # (no budget: all in memory)
    sent = payloads(100)
    for body in sent:
        publish(broker, "jobs", body)
    broker.stop()
    again, _ = make(store, queue_memory_budget=16 * KB)
    assert again.queues.resident <= 16 * KB
    worker, link = client(again, "worker-1")
    join(again, worker, "$queue/jobs/#")
    assert drain(again, worker, link, store) == sent


def test_purge_and_delete_release_what_they_counted() -> None:
    """Purging or deleting a queue with evicted bodies leaves no bytes counted."""
    store = MemoryStore()
    broker, _ = make(store, queue_memory_budget=8 * KB)
    for body in payloads(50):
        publish(broker, "a", body)
        publish(broker, "b", body)
    broker.queues.purge("a")
    broker.queues.delete("b")
    assert broker.queues.resident == 0
    assert broker.queues.total_bytes == 0
    assert broker.queues.evicted_messages == 0


def test_dead_letters_read_back_are_requeued_whole() -> None:
    """Requeueing dead letters whose bodies were evicted moves them with their bodies."""
    store = MemoryStore()
    broker, _ = make(store, queue_memory_budget=8 * KB)
    sent = payloads(30)
    for body in sent:
        publish(broker, "jobs", body)
    worker, _ = client(broker, "worker-1")
    join(broker, worker, "$queue/jobs/#")
    for _ in range(1000):   # every delivery rejected: dead-lettered
        pending = list(worker.inflight)
        if not pending and not store.finish_reads():
            break
        for pid in pending:
            broker.settle(worker, pid, Outcome.REJECTED, reason="no")
    broker.unsubscribe(worker, ["$queue/jobs/#"])
    dlq = broker.queues.queues["$dlq/jobs"]
    assert len(dlq.log) == 30 and dlq.evicted      # (most of them in storage only)
    moved, d = broker.queues.requeue("$dlq/jobs")
    assert moved == 30 and d is not None and d.called
    assert [m.payload for _, m in sorted(store.queues["jobs"].messages)] == sent


# -- total stored bytes and the free-disk watermark ----------------------------------


def _captured() -> tuple[list[dict[str, Any]], Any]:
    events: list[dict[str, Any]] = []

    def observer(event: dict[str, Any]) -> None:
        if "queues.budget" in event.get("log_namespace", ""):
            events.append(event)

    globalLogPublisher.addObserver(observer)
    return events, observer


def test_publishers_are_blocked_at_the_total_bound_and_resumed_below_it() -> None:
    """At --queue-max-total-bytes a publish says ``blocked``; a drain resumes them."""
    events, observer = _captured()
    try:
        store = MemoryStore()
        broker, _ = make(store, queue_max_total_bytes=20 * KB)
        results = [publish(broker, "jobs", body) for body in payloads(19)]
        assert not any(r.blocked for r in results)
        assert publish(broker, "jobs", payloads(1)[0]).blocked    # at the bound: stored
        assert publish(broker, "other", payloads(1)[0]).blocked   # every queue
        assert broker.queues.total_bytes == 21 * KB
        resumed: list[str] = []
        broker.when_queues_writable(1, lambda: resumed.append("mqtt"))
        broker.when_queues_writable(2, lambda: resumed.append("amqp"))
        broker.forget_paused(2)                                   # (it went away)
        worker, link = client(broker, "worker-1")
        join(broker, worker, "$queue/jobs/#")
        for _ in range(2):   # 16 by 16 (the prefetch): under 90 % after the first
            for _message, _, pid, *_ in link.published()[-16:]:
                broker.acknowledged(worker, pid)
        assert resumed == ["mqtt"]
        assert not publish(broker, "jobs", b"x").blocked
        warned = [e for e in events if e["log_level"] == LogLevel.warn]
        infos = [e for e in events if e["log_level"] == LogLevel.info]
        assert len(warned) == 1 and "blocked" in warned[0]["log_format"]
        assert len(infos) == 1 and "room again" in infos[0]["log_format"]
    finally:
        globalLogPublisher.removeObserver(observer)


def test_mqtt5_qos1_gets_quota_exceeded_while_blocked_and_nothing_is_stored() -> None:
    """An MQTT 5 QoS 1/2 publish to a full queue store is refused with 0x97 at once."""
    store = MemoryStore()
    broker, _ = make(store, queue_max_total_bytes=4 * KB)
    for body in payloads(4):
        publish(broker, "jobs", body, protocol="mqtt5")
    refused = publish(broker, "jobs", b"late", protocol="mqtt5")
    assert refused.refusal is not None and refused.refusal.code == 0x97
    assert "queue" in refused.refusal.reason and not refused.blocked
    assert len(store.queues["jobs"].messages) == 4
    qos0 = publish(broker, "jobs", b"qos0", qos=0, protocol="mqtt5")
    assert qos0.refusal is None and qos0.blocked                  # (no PUBACK to refuse)
    assert broker.queues.stats.refused == 1


def test_free_disk_watermark_blocks_and_clears_with_hysteresis() -> None:
    """Below --disk-free-limit publishers block (checked every 2 s); back above the
    limit and a tenth, they resume; one log line each way; no timer after stop."""
    free = [10 << 30]
    store = MemoryStore()
    broker, clock = make(store, lambda: free[0], disk_free_limit=1 << 30)
    assert not publish(broker, "jobs", b"a").blocked
    free[0] = 900 << 20
    clock.advance(2.0)
    assert broker.queues.blocked and broker.queues.alarm.causes == ("disk",)
    assert publish(broker, "jobs", b"b").blocked
    resumed: list[int] = []
    broker.when_queues_writable(7, lambda: resumed.append(7))
    free[0] = (1 << 30) + (50 << 20)          # above the limit, not by a tenth
    clock.advance(2.0)
    assert broker.queues.blocked and not resumed
    free[0] = 2 << 30
    clock.advance(2.0)
    assert not broker.queues.blocked and resumed == [7]
    assert broker.queues.alarm.episodes == 1
    broker.stop()
    assert timers_left(clock) == []


def test_a_raising_check_or_resume_leaves_no_publisher_paused() -> None:
    """A free-space check that raises keeps the polling alive, and a resume callback
    that raises neither stops the others nor the timer; one log line per cause."""
    events, observer = _captured()
    try:
        clock = Clock()
        answers: list[Any] = [RuntimeError("statvfs broke"), 100, 100, 10_000]

        def free() -> int:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return int(answer)

        alarm = StorageAlarm(clock, 0, 1000, free)
        alarm.start()                        # raises: polled again in 2 s anyway
        assert alarm.free is None and not alarm.blocked
        clock.advance(2.0)
        assert alarm.blocked
        resumed: list[int] = []

        def broken() -> None:
            raise ValueError("a publisher's resume broke")

        alarm.wait(1, broken)
        alarm.wait(2, lambda: resumed.append(2))
        alarm.wait(3, lambda: resumed.append(3))
        clock.advance(2.0)
        assert alarm.blocked
        clock.advance(2.0)                   # room again: every other one resumes
        assert not alarm.blocked and resumed == [2, 3] and alarm.waiting == 0
        assert [c.getTime() for c in clock.getDelayedCalls()] == [8.0]
        failures = [e for e in events if e["log_level"] == LogLevel.critical]
        assert len(failures) == 2
        assert "checking the free disk space" in failures[0]["what"]
        assert "resuming a publisher" in failures[1]["what"]
        alarm.stop()
        assert timers_left(clock) == []
    finally:
        globalLogPublisher.removeObserver(observer)


def test_sys_and_read_model_show_the_bounds() -> None:
    """$SYS and the read model's counters carry the stored bytes, the bodies in
    memory and whether queue publishers are blocked."""
    store = MemoryStore()
    broker, _ = make(store, queue_max_total_bytes=2 * KB, queue_memory_budget=64 * KB)
    before = dict(queue_topics(broker.queues))
    assert before["$SYS/broker/queues/blocked"] == "0"
    for body in payloads(2):
        publish(broker, "jobs", body)
    topics = dict(queue_topics(broker.queues))
    assert topics["$SYS/broker/queues/blocked"] == "1"
    assert topics["$SYS/broker/queues/bytes"] == str(2 * KB)
    assert topics["$SYS/broker/queues/memory-bytes"] == str(2 * KB)
    counters = broker.view.counters()
    assert counters.queues_blocked is not None and "queue" in counters.queues_blocked


def test_publishers_wait_while_too_much_waits_for_the_writer() -> None:
    """Appends not yet committed past their bound (8 MB at least) pause queue
    publishers, without a refusal or an alarm, until the commits catch up."""
    store = ManualMemoryStore()
    broker, _ = make(store, queue_memory_budget=16 * KB)
    big = b"x" * (256 * KB)
    results = [publish(broker, "jobs", big, protocol="mqtt5") for _ in range(33)]
    assert not any(r.blocked for r in results[:32]) and results[32].blocked
    assert all(r.refusal is None for r in results)
    assert not broker.queues.blocked              # (no alarm: nothing logged)
    resumed: list[int] = []
    broker.when_queues_writable(3, lambda: resumed.append(3))
    store.commit_all()
    assert resumed == [3] and broker.queues.unstored_bytes == 0
    assert not publish(broker, "jobs", big).blocked


def test_an_amqp_sender_to_a_full_queue_store_gets_no_more_credit() -> None:
    """AMQP withholds credit from a queue sender while the queues are full on disk
    (what it held arrives and is stored), and grants it again once there is room."""
    from amqp_memory import ACCEPTED, Net, outcome
    from proton import Message as AmqpMessage

    net = Net(store=MemoryStore(), queue_max_total_bytes=4 * KB)
    app = net.amqp()
    snd = app.session.sender("to-jobs")
    snd.target.address = "$queue/jobs/x"
    snd.open()
    net.pump()
    granted = snd.credit
    assert granted > 4
    for _ in range(4):
        assert outcome(app.send(snd, AmqpMessage(body=b"x" * KB))) == (ACCEPTED, None)
    assert net.broker.queues.blocked
    while snd.credit > 0:     # what it still held: taken and stored, not refused
        assert outcome(app.send(snd, AmqpMessage(body=b"y"))) == (ACCEPTED, None)
    net.pump()
    assert snd.credit == 0
    assert net.broker.queues.alarm.waiting == 1
    net.broker.queues.purge("jobs")
    net.pump()
    assert not net.broker.queues.blocked and snd.credit > 0


# -- the ZODB store's part ------------------------------------------------------------


def test_zodb_load_keeps_to_the_body_budget_and_reads_bodies_back(tmp_path: Any) -> None:
    """A FileStorage store loads each queue's head within the budget, the rest as
    metadata only; the reader thread reads the rest back whole, in offset order."""
    from store_reactor import FakeReactor, commit

    from mqttamqp.core.persistence import PutQueue, PutQueueMessage
    from mqttamqp.store import ZODBStore

    reactor = FakeReactor()
    sent = payloads(100)
    store = ZODBStore(str(tmp_path), reactor)    # type: ignore[arg-type]
    commit(reactor, store, [PutQueue("jobs", (None, None, None))] + [
        PutQueueMessage("jobs", i, Message("$queue/jobs/k", b, 1, False, "p", 1.0))
        for i, b in enumerate(sent)])
    store.close()
    store = ZODBStore(str(tmp_path), reactor, queue_body_budget=10 * KB)  # type: ignore[arg-type]
    try:
        (record,) = store.load().queues
        kept = [o for o, m in record.messages if m.payload]
        assert kept == list(range(10))                       # the head, within budget
        assert sorted(record.evicted) == list(range(10, 100))
        assert record.evicted[10] == (KB, KB)
        assert all(m.topic == "$queue/jobs/k" for _, m in record.messages)
        d = store.read_queue_messages("jobs", [42, 11, 99, 500])
        found: list[Any] = []
        d.addCallback(found.extend)
        reactor.run_until_fired(d)
        assert [(o, m.payload) for o, m in found] == [(11, sent[11]), (42, sent[42]),
                                                       (99, sent[99])]
    finally:
        store.close()


def test_a_reader_thread_that_cannot_open_fails_its_reads_and_restarts(
        tmp_path: Any) -> None:
    """When the reader thread's connection does not open, the read waiting for it
    fails (not hangs), and the next read starts a new thread that answers it."""
    from store_reactor import FakeReactor, commit

    from mqttamqp.core.persistence import PutQueue, PutQueueMessage
    from mqttamqp.store import ZODBStore

    reactor = FakeReactor()
    sent = payloads(3)
    store = ZODBStore(str(tmp_path), reactor)    # type: ignore[arg-type]
    try:
        commit(reactor, store, [PutQueue("jobs", (None, None, None))] + [
            PutQueueMessage("jobs", i, Message("$queue/jobs/k", b, 1, False, "p", 1.0))
            for i, b in enumerate(sent)])
        db = store._db
        real_open = db.open
        opens: list[int] = []

        def open_once_broken(*args: Any, **kwargs: Any) -> Any:
            opens.append(1)
            if len(opens) == 1:
                raise OSError("cannot open a connection")
            return real_open(*args, **kwargs)

        db.open = open_once_broken   # type: ignore[method-assign]
        first = store.read_queue_messages("jobs", [0])
        failed: list[Any] = []
        first.addErrback(failed.append)
        reactor.run_until_fired(first, timeout=10)
        assert len(failed) == 1 and "cannot open" in failed[0].getErrorMessage()
        second = store.read_queue_messages("jobs", [1, 2])
        found: list[Any] = []
        second.addCallback(found.extend)
        reactor.run_until_fired(second, timeout=10)
        assert [(o, m.payload) for o, m in found] == [(1, sent[1]), (2, sent[2])]
        assert len(opens) == 2
    finally:
        store.close()


def test_the_disk_watermark_reads_the_file_system_the_storage_is_on(
        tmp_path: Any, monkeypatch: Any) -> None:
    """With --storage naming a file outside the data directory, --disk-free-limit
    reads statvfs of that file's directory, not of the data directory."""
    import os

    from mqttamqp.core.limits import Limits
    from mqttamqp.service import BrokerService

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    asked: list[str] = []
    real_statvfs = os.statvfs

    def statvfs(path: Any) -> Any:
        asked.append(str(path))
        return real_statvfs(path)

    svc = BrokerService(str(tmp_path / "data"), Limits(sys_interval=0,
                                                       disk_free_limit=1 << 20),
                        storage=f"file://{elsewhere / 'broker.fs'}")
    svc._open_store()
    try:
        monkeypatch.setattr(os, "statvfs", statvfs)
        svc.broker.queues.alarm.check_disk()
        assert asked == [str(elsewhere)]
        assert svc.broker.queues.alarm.free is not None
    finally:
        svc.store.close()


def test_a_browser_reads_every_message_kept_in_storage_only() -> None:
    """A browser over a queue whose bodies were evicted reads each back once and
    sees every message in order: what a read brought back stays until it is sent."""
    store = MemoryStore()
    store.hold_reads = True
    broker, _ = make(store, queue_memory_budget=32 * KB)
    sent = payloads(300)
    for body in sent:
        publish(broker, "jobs", body)
    assert broker.queues.queues["jobs"].evicted
    browser, link = client(broker, "browser")
    join(broker, browser, "$queue/jobs/#", 0, consumer=Consumer(browse=True))
    broker.link_drained(browser)
    reads = 0
    for _ in range(200):   # (bounded: a looping browser would use them all)
        if not store.finish_reads():
            break
        reads += 1
    assert [m.payload for m, *_ in link.published()] == sent
    assert reads < 200
    assert broker.queues.read_backs <= len(sent)


def test_an_append_while_over_the_total_bound_asks_again_and_clears_it() -> None:
    """While the alarm says the queues are over --queue-max-total-bytes, every append
    asks again: once the total is under 90 % of the bound (fallen by a path that did
    not ask), the next append clears the alarm."""
    broker, _ = make(MemoryStore(), queue_max_total_bytes=20 * KB)
    alarm = broker.queues.alarm
    alarm._set(total=True)
    assert alarm.blocked and broker.queues.total_bytes < 18 * KB
    publish(broker, "jobs", b"x")
    assert not alarm.blocked
