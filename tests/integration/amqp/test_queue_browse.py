"""Browsing a durable queue (a receiver whose source asks for distribution-mode
``copy``), against the real broker with python-qpid-proton's blocking client.

A browser reads the queue without taking anything: from the head to what is there,
then new messages as they come; what it reads stays in the queue, is not counted as
a delivery and still goes to consumers; its outcomes change nothing.  The attach is
answered with distribution-mode ``copy``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import ACCEPTED, TIMEOUT, conns, receiver, send_expect, uid
from brokerproc import BrokerProcess
from proton import Delivery, Link, Message, Terminus
from proton.reactor import Copy
from proton.utils import BlockingConnection, BlockingReceiver

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns"]  # fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("queue-browse")), "--amqp-queues=*",
                         listeners=("--amqp",))
    proc.start()
    yield proc
    proc.stop()


def fill(conn: BlockingConnection, address: str, *bodies: str) -> None:
    snd = conn.create_sender(address)
    for body in bodies:
        assert send_expect(snd, Message(body=body)).remote_state == ACCEPTED
    snd.close()


def read(rcv: BlockingReceiver, n: int, settle: int | None = ACCEPTED) -> list[Message]:
    """``n`` messages, each settled with ``settle`` (None: they come pre-settled)."""
    got = []
    for _ in range(n):
        got.append(rcv.receive(timeout=TIMEOUT))
        if settle is not None:
            rcv.settle(settle)
    return got


class UnsettledCopy(Copy):  # type: ignore[misc]
    """A browser that asks for unsettled deliveries (its outcomes reach the broker)."""

    def apply(self, link: Any) -> None:
        super().apply(link)
        link.snd_settle_mode = Link.SND_UNSETTLED


def test_a_browser_reads_without_taking(broker, conns) -> None:
    """A browser gets the queue's messages pre-settled (its attach answered with
    copy) and they stay: a consumer then gets each as a first delivery."""
    name = uid("br")
    fill(conns(broker), name, "m0", "m1")
    conn = conns(broker)
    browser = receiver(conn, name, options=Copy())
    assert browser.link.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
    seen = read(browser, 2, None)
    assert [m.body for m in seen] == ["m0", "m1"]
    assert not seen[0].first_acquirer
    consumer = receiver(conns(broker), name)
    got = read(consumer, 2)
    assert [m.body for m in got] == ["m0", "m1"]
    assert [(m.delivery_count, m.first_acquirer) for m in got] == [(0, True), (0, True)]


def test_a_browser_gets_new_messages_as_consumers_do(broker, conns) -> None:
    """After what was there, a browser gets each new message, and so does the
    consumer; a browser's Rejected does nothing to the message."""
    name = uid("bn")
    conn = conns(broker)
    consumer = receiver(conn, name, credit=None)
    browser = receiver(conns(broker), name, options=UnsettledCopy())
    fill(conns(broker), name, "n0", "n1")
    assert [m.body for m in read(browser, 2, Delivery.REJECTED)] == ["n0", "n1"]
    consumer.link.flow(2)
    assert [m.body for m in read(consumer, 2)] == ["n0", "n1"]


def test_a_browser_skips_what_consumers_finished(broker, conns) -> None:
    """What a consumer acknowledged is not in the queue any more: a browser that
    comes later reads only what is left."""
    name = uid("bf")
    fill(conns(broker), name, "f0", "f1", "f2")
    consumer_conn = conns(broker)
    consumer = receiver(consumer_conn, name, credit=1)
    assert [m.body for m in read(consumer, 1)] == ["f0"]
    consumer_conn.create_sender(None).close()   # (answered after the Accepted is seen)
    browser_conn = conns(broker)
    browser = receiver(browser_conn, name, options=Copy())
    assert [m.body for m in read(browser, 2, None)] == ["f1", "f2"]


def test_a_browser_drain_ends_at_the_end_of_the_queue(broker, conns) -> None:
    """A drain on a browser: what the queue holds, then the drained flow (how
    proton's queue_browser.py knows it has seen everything)."""
    name = uid("bd")
    fill(conns(broker), name, "d0", "d1")
    conn = conns(broker)
    browser = receiver(conn, name, credit=None, options=Copy())
    browser.link.drain(10)
    conn.wait(lambda: browser.link.credit == 0 and browser.fetcher.has_message >= 2,
              timeout=TIMEOUT, msg="the browser's drained flow")
    assert [m.body for m, _ in browser.fetcher.incoming] == ["d0", "d1"]


def test_a_topic_source_with_copy_is_attached(broker, conns) -> None:
    """distribution-mode copy on a topic source: attached, and it gets what is
    published to the topic."""
    topic = uid("tc") + "/x"
    conn = conns(broker)
    rcv = receiver(conn, topic, options=Copy())
    snd = conn.create_sender(topic)
    assert send_expect(snd, Message(body="t")).remote_state == ACCEPTED
    assert rcv.receive(timeout=TIMEOUT).body == "t"
    rcv.accept()
