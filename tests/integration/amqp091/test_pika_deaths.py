"""x-death over a DLX + TTL retry loop with pika against the real broker (mqttamqp):
the work queue W rejects into the retry queue R, whose x-message-ttl expires the
message back into W; each round's delivery shows both (queue, reason) entries with
growing counts, as RabbitMQ counts them, for a 0.9.1 publisher's message and for
an MQTT publisher's (the death history travels with the message either way)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest
from brokerproc import BrokerProcess
from pahoclient import PahoClient

pytestmark = pytest.mark.timeout(120)

Connect = Callable[..., pika.BlockingConnection]
ROUNDS = 3
WAIT = 10.0   # (per delivery: R's TTL is 200 ms)


def _loop(ch: Any, publish: Callable[[str], None]) -> list[list[tuple[str, str, int]]]:
    """Declares W and R, calls ``publish(W)``, and rejects ROUNDS deliveries of W:
    the x-death entries (queue, reason, count) each delivery carried."""
    w, r = f"w-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(r, durable=True, arguments={
        "x-message-ttl": 200, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": w})
    ch.queue_declare(w, durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": r})
    publish(w)
    seen: list[list[tuple[str, str, int]]] = []
    for method, props, _ in ch.consume(w, inactivity_timeout=WAIT):
        assert method is not None, f"no delivery within {WAIT}s after {len(seen)} rounds"
        deaths = (props.headers or {}).get("x-death", [])
        seen.append([(d["queue"], d["reason"], d["count"]) for d in deaths])
        ch.basic_reject(method.delivery_tag, requeue=False)
        if len(seen) == ROUNDS:
            ch.cancel()
            break
    expected = [[]] + [[(r, "expired", n), (w, "rejected", n)] for n in range(1, ROUNDS)]
    assert seen == expected
    return seen


def test_a_091_retry_loop_counts_its_deaths(pika_conn: Connect) -> None:
    """A pika publisher's message through W -> R -> W: counts 1, then 2, for both."""
    ch = pika_conn().channel()
    ch.confirm_delivery()
    _loop(ch, lambda w: ch.basic_publish("", w, b"job", pika.BasicProperties(
        delivery_mode=2, headers={"task": "t1"})))


def test_an_mqtt_message_in_the_retry_loop_counts_its_deaths(
        pika_conn: Connect, broker091: BrokerProcess) -> None:
    """An MQTT publisher's message to $queue/W goes round the same loop with the
    same growing x-death counts."""
    ch = pika_conn().channel()
    pub = PahoClient(broker091.mqtt_port, f"deaths-{uuid.uuid4().hex[:6]}")
    try:
        _loop(ch, lambda w: pub.publish(f"$queue/{w}", b"job", qos=1))
    finally:
        pub.stop()
