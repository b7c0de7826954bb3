"""AMQP 1.0 local transactions from a python-qpid-proton ``BlockingConnection`` (proton's
blocking API has none): a coordinator link, declare and discharge, a transfer and
an outcome under a transaction, and reading all of a durable queue up to a marker,
so that a test can assert what is *not* there without waiting out a timeout."""

from __future__ import annotations

from typing import Any

from proton import Data, Described, Link, Message, Terminus, symbol, ulong
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

__all__ = ["Coordinator", "TRANSACTIONAL", "accept_in", "read_all", "send_in"]

DECLARED = 0x33
TRANSACTIONAL = 0x34
TIMEOUT = 10.0


class _CoordinatorTarget(LinkOption):  # type: ignore[misc]
    def apply(self, link: Link) -> None:
        link.target.type = Terminus.COORDINATOR
        caps: Data = link.target.capabilities
        caps.put_array(False, Data.SYMBOL)
        caps.enter()
        caps.put_symbol(symbol("amqp:local-transactions"))
        caps.exit()


class Coordinator:
    """A transaction controller on ``conn``."""

    def __init__(self, conn: BlockingConnection) -> None:
        self.conn = conn
        self.link: BlockingSender = conn.create_sender(None, name="txn-ctrl",
                                                       options=_CoordinatorTarget())

    def declare(self) -> bytes:
        dlv = self.link.send(Message(body=Described(symbol("amqp:declare:list"), [None])),
                             error_states=[])
        assert dlv.remote_state == DECLARED, dlv.remote_state
        return bytes(dlv.remote.data[0])

    def discharge(self, txn: bytes, fail: bool = False, wait: bool = True) -> Any:
        """Commit (or roll back, ``fail``); with ``wait`` False, only until the
        discharge is written to the socket (the answer not awaited)."""
        body = Message(body=Described(symbol("amqp:discharge:list"), [txn, fail]))
        if wait:
            return self.link.send(body, error_states=[])
        dlv = self.link.link.send(body)
        flush(self.conn)
        return dlv


def flush(conn: BlockingConnection) -> None:
    """Write what the connection holds to the socket (one turn of its container)."""
    transport = conn.conn.transport
    conn.wait(lambda: transport is None or transport.pending() <= 0, timeout=TIMEOUT,
              msg="writing to the broker")


def send_in(conn: BlockingConnection, sender: BlockingSender, txn: bytes,
            message: Message) -> Any:
    """Send ``message`` under ``txn`` (transactional-state in the transfer) and wait
    for the broker's answer."""
    dlv = sender.link.send(message)
    dlv.local.data = [txn]
    dlv.update(TRANSACTIONAL)
    conn.wait(lambda: dlv.remote_state != 0 or dlv.settled, timeout=TIMEOUT,
              msg="a transactional transfer's answer")
    return dlv


def accept_in(conn: BlockingConnection, rcv: BlockingReceiver, txn: bytes) -> Message:
    """Take the next message of ``rcv`` and accept it under ``txn`` (unsettled, as
    proton's ``Transaction.accept``), written to the socket."""
    conn.wait(lambda: rcv.fetcher.has_message > 0, timeout=TIMEOUT,
              msg="a message to accept")
    message, dlv = rcv.fetcher.incoming.popleft()
    dlv.local.data = [txn, Described(ulong(0x24), [])]
    dlv.update(TRANSACTIONAL)
    flush(conn)
    return message


def read_all(conn: BlockingConnection, address: str, most: int = 100) -> list[Any]:
    """The bodies of what the durable queue ``address`` holds, accepted: a marker is
    appended and read back, and a queue delivers in order (redeliveries, lower
    offsets, first), so everything before the marker is all there was."""
    marker = "-- the end of what was there --"
    sender = conn.create_sender(address)
    sender.send(Message(body=marker))
    rcv = conn.create_receiver(address, credit=most + 1)
    bodies = []
    while True:
        conn.wait(lambda: rcv.fetcher.has_message > 0, timeout=TIMEOUT,
                  msg=f"reading {address}")
        body = rcv.fetcher.pop().body
        rcv.fetcher.settle(0x24)
        if body == marker:
            break
        bodies.append(body)
        assert len(bodies) <= most, f"more than {most} messages in {address}"
    flush(conn)
    rcv.close()
    sender.close()
    return bodies
