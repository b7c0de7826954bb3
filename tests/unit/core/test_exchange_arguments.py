"""Queue arguments (``mqttamqp.core.exchanges.arguments``) on the queue manager's
mechanisms, with fake links and ``task.Clock``: validation, length and overflow,
TTLs, dead-letter exchanges, x-expires, streams."""

from __future__ import annotations

from typing import Any

import pytest
from exchange_facade import code_of, consume, get_session, message
from queue_facade import got, make

from mqttamqp.core.broker import Outcome
from mqttamqp.core.exchanges.errors import ChannelError
from mqttamqp.core.message import Message


def test_invalid_known_arguments_are_406_and_unknown_ones_kept() -> None:
    """A known argument with an invalid value is 406 (quorum with a clear text);
    unknown x- arguments are accepted and kept; x-max-priority is accepted."""
    broker, _, _ = make()
    ex = broker.exchanges
    for bad in ({"x-message-ttl": "soon"}, {"x-message-ttl": -1},
                {"x-max-length": True}, {"x-overflow": "explode"},
                {"x-queue-type": "lazy"}, {"x-max-priority": 256},
                {"x-dead-letter-routing-key": "k"}, {"x-expires": 0}):
        assert code_of(ex.declare_queue, "q", "c1", durable=True, arguments=bad) == 406, bad
    with pytest.raises(ChannelError) as info:
        ex.declare_queue("q", "c1", durable=True, arguments={"x-queue-type": "quorum"})
    assert "quorum queues are not supported" in info.value.text
    assert code_of(ex.declare_queue, "s", "c1", exclusive=True,
                   arguments={"x-queue-type": "stream"}) == 406
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-custom-thing": "yes", "x-max-priority": 10})
    assert dict(ex.declared["q"].arguments) == {"x-custom-thing": "yes",
                                                "x-max-priority": 10}
    assert ex.declared["q"].parsed.max_priority == 10
    # (as RabbitMQ: a redeclaration may differ in unknown arguments, not known ones)
    ex.declare_queue("q", "c2", durable=True, arguments={"x-max-priority": 10})
    assert code_of(ex.declare_queue, "q", "c2", durable=True) == 406


