"""Drain on queue receivers (AMQP 1.0 §2.6.7), and on a topic receiver, against the
real broker with python-qpid-proton's blocking client.

A receiver that sets drain asks the broker to use up its credit: send what the queue
holds, up to the credit, then advance delivery-count by what is left, set credit 0 and
send a flow saying so.  The receiver sees that as its credit dropping to 0 with only
the messages that came.  Both orders are covered: the drain sent with the attach
(the link is not yet a queue member when the flow arrives) and a drain on a link
already attached.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import ACCEPTED, conns, receiver, send_expect, uid
from brokerproc import BrokerProcess
from proton import Message
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns"]  # fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("queue-drain")), "--amqp-queues=*",
                         listeners=("--amqp",))
    proc.start()
    yield proc
    proc.stop()


class DrainOnAttach(LinkOption):  # type: ignore[misc]
    """Grant ``credit`` with drain set before the link opens: the flow goes out in
    the same write as the attach."""

    def __init__(self, credit: int) -> None:
        self.credit = credit

    def apply(self, link: Any) -> None:
        link.drain(self.credit)


def fill(conn: BlockingConnection, address: str, count: int) -> None:
    snd = conn.create_sender(address)
    for i in range(count):
        assert send_expect(snd, Message(body=f"m{i}")).remote_state == ACCEPTED
    snd.close()


def wait_drained(conn: BlockingConnection, rcv: BlockingReceiver, messages: int) -> None:
    """Wait until the broker's drained flow has taken the credit to 0 and ``messages``
    arrived (credit consumed by messages alone would leave it above 0 here)."""
    conn.wait(lambda: rcv.link.credit == 0, timeout=10.0,
              msg=f"waiting for the drained flow on {rcv.link.name}")
    conn.wait(lambda: rcv.fetcher.has_message >= messages, timeout=10.0,
              msg="waiting for the messages before the drained flow")


def bodies(rcv: BlockingReceiver) -> list[str]:
    return [message.body for message, _ in rcv.fetcher.incoming]


def test_drain_with_the_attach_delivers_what_the_queue_holds_first(broker, conns) -> None:
    """A drain sent with the attach on a queue holding 2 messages: both arrive, then
    the drained flow takes the 3 credits left."""
    name = uid("da")
    conn = conns(broker)
    fill(conn, name, 2)
    rcv = receiver(conn, name, credit=None, options=DrainOnAttach(5))
    wait_drained(conn, rcv, 2)
    assert bodies(rcv) == ["m0", "m1"]
    assert rcv.link.credit == 0 and rcv.fetcher.has_message == 2


def test_drain_on_an_attached_receiver_ends_with_a_drained_flow(broker, conns) -> None:
    """A drain of 5 on an attached receiver of a queue holding 2: the 2 messages go,
    then the drained flow (credit 0); a message sent after it waits for new credit."""
    name = uid("db")
    conn = conns(broker)
    fill(conn, name, 2)
    rcv = receiver(conn, name, credit=None)
    rcv.link.drain(5)
    wait_drained(conn, rcv, 2)
    assert bodies(rcv) == ["m0", "m1"]
    for _message, dlv in rcv.fetcher.incoming:
        dlv.update(ACCEPTED)
        dlv.settle()
    rcv.fetcher.incoming.clear()
    fill(conn, name, 1)
    rcv.link.flow(1)
    conn.wait(lambda: rcv.fetcher.has_message >= 1, timeout=10.0, msg="m0 after new credit")
    assert bodies(rcv) == ["m0"]


def test_drain_of_an_empty_queue_is_answered_at_once(broker, conns) -> None:
    """A drain on an empty queue: no message, the drained flow."""
    name = uid("dc")
    conn = conns(broker)
    rcv = receiver(conn, name, credit=None)
    rcv.link.drain(3)
    wait_drained(conn, rcv, 0)
    assert rcv.fetcher.has_message == 0


def test_drain_takes_no_more_than_the_credit(broker, conns) -> None:
    """A drain of 2 on a queue of 3: two arrive, credit ends at 0, the third waits."""
    name = uid("dd")
    conn = conns(broker)
    fill(conn, name, 3)
    rcv = receiver(conn, name, credit=None)
    rcv.link.drain(2)
    wait_drained(conn, rcv, 2)
    assert bodies(rcv) == ["m0", "m1"]
    rcv.link.flow(1)
    conn.wait(lambda: rcv.fetcher.has_message >= 3, timeout=10.0, msg="m2 after new credit")
    assert bodies(rcv)[2] == "m2"


def test_drain_on_a_topic_receiver_sends_what_waited_then_the_drained_flow(
        broker, conns) -> None:
    """A topic receiver without credit: QoS 1 messages published meanwhile wait in its
    session; a drain of 5 gets the 2 of them, then the drained flow."""
    topic = uid("dt") + "/x"
    conn = conns(broker)
    rcv = receiver(conn, topic, credit=None)
    conn.create_sender(None).close()    # (the attach is seen before the publishes)
    pub = conns(broker).create_sender(topic)
    for i in range(2):
        assert send_expect(pub, Message(body=f"m{i}", durable=True)).remote_state == ACCEPTED
    rcv.link.drain(5)
    wait_drained(conn, rcv, 2)
    assert bodies(rcv) == ["m0", "m1"]
