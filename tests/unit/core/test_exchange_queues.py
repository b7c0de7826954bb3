"""Queues as AMQP 0.9.1 declares them (``mqttamqp.core.exchanges.queuedecl``) on the
queue manager's queues, with fake links, ``task.Clock`` and in-memory stores: the
default exchange, consumers, transient queues, basic.get, purge, connection close."""

from __future__ import annotations

from typing import Any

from exchange_facade import code_of, consume, depth, get_session, message
from fakes import ManualMemoryStore, MemoryStore
from queue_facade import client, got, join, make, send

from mqttamqp.core.broker import Broker, Outcome


def _filled(count: int) -> tuple[Broker, Any]:
    """A broker with durable queue ``q`` holding ``count`` messages b"0", b"1"...,
    and its exchanges."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    for i in range(count):
        ex.publish(message(b"%d" % i, broker=broker), "", "q")
    return broker, ex


def _ready(broker: Broker, name: str) -> int:
    """Queue ``name``'s ready messages counted the long way, walking its log: not
    held unacknowledged by its group, not acknowledged and still in the log."""
    queue = broker.queues.queues[name]
    group = queue.groups.get(name)
    if group is None:
        return len(queue.log)
    return sum(1 for o in queue.log if o >= group.floor and o not in group.pending
               and o not in group.done)


def test_a_declared_durable_queue_is_the_queue_managers_queue() -> None:
    """A durable 0.9.1 queue is stored as the queue manager's queue, and a publish
    to the default exchange with its name reaches an MQTT consumer of $queue/."""
    store = MemoryStore()
    broker, _, _ = make(store)
    declared, d = broker.exchanges.declare_queue("orders", "c1", durable=True)
    assert (declared.name, declared.message_count, declared.consumer_count) == (
        "orders", 0, 0)
    assert d is not None and d.called
    assert "orders" in broker.queues.queues and "orders" in store.queues
    mqtt, link = client(broker, "worker-1")
    assert join(broker, mqtt, "$queue/orders/#") < 0x80
    routed, confirm = broker.exchanges.publish(message(b"job", broker=broker), "", "orders")
    assert routed and confirm is not None and confirm.called
    assert got(link) == [("$queue/orders", b"job")]


def test_default_exchange_to_a_missing_queue_is_unroutable() -> None:
    """The default exchange routes only to an existing queue: otherwise not routed
    (basic.return when mandatory) and nothing to wait for."""
    broker, _, _ = make()
    assert broker.exchanges.publish(message(), "", "nowhere", mandatory=True) == (False, None)


def test_the_confirm_waits_for_the_commit() -> None:
    """A publisher confirm fires only once the append is committed."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    broker.exchanges.declare_queue("jobs", "c1", durable=True)
    store.commit_all()
    _, confirm = broker.exchanges.publish(message(), "", "jobs")
    assert confirm is not None and not confirm.called
    store.commit_all()
    assert confirm.called


def test_passive_declare_and_redeclare_rules() -> None:
    """Passive declare of a missing queue is 404; a redeclare with other flags or
    arguments is 406; amq. names are 403; names MQTT cannot address are 406."""
    broker, _, _ = make()
    ex = broker.exchanges
    assert code_of(ex.declare_queue, "ghost", "c1", passive=True) == 404
    ex.declare_queue("q", "c1", durable=True, arguments={"x-max-length": 10})
    assert ex.declare_queue("q", "c2", passive=True)[0].name == "q"
    assert ex.declare_queue("q", "c2", durable=True,
                            arguments={"x-max-length": 10})[0].name == "q"
    assert code_of(ex.declare_queue, "q", "c1", durable=False) == 406
    assert code_of(ex.declare_queue, "q", "c1", durable=True,
                   arguments={"x-max-length": 11}) == 406
    assert code_of(ex.declare_queue, "amq.mine", "c1", durable=True) == 403
    assert code_of(ex.declare_queue, "a/b", "c1", durable=True) == 406
    assert code_of(ex.declare_queue, "a+b", "c1", durable=True) == 406


def test_celery_and_kombu_queue_names_are_accepted() -> None:
    """The names Celery and kombu declare are valid queue names."""
    broker, _, _ = make()
    for name in ("celery", "celery@host.celery.pidbox",
                 "celeryev.0e4b8bb3-3b9c-4b39-9d4d-0a3c1a9d6e51",
                 "9f2d3c1e-5b1a-4f0e-8d7c-2a6b4e8f1c3d"):
        assert broker.exchanges.declare_queue(name, "c1", durable=True)[0].name == name