def test_max_length_drops_the_oldest_by_default() -> None:
    """x-max-length keeps the newest messages (x-overflow drop-head)."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-max-length": 2})
    for i in range(3):
        ex.publish(message(b"%d" % i, broker=broker), "", "q")
    assert [m.payload for m in broker.queues.queues["q"].log.values()] == [b"1", b"2"]


def test_reject_publish_refuses_what_a_full_queue_cannot_take() -> None:
    """With x-overflow reject-publish a publish to a full queue is refused: its
    confirm fails (basic.nack) and the queue keeps what it had."""
    from mqttamqp.core.exchanges.exchanges import PublishRefused
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ex.publish(message(b"a", broker=broker), "", "q")
    routed, confirm = ex.publish(message(b"b", broker=broker), "", "q")
    assert routed and confirm is not None
    failures: list[Any] = []
    confirm.addErrback(failures.append)
    assert failures and failures[0].check(PublishRefused)
    assert [m.payload for m in broker.queues.queues["q"].log.values()] == [b"a"]


def test_reject_publish_refuses_for_good_what_could_never_fit() -> None:
    """A message even an empty reject-publish queue would refuse (a payload over
    x-max-length-bytes, or x-max-length 0) is refused for good (MQTT 5 0x97 quota
    exceeded, as RabbitMQ; AMQP 1.0 amqp:precondition-failed: a bridge does not
    send it again); one that waits for room, for now (0x97 too;
    amqp:resource-limit-exceeded); a 0.9.1 confirm fails for both."""
    from mqttamqp.amqp.refusals import RESOURCE_LIMIT_EXCEEDED, condition_of, for_good
    from mqttamqp.core.exchanges.exchanges import PublishRefused
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q4", "c1", durable=True, arguments={
        "x-max-length-bytes": 4, "x-overflow": "reject-publish"})
    ex.declare_queue("q0", "c1", durable=True, arguments={
        "x-max-length": 0, "x-overflow": "reject-publish"})

    def refusal(topic: str, payload: bytes) -> Any:
        result = broker.publish(Message(topic, payload, 1, False, "p", 0.0), None,
                                wait=True)
        assert result.refusal is not None, (topic, payload)
        return result.refusal

    for topic, payload in (("$queue/q4/x", b"0123456789"), ("$queue/q0/x", b"a")):
        for _ in range(3):   # (the same every time: never for now)
            r = refusal(topic, payload)
            assert r.code == 0x97 and r.lasting
            assert for_good(r) and condition_of(r) == "amqp:precondition-failed"
            assert "can never take" in r.reason
    _, copies = broker.queues.publish_copies(
        [("q4", Message("$queue/q4", b"0123456789", 1, False, "p", 0.0))], "p")
    assert [(n, r.code, for_good(r)) for n, r in copies] == [("q4", 0x97, True)]
    assert not broker.queues.queues["q4"].log and not broker.queues.queues["q0"].log
    # (room for it once the queue drains: for now)
    assert broker.publish(Message("$queue/q4/x", b"abc", 1, False, "p", 0.0),
                          None, wait=True).refusal is None
    r = refusal("$queue/q4/x", b"ab")
    assert r.code == 0x97 and not r.lasting
    assert condition_of(r) == RESOURCE_LIMIT_EXCEEDED and not for_good(r)
    for name, payload in (("q4", b"0123456789"), ("q4", b"ab"), ("q0", b"a")):
        routed, confirm = ex.publish(message(payload, broker=broker), "", name)
        assert routed and confirm is not None
        failures: list[Any] = []
        confirm.addErrback(failures.append)
        assert failures and failures[0].check(PublishRefused), (name, payload)


def test_reject_publish_dlx_dead_letters_the_refused_message() -> None:
    """x-overflow reject-publish-dlx refuses the publish and dead-letters it."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("over", "c1", durable=True)
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                "x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "over"})
    ex.publish(message(b"a", broker=broker), "", "q")
    _, confirm = ex.publish(message(b"b", broker=broker), "", "q")
    assert confirm is not None
    confirm.addErrback(lambda f: None)
    assert [m.payload for m in broker.queues.queues["over"].log.values()] == [b"b"]


def test_message_ttl_expires_into_the_dead_letter_exchange() -> None:
    """x-message-ttl expires messages; with x-dead-letter-exchange they are routed
    there with reason expired (and the dead-letter routing key)."""
    broker, clock, _ = make()
    ex = broker.exchanges
    ex.declare_queue("dead", "c1", durable=True)
    ex.declare_exchange("dlx", "direct", durable=True)
    ex.bind_queue("dead", "dlx", "gone")
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx",
                                "x-dead-letter-routing-key": "gone"})
    ex.publish(message(b"m", broker=broker), "", "q")
    clock.advance(2.5)
    assert not broker.queues.queues["q"].log
    (dead,) = broker.queues.queues["dead"].log.values()
    assert dead.payload == b"m" and dead.topic == "$queue/dead/gone"
    assert dead.props is not None and ("reason", "expired") in dead.props.user_properties
    assert ("origin-queue", "q") in dead.props.user_properties


def test_message_ttl_zero_delivers_to_a_waiting_consumer_only() -> None:
    """x-message-ttl 0: a consumer with room gets the message, else it expires."""
    broker, clock, _ = make()
    ex = broker.exchanges
    ex.declare_queue("now", "c1", durable=True, arguments={"x-message-ttl": 0})
    ex.publish(message(b"nobody", broker=broker), "", "now")
    clock.advance(1.5)
    assert not broker.queues.queues["now"].log
    _, link = consume(broker, "now")
    ex.publish(message(b"taken", broker=broker), "", "now")
    assert got(link) == [("$queue/now", b"taken")]


