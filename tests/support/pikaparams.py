"""pika connection parameters for a broker process of the AMQP 0.9.1 tests
(tests/integration/amqp091/): loopback, its AMQP port, one attempt, timeouts that
end a stuck test."""

from __future__ import annotations

from typing import Any

import pika
from brokerproc import BrokerProcess


def parameters(broker: BrokerProcess, **kw: Any) -> pika.ConnectionParameters:
    kw.setdefault("connection_attempts", 1)
    kw.setdefault("socket_timeout", 10)
    kw.setdefault("blocked_connection_timeout", 30)
    return pika.ConnectionParameters("127.0.0.1", broker.ports["AMQP"], **kw)