def test_a_091_consumer_joins_the_default_group_with_mqtt_ones() -> None:
    """A 0.9.1 consumer joins the queue's default group: it competes with an AMQP
    1.0-style receiver of the same group, and declare-ok counts it."""
    broker, _, _ = make()
    broker.exchanges.declare_queue("work", "c1", durable=True)
    _, link_a = consume(broker, "work", "c1", "a")
    _, link_b = consume(broker, "work", "c2", "b")
    assert broker.exchanges.declare_queue("work", "c1", passive=True)[0].consumer_count == 2
    for i in range(4):
        broker.exchanges.publish(message(b"%d" % i, broker=broker), "", "work")
    assert len(got(link_a)) == 2 and len(got(link_b)) == 2


def test_consume_on_a_missing_queue_is_404() -> None:
    """basic.consume on a queue that does not exist is 404."""
    broker, _, _ = make()
    assert code_of(broker.exchanges.consumer_filter, "none", "c1") == 404


def test_an_mqtt_publish_to_queue_reaches_a_091_consumer() -> None:
    """What MQTT publishes to $queue/<name>/... a 0.9.1 consumer of <name> receives."""
    broker, _, _ = make()
    broker.exchanges.declare_queue("tasks", "c1", durable=True)
    _, link = consume(broker, "tasks")
    send(broker, "$queue/tasks/eu", b"from-mqtt")
    assert got(link) == [("$queue/tasks/eu", b"from-mqtt")]


def test_delete_and_purge() -> None:
    """Purge empties a queue; delete with if_empty refuses a non-empty queue (406),
    otherwise removes it and says how many messages went with it."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    for _ in range(3):
        ex.publish(message(broker=broker), "", "q")
    assert code_of(ex.delete_queue, "q", "c1", if_empty=True) == 406
    assert ex.purge_queue("q", "c1")[0] == 3
    ex.publish(message(broker=broker), "", "q")
    assert ex.delete_queue("q", "c1")[0] == 1
    assert "q" not in broker.queues.queues
    assert code_of(ex.purge_queue, "q", "c1") == 404


def test_purge_keeps_what_consumers_hold_unacknowledged() -> None:
    """queue.purge removes ready messages only: a consumer's unacknowledged delivery
    stays its own and can still be acknowledged; what comes later is delivered."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    session, link = consume(broker, "q")
    for i in range(20):
        ex.publish(message(b"%d" % i, broker=broker), "", "q")
    held = len(link.published())
    assert 0 < held < 20
    assert ex.purge_queue("q", "c1")[0] == 20 - held
    assert len(broker.queues.queues["q"].log) == held
    for _, _, packet_id, *_ in link.published():
        broker.acknowledged(session, packet_id)
    assert not broker.queues.queues["q"].log
    ex.publish(message(b"late", broker=broker), "", "q")
    assert got(link)[-1] == ("$queue/q", b"late")


def test_delete_if_empty_counts_ready_messages_only() -> None:
    """queue.delete with if-empty, as RabbitMQ (whose backing queue's len leaves out
    what is pending acknowledgement): a ready message makes it 406; what a consumer
    holds unacknowledged does not, nor what it acknowledged earlier in the same
    socket read (in the log until the batch ends); delete-ok and declare-ok count
    ready messages only."""
    broker, ex = _filled(3)
    assert code_of(ex.delete_queue, "q", "c1", if_empty=True) == 406
    assert ex.declare_queue("q", "c1", passive=True)[0].message_count == 3
    session, link = consume(broker, "q")
    assert len(link.published()) == 3
    assert ex.declare_queue("q", "c1", passive=True)[0].message_count == 0
    commits = broker.queues.commits
    commits.begin()   # (one socket read: basic.ack, then queue.delete)
    broker.settlement.accept_many([(session, link.published()[0][2])])
    assert len(broker.queues.queues["q"].log) == 3   # (trimmed at the batch's end)
    count, _ = ex.delete_queue("q", "c1", if_empty=True)
    commits.end()
    assert count == 0 and "q" not in broker.queues.queues


def test_purge_does_not_count_what_was_acknowledged_in_the_same_read() -> None:
    """queue.purge right after the basic.ack of every delivery, in one socket read:
    purge-ok says 0 (RabbitMQ's count is its ready messages), though the acknowledged
    messages leave the log only at the read's end; a later message is delivered."""
    broker, ex = _filled(3)
    session, link = consume(broker, "q")
    ex.publish(message(b"3", broker=broker), "", "q")
    held = [p[2] for p in link.published()]
    assert len(held) == 4
    commits = broker.queues.commits
    commits.begin()
    broker.settlement.accept_many([(session, packet_id) for packet_id in held[:3]])
    assert len(broker.queues.queues["q"].log) == 4   # (trimmed at the batch's end)
    assert ex.purge_queue("q", "c1")[0] == 0
    commits.end()
    assert len(broker.queues.queues["q"].log) == 1   # (the one still unacknowledged)
    broker.settlement.accept_many([(session, held[3])])
    ex.publish(message(b"late", broker=broker), "", "q")
    assert got(link)[-1] == ("$queue/q", b"late")


