"""AMQP 0.9.1's model on the core (``mqttamqp.core.exchanges``) through
``Broker.exchanges``, with fake links, ``task.Clock`` and in-memory stores: queue
declarations, the default exchange and 0.9.1 consumers on the queue manager's
queues."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FakeLink, ManualMemoryStore, MemoryStore
from queue_facade import client, got, join, make, send

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker, Outcome
from mqttamqp.core.exchanges.errors import ChannelError
from mqttamqp.core.message import Message
from mqttamqp.core.sessions.session import Session


def message(payload: bytes = b"x", qos: int = 1, broker: Broker | None = None) -> Message:
    now = broker.clock.seconds() if broker is not None else 0.0
    return Message("", payload, qos, False, "pub", now)


def consume(broker: Broker, queue: str, owner: str = "c1", key: str = "ctag",
            arguments: dict[str, Any] | None = None) -> tuple[Session, FakeLink]:
    """A 0.9.1 consumer as the adapter makes one: the queue's filter and consumer."""
    topic_filter, consumer = broker.exchanges.consumer_filter(queue, owner, arguments)
    session = broker.add_topic_receiver(f"{owner}/{key}", topic_filter,
                                        Identity(owner, None, "amqp0-9-1"), 1,
                                        consumer=consumer)
    assert session is not None
    link = FakeLink(key)
    broker.start_topic_receiver(session, link)
    broker.exchanges.consumer_added(queue)
    return session, link


def code_of(call: Any, *args: Any, **kwargs: Any) -> int:
    with pytest.raises(ChannelError) as info:
        call(*args, **kwargs)
    return info.value.code


# -- step 1: declare, the default exchange, consumers ------------------------------


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


# -- step 2: transient queues ------------------------------------------------------


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


# -- step 3: exchanges and bindings ------------------------------------------------


def declared(broker: Broker, *names: str, durable: bool = True) -> None:
    for name in names:
        broker.exchanges.declare_queue(name, "c1", durable=durable)


def depth(broker: Broker, name: str) -> int:
    return len(broker.queues.queues[name].log)


def test_standard_exchanges_exist_and_cannot_be_made_or_deleted() -> None:
    """amq.direct, amq.fanout, amq.topic, amq.headers and amq.match exist; declaring
    them as they are is fine, otherwise 406; new amq. names and deleting them 403."""
    broker, _, _ = make()
    ex = broker.exchanges
    for name, kind in (("amq.direct", "direct"), ("amq.fanout", "fanout"),
                       ("amq.topic", "topic"), ("amq.headers", "headers"),
                       ("amq.match", "headers")):
        assert ex.declare_exchange(name, kind, durable=True) is None
        assert ex.declare_exchange(name, passive=True) is None
    assert code_of(ex.declare_exchange, "amq.direct", "fanout", durable=True) == 406
    assert code_of(ex.declare_exchange, "amq.new", "direct") == 403
    assert code_of(ex.delete_exchange, "amq.fanout") == 403
    assert code_of(ex.declare_exchange, "", "direct") == 403
    assert code_of(ex.declare_exchange, "x", "x-delayed-message") == 503


