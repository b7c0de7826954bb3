"""Socket-level fuzzing of the broker's AMQP 0.9.1 (issue 27, beside the MQTT and AMQP 1.0
fuzzers in tests/integration/security/test_fuzz.py).

Each case opens a socket on 127.0.0.1, sends a seeded mutation of a valid 0.9.1 client
stream (tests/support/amqp091_frames.py: handshake, declarations with arguments,
publishes with every property, consume, acks, get, closes), reads until the broker
closes or a short timeout, and closes.  Bounded twice: ``CASES`` cases and a
wall-clock ``BUDGET``.  Afterwards a 0.9.1 connection opened *before* the cases still
works (other clients unaffected), a new one too, and mqttamqp's log has no traceback and
nothing at critical level.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pika
import pytest
from amqp091_frames import PROTOCOL_HEADER, amqp091_stream
from amqp091_target import TIMEOUT, Target, target, uname
from fuzzing import mutate, poke
from pika.adapters.blocking_connection import BlockingChannel

pytestmark = pytest.mark.timeout(180)

CASES = 200
BUDGET = 25.0           # seconds, whatever CASES says (as the MQTT and AMQP 1.0 fuzzers)
SEED = 27_091


@pytest.fixture(scope="module")
def amqp091(request: pytest.FixtureRequest) -> Iterator[Target]:
    with target(request, "--connect-timeout", "2", "--max-connect-rate", "0") as t:
        yield t


def round_trip(ch: BlockingChannel, queue: str, payload: bytes) -> None:
    ch.basic_publish("", queue, payload, pika.BasicProperties(delivery_mode=2))
    for method, _props, body in ch.consume(queue, inactivity_timeout=TIMEOUT):
        assert method is not None, f"{payload!r} did not come back within {TIMEOUT}s"
        ch.basic_ack(method.delivery_tag)
        ch.cancel()
        assert body == payload
        return


def test_fuzzed_amqp091_frames_leave_the_broker_well(amqp091: Target) -> None:
    """Mutated 0.9.1 streams on real sockets: no traceback, and connections opened
    before and after them work."""
    bystander = pika.BlockingConnection(pika.URLParameters(amqp091.url))
    try:
        ch = bystander.channel()
        ch.confirm_delivery()
        queue = ch.queue_declare(uname("fz-live"), exclusive=True).method.queue
        round_trip(ch, queue, b"before")

        stream = amqp091_stream()
        rng = random.Random(SEED)
        deadline = time.monotonic() + BUDGET
        done = 0
        while done < CASES and time.monotonic() < deadline:
            poke(amqp091.port, mutate(rng, stream, len(PROTOCOL_HEADER)))
            done += 1
        assert done >= 50, f"only {done} cases within the budget"

        round_trip(ch, queue, b"after")
    finally:
        if bystander.is_open:
            bystander.close()
    fresh = pika.BlockingConnection(pika.URLParameters(amqp091.url))
    try:
        ch = fresh.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        round_trip(ch, queue, b"new")
    finally:
        fresh.close()
    bad = amqp091.bad_log_lines()
    assert bad == [], f"seed {SEED}: the broker logged:\n" + "".join(bad[:40])