def test_a_message_past_its_own_expiry_is_not_delivered() -> None:
    """A queued message whose expiry interval ran out (0.9.1 expiration, MQTT 5
    message expiry) leaves the queue when it would be delivered, dead-lettered as
    expired by the queue's dead-letter exchange, and never reaches the consumer."""
    from mqttamqp.core.message import MessageProperties
    broker, clock, _ = make()
    ex = broker.exchanges
    ex.declare_queue("gone", "c1", durable=True)
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "gone"})
    now = broker.clock.seconds()
    short = Message("", b"short", 1, False, "p", now, props=MessageProperties(
        expiry_interval=1))
    ex.publish(short, "", "q")
    ex.publish(message(b"long", broker=broker), "", "q")
    clock.advance(2)
    _, link = consume(broker, "q")
    assert got(link) == [("$queue/q", b"long")]
    (dead,) = broker.queues.queues["gone"].log.values()
    assert dead.payload == b"short" and dead.props is not None
    assert ("reason", "expired") in dead.props.user_properties
    session, _ = get_session(broker)
    ex.publish(short, "", "q")
    assert ex.get("q", session) == (False, 0)


def test_a_rejected_message_goes_to_the_dead_letter_exchange_not_dlq() -> None:
    """A rejected delivery of a queue with a dead-letter exchange is routed there
    by its original key; no $dlq/ queue is made."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("parked", "c1", durable=True)
    ex.bind_queue("parked", "amq.direct", "jobs")
    ex.declare_queue("jobs", "c1", durable=True,
                     arguments={"x-dead-letter-exchange": "amq.direct"})
    session, link = consume(broker, "jobs")
    ex.publish(message(b"bad", broker=broker), "", "jobs")
    broker.settle(session, link.published()[0][2], Outcome.REJECTED)
    (dead,) = broker.queues.queues["parked"].log.values()
    assert dead.payload == b"bad" and dead.topic == "$queue/parked/jobs"
    assert dead.props is not None and ("reason", "rejected") in dead.props.user_properties
    assert {("dead-letter-exchange", "amq.direct"), ("dead-letter-routing-key", "jobs"),
            ("origin-queue", "jobs")} <= set(dead.props.user_properties)
    assert "$dlq/jobs" not in broker.queues.queues


def test_x_expires_deletes_an_unused_queue() -> None:
    """x-expires deletes a queue unused that long; a consumer keeps it."""
    broker, clock, _ = make()
    ex = broker.exchanges
    ex.declare_queue("short", "c1", durable=True, arguments={"x-expires": 1000})
    ex.declare_queue("held", "c1", durable=True, arguments={"x-expires": 1000})
    consume(broker, "held")
    clock.advance(1.5)
    assert "short" not in broker.queues.queues and "short" not in ex.declared
    assert "held" in broker.queues.queues


def test_x_expires_keeps_a_queue_mqtt_consumers_read() -> None:
    """A queue with an MQTT member is in use: x-expires does not delete it, and
    deletes it once it has been unused that long after the member left."""
    from queue_facade import client, join
    broker, clock, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-expires": 1000})
    dev, _ = client(broker, "dev")
    assert join(broker, dev, "$queue/q") in (0, 1)
    clock.advance(2.5)
    assert "q" in broker.queues.queues and "q" in ex.declared
    assert any(g.members for g in broker.queues.queues["q"].groups.values())
    broker.unsubscribe(dev, ["$queue/q"])
    clock.advance(2.5)
    assert "q" not in broker.queues.queues


def test_a_stream_queue_is_read_by_cursor() -> None:
    """x-queue-type stream: consumers join as stream readers from x-stream-offset."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("events", "c1", durable=True, arguments={"x-queue-type": "stream"})
    for i in range(3):
        ex.publish(message(b"%d" % i, broker=broker), "", "events")
    _, consumer = ex.consumer_filter("events", "c1", {"x-stream-offset": "first"})
    assert consumer.mode == "stream" and consumer.stream_offset == "first"
    _, link = consume(broker, "events", arguments={"x-stream-offset": "first"})
    assert [p for _, p in got(link)] == [b"0", b"1", b"2"]


