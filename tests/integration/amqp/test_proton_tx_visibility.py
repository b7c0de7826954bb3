"""What a transaction of python-qpid-proton's own API (``Container.declare_transaction``,
``Transaction.send``/``accept``, as its tx_send.py and tx_recv.py use it) makes
visible, and when: the example tests check only the scripts' output, which a broker
that applied the work at once would pass too.

A proton ``Container`` runs in a thread of the test and is told what to do through
its ``EventInjector``; a second connection (``proton.utils.BlockingConnection``)
reads the queue with ``amqp_tx.read_all`` (a marker read back: no timeout waited out
to see that nothing is there)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amqp_tx import read_all
from brokerproc import BrokerProcess
from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import ApplicationEvent, Container, EventInjector
from proton.utils import BlockingConnection

pytestmark = pytest.mark.timeout(180)

TIMEOUT = 30.0


class HeldTransactions(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Sends or accepts in one transaction at a time, committing or aborting on
    command; reports each step on ``steps``."""

    def __init__(self, url: str, address: str) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url = url
        self.address = address
        self.injector = EventInjector()
        self.steps: queue.Queue[str] = queue.Queue()
        self.transaction: Any = None
        self.to_send: list[str] = []
        self.answered = 0

    def on_start(self, event: Any) -> None:
        container = event.container
        container.selectable(self.injector)
        self.conn = container.connect(self.url)
        self.sender = container.create_sender(self.conn, self.address)
        self.receiver = container.create_receiver(self.conn, self.address)
        self.container = container
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.steps.put("declared")

    def on_transaction_committed(self, event: Any) -> None:
        self.steps.put("committed")
        self.container.declare_transaction(self.conn, handler=self)

    def on_transaction_aborted(self, event: Any) -> None:
        self.steps.put("aborted")
        self.container.declare_transaction(self.conn, handler=self)

    def on_sendable(self, event: Any) -> None:
        self._send()

    def _send(self) -> None:
        while self.to_send and self.sender.credit:
            self.transaction.send(self.sender, Message(body=self.to_send.pop(0)))

    def on_settled(self, event: Any) -> None:
        # (a transactional transfer's answer, transactional-state(Accepted), settled)
        if event.sender == self.sender:
            self.answered += 1
            self.steps.put("answered")

    def on_message(self, event: Any) -> None:
        self.transaction.accept(event.delivery)
        self.steps.put(f"got {event.message.body}")

    # commands from the test's thread (``do``)
    def on_send(self, event: Any) -> None:
        self.to_send.extend(event.subject)
        self._send()

    def on_fetch(self, event: Any) -> None:
        self.receiver.flow(1)

    def on_commit(self, event: Any) -> None:
        self.transaction.commit()

    def on_abort(self, event: Any) -> None:
        self.transaction.abort()

    def on_quit(self, event: Any) -> None:
        self.conn.close()
        self.injector.close()


class Driver:
    """The handler in its container's thread, driven from the test."""

    def __init__(self, url: str, address: str) -> None:
        self.handler = HeldTransactions(url, address)
        self.thread = threading.Thread(target=Container(self.handler).run, daemon=True)
        self.thread.start()

    def do(self, command: str, subject: Any = None) -> None:
        self.handler.injector.trigger(ApplicationEvent(command, subject=subject))

    def expect(self, step: str) -> None:
        seen = []
        while True:
            got = self.handler.steps.get(timeout=TIMEOUT)
            seen.append(got)
            if got == step:
                return
            assert got in ("answered", "declared"), f"expected {step!r}, saw {seen}"

    def stop(self) -> None:
        self.do("quit")
        self.thread.join(timeout=TIMEOUT)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path / "data"), listeners=("--amqp",))
    proc.start()
    yield proc
    proc.stop()


def _url(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.ports['AMQP']}"


def test_sent_in_a_transaction_is_visible_only_after_commit(broker: BrokerProcess) -> None:
    """Messages proton sends in a transaction are answered but not on the queue
    while it is open, nor after an abort; all of them are once it commits."""
    address = "$queue/txvis"
    driver = Driver(_url(broker), address)
    watcher = BlockingConnection(_url(broker), timeout=TIMEOUT)
    try:
        driver.expect("declared")
        driver.do("send", ["a1", "a2"])
        driver.expect("answered")
        driver.expect("answered")
        assert read_all(watcher, address) == []
        driver.do("abort")
        driver.expect("aborted")
        assert read_all(watcher, address) == []
        driver.expect("declared")
        driver.do("send", ["c1", "c2", "c3"])
        for _ in range(3):
            driver.expect("answered")
        assert read_all(watcher, address) == []
        driver.do("commit")
        driver.expect("committed")
        assert read_all(watcher, address) == ["c1", "c2", "c3"]
    finally:
        watcher.close()
        driver.stop()


def test_accepted_in_a_transaction_is_consumed_only_after_commit(
        broker: BrokerProcess) -> None:
    """A message proton accepts in a transaction stays on the queue, held, until the
    commit: an abort gives it back (fetched again), a commit consumes it."""
    address = "$queue/txacc"
    watcher = BlockingConnection(_url(broker), timeout=TIMEOUT)
    watcher.create_sender(address, name="feed").send(Message(body="job"))
    driver = Driver(_url(broker), address)
    try:
        driver.expect("declared")
        driver.do("fetch")
        driver.expect("got job")
        driver.do("abort")
        driver.expect("aborted")
        driver.expect("declared")
        driver.do("fetch")
        driver.expect("got job")    # (released by the abort: delivered again)
        driver.do("commit")
        driver.expect("committed")
        assert read_all(watcher, address) == []
    finally:
        watcher.close()
        driver.stop()
