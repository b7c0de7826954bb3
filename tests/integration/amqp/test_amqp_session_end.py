"""A real AMQP 1.0 client (python-qpid-proton's ``Container``) that ends its sessions
with links still attached, against a broker process on loopback: each round's
session has a sender to a durable queue, whose message is still waiting for its
commit when the session ends, and a receiver.  proton frees such links with the
session and leaves them looking bound; the broker must neither crash nor drop the
connection, and the queue keeps what it accepted.  (The same in memory, with the
C heap measured: ``tests/unit/amqp/test_amqp_session_end_free.py``.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import TIMEOUT, amqp, receiver, run_container, uid
from brokerproc import BrokerProcess
from proton import Message
from proton.handlers import MessagingHandler

pytestmark = pytest.mark.timeout(180)

ROUNDS = 100
_BAD = re.compile(r"Traceback|#critical\]|Unhandled error|internal error")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("session-end")), "--max-connect-rate",
                         "0", listeners=("--amqp",))
    proc.start()
    yield proc
    proc.stop()


class _EndsSessionsWithLinks(MessagingHandler):  # type: ignore[misc]
    """``rounds`` sessions on one connection, each ended right after its sender's
    transfer with both links attached; the next begins once the broker answered the
    end.  Then a last session checks that the connection still carries a message."""

    def __init__(self, url: str, queue: str, topic: str, rounds: int) -> None:
        super().__init__()
        self.url, self.queue, self.topic, self.rounds = url, queue, topic, rounds
        self.ended = 0
        self.conn: Any = None
        self.sender: Any = None
        self.last: Any = None          # (the last session's receiver, then its sender)
        self.received: list[str] = []
        self.failed = ""

    def on_start(self, event: Any) -> None:
        # (no reconnecting: a broker that died fails the test at once, not by time-out)
        self.conn = event.container.connect(self.url, reconnect=False)

    def on_transport_error(self, event: Any) -> None:
        self.failed = str(event.transport.condition)
        event.container.stop()

    def on_disconnected(self, event: Any) -> None:
        if not self.received:   # (before the last message: the broker went away)
            self.failed = self.failed or "disconnected"
            event.container.stop()

    def on_connection_opened(self, event: Any) -> None:
        self._begin()

    def _begin(self) -> None:
        ssn = self.conn.session()
        ssn.open()
        snd = ssn.sender(f"ended-s-{self.ended}")
        snd.target.address = self.queue
        snd.open()
        rcv = ssn.receiver(f"ended-r-{self.ended}")
        rcv.source.address = self.topic
        rcv.open()
        rcv.flow(5)
        self.sender = snd

    def on_link_opened(self, event: Any) -> None:
        if self.last is not None and event.link == self.last and event.link.is_receiver:
            # (subscribed: now a message on its topic reaches it)
            self.last = event.container.create_sender(self.conn, self.topic)

    def on_sendable(self, event: Any) -> None:
        if self.last is not None and event.sender == self.last:
            if not self.received and event.sender.credit:
                event.sender.send(Message(body="still here"))
                self.last = None
            return
        if self.sender is not None and event.sender == self.sender:
            self.sender = None
            event.sender.send(Message(body=f"m{self.ended}", durable=True))
            event.sender.session.close()   # (both links still attached)

    def on_session_closed(self, event: Any) -> None:
        self.ended += 1
        if self.ended < self.rounds:
            self._begin()
        else:
            self.last = event.container.create_receiver(self.conn, self.topic)

    def on_message(self, event: Any) -> None:
        self.received.append(str(event.message.body))
        event.connection.close()


def test_sessions_ended_with_links_attached_leave_the_broker_serving(broker) -> None:
    """100 sessions ended with a sender (its durable transfer not yet committed) and a
    receiver attached: the connection still carries a message, the broker logged no
    error, and the queue holds the messages it accepted before each end."""
    url = f"127.0.0.1:{broker.ports['AMQP']}"
    queue = f"$queue/{uid('ended')}"
    handler = _EndsSessionsWithLinks(url, queue, uid("ended") + "/t", ROUNDS)
    run_container(handler, timeout=TIMEOUT * 6)
    assert not handler.failed, (handler.failed, broker.output()[-3000:])
    assert handler.ended == ROUNDS
    assert handler.received == ["still here"]
    assert broker.proc is not None and broker.proc.poll() is None
    assert not _BAD.search(broker.output()), broker.output()[-3000:]
    # Each transfer came before its session's end: the broker took it (durable, so
    # accepted once committed, though the outcome could not reach the ended link).
    conn = amqp(broker)
    try:
        rcv = receiver(conn, queue, credit=ROUNDS)
        bodies = set()
        for _ in range(ROUNDS):   # (each accepted: the queue's window to it frees)
            bodies.add(str(rcv.receive(timeout=TIMEOUT).body))
            rcv.accept()
    finally:
        conn.close()
    assert bodies == {f"m{i}" for i in range(ROUNDS)}