def test_transient_queues_store_nothing() -> None:
    """Exclusive, auto-delete, non-durable and server-named queues live in memory:
    declaring, publishing, consuming and acknowledging them stores no op."""
    store = MemoryStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    names = [ex.declare_queue("", "c1", exclusive=True)[0].name,
             ex.declare_queue("ad", "c1", durable=True, auto_delete=True)[0].name,
             ex.declare_queue("plain", "c1")[0].name,
             ex.declare_queue("", "c1", durable=True)[0].name]
    assert names[0].startswith("amq.gen-") and names[3].startswith("amq.gen-")
    for name in names:
        session, link = consume(broker, name, "c1", "t-" + name)
        ex.publish(message(b"m", broker=broker), "", name)
        entry_message = link.published()[0][0]
        assert entry_message.payload == b"m"
        broker.acknowledged(session, link.published()[0][2])
    assert not any(name in store.queues for name in names)
    assert all(name in broker.queues.queues for name in names)


def test_a_qos2_message_to_a_transient_queue_is_delivered() -> None:
    """With nothing to commit, a QoS 2 append to a transient queue goes out at once."""
    broker, _, _ = make()
    name = broker.exchanges.declare_queue("", "c1", exclusive=True)[0].name
    _, link = consume(broker, name)
    routed, confirm = broker.exchanges.publish(message(qos=2, broker=broker), "", name)
    assert routed and confirm is None
    assert len(got(link)) == 1


def test_exclusive_queue_is_locked_to_its_connection_and_goes_with_it() -> None:
    """Another connection gets 405 on an exclusive queue (declare, consume, purge,
    delete); the owner's close removes it."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("reply", "c1", exclusive=True)
    assert code_of(ex.declare_queue, "reply", "c2", exclusive=True) == 405
    assert code_of(ex.declare_queue, "reply", "c2", passive=True) == 405
    assert code_of(ex.consumer_filter, "reply", "c2") == 405
    assert code_of(ex.purge_queue, "reply", "c2") == 405
    assert code_of(ex.delete_queue, "reply", "c2") == 405
    assert ex.publish(message(), "", "reply")[0]    # (anyone may publish to it)
    ex.connection_closed("c2")
    assert "reply" in broker.queues.queues
    ex.connection_closed("c1")
    assert "reply" not in broker.queues.queues and "reply" not in ex.declared


def test_auto_delete_queue_goes_with_its_last_consumer() -> None:
    """An auto-delete queue stays until its last consumer leaves, then goes."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("ev", "c1", auto_delete=True)
    consume(broker, "ev", "c1", "a")
    consume(broker, "ev", "c2", "b")
    ex.consumer_cancelled("ev")
    assert "ev" in broker.queues.queues
    ex.consumer_cancelled("ev")
    assert "ev" not in broker.queues.queues


def test_a_transient_queue_does_not_dead_letter_into_storage() -> None:
    """A message rejected on a transient queue (no dead-letter exchange) is dropped
    and counted: no $dlq/ queue is made for it."""
    store = MemoryStore()
    broker, _, _ = make(store)
    name = broker.exchanges.declare_queue("", "c1", exclusive=True)[0].name
    session, link = consume(broker, name)
    broker.exchanges.publish(message(broker=broker), "", name)
    entry = link.published()[0][2]
    broker.settle(session, entry, Outcome.REJECTED)
    assert broker.queues.queues[name].dead == 1
    assert "$dlq/" + name not in broker.queues.queues and not store.queues


def test_basic_get_takes_one_message_at_a_time() -> None:
    """basic.get hands one message, says how many are left, and says empty when
    there is none; an acknowledged one is gone."""
    broker, ex = _filled(2)
    session, link = get_session(broker)
    assert ex.get("q", session) == (True, 1)
    assert got(link) == [("$queue/q", b"0")]
    broker.acknowledged(session, link.published()[0][2])
    assert ex.get("q", session, no_ack=True) == (True, 0)
    assert ex.get("q", session) == (False, 0)
    assert not broker.queues.queues["q"].log