def test_stopping_the_broker_leaves_no_expiry_timer() -> None:
    """Broker.stop cancels the x-expires timers of unused queues."""
    from fakes import timers_left
    broker, clock, _ = make()
    broker.exchanges.declare_queue("short", "c1", durable=True,
                                   arguments={"x-expires": 60_000})
    broker.stop()
    assert timers_left(clock) == []


def test_max_length_counts_ready_messages_only() -> None:
    """x-max-length drops and reject-publish refuses by the ready messages: one a
    consumer holds unacknowledged is neither counted nor dead-lettered under it."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("dead", "c1", durable=True)
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-max-length": 1, "x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "dead"})
    _, link = consume(broker, "q")
    ex.publish(message(b"one", broker=broker), "", "q")
    assert [p for _, p in got(link)] == [b"one"]          # held, unacknowledged
    link.congested = True                                 # (takes no more for now)
    ex.publish(message(b"two", broker=broker), "", "q")
    assert broker.queues.queues["dead"].log == {}
    ex.publish(message(b"three", broker=broker), "", "q")  # two is ready: it goes
    assert [m.payload for m in broker.queues.queues["dead"].log.values()] == [b"two"]
    assert [m.payload for m in broker.queues.queues["q"].log.values()] == [b"one", b"three"]
    ex.declare_queue("r", "c1", durable=True,
                     arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    _, l2 = consume(broker, "r", key="t2")
    ex.publish(message(b"a", broker=broker), "", "r")
    assert len(l2.published()) == 1
    l2.congested = True
    _, d = ex.publish(message(b"b", broker=broker), "", "r")   # 0 ready: taken
    fails: list[Any] = []
    assert d is not None
    d.addErrback(fails.append)
    assert fails == []
    _, d = ex.publish(message(b"c", broker=broker), "", "r")   # 1 ready: refused
    assert d is not None
    d.addErrback(fails.append)
    assert len(fails) == 1
    assert [m.payload for m in broker.queues.queues["r"].log.values()] == [b"a", b"b"]


def test_dead_letters_keep_the_key_they_were_published_with() -> None:
    """A dead letter is routed with the routing key it was published with (as
    RabbitMQ): a.b.c for a copy that came through amq.topic (whose topic in the
    queue is a/b/c), and "" for a 0.9.1 fanout publish with an empty key."""
    from dataclasses import replace

    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_exchange("dlx", "topic", durable=True)
    ex.declare_queue("dead", "c1", durable=True)
    ex.bind_queue("dead", "dlx", "plant.#")
    ex.declare_queue("q", "c1", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    ex.bind_queue("q", "amq.topic", "plant.#")
    ex.publish(message(b"m", broker=broker), "amq.topic", "plant.line1.temp")
    session, link = consume(broker, "q")
    broker.settle(session, link.published()[0][2], Outcome.REJECTED)
    (dead,) = broker.queues.queues["dead"].log.values()
    assert dead.props is not None
    assert ("dead-letter-routing-key", "plant.line1.temp") in dead.props.user_properties
    from mqttamqp.amqp091.properties import envelope, sent_with
    ex.attach_envelope(sent_with)          # (as the 0.9.1 adapter's factory does)
    ex.declare_queue("empty", "c1", durable=True)
    ex.bind_queue("empty", "amq.direct", "")
    ex.declare_queue("f", "c1", durable=True,
                     arguments={"x-dead-letter-exchange": "amq.direct"})
    ex.bind_queue("f", "amq.fanout", "")
    sent = replace(message(b"n", broker=broker), amqp091=envelope("amq.fanout", "", b""))
    ex.publish(sent, "amq.fanout", "")
    s2, l2 = consume(broker, "f", key="t2")
    broker.settle(s2, l2.published()[0][2], Outcome.REJECTED)
    assert [m.payload for m in broker.queues.queues["empty"].log.values()] == [b"n"]


def test_dead_letters_respect_a_reject_publish_target() -> None:
    """A dead-letter target with x-overflow reject-publish takes dead letters up to
    its bound; the rest are dropped and counted, not appended past it."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("dead", "c1", durable=True,
                     arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "dead"})
    session, link = consume(broker, "q")
    for i in range(3):
        ex.publish(message(b"%d" % i, broker=broker), "", "q")
    refused = broker.queues.stats.refused
    for _, _, pid, *_ in list(link.published()):
        broker.settle(session, pid, Outcome.REJECTED)
    assert [m.payload for m in broker.queues.queues["dead"].log.values()] == [b"0"]
    assert broker.queues.stats.refused == refused + 2
    assert broker.queues.queues["q"].log == {}


