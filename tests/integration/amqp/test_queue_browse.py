"""Browsing a durable queue (a receiver whose source asks for distribution-mode
``copy``), against the real broker with python-qpid-proton's blocking client.

The broker has no browsing cursor yet: such a receiver is refused with
``amqp:not-implemented`` at attach, rather than served as a consumer that takes the
messages away (what it did before), and the queue keeps its messages.  A topic
source with ``copy`` is what a topic is anyway: attached as usual.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from amqp_clients import ACCEPTED, TIMEOUT, conns, receiver, send_expect, uid
from brokerproc import BrokerProcess
from proton import Message
from proton.reactor import Copy
from proton.utils import LinkDetached

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns"]  # fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("queue-browse")), "--amqp-queues=*",
                         listeners=("--amqp",))
    proc.start()
    yield proc
    proc.stop()


def test_a_queue_browser_is_refused_and_the_queue_keeps_its_messages(broker, conns) -> None:
    """A receiver with distribution-mode copy on a queue gets amqp:not-implemented
    saying browsing is not supported; a consumer then gets every message."""
    name = uid("br")
    conn = conns(broker)
    snd = conn.create_sender(name)
    for i in range(2):
        assert send_expect(snd, Message(body=f"m{i}")).remote_state == ACCEPTED
    with pytest.raises(LinkDetached) as refused:
        receiver(conn, name, options=Copy())
    condition = refused.value.link.remote_condition
    assert condition.name == "amqp:not-implemented"
    assert "browsing" in condition.description
    rcv = receiver(conns(broker), name)
    got = []
    for _ in range(2):
        got.append(rcv.receive(timeout=TIMEOUT).body)
        rcv.accept()
    assert got == ["m0", "m1"]


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
