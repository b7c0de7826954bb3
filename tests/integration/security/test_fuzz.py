"""Socket-level fuzzing of the real broker, MQTT and AMQP (issue 10, "Hostile input").

Each case opens a socket on 127.0.0.1, sends a mutation of a valid byte stream
(a CONNECT and the packets after it; an AMQP connection with its session, links
and transfers, recorded from a real proton client), reads until the broker closes
or a short timeout, and closes.  The mutations are seeded, so a failure names the
seed and case that reproduce it.  Bounded twice: a fixed number of cases and a
wall-clock budget per protocol.

After the cases: the broker is alive and a well-behaved client's QoS 1 message
round-trips, and the broker's log has no traceback and nothing at critical level.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator

import pytest
from brokerproc import BrokerProcess
from fuzzing import amqp_stream, mqtt_stream, mutate, poke
from pahoclient import PahoClient

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import (
    Connect,
)

pytestmark = pytest.mark.timeout(180)

CASES = 200            # per protocol
BUDGET = 25.0          # seconds per protocol, whatever CASES says
BAD = re.compile(r"Traceback|#critical\]|Unhandled error")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("fuzz")), "--connect-timeout", "2",
                         "--max-connect-rate", "0", listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def _fuzz(port: int, seed_data: bytes, keep: int, seed: int) -> int:
    rng = random.Random(seed)
    deadline = time.monotonic() + BUDGET
    done = 0
    while done < CASES and time.monotonic() < deadline:
        poke(port, mutate(rng, seed_data, keep))
        done += 1
    return done


def _alive(broker: BrokerProcess) -> None:
    sub = PahoClient(broker.mqtt_port, "fz-sub")
    pub = PahoClient(broker.mqtt_port, "fz-pub")
    try:
        assert sub.subscribe(("fz/alive", 1)) == [1]
        pub.publish("fz/alive", b"still here", qos=1)
        assert sub.get().payload == b"still here"
    finally:
        sub.stop()
        pub.stop()


@pytest.mark.parametrize("protocol", ["mqtt", "amqp"])
def test_fuzzed_sockets_leave_the_broker_well(broker: BrokerProcess, protocol: str) -> None:
    """Mutated MQTT and AMQP byte streams on real sockets leave the broker alive and
    logging no traceback."""
    if protocol == "mqtt":
        data, keep, port = mqtt_stream(), len(encode(Connect("MQTT", 4, "fuzz", False, 30,
                                                               None))), broker.mqtt_port
    else:
        data, keep, port = amqp_stream(), 8, broker.ports["AMQP"]
    seed = 16_10 + len(protocol)
    done = _fuzz(port, data, keep, seed)
    assert done >= 50, f"only {done} cases within the budget"
    _alive(broker)
    bad = [line for line in broker.log if BAD.search(line)]
    assert bad == [], f"seed {seed}: the broker logged:\n" + "".join(bad[:40])
