"""AMQP 0.9.1's durable model (exchanges, bindings, declared queue arguments) after a
restart: on the in-memory store and on the real ZODB store."""

from __future__ import annotations

from typing import Any

from exchange_facade import code_of, message
from fakes import MemoryStore
from queue_facade import make

from mqttamqp.core.broker import Broker


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


def test_a_queue_deleted_from_the_console_leaves_the_091_model_too() -> None:
    """QueueManager.delete (the console's delete) takes the queue's 0.9.1
    declaration and bindings with it, stored bindings included: a redeclare makes
    the queue again and the old binding does not come back after a restart."""
    store = MemoryStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    ex.declare_queue("q", "c1", durable=True, arguments={"x-expires": 60000})
    ex.bind_queue("q", "amq.direct", "k")
    broker.queues.delete("q")             # what the console's delete does
    assert "q" not in ex.declared and ex.binding_count == 0
    assert ex.publish(message(b"m", broker=broker), "amq.direct", "k") == (False, None)
    ex.declare_queue("q", "c1", durable=True)
    assert "q" in broker.queues.queues
    assert ex.consumer_filter("q", "c1")[0] == "$queue/q"
    again, _, _ = make(store)
    assert again.exchanges.binding_count == 0 and "q" in again.queues.queues
    assert not [b for b in store.load().bindings if b.destination == "q"]


def test_a_transient_queue_taking_an_auto_delete_exchange_stores_its_delete() -> None:
    """A durable auto-delete exchange whose last binding was to an exclusive queue
    goes when that queue goes, in storage too: it does not come back after a
    restart, and the transient binding left nothing stored."""
    store = MemoryStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    ex.declare_exchange("ad", "direct", durable=True, auto_delete=True)
    ex.declare_queue("tq", "c1", exclusive=True)
    ex.bind_queue("tq", "ad", "k", owner="c1")
    ex.connection_closed("c1")
    assert "ad" not in ex.exchanges
    assert [e.name for e in store.load().exchanges] == []
    assert not list(store.load().bindings)
    again, _, _ = make(store)
    assert "ad" not in again.exchanges.exchanges