def test_declare_redeclare_and_passive_exchange_rules() -> None:
    """Redeclaring with another type, durability, auto-delete, internal or arguments
    is 406; a passive declare of a missing exchange is 404."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_exchange("logs", "fanout", durable=True)
    assert ex.declare_exchange("logs", "fanout", durable=True) is None
    assert code_of(ex.declare_exchange, "logs", "direct", durable=True) == 406
    assert code_of(ex.declare_exchange, "logs", "fanout", durable=False) == 406
    assert code_of(ex.declare_exchange, "logs", "fanout", durable=True,
                   internal=True) == 406
    assert code_of(ex.declare_exchange, "logs", "fanout", durable=True,
                   arguments={"alternate-exchange": "ae"}) == 406
    assert code_of(ex.declare_exchange, "nope", passive=True) == 404


def test_direct_fanout_and_topic_routing() -> None:
    """Direct routes by equal key, fanout to every bound queue, topic by pattern
    (* one word, # zero or more, anywhere in the key)."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "a", "b", "c")
    ex.bind_queue("a", "amq.direct", "red")
    ex.bind_queue("b", "amq.direct", "blue")
    assert ex.publish(message(broker=broker), "amq.direct", "red")[0]
    assert (depth(broker, "a"), depth(broker, "b")) == (1, 0)
    assert not ex.publish(message(broker=broker), "amq.direct", "green")[0]
    ex.declare_exchange("fan", "fanout")
    for q in ("a", "b", "c"):
        ex.bind_queue(q, "fan")
    ex.publish(message(broker=broker), "fan", "whatever")
    assert [depth(broker, q) for q in "abc"] == [2, 1, 1]
    ex.declare_exchange("t", "topic")
    ex.bind_queue("a", "t", "stock.*.nyse")
    ex.bind_queue("b", "t", "stock.#")
    ex.bind_queue("c", "t", "#.nyse")
    ex.publish(message(broker=broker), "t", "stock.ibm.nyse")
    assert [depth(broker, q) for q in "abc"] == [3, 2, 2]
    ex.publish(message(broker=broker), "t", "stock")
    assert [depth(broker, q) for q in "abc"] == [3, 3, 2]
    ex.publish(message(broker=broker), "t", "bond.x.y.nyse")
    assert [depth(broker, q) for q in "abc"] == [3, 3, 3]


def test_topic_patterns_match_linearly() -> None:
    """Topic matching: the spec's cases, and a key of many # is still answered."""
    from mqttamqp.core.exchanges.routes import topic_match, topic_words
    cases = [("a.b.c", "a.b.c", True), ("a.*.c", "a.b.c", True), ("a.*", "a.b.c", False),
             ("a.#", "a", True), ("#", "", True), ("#.c", "a.b.c", True),
             ("a.#.c", "a.c", True), ("a.#.c", "a.x.y.c", True), ("*.*", "a", False),
             ("a.#.#.b", "a.b", True)]
    for pattern, key, expected in cases:
        assert topic_match(topic_words(pattern), key.split(".")) is expected, pattern
    many = topic_words(".".join(["#", "x"] * 60))
    assert topic_match(many, ["y"] * 200) is False


def test_headers_exchange_all_and_any() -> None:
    """Headers routing: x-match all (default) needs every pair, any one of them;
    x- arguments are left out; an unknown x-match is 406."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "all", "any")
    ex.bind_queue("all", "amq.headers", "", {"format": "pdf", "type": "report"})
    ex.bind_queue("any", "amq.match", "", {"x-match": "any", "format": "pdf",
                                           "type": "log"})
    ex.publish(message(broker=broker), "amq.headers", "", {"format": "pdf"})
    ex.publish(message(broker=broker), "amq.match", "", {"format": "pdf"})
    assert (depth(broker, "all"), depth(broker, "any")) == (0, 1)
    ex.publish(message(broker=broker), "amq.headers", "",
               {"format": "pdf", "type": "report", "extra": 1})
    assert depth(broker, "all") == 1
    assert code_of(ex.bind_queue, "all", "amq.headers", "", {"x-match": "some"}) == 406


def test_exchange_to_exchange_bindings_and_loops() -> None:
    """exchange.bind routes on; a loop of exchanges delivers each queue one copy."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "q")
    ex.declare_exchange("x1", "fanout")
    ex.declare_exchange("x2", "fanout")
    ex.bind_exchange("x2", "x1")
    ex.bind_exchange("x1", "x2")
    ex.bind_queue("q", "x2")
    assert ex.publish(message(broker=broker), "x1", "k")[0]
    assert depth(broker, "q") == 1


def test_bind_errors_unbind_and_delete() -> None:
    """Binding a missing queue or exchange is 404, to the default exchange 403;
    unbind stops routing; deleting a queue or exchange removes its bindings;
    if_unused refuses a bound exchange (406)."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "q")
    assert code_of(ex.bind_queue, "ghost", "amq.direct", "k") == 404
    assert code_of(ex.bind_queue, "q", "ghost", "k") == 404
    assert code_of(ex.bind_queue, "q", "", "q") == 403
    ex.declare_exchange("d", "direct")
    ex.bind_queue("q", "d", "k")
    assert code_of(ex.delete_exchange, "d", True) == 406
    ex.unbind_queue("q", "d", "k")
    assert not ex.publish(message(broker=broker), "d", "k")[0]
    ex.bind_queue("q", "d", "k")
    ex.delete_queue("q", "c1")
    assert ex.binding_count == 0 and not ex.exchanges["d"].bindings
    ex.delete_exchange("d")
    assert code_of(ex.publish, message(), "d", "k") == 404


def test_internal_exchange_refuses_publishes_and_alternate_takes_the_unroutable() -> None:
    """A publish to an internal exchange is 403; an alternate exchange takes what
    its exchange could not route."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "lost")
    ex.declare_exchange("ae", "fanout", internal=True)
    ex.bind_queue("lost", "ae")
    ex.declare_exchange("main", "direct", arguments={"alternate-exchange": "ae"})
    assert code_of(ex.publish, message(), "ae", "") == 403
    assert ex.publish(message(broker=broker), "main", "nobody")[0]
    assert depth(broker, "lost") == 1


def test_auto_delete_exchange_goes_with_its_last_binding() -> None:
    """An auto-delete exchange is deleted when its last binding is removed."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "q")
    ex.declare_exchange("tmp", "fanout", auto_delete=True)
    ex.bind_queue("q", "tmp")
    ex.unbind_queue("q", "tmp")
    assert "tmp" not in ex.exchanges


def test_exchange_and_binding_bounds() -> None:
    """Past --max-exchanges / --max-bindings a declare or bind is refused (406),
    counted, and logged once a minute per bound."""
    from twisted.logger import globalLogPublisher
    events: list[dict[str, Any]] = []

    def observer(event: dict[str, Any]) -> None:
        if str(event.get("log_namespace")).startswith("mqttamqp.core.exchanges"):
            events.append(event)

    globalLogPublisher.addObserver(observer)
    try:
        broker, _, _ = make(max_exchanges=2, max_bindings=2)
        ex = broker.exchanges
        declared(broker, "q")
        ex.declare_exchange("e1", "direct")
        ex.declare_exchange("e2", "direct")
        assert code_of(ex.declare_exchange, "e3", "direct") == 406
        assert code_of(ex.declare_exchange, "e4", "direct") == 406
        ex.bind_queue("q", "e1", "a")
        ex.bind_queue("q", "e1", "b")
        assert code_of(ex.bind_queue, "q", "e1", "c") == 406
    finally:
        globalLogPublisher.removeObserver(observer)
    assert ex.refused == 3
    assert broker.stats.limits == {"max_exchanges": 2, "max_bindings": 1}
    assert sorted(e["w"] for e in events) == ["bindings", "exchanges"]


def test_mandatory_result_and_exclusive_bind() -> None:
    """An unroutable publish says so (basic.return); binding another connection's
    exclusive queue is 405."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("mine", "c1", exclusive=True)
    assert code_of(ex.bind_queue, "mine", "amq.fanout", "", None, "c2") == 405
    assert ex.publish(message(), "amq.fanout", "", mandatory=True) == (False, None)
    ex.bind_queue("mine", "amq.fanout", "", None, "c1")
    routed, _ = ex.publish(message(broker=broker), "amq.fanout", "", mandatory=True)
    assert routed


# -- step 4: amq.topic is the MQTT topic space -------------------------------------


def test_a_091_publish_to_amq_topic_reaches_mqtt_subscribers() -> None:
    """Routing key a.b.c to amq.topic is MQTT topic a/b/c: a subscriber of a/+/c gets
    it, and a queue bound with a.*.c too (once)."""
    broker, _, _ = make()
    ex = broker.exchanges
    sub, link = client(broker, "dev")
    broker.subscribe(sub, Identity("dev"), [("a/+/c", 1)])
    declared(broker, "q")
    ex.bind_queue("q", "amq.topic", "a.*.c")
    routed, _ = ex.publish(message(b"t", broker=broker), "amq.topic", "a.b.c")
    assert routed
    assert got(link) == [("a/b/c", b"t")]
    assert depth(broker, "q") == 1
    assert broker.queues.queues["q"].log[0].topic == "$queue/q/a/b/c"


def test_an_mqtt_publish_reaches_queues_bound_to_amq_topic() -> None:
    """An MQTT publish of plant/line1/temp reaches a queue bound to amq.topic with
    plant.*.temp (and plant.#), not one bound with office.#; its PUBACK waits for
    the append's commit."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    declared(broker, "hot", "all", "office")
    ex.bind_queue("hot", "amq.topic", "plant.*.temp")
    ex.bind_queue("all", "amq.topic", "plant.#")
    ex.bind_queue("office", "amq.topic", "office.#")
    store.commit_all()
    result = send(broker, "plant/line1/temp", b"21")
    assert [depth(broker, q) for q in ("hot", "all", "office")] == [1, 1, 0]
    assert result.durable is not None and not result.durable.called
    store.commit_all()
    assert result.durable.called


def test_nothing_bound_to_amq_topic_costs_one_attribute() -> None:
    """Publishing calls the amq.topic hook only while something is bound there."""
    broker, _, _ = make()
    ex = broker.exchanges
    assert broker.publishing.topic_exchange is None
    declared(broker, "q")
    ex.bind_queue("q", "amq.topic", "#")
    assert broker.publishing.topic_exchange is ex
    ex.unbind_queue("q", "amq.topic", "#")
    assert broker.publishing.topic_exchange is None


def test_amq_topic_publish_denied_is_403_and_dollar_topics_stay_out() -> None:
    """A 0.9.1 publish the ACL denies is 403; keys that map to $ topics never reach
    the MQTT topic space."""
    from mqttamqp.core.auth import AllowAll

    class NoWrites(AllowAll):
        def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
            return False

    from fakes import NullStore
    from twisted.internet.task import Clock

    from mqttamqp.core.limits import Limits
    broker = Broker(Clock(), NullStore(), Limits(sys_interval=0), authorizer=NoWrites())
    broker.start()
    assert code_of(broker.exchanges.publish, message(), "amq.topic", "a.b",
                   identity=Identity("p")) == 403
    sub, link = client(broker, "spy")
    broker.subscribe(sub, Identity("spy"), [("#", 0)])
    assert broker.exchanges.publish(message(), "amq.topic", "$SYS.x") == (False, None)
    assert got(link) == []


# -- step 5: durability --------------------------------------------------------------


def build_durable_model(broker: Broker) -> list[Any]:
    """Durable and transient exchanges, queues and bindings; the commits to wait for."""
    ex = broker.exchanges
    waits = [ex.declare_exchange("orders", "topic", durable=True),
             ex.declare_exchange("audit", "fanout", durable=True,
                                 arguments={"alternate-exchange": "amq.fanout"}),
             ex.declare_exchange("scratch", "direct"),
             ex.declare_queue("eu", "c1", durable=True,
                              arguments={"x-max-length": 100, "x-custom": "kept"})[1],
             ex.declare_queue("tmp", "c1", exclusive=True)[1],
             ex.bind_queue("eu", "orders", "eu.#"),
             ex.bind_exchange("audit", "orders", "#"),
             ex.bind_queue("eu", "audit"),
             ex.bind_queue("tmp", "orders", "#", None, "c1"),
             ex.bind_queue("eu", "amq.topic", "plant.#")]
    return [d for d in waits if d is not None]


def check_restored(broker: Broker) -> None:
    ex = broker.exchanges
    assert {"orders", "audit"} <= set(ex.exchanges) and "scratch" not in ex.exchanges
    assert dict(ex.exchanges["audit"].arguments) == {"alternate-exchange": "amq.fanout"}
    assert ex.declared["eu"].arguments == (("x-custom", "kept"), ("x-max-length", 100))
    assert "tmp" not in broker.queues.queues
    assert ex.binding_count == 4
    # redeclaring as before is fine, otherwise 406
    ex.declare_queue("eu", "c9", durable=True,
                     arguments={"x-max-length": 100, "x-custom": "kept"})
    assert code_of(ex.declare_queue, "eu", "c9", durable=True) == 406
    assert broker.publishing.topic_exchange is ex


def test_durable_exchanges_bindings_and_arguments_survive_a_restart() -> None:
    """A second broker on the same (in-memory) store has the durable exchanges,
    bindings and queue arguments, and none of the transient ones."""
    store = MemoryStore()
    broker, _, _ = make(store)
    build_durable_model(broker)
    routed, _ = broker.exchanges.publish(message(b"kept", broker=broker), "orders", "eu.de")
    assert routed
    again, _, _ = make(store)
    check_restored(again)
    # (one copy a queue, whichever routes reach it)
    assert [m.payload for m in again.queues.queues["eu"].log.values()] == [b"kept"]


def test_durable_model_survives_on_the_zodb_store(tmp_path: Any) -> None:
    """The same on the real ZODB store: what was committed (confirmed) is back after
    the store is opened again, and routing works as before."""
    from store_reactor import FakeReactor
    from twisted.internet.task import Clock

    from mqttamqp.core.limits import Limits
    from mqttamqp.store import ZODBStore

    reactor = FakeReactor()
    store = ZODBStore(str(tmp_path), reactor)    # type: ignore[arg-type]
    broker = Broker(Clock(), store, Limits(sys_interval=0))
    broker.start()
    for d in build_durable_model(broker):
        reactor.run_until_fired(d)
    routed, confirm = broker.exchanges.publish(message(b"c", broker=broker), "orders",
                                               "eu.fr")
    assert routed and confirm is not None
    reactor.run_until_fired(confirm)
    broker.stop()
    store.close()
    store = ZODBStore(str(tmp_path), reactor)    # type: ignore[arg-type]
    try:
        again = Broker(Clock(), store, Limits(sys_interval=0))
        again.start()
        check_restored(again)
        assert [m.payload for m in again.queues.queues["eu"].log.values()] == [b"c"]
        routed, d = again.exchanges.publish(message(b"d"), "orders", "eu.it")
        assert routed and d is not None
        reactor.run_until_fired(d)
        again.stop()
    finally:
        store.close()


# -- step 6: queue arguments -------------------------------------------------------


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
    assert dead.payload == b"m"
    assert dead.props is not None and ("reason", "expired") in dead.props.user_properties
    assert ("origin-queue", "q") in dead.props.user_properties


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
    assert dead.payload == b"bad" and dead.topic == "$queue/parked"
    assert dead.props is not None and ("reason", "rejected") in dead.props.user_properties
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


# -- step 7: basic.get and connection_closed ------------------------------------------


def get_session(broker: Broker, key: str = "c1/get") -> tuple[Session, FakeLink]:
    """A channel's session for basic.get: online, subscribed to nothing."""
    session = broker.registry.add_link_subscriber(key)
    link = FakeLink(key)
    broker.activate(session, link, "amqp0-9-1")
    return session, link


def test_basic_get_takes_one_message_at_a_time() -> None:
    """basic.get hands one message, says how many are left, and says empty when
    there is none; an acknowledged one is gone."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    for i in range(2):
        ex.publish(message(b"%d" % i, broker=broker), "", "q")
    session, link = get_session(broker)
    assert ex.get("q", session) == (True, 1)
    assert got(link) == [("$queue/q", b"0")]
    broker.acknowledged(session, link.published()[0][2])
    assert ex.get("q", session, no_ack=True) == (True, 0)
    assert ex.get("q", session) == (False, 0)
    assert not broker.queues.queues["q"].log


def test_an_unsettled_get_goes_back_when_its_session_goes() -> None:
    """A message got and not acknowledged is back in the queue (redelivered) once
    the channel's session goes; a nack requeues it too."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True)
    ex.publish(message(b"m", broker=broker), "", "q")
    session, link = get_session(broker)
    assert ex.get("q", session)[0]
    broker.settle(session, link.published()[0][2], Outcome.RELEASED)
    assert ex.get("q", session)[0]
    broker.registry.remove_link_subscriber("c1/get")
    other, link2 = get_session(broker, "c2/get")
    assert ex.get("q", other)[0]
    assert got(link2) == [("$queue/q", b"m")]


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


def test_an_mqtt_qos2_publish_and_a_will_reach_queues_bound_to_amq_topic() -> None:
    """An MQTT QoS 2 publish and a will published by the broker reach the queues
    bound to amq.topic as any publish does."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "q")
    ex.bind_queue("q", "amq.topic", "dev.#")
    session, _ = client(broker, "dev1")
    result = broker.publish_qos2(session, Message("dev/a", b"q2", 2, False, "dev1",
                                                  broker.clock.seconds()),
                                 Identity("dev1"), 7)
    assert result.gate is not None
    result.gate.open()
    broker.publishing.publish_with(Message("dev/will", b"bye", 1, False, "dev1",
                                           broker.clock.seconds()), ())
    assert [m.payload for m in broker.queues.queues["q"].log.values()] == [b"q2", b"bye"]


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


def test_dead_letter_queues_take_dead_letters_only() -> None:
    """$dlq/ queues cannot be published to through the default exchange nor bound."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("jobs", "c1", durable=True)
    session, link = consume(broker, "jobs")
    ex.publish(message(broker=broker), "", "jobs")
    broker.settle(session, link.published()[0][2], Outcome.REJECTED)
    assert "$dlq/jobs" in broker.queues.queues
    assert ex.publish(message(), "", "$dlq/jobs") == (False, None)
    assert code_of(ex.bind_queue, "$dlq/jobs", "amq.fanout") == 403


def test_views_show_exchanges_bindings_and_declared_arguments() -> None:
    """The console's views list exchanges, bindings and declared queues with their
    arguments, unknown ones included."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-app-hint": "blue"})
    ex.declare_exchange("e", "fanout")
    ex.bind_queue("q", "e")
    exchanges, bindings, queues = ex.views()
    assert [e.name for e in exchanges] == ["amq.direct", "amq.fanout", "amq.headers",
                                           "amq.match", "amq.topic", "e"]
    assert [(b.source, b.destination, b.destination_kind) for b in bindings] == [
        ("e", "q", "queue")]
    assert [(q.name, q.arguments, q.transient) for q in queues] == [
        ("q", (("x-app-hint", "blue"),), False)]


def test_an_operators_retention_survives_a_restart_of_a_declared_queue() -> None:
    """The console's retention of a 0.9.1-declared queue is kept after a restart;
    what the arguments bound stays bound."""
    from mqttamqp.core.queues.model import Retention
    store = MemoryStore()
    broker, _, _ = make(store)
    broker.exchanges.declare_queue("q", "c1", durable=True,
                                   arguments={"x-max-length": 5})
    broker.queues.set_retention("q", Retention(60.0, 1000, 5))
    again, _, _ = make(store)
    assert again.queues.queues["q"].retention == Retention(60.0, 1000, 5)


def test_deleting_an_exchange_removes_the_bindings_to_it_not_a_queues() -> None:
    """Deleting exchange "x" removes the exchange-to-exchange bindings to it and
    leaves the bindings of a queue also named "x"."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "x")
    ex.declare_exchange("x", "fanout")
    ex.declare_exchange("src", "fanout")
    ex.bind_exchange("x", "src")
    ex.bind_queue("x", "src")
    ex.delete_exchange("x")
    assert [(b.destination, b.destination_kind) for b in ex.views()[1]] == [("x", "queue")]
    assert ex.binding_count == 1
