"""AMQP 0.9.1's exchanges (``mqttamqp.core.exchanges``) through ``Broker.exchanges``,
with fake links and ``task.Clock``: declare rules, direct/fanout/topic/headers routing,
exchange-to-exchange bindings, bounds, ``amq.topic`` as the MQTT topic space, views."""

from __future__ import annotations

from typing import Any

from exchange_facade import code_of, consume, declared, depth, message
from fakes import ManualMemoryStore
from queue_facade import client, got, make, send

from mqttamqp.core.auth import AllowAll, Identity
from mqttamqp.core.broker import Broker, Outcome
from mqttamqp.core.message import Message


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


def test_a_queue_deleted_from_the_console_loses_its_declaration_and_bindings() -> None:
    """A queue the queue manager deletes (the console's delete) is gone from the 0.9.1
    model too: no binding routes to it, and it may be declared anew with other
    arguments."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-max-length": 5})
    ex.declare_exchange("d", "direct", durable=True)
    ex.bind_queue("q", "d", "k")
    broker.queues.delete("q")
    assert "q" not in ex.declared
    assert ex.binding_count == 0 and not ex.exchanges["d"].bindings
    declared_again, _ = ex.declare_queue("q", "c1", durable=True,
                                         arguments={"x-max-length": 9})
    assert declared_again.name == "q"


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


def test_amq_topic_keys_that_are_no_topic_are_checked_too() -> None:
    """A key with + # or NUL, or an empty one, is checked against the publisher's
    write permission as any other key on amq.topic (403 when denied)."""
    from fakes import NullStore
    from twisted.internet.task import Clock

    from mqttamqp.core.limits import Limits

    class OnlyPlant(AllowAll):
        def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
            return topic == "plant/ok"

    broker = Broker(Clock(), NullStore(), Limits(sys_interval=0), authorizer=OnlyPlant())
    broker.start()
    ex = broker.exchanges
    declared(broker, "q", "all")
    ex.bind_queue("q", "amq.topic", "plant.*.temp")
    ex.bind_queue("all", "amq.topic", "#")
    for key in ("plant.+.temp", "plant.#", "", "plant.\x00.temp"):
        assert code_of(ex.publish, message(b"evil"), "amq.topic", key,
                       identity=Identity("p")) == 403, key
    assert depth(broker, "q") == 0 and depth(broker, "all") == 0
    assert ex.publish(message(b"ok"), "amq.topic", "plant.ok", identity=Identity("p"))[0]
    assert depth(broker, "all") == 1


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


def test_dead_letter_queues_take_dead_letters_only() -> None:
    """$dlq/ queues cannot be published to through the default exchange nor bound."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("jobs", "c1", durable=True)
    session, link = consume(broker, "jobs")
    ex.publish(message(broker=broker), "", "jobs")
    # (past --queue-max-deliveries makes it: a 0.9.1-declared queue without
    # x-dead-letter-exchange drops what is rejected, as RabbitMQ)
    for _ in range(broker.limits.queue_max_deliveries):
        broker.settle(session, link.published()[-1][2], Outcome.MODIFIED, True)
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


def _reference_match(pattern: str, key: str) -> bool:
    """0.9.1 topic matching by plain recursion (slow, obviously right)."""
    def go(p: list[str], w: list[str]) -> bool:
        if not p:
            return not w
        if p[0] == "#":
            return any(go(p[1:], w[i:]) for i in range(len(w) + 1))
        return bool(w) and (p[0] in ("*", w[0])) and go(p[1:], w[1:])
    return go(pattern.split(".") if pattern else [], key.split(".") if key else [])


