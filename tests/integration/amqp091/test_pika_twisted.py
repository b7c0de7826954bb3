"""pika's Twisted adapter (``pika.adapters.twisted_connection``) against the real
broker: connect, declare, publish with confirms, consume and acknowledge.

The client runs on a ``SelectReactor`` of its own in a thread (as
``tests/support/hookserver.py`` runs treq), not the global reactor; the test waits
on a queue for the scenario's outcome, with a timeout.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Generator
from typing import Any

from brokerproc import BrokerProcess
from pika.adapters.twisted_connection import TwistedProtocolConnection
from pikaparams import parameters
from twisted.internet import defer, protocol
from twisted.internet.selectreactor import SelectReactor

TIMEOUT = 20.0


def run_on_own_reactor(scenario: Any, *args: Any) -> Any:
    """Run ``scenario(reactor, *args)`` (a Deferred-returning function) on a new
    reactor in a thread; its result, or its failure raised, within TIMEOUT."""
    reactor = SelectReactor()
    outcome: queue.Queue[tuple[bool, Any]] = queue.Queue()
    thread = threading.Thread(target=reactor.run, kwargs={"installSignalHandlers": False},
                              daemon=True)
    thread.start()

    def start() -> None:
        d = defer.maybeDeferred(scenario, reactor, *args)
        d.addTimeout(TIMEOUT, reactor)
        d.addCallbacks(lambda result: outcome.put((True, result)),
                       lambda failure: outcome.put((False, failure)))

    reactor.callFromThread(start)
    try:
        ok, value = outcome.get(timeout=TIMEOUT + 5)
    finally:
        reactor.callFromThread(reactor.stop)
        thread.join(TIMEOUT)
    if not ok:
        value.raiseException()
    return value


@defer.inlineCallbacks
def declare_publish_consume(reactor: Any, broker: BrokerProcess
                            ) -> Generator[Any, Any, dict[str, Any]]:
    creator = protocol.ClientCreator(reactor, TwistedProtocolConnection,
                                     parameters(broker), custom_reactor=reactor)
    conn = yield creator.connectTCP("127.0.0.1", broker.ports["AMQP"], timeout=10)
    try:
        yield conn.ready
        channel = yield conn.channel()
        name = f"tw-{uuid.uuid4().hex[:10]}"
        declared = yield channel.queue_declare(queue=name, durable=True)
        yield channel.confirm_delivery()
        confirms = []
        for i in range(3):
            # With confirms on, the Deferred fires on the broker's basic.ack.
            frame = yield channel.basic_publish("", name, b"task %d" % i)
            confirms.append(type(frame).__name__)   # (the method: Basic.Ack)
        yield channel.basic_qos(prefetch_count=2)
        consumer, tag = yield channel.basic_consume(queue=name)
        bodies = []
        for _ in range(3):
            _ch, method, _props, body = yield consumer.get()
            bodies.append(body)
            yield channel.basic_ack(method.delivery_tag)
        yield channel.basic_cancel(tag)
        after = yield channel.queue_declare(queue=name, passive=True)
        return {"queue": declared.method.queue, "confirms": confirms, "bodies": bodies,
                "left": after.method.message_count}
    finally:
        conn.transport.loseConnection()


def test_pika_twisted_adapter_declares_publishes_with_confirms_and_consumes(
        broker091: BrokerProcess) -> None:
    """pika's Twisted adapter declares a durable queue, publishes with confirms (each
    acknowledged), consumes at a prefetch and acknowledges: the queue is then empty."""
    result = run_on_own_reactor(declare_publish_consume, broker091)
    assert result["queue"].startswith("tw-")
    assert result["confirms"] == ["Ack", "Ack", "Ack"]
    assert result["bodies"] == [b"task 0", b"task 1", b"task 2"]
    assert result["left"] == 0
