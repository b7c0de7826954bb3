"""The broker the AMQP 0.9.1 client-ecosystem tests talk to (tests/integration/amqp091/).

By default the real broker of this repository, as a child process on 127.0.0.1 with its
MQTT and AMQP listeners (AMQP 1.0 and 0.9.1 share the AMQP port): the folder's
``broker091`` fixture, or one of the module's own when it needs other options.  With
``MQTTAMQP_TEST_AMQP091_URL`` set (``amqp://guest:guest@127.0.0.1:PORT/``) the same
tests run against another broker, RabbitMQ in practice, to show that a test is right
before it judges mqttamqp: ``python bench/rabbitmq.py serve SECONDS`` starts Debian's
RabbitMQ with its MQTT and AMQP 1.0 plugins and prints the variables to set
(``MQTTAMQP_TEST_AMQP091_MQTT_PORT``, ``MQTTAMQP_TEST_AMQP091_AMQP10_PORT`` for the
crossing tests).  What mqttamqp does not do yet is marked where a test checks it
(``Target.pending``: skipped there with the reason).  A test that needs what only
mqttamqp has (``$queue/``, ``kill -9`` of the broker, its log) asks ``Target.require``,
which skips it elsewhere with the reason.

No test here needs RabbitMQ: CI runs them against mqttamqp only.
"""

from __future__ import annotations

import itertools
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
from brokerproc import BrokerProcess, RestartableBroker

ENV_URL = "MQTTAMQP_TEST_AMQP091_URL"
ENV_MQTT_PORT = "MQTTAMQP_TEST_AMQP091_MQTT_PORT"
ENV_AMQP10_PORT = "MQTTAMQP_TEST_AMQP091_AMQP10_PORT"
ENV_PENDING = "MQTTAMQP_TEST_AMQP091_PENDING"      # "run": check what is pending too
TIMEOUT = 10.0
BAD_LOG = re.compile(r"Traceback|#critical\]|Unhandled error")

_ids = itertools.count(1)


def uname(prefix: str) -> str:
    """A queue or exchange name unique to this run (tests share one broker, and a
    RabbitMQ node outlives a test run's queues only if they are durable)."""
    return f"{prefix}-{next(_ids)}-{uuid.uuid4().hex[:8]}"


@dataclass
class Target:
    """One broker under test: its 0.9.1 URL and, where it has them, MQTT and AMQP 1.0."""

    kind: str                       # "mqttamqp" or "other"
    url: str
    mqtt_port: int | None
    amqp10_port: int | None
    broker: BrokerProcess | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port

    def require(self, what: str) -> None:
        """Skip unless the broker has ``what``: "mqttamqp" (its own features), "mqtt"
        or "amqp10" (a listener for the crossing tests)."""
        if what == "mqttamqp" and self.kind != "mqttamqp":
            pytest.skip("mqttamqp only (its $queue/ space, its process or its log)")
        if what == "mqtt" and self.mqtt_port is None:
            pytest.skip(f"no MQTT port for this broker (set {ENV_MQTT_PORT})")
        if what == "amqp10" and self.amqp10_port is None:
            pytest.skip(f"no AMQP 1.0 port for this broker (set {ENV_AMQP10_PORT})")

    def pending(self, reason: str) -> None:
        """Skip the rest of the test on mqttamqp: what follows checks something the
        broker does not do yet (``reason``; issue 27 is built in slices).  RabbitMQ runs
        it, and so does mqttamqp with ``MQTTAMQP_TEST_AMQP091_PENDING=run``; the checks
        before the call run everywhere."""
        if self.kind == "mqttamqp" and os.environ.get(ENV_PENDING) != "run":
            pytest.skip(f"pending in mqttamqp (issue 27): {reason}")

    def amqp10_queue_address(self, queue: str) -> str:
        """The AMQP 1.0 address of 0.9.1 queue ``queue``: ``$queue/<name>`` here;
        ``/amq/queue/<name>`` for RabbitMQ's AMQP 1.0 plugin (a queue that exists: it
        sends through the default exchange and receives from the queue; ``/queue/<name>``
        would declare it again, not durable)."""
        return f"$queue/{queue}" if self.kind == "mqttamqp" else f"/amq/queue/{queue}"

    def amqp10_topic_address(self, topic: str) -> str:
        """The AMQP 1.0 address of MQTT topic (or filter) ``topic``: the topic itself
        here; ``/topic/<routing or binding key>`` (amq.topic) for RabbitMQ's plugin."""
        if self.kind == "mqttamqp":
            return topic
        return "/topic/" + topic.replace("/", ".").replace("+", "*")

    def bad_log_lines(self) -> list[str]:
        """Tracebacks and critical lines in the broker's log (mqttamqp only)."""
        if self.broker is None:
            return []
        return [line for line in self.broker.log if BAD_LOG.search(line)]


def speaks_amqp091() -> bool:
    """Whether this checkout has the 0.9.1 adapter at all (issue 27's h-x091 part)."""
    try:
        import mqttamqp.amqp091  # noqa: F401
    except ImportError:
        return False
    return True


NOT_YET = ("the broker has no AMQP 0.9.1 adapter yet (mqttamqp.amqp091, issue 27); "
           f"set {ENV_URL} to run these tests against RabbitMQ")


def start_broker(data_dir: str, *extra: str, restartable: bool = False) -> BrokerProcess:
    """mqttamqp with MQTT and AMQP listeners on loopback, port 0."""
    cls = RestartableBroker if restartable else BrokerProcess
    return cls(data_dir, *extra, listeners=("--mqtt", "--amqp")).start()


def amqp_url(broker: BrokerProcess) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.ports['AMQP']}/"


@contextmanager
def target(request: pytest.FixtureRequest, *extra: str) -> Iterator[Target]:
    """The broker named by the environment, else mqttamqp: the module's ``broker091``
    (tests/integration/amqp091/conftest.py), or, with ``extra`` options, a broker
    process of the module's own started with them."""
    url = os.environ.get(ENV_URL)
    if url:
        mqtt = os.environ.get(ENV_MQTT_PORT)
        amqp10 = os.environ.get(ENV_AMQP10_PORT)
        yield Target("other", url, int(mqtt) if mqtt else None,
                     int(amqp10) if amqp10 else None)
        return
    if not speaks_amqp091():
        pytest.skip(NOT_YET)
    if not extra:
        shared: BrokerProcess = request.getfixturevalue("broker091")
        yield Target("mqttamqp", amqp_url(shared), shared.mqtt_port, shared.ports["AMQP"],
                     shared)
        return
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    broker = start_broker(str(factory.mktemp("own091")), *extra)
    try:
        yield Target("mqttamqp", amqp_url(broker), broker.mqtt_port, broker.ports["AMQP"],
                     broker)
    finally:
        broker.stop()
