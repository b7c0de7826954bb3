"""Real AMQP clients against a real broker process, for the integration tests.

* ``amqp(broker)`` — python-qpid-proton's ``BlockingConnection`` on the broker's
  AMQP port; its receivers are created without prefetch where a test counts credit.
* ``Paho`` — the shared ``pahoclient.PahoClient`` (paho-mqtt 2.x on its own loop
  thread) as MQTT 3.1.1; callbacks become queue items and events, so waits are
  bounded event waits.
* ``run_container`` — proton's event-driven ``Container`` in a thread with a
  bounded join.

Where a test must show that something does *not* arrive, it sends a marker after
it on the same path and checks that the marker comes next.
"""

from __future__ import annotations

import itertools
import os
import queue
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from brokerproc import BrokerProcess
from pahoclient import PahoClient
from proton import Delivery, Link, Message
from proton.reactor import Container, LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

TIMEOUT = 10.0
_ids = itertools.count(1)


def uid(prefix: str = "a") -> str:
    """A unique id usable as MQTT client id (<= 23 characters) and topic level."""
    return f"{prefix}{next(_ids)}-{uuid.uuid4().hex[:8]}"[:23]


class Modes(LinkOption):
    """Ask for settle modes on a link (``snd``/``rcv`` = proton Link constants)."""

    def __init__(self, snd: int | None = None, rcv: int | None = None) -> None:
        self.snd, self.rcv = snd, rcv

    def apply(self, link: Link) -> None:
        if self.snd is not None:
            link.snd_settle_mode = self.snd
        if self.rcv is not None:
            link.rcv_settle_mode = self.rcv


AT_LEAST_ONCE = Modes(Link.SND_UNSETTLED, Link.RCV_FIRST)   # the FE's links (seed 000)


def amqp(broker: BrokerProcess, **kwargs: Any) -> BlockingConnection:
    return BlockingConnection(f"127.0.0.1:{broker.ports['AMQP']}", timeout=TIMEOUT, **kwargs)


def receiver(conn: BlockingConnection, address: str, credit: int | None = 10,
             name: str | None = None, options: Any = None) -> BlockingReceiver:
    """A receiver; ``credit=None`` grants none (the test flows it by hand)."""
    rcv = conn.create_receiver(address, credit=credit, name=name, options=options)
    return rcv


def wait_messages(conn: BlockingConnection, rcv: BlockingReceiver, n: int,
                  timeout: float = TIMEOUT) -> None:
    """Wait until ``rcv`` holds ``n`` messages (without granting credit)."""
    conn.wait(lambda: rcv.fetcher.has_message >= n, timeout=timeout,
              msg=f"waiting for {n} message(s) on {rcv.link.name}")


def take(conn: BlockingConnection, rcv: BlockingReceiver,
         timeout: float = TIMEOUT) -> tuple[Message, Any]:
    """The next message and its delivery (credit must have been granted)."""
    wait_messages(conn, rcv, 1, timeout)
    message, delivery = rcv.fetcher.incoming[0]
    rcv.fetcher.pop()
    return message, delivery


def body_bytes(message: Message) -> bytes:
    body = message.body
    if isinstance(body, str):
        return body.encode()
    return bytes(body) if body is not None else b""


def send_expect(sender: BlockingSender, message: Message) -> Any:
    """Send unsettled and return the delivery whatever its outcome."""
    return sender.send(message, error_states=[])


def outcome(delivery: Any) -> tuple[int, str | None]:
    cond = delivery.remote.condition
    return delivery.remote_state, (cond.name if cond is not None else None)


ACCEPTED = Delivery.ACCEPTED
REJECTED = Delivery.REJECTED


# -- paho ------------------------------------------------------------------------------

class Paho(PahoClient):
    """The shared paho wrapper (``pahoclient``) as MQTT 3.1.1, with credentials and a
    check of the CONNACK return code (``expect_rc``, 0 unless told)."""

    def __init__(self, port: int, client_id: str, clean: bool = True,
                 will: tuple[str, bytes, int, bool] | None = None,
                 username: str | None = None, password: str | None = None,
                 expect_rc: int = 0) -> None:
        super().__init__(port, client_id, mqtt.MQTTv311, clean, will,
                         username=username, password=password, expect_rc=expect_rc)


@pytest.fixture
def paho(request: pytest.FixtureRequest) -> Iterator[Callable[..., Paho]]:
    made: list[Paho] = []

    def open_client(broker: BrokerProcess, client_id: str, **kw: Any) -> Paho:
        client = Paho(broker.mqtt_port, client_id, **kw)
        made.append(client)
        return client

    yield open_client
    for client in made:
        client.stop()


@pytest.fixture
def conns() -> Iterator[Callable[..., BlockingConnection]]:
    """``conns(broker, **kw)``: blocking AMQP connections closed after the test."""
    made: list[BlockingConnection] = []

    def open_conn(broker: BrokerProcess, **kw: Any) -> BlockingConnection:
        conn = amqp(broker, **kw)
        made.append(conn)
        return conn

    yield open_conn
    for conn in made:
        try:
            conn.close()
        except Exception:
            pass


# -- event-driven container -------------------------------------------------------------

def run_container(handler: Any, timeout: float = TIMEOUT) -> None:
    """Run a proton ``Container`` with ``handler`` in a thread; bounded join."""
    container = Container(handler)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            container.run()
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        container.stop()
        thread.join(5)
        raise AssertionError("the proton container did not finish in time")
    if errors:
        raise errors[0]


# -- a client process that can be killed ---------------------------------------------------

_WILL_CLIENT = r"""
import sys
from proton import Message, int32, symbol
from proton.utils import BlockingConnection
url, link_name, topic, payload, qos, retain = sys.argv[1:7]
conn = BlockingConnection(url, timeout=10)
snd = conn.create_sender("$mqtt.willservice", name=link_name)
msg = Message(subject="will", address=topic, body=payload.encode(), durable=int(qos) > 0,
              annotations={symbol("x-opt-mqtt-qos"): int32(int(qos)),
                           symbol("x-opt-retain-message"): retain == "1"})
msg.inferred = True
snd.send(msg)
print("READY", flush=True)
sys.stdin.read()   # until killed
"""


def will_client_process(broker: BrokerProcess, link_name: str, topic: str, payload: str,
                        qos: int = 1, retain: bool = False) -> subprocess.Popen[str]:
    """A process holding an AMQP will link (will accepted when it prints READY)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WILL_CLIENT, f"127.0.0.1:{broker.ports['AMQP']}", link_name,
         topic, payload, str(qos), "1" if retain else "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or []],
                     daemon=True).start()
    try:
        line = lines.get(timeout=TIMEOUT)
    except queue.Empty:
        proc.kill()
        raise AssertionError("will client did not start") from None
    assert line.strip() == "READY", line
    return proc
