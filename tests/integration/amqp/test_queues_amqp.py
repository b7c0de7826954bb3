"""Durable queues over AMQP 1.0 (issue 12), against the real broker with
python-qpid-proton's blocking client (and paho for the MQTT side).

Queue links: a source or target ``$queue/<name>[/...]``, a plain address matching
``--amqp-queues`` (``*`` here: every address without a ``/``), or one whose terminus
offers the ``queue`` capability.  The receivers here grant credit by hand
(``credit=None``), so what a test sees arrive is what the broker chose to send.

The queue rules themselves are unit-tested in ``test_queues``; the in-memory edge
cases of the AMQP mapping are at the end of this file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import TIMEOUT, conns, paho, receiver, send_expect, take, uid
from amqp_messages import meta
from brokerproc import BrokerProcess
from proton import Condition, Data, Delivery, Message, symbol
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns", "paho"]  # fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("queues-amqp")), "--amqp-queues=*",
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


class Properties(LinkOption):  # type: ignore[misc]
    """Attach properties (``consumer-group``, ``consumer-mode``, ``stream-offset``)."""

    def __init__(self, **values: str) -> None:
        self.values = {symbol(key.replace("_", "-")): value for key, value in values.items()}

    def apply(self, link: Any) -> None:
        link.properties = self.values


def queue_receiver(conn: BlockingConnection, address: str, credit: int = 0,
                   **properties: str) -> BlockingReceiver:
    """A receiver with no credit but ``credit`` granted by hand."""
    rcv = receiver(conn, address, credit=None,
                   options=Properties(**properties) if properties else None)
    if credit:
        flow(conn, rcv, credit)
    return rcv


def sync(conn: BlockingConnection) -> None:
    """Wait until the broker has seen what ``conn`` sent so far: a link attached and
    detached, answered in order.  (Proton writes a pass's flow frames before its
    dispositions, and detaches after both.)"""
    conn.create_sender(None).close()


def flow(conn: BlockingConnection, rcv: BlockingReceiver, credit: int) -> None:
    """Grant ``credit``, seen by the broker when this returns."""
    rcv.link.flow(credit)
    sync(conn)


def settle(conn: BlockingConnection, dlv: Any, state: Any, failed: bool = False,
           description: str | None = None) -> None:
    """Settle ``dlv`` with an outcome (Modified ``failed``, Rejected's description),
    seen by the broker when this returns (before any credit granted after it)."""
    if failed:
        dlv.local.failed = True
    if description is not None:
        dlv.local.condition = Condition("app:rejected", description)
    dlv.update(state)
    dlv.settle()
    sync(conn)


def props(message: Message) -> dict[str, Any]:
    return dict(message.properties or {})


# == consumer groups ===========================================================================

def test_consumer_group_members_take_turns(broker, conns) -> None:
    """Two receivers of one consumer group (attach property ``consumer-group``) on
    ``$queue/<name>``: the messages go round-robin, each to one member, with the
    queue's metadata as message annotations (``x-opt-message-id`` is
    ``<queue>:<offset>``) and the bare message as it was sent."""
    name = uid("rr")
    a_conn, b_conn, p_conn = conns(broker), conns(broker), conns(broker)
    a = queue_receiver(a_conn, f"$queue/{name}", 10, consumer_group="workers")
    b = queue_receiver(b_conn, f"$queue/{name}", 10, consumer_group="workers")
    snd = p_conn.create_sender(f"$queue/{name}/k")
    for i in range(4):
        assert send_expect(snd, Message(body=f"m{i}")).remote_state == Delivery.ACCEPTED
    got_a = [take(a_conn, a)[0] for _ in range(2)]
    got_b = [take(b_conn, b)[0] for _ in range(2)]
    assert [m.body for m in got_a] == ["m0", "m2"]
    assert [m.body for m in got_b] == ["m1", "m3"]
    first = got_a[0]
    assert first.id is None and first.address is None and first.properties is None
    assert {k: v for k, v in meta(first).items() if k.startswith("x-opt-")
            and not k.startswith("x-opt-mqtt") and k != "x-opt-retain-message"} == {
        "x-opt-message-id": f"{name}:0", "x-opt-group": "workers", "x-opt-queue": name,
        "x-opt-offset": 0, "x-opt-topic": f"$queue/{name}/k"}
    assert (first.delivery_count, first.first_acquirer) == (0, True)


def test_credit_is_the_prefetch_and_a_flow_pumps_the_queue(broker, conns) -> None:
    """A member without credit is skipped (its messages are not held back for it),
    and granting credit later makes the queue hand out what waited."""
    name = uid("cr")
    a_conn, b_conn, p_conn = conns(broker), conns(broker), conns(broker)
    a = queue_receiver(a_conn, f"$queue/{name}", 1, consumer_group="g")
    b = queue_receiver(b_conn, f"$queue/{name}", 2, consumer_group="g")
    snd = p_conn.create_sender(f"$queue/{name}")
    for i in range(3):
        assert send_expect(snd, Message(body=f"m{i}")).remote_state == Delivery.ACCEPTED
    assert take(a_conn, a)[0].body == "m0"
    assert [take(b_conn, b)[0].body for _ in range(2)] == ["m1", "m2"]
    # Nobody has credit now: m3 waits in the queue until a flow.
    assert send_expect(snd, Message(body="m3")).remote_state == Delivery.ACCEPTED
    flow(a_conn, a, 1)
    assert take(a_conn, a)[0].body == "m3"


# == dispositions ==============================================================================

def test_dispositions_map_to_ack_nack_and_dead_letter(broker, conns) -> None:
    """Released: visible again, delivery count not raised; Modified(delivery-failed):
    raised (header delivery-count); Rejected: to ``$dlq/<name>`` with the error
    description as ``x-opt-reason``; Accepted: acknowledged (the next message is next).
    First-acquirer is true on the first delivery only."""
    name = uid("dp")
    conn, p_conn = conns(broker), conns(broker)
    rcv = queue_receiver(conn, f"$queue/{name}")
    snd = p_conn.create_sender(f"$queue/{name}/o")
    send_expect(snd, Message(body="a"))
    send_expect(snd, Message(body="b"))

    rcv.link.flow(1)
    msg, dlv = take(conn, rcv)
    assert (msg.body, msg.delivery_count, msg.first_acquirer) == ("a", 0, True)
    settle(conn, dlv, Delivery.RELEASED)

    rcv.link.flow(1)
    msg, dlv = take(conn, rcv)
    assert (msg.body, msg.delivery_count, msg.first_acquirer) == ("a", 0, False)
    settle(conn, dlv, Delivery.MODIFIED, failed=True)

    rcv.link.flow(1)
    msg, dlv = take(conn, rcv)
    assert (msg.body, msg.delivery_count, msg.first_acquirer) == ("a", 1, False)
    settle(conn, dlv, Delivery.REJECTED, description="customer 42 does not exist")

    dead = queue_receiver(conn, f"$dlq/{name}/#", 1)
    msg, dlv = take(conn, dead)
    settle(conn, dlv, Delivery.ACCEPTED)
    assert msg.body == "a" and msg.address is None and msg.id is None
    ann = meta(msg)
    assert ann["x-opt-message-id"] == f"$dlq/{name}:0"
    assert ann["x-opt-topic"] == f"$dlq/{name}/o"
    assert {k: ann[k] for k in ("x-opt-reason", "x-opt-origin-queue", "x-opt-origin-offset")} == {
        "x-opt-reason": "customer 42 does not exist", "x-opt-origin-queue": name,
        "x-opt-origin-offset": 0}

    rcv.link.flow(1)
    msg, dlv = take(conn, rcv)
    assert msg.body == "b"
    settle(conn, dlv, Delivery.ACCEPTED)
    send_expect(snd, Message(body="c"))
    rcv.link.flow(1)
    assert take(conn, rcv)[0].body == "c"        # b was acknowledged: not again


# == plain addresses (--amqp-queues) =============================================================

def test_plain_address_queue_keeps_a_message_sent_before_any_receiver(broker, conns) -> None:
    """With ``--amqp-queues '*'`` an application's plain address is a queue: a message
    sent before any receiver exists (on a sender link or the anonymous relay) waits
    and arrives.  ``*`` does not cross ``/``: a
    topic with levels stays pub/sub (nothing kept for a later receiver)."""
    address, topic = uid("orders"), uid("t") + "/x"
    conn = conns(broker)
    snd = conn.create_sender(address)
    assert send_expect(snd, Message(body="early")).remote_state == Delivery.ACCEPTED
    relay = conn.create_sender(None)     # the anonymous relay: `to` names the queue
    assert send_expect(relay, Message(address=address, body="relayed")).remote_state \
        == Delivery.ACCEPTED
    tsnd = conn.create_sender(topic)
    tsnd.send(Message(body="lost"))
    rcv = queue_receiver(conn, address, 5)
    msg, dlv = take(conn, rcv)
    settle(conn, dlv, Delivery.ACCEPTED)
    assert msg.body == "early" and meta(msg)["x-opt-message-id"] == f"{address}:0"
    relayed = take(conn, rcv)[0]
    assert (relayed.body, relayed.address) == ("relayed", address)   # its `to`, as sent
    assert meta(msg)["x-opt-group"] == address        # one default group per address
    caps = rcv.link.remote_source.capabilities
    caps.rewind()
    assert caps.next() == Data.ARRAY and "queue" in [str(c) for c in caps.get_object()]
    trcv = receiver(conn, topic)
    tsnd.send(Message(body="marker"))
    assert trcv.receive(timeout=TIMEOUT).body == "marker"
    trcv.accept()


# == MQTT <-> AMQP ================================================================================

def test_mqtt_publisher_to_amqp_queue_consumer(broker, conns, paho) -> None:
    """An MQTT 3.1.1 publish to ``$queue/<name>/<key>`` reaches an AMQP queue receiver
    (payload as one Data section, ``to`` the topic), with the queue's message-id in
    the annotations."""
    name = uid("mq")
    conn = conns(broker)
    rcv = queue_receiver(conn, f"$queue/{name}", 5)
    pub = paho(broker, uid("p"))
    pub.publish(f"$queue/{name}/eu", b"from mqtt", qos=1)
    msg, dlv = take(conn, rcv)
    settle(conn, dlv, Delivery.ACCEPTED)
    assert bytes(msg.body) == b"from mqtt" and meta(msg)["x-opt-message-id"] == f"{name}:0"
    assert msg.address == f"$queue/{name}/eu" and meta(msg)["x-opt-queue"] == name
    assert msg.properties is None                      # the metadata is not there


def test_amqp_sender_to_mqtt311_queue_consumer(broker, conns, paho) -> None:
    """An AMQP sender on ``$queue/<name>/<key>``: its string body reaches an MQTT 3.1.1
    member of the queue (its PUBACK acknowledges it) on the published topic."""
    name = uid("am")
    sub = paho(broker, uid("w") + "-1")
    assert sub.subscribe((f"$queue/{name}/#", 1)) == [1]
    conn = conns(broker)
    snd = conn.create_sender(f"$queue/{name}/k")
    assert send_expect(snd, Message(body="to mqtt")).remote_state == Delivery.ACCEPTED
    got = sub.get()
    assert (got.topic, got.payload, got.qos) == (f"$queue/{name}/k", b"to mqtt", 1)


# == refusals =====================================================================================

def test_refused_queue_publish_is_rejected_and_the_connection_stays(broker, conns) -> None:
    """A queue publish the core refuses (``$queue/`` names no queue) is Rejected with
    the reason as its description; the connection and link go on."""
    conn = conns(broker)
    relay = conn.create_sender(None)
    dlv = send_expect(relay, Message(address="$queue/", body="x"))
    assert dlv.remote_state == Delivery.REJECTED
    assert "names no queue" in dlv.remote.condition.description
    name = uid("ok")
    dlv = send_expect(relay, Message(address=f"$queue/{name}/k", body="y"))
    assert dlv.remote_state == Delivery.ACCEPTED
    dlv = send_expect(relay, Message(address=f"$queue/{name}/$ack", body="z"))
    assert dlv.remote_state == Delivery.REJECTED
    assert "dispositions" in dlv.remote.condition.description


# == in memory: the mapping's edge cases ===========================================================