def test_a_stream_refuses_x_overflow_at_declare() -> None:
    """Review finding: a stream took x-overflow reject-publish, then refused every
    publish past its bound "for now" for ever (a stream's bounds drop the oldest;
    nothing consumes to make room).  x-overflow on a stream is refused (406), any
    value, as RabbitMQ refuses it there; a stream with x-max-length alone keeps
    the newest."""
    broker, _, _ = make()
    ex = broker.exchanges
    for overflow in ("reject-publish", "reject-publish-dlx", "drop-head"):
        with pytest.raises(ChannelError) as info:
            ex.declare_queue("s", "c1", durable=True, arguments={
                "x-queue-type": "stream", "x-max-length": 2, "x-overflow": overflow})
        assert info.value.code == 406 and "invalid arg 'x-overflow'" in info.value.text
        assert "s" not in broker.queues.queues and "s" not in ex.declared
    ex.declare_queue("s", "c1", durable=True, arguments={
        "x-queue-type": "stream", "x-max-length": 2})
    for payload in (b"a", b"b", b"c", b"d"):
        assert broker.publish(Message("$queue/s/x", payload, 1, False, "p", 0.0), None,
                              wait=True).refusal is None
    assert [m.payload for m in broker.queues.queues["s"].log.values()] == [b"c", b"d"]


def test_a_stream_stored_with_x_overflow_restarts_dropping_the_oldest() -> None:
    """A stream declared with x-overflow before it was refused is restored with its
    bounds acting as a stream's (the oldest go), not refusing publishes for ever."""
    from fakes import MemoryStore

    from mqttamqp.core.persistence import PutQueueArguments
    store = MemoryStore()
    broker, _, _ = make(store)
    broker.exchanges.declare_queue("s", "c1", durable=True, arguments={
        "x-queue-type": "stream", "x-max-length": 2})
    # (what an older version stored for x-overflow reject-publish on a stream)
    broker.queues.commits.persist([PutQueueArguments("s", (
        ("x-max-length", 2), ("x-overflow", "reject-publish"),
        ("x-queue-type", "stream")))])
    again, _, _ = make(store)
    queue = again.queues.queues["s"]
    assert queue.reject_above is None and queue.retention.max_messages == 2
    for payload in (b"a", b"b", b"c"):
        assert again.publish(Message("$queue/s/x", payload, 1, False, "p", 0.0), None,
                             wait=True).refusal is None
    assert [m.payload for m in queue.log.values()] == [b"b", b"c"]


def test_a_classic_queue_stored_with_a_bad_x_overflow_keeps_it() -> None:
    """Only a stream's stored x-overflow is dropped at restore (with one line): a
    classic queue whose stored arguments do not parse is not quietly turned from
    refusing publishes into dropping the oldest."""
    from fakes import MemoryStore

    from mqttamqp.core.persistence import PutQueueArguments
    store = MemoryStore()
    broker, _, _ = make(store)
    broker.exchanges.declare_queue("q", "c1", durable=True, arguments={"x-max-length": 2})
    broker.queues.commits.persist([PutQueueArguments("q", (
        ("x-max-length", 2), ("x-overflow", "no-such-overflow")))])
    again, _, _ = make(store)
    assert again.exchanges.declared["q"].parsed.max_length is None