def test_topic_matching_agrees_with_the_plain_definition() -> None:
    """For random binding and routing keys the linear matcher agrees with the
    definition (* one word, # zero or more)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mqttamqp.core.exchanges.routes import key_words, topic_match, topic_words
    word = st.sampled_from(["a", "b", ""])
    pattern = st.lists(st.sampled_from(["a", "b", "*", "#"]), min_size=1, max_size=6)

    @settings(max_examples=300, deadline=None)
    @given(pattern, st.lists(word, min_size=1, max_size=6))
    def check(p: list[str], w: list[str]) -> None:
        key, binding = ".".join(w), ".".join(p)
        assert topic_match(topic_words(binding), key_words(key)) == _reference_match(
            binding, key), (binding, key)

    check()


def test_a_topic_exchange_remembers_matches_until_its_bindings_change() -> None:
    """A topic exchange answers a repeated key from its bounded cache, and a new or
    removed binding is seen by the next publish."""
    from mqttamqp.core.exchanges.routes import MATCH_CACHE
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "a", "b")
    ex.declare_exchange("t", "topic")
    ex.bind_queue("a", "t", "x.*")
    ex.publish(message(broker=broker), "t", "x.1")
    ex.bind_queue("b", "t", "#")
    ex.publish(message(broker=broker), "t", "x.1")
    assert (depth(broker, "a"), depth(broker, "b")) == (2, 1)
    ex.unbind_queue("a", "t", "x.*")
    ex.publish(message(broker=broker), "t", "x.1")
    assert (depth(broker, "a"), depth(broker, "b")) == (2, 2)
    for i in range(MATCH_CACHE + 10):
        ex.route(ex.exchanges["t"], f"k.{i}", None)
    assert len(ex.exchanges["t"].matched) <= MATCH_CACHE


def test_the_topic_match_caches_are_bounded_together_and_skip_long_keys() -> None:
    """Every topic exchange's remembered matches count against one bound, and a
    key longer than a 0.9.1 short string (an MQTT topic on amq.topic) is matched
    but not remembered."""
    from mqttamqp.core.exchanges.routes import MATCH_CACHE
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "q")
    ex.bind_queue("q", "amq.topic", "a.#")
    for _ in range(3):
        send(broker, "a/" + "x" * 60000, b"", qos=0)
    assert ex.exchanges["amq.topic"].matched == {}
    assert depth(broker, "q") == 3
    for n in range(4):
        ex.declare_exchange(f"t{n}", "topic")
        ex.bind_queue("q", f"t{n}", "k.*")
    for i in range(MATCH_CACHE):
        for n in range(4):
            ex.route(ex.exchanges[f"t{n}"], f"k.{i}", None)
    held = sum(len(e.matched) for e in ex.exchanges.values())
    assert 0 < held <= MATCH_CACHE
    ex.delete_exchange("t0")
    assert sum(len(e.matched) for e in ex.exchanges.values()) <= held
    assert ex._match_budget.used == sum(len(e.matched) for e in ex.exchanges.values())


def test_a_publish_into_the_topic_space_says_which_subscribers_it_congested() -> None:
    """A 0.9.1 publish to amq.topic that leaves an MQTT subscriber past its
    high-water mark names it in ``congested`` (the adapter pauses its publisher);
    the next publish elsewhere clears it."""
    broker, _, _ = make()
    ex = broker.exchanges
    sub, link = client(broker, "slow")
    broker.subscribe(sub, Identity("slow"), [("t/#", 1)])
    link.congested = True
    # (past half its queue bound, a subscriber is past its high-water mark)
    for _ in range(broker.limits.max_queued_messages // 2 + 1):
        ex.publish(message(broker=broker), "amq.topic", "t.x")
    assert list(ex.congested) == [sub]
    declared(broker, "q")
    ex.publish(message(broker=broker), "", "q")
    assert ex.congested == ()


def test_a_full_bound_queue_fails_a_091_confirm_but_not_an_mqtt_puback() -> None:
    """A reject-publish queue bound to amq.topic refuses a message: the 0.9.1
    publisher's confirm fails, the MQTT publisher's acknowledgement does not."""
    from mqttamqp.core.exchanges.exchanges import PublishRefused
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("full", "c1", durable=True,
                     arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ex.bind_queue("full", "amq.topic", "#")
    _, confirm = ex.publish(message(broker=broker), "amq.topic", "a.b")
    failures: list[Any] = []
    assert confirm is not None
    confirm.addErrback(failures.append)
    assert failures and failures[0].check(PublishRefused)
    result = send(broker, "a/b")
    mqtt_failures: list[Any] = []
    if result.durable is not None:
        result.durable.addErrback(mqtt_failures.append)
    assert mqtt_failures == [] and broker.queues.stats.refused == 2


def test_a_queue_copy_keeps_every_field_but_the_topic() -> None:
    """The exchanges' per-queue copy of a message (built field by field) keeps every
    field of ``Message`` but its topic: a new field must be added to it."""
    from dataclasses import fields

    from mqttamqp.core.message import MessageProperties
    original = Message("", b"p", 1, False, "pub", 5.0, False, b"n", True,
                       MessageProperties(content_type="t"), b"091")
    seen: list[Message] = []

    class Queues:
        queues = {"q": None}

        def publish(self, copy: Message, address: Any, publisher: str,
                    in_round: bool = False) -> Any:
            seen.append(copy)
            return None, None

    from mqttamqp.core.exchanges.topicspace import TopicSpace
    space = TopicSpace.__new__(TopicSpace)
    space.queues = Queues()   # type: ignore[assignment]
    assert space._enqueue(original, ["q"], "a/b", "pub") is None
    [copy] = seen
    assert copy.topic != original.topic
    for f in fields(Message):
        if f.name != "topic":
            assert getattr(copy, f.name) == getattr(original, f.name), f.name


def test_a_refusal_fails_the_confirm_for_a_key_that_is_no_topic() -> None:
    """A reject-publish queue bound to amq.topic that refuses a 0.9.1 publish
    whose key is no MQTT topic (a wildcard, empty) fails its confirm too."""
    broker, _, _ = make()
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True,
                     arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ex.bind_queue("q", "amq.topic", "#")
    for key in ("a.b", "a.#", ""):
        _, confirm = ex.publish(message(broker=broker), "amq.topic", key)
        failures: list[Any] = []
        assert confirm is not None, key
        confirm.addErrback(failures.append)
        assert len(failures) == 1, key
    assert depth(broker, "q") == 0


def test_mandatory_on_amq_topic_counts_shared_subscribers() -> None:
    """A 0.9.1 publish to amq.topic whose only taker is a $share/ subscriber is
    routed (no basic.return for mandatory), and the subscriber gets it."""
    broker, _, _ = make()
    sub, link = client(broker, "worker")
    broker.subscribe(sub, Identity("worker"), [("$share/g/plant/#", 0)])
    routed, _ = broker.exchanges.publish(message(b"m"), "amq.topic", "plant.x",
                                         mandatory=True)
    assert routed
    assert got(link) == [("plant/x", b"m")]


def test_an_empty_routing_key_has_no_words() -> None:
    """As RabbitMQ splits keys, "" is zero words: a topic binding * does not take
    it, # and "" do; a..b still has an empty word for *."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "star", "hash", "empty", "mid")
    ex.declare_exchange("t", "topic")
    for queue, key in (("star", "*"), ("hash", "#"), ("empty", ""), ("mid", "a.*.b")):
        ex.bind_queue(queue, "t", key)
    ex.publish(message(broker=broker), "t", "")
    ex.publish(message(broker=broker), "t", "a..b")
    assert [depth(broker, q) for q in ("star", "hash", "empty", "mid")] == [0, 2, 1, 1]