def test_basic_get_counts_ready_messages_only() -> None:
    """get-ok's message-count is the ready messages, as RabbitMQ's: not one
    acknowledged out of order (in the log until those before it are), nor one a
    consumer holds unacknowledged; the count the queue keeps agrees at every step
    with a walk over the log."""
    broker, ex = _filled(5)
    session, link = get_session(broker)
    assert ex.get("q", session) == (True, 4) and _ready(broker, "q") == 4
    assert ex.get("q", session) == (True, 3) and _ready(broker, "q") == 3
    broker.acknowledged(session, link.published()[1][2])   # the second, not the first
    assert len(broker.queues.queues["q"].log) == 5   # (kept: the first is unacknowledged)
    assert ex.get("q", session) == (True, 2) and _ready(broker, "q") == 2
    _, consumer = consume(broker, "q")   # takes the two ready ones, holds them
    assert len(consumer.published()) == 2
    assert ex.get("q", session) == (False, 0) and _ready(broker, "q") == 0
    consumer.congested = True
    broker.settle(session, link.published()[0][2], Outcome.RELEASED)   # back: ready
    assert ex.declare_queue("q", "c1", passive=True)[0].message_count == 1
    assert _ready(broker, "q") == 1


def test_an_unsettled_get_goes_back_when_its_session_goes() -> None:
    """A message got and not acknowledged is back in the queue once the channel's
    session goes, and is got again marked redelivered with its delivery counted;
    a nack requeues it too (redelivered, not counted: released)."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    ex.publish(message(b"m", broker=broker), "", "q")
    session, link = get_session(broker)
    assert ex.get("q", session)[0]
    assert not link.published()[0][0].dup
    broker.settle(session, link.published()[0][2], Outcome.RELEASED)
    assert ex.get("q", session)[0]
    assert link.published()[1][0].dup
    broker.registry.remove_link_subscriber("c1/get")
    other, link2 = get_session(broker, "c2/get")
    assert ex.get("q", other)[0]
    assert got(link2) == [("$queue/q", b"m")]
    again = link2.published()[0][0]
    assert again.dup and again.props is not None
    assert ("delivery-count", "2") in again.props.user_properties


def test_get_on_a_stream_or_a_locked_queue_is_refused() -> None:
    """basic.get on a stream is 406; on another connection's exclusive queue 405."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("s", "c1", durable=True, arguments={"x-queue-type": "stream"})
    ex.declare_queue("mine", "c1", exclusive=True)
    session, _ = get_session(broker)
    consume(broker, "s")
    assert code_of(ex.get, "s", session) == 406
    assert code_of(ex.get, "mine", session, "c2") == 405


def test_connection_closed_takes_exclusive_queues_and_their_bindings() -> None:
    """A connection's exclusive queues and their bindings go when it closes; its
    durable queues stay."""
    broker, _, _ = make()
    ex = broker.exchanges
    reply = ex.declare_queue("", "c1", exclusive=True)[0].name
    ex.declare_queue("keep", "c1", durable=True)
    ex.bind_queue(reply, "amq.direct", "rpc", None, "c1")
    ex.connection_closed("c1")
    assert reply not in broker.queues.queues and "keep" in broker.queues.queues
    assert ex.binding_count == 0
    assert not ex.publish(message(), "amq.direct", "rpc")[0]


def test_dlq_queues_are_out_of_reach_of_091_methods() -> None:
    """$dlq/ queues (and any $ name) are 403 to queue.declare passive, delete,
    purge, basic.get and basic.consume: they keep their dead letters."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    session, link = consume(broker, "q")
    ex.publish(message(b"m", broker=broker), "", "q")
    # (past --queue-max-deliveries: a 0.9.1-declared queue without
    # x-dead-letter-exchange drops what is rejected, as RabbitMQ)
    for _ in range(broker.limits.queue_max_deliveries):
        broker.settle(session, link.published()[-1][2], Outcome.MODIFIED, True)
    assert depth(broker, "$dlq/q") == 1
    getter, _ = get_session(broker)
    for call, args in ((ex.declare_queue, ("$dlq/q", "c1", True, False, False, None, True)),
                       (ex.delete_queue, ("$dlq/q", "c1")),
                       (ex.delete_queue, ("$dlq/missing", "c1")),
                       (ex.purge_queue, ("$dlq/q", "c1")),
                       (ex.get, ("$dlq/q", getter, "c1")),
                       (ex.consumer_filter, ("$dlq/q", "c1"))):
        assert code_of(call, *args) == 403, (call, args)
    assert depth(broker, "$dlq/q") == 1


def test_basic_get_past_the_sessions_window_takes_nothing() -> None:
    """basic.get answers taken only for what the channel's session sends now: past
    its in-flight window nothing is taken (the adapter answers get-empty), and
    settling frees room for the next."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    window = broker.limits.max_inflight
    for i in range(window + 8):
        ex.publish(message(str(i).encode(), broker=broker), "", "q")
    session, link = get_session(broker)
    results = [ex.get("q", session) for _ in range(window + 8)]
    taken = sum(1 for t, _ in results if t)
    assert taken == len(link.published()) == window
    assert results[-1] == (False, 8)
    broker.acknowledged(session, link.published()[0][2])
    assert ex.get("q", session)[0]
    assert len(link.published()) == window + 1