def test_a_refused_amq_topic_publish_counts_for_no_protocol() -> None:
    """A 0.9.1 publish refused on amq.topic (403) is not counted as received: the
    MQTT figure (received less the other protocols') never goes below zero."""
    from fakes import NullStore
    from twisted.internet.task import Clock

    from mqttamqp.core.limits import Limits

    class NoWrites(AllowAll):
        def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
            return False

    broker = Broker(Clock(), NullStore(), Limits(sys_interval=0), authorizer=NoWrites())
    broker.start()
    for _ in range(3):
        assert code_of(broker.exchanges.publish, message(), "amq.topic", "a.b",
                       identity=Identity("p")) == 403
    received, _ = broker.stats.messages_by_protocol()
    assert received["mqtt"] == 0 and received["amqp0-9-1"] == 0


def test_a_direct_key_bound_to_one_queue_skips_the_route_walk() -> None:
    """A direct exchange's key bound to one queue goes there without ``route`` (counted
    as received once); several queues, an exchange binding, an unbound key (the
    alternate exchange) and an internal exchange keep ``route``'s answers."""
    broker, _, _ = make()
    ex = broker.exchanges
    declared(broker, "a", "b", "lost")
    walks: list[str] = []
    route = ex.route
    ex.route = lambda source, *args: walks.append(source.name) or route(source, *args)  # type: ignore[method-assign]
    ex.declare_exchange("ae", "fanout")
    ex.bind_queue("lost", "ae")
    ex.declare_exchange("d", "direct", arguments={"alternate-exchange": "ae"})
    ex.bind_queue("a", "d", "one")
    ex.bind_queue("a", "d", "two")
    ex.bind_queue("b", "d", "two")
    # (an exchange named as a queue: names of the two are apart in 0.9.1, and a key
    # bound to exchange "a" alone must not reach queue "a")
    ex.declare_exchange("a", "fanout")
    ex.bind_exchange("a", "d", "hop")
    ex.bind_queue("b", "a")
    received = broker.stats.messages_received
    assert ex.publish(message(broker=broker), "d", "one")[0]
    assert walks == [] and broker.stats.messages_received == received + 1
    assert [depth(broker, q) for q in ("a", "b", "lost")] == [1, 0, 0]
    assert ex.publish(message(broker=broker), "d", "two")[0]
    assert ex.publish(message(broker=broker), "d", "hop")[0]
    assert ex.publish(message(broker=broker), "d", "nobody")[0]
    assert walks == ["d", "d", "d"]
    assert [depth(broker, q) for q in ("a", "b", "lost")] == [2, 2, 1]
    assert broker.stats.messages_received == received + 4
    ex.declare_exchange("inner", "direct", internal=True)
    ex.bind_queue("a", "inner", "one")
    assert code_of(ex.publish, message(), "inner", "one") == 403
    assert depth(broker, "a") == 2


def test_a_qos0_publish_nobody_waits_for_hands_back_no_commit_with_amq_topic_bound() -> None:
    """With a queue bound to amq.topic, a publish whose caller does not wait
    (``wait=False``: a QoS 0 PUBLISH) is answered without its append's commit, which
    the broker watches itself (a failure logged once, "routing a message"), even
    when the router's own answer was the shared plain one."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    declared(broker, "all")
    broker.exchanges.bind_queue("all", "amq.topic", "plant.#")
    store.commit_all()
    now = broker.clock.seconds()
    result = broker.publishing.publish(Message("plant/a", b"1", 0, False, "p", now),
                                       None, False)
    assert depth(broker, "all") == 1
    assert result.durable is None
