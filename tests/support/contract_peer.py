"""A gateway-like AMQP 1.0 peer for the tests against a real core broker: one
python-qpid-proton client engine on one socket, an AMQP session per MQTT client id
(as a gateway multiplexes its clients), and the contract's links of each client
(seed 000: the subscription service sender, ``.control`` and ``.publish``
receivers).  Every wait is bounded in time and ends as soon as its condition holds.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from typing import Any

from amqp_messages import control, drain
from proton import Connection, Delivery, Endpoint, Link, Message, Transport, int32, ulong

__all__ = ["ContractPeer", "ContractClient", "TIMEOUT"]

TIMEOUT = 10.0


class ContractClient:
    """One client id's AMQP session on a ``ContractPeer`` and its links."""

    def __init__(self, peer: ContractPeer, client_id: str) -> None:
        self.peer = peer
        self.client_id = client_id
        self.session = peer.conn.session()
        self.session.open()
        self.links: list[Link] = []
        self.ss = self.sender("$mqtt.subscriptionservice")
        self.control = self.receiver(f"$mqtt.to.{client_id}.control")
        self.publish: Link | None = None

    def sender(self, address: str, name: str | None = None) -> Link:
        link = self.session.sender(name or f"{self.client_id}-s{len(self.links)}")
        link.target.address = address
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.open()
        self.links.append(link)
        return link

    def receiver(self, address: str, credit: int = 10) -> Link:
        link = self.session.receiver(f"{self.client_id}-r{len(self.links)}")
        link.source.address = address
        link.open()
        link.flow(credit)
        self.links.append(link)
        return link

    def listed(self) -> dict[str, int]:
        """AMQP_LIST, Accepted, and its AMQP_SUBSCRIPTIONS reply (settled Accepted)."""
        reply_to = f"$mqtt.to.{self.client_id}.control"
        dlv = self.peer.send(self.ss, control("list", self.client_id, reply_to=reply_to))
        assert dlv.remote_state == Delivery.ACCEPTED, dlv.remote_state
        [(reply, rdlv)] = self.peer.take(self.control, 1)
        rdlv.update(Delivery.ACCEPTED)
        rdlv.settle()
        assert reply.subject == "subscriptions"
        return {str(k): int(v) for k, v in dict(reply.body).items()}

    def attach_publish(self, credit: int = 10) -> Link:
        self.publish = self.receiver(f"$mqtt.to.{self.client_id}.publish", credit)
        assert self.peer.wait(lambda: self.peer.answered(self.publish)), "no attach answer"
        return self.publish

    def subscribe(self, topic_filter: str, qos: int, packet_id: int = 1) -> int:
        """AMQP_SUBSCRIBE of one filter; the core's outcome."""
        dlv = self.peer.send(self.ss, control(
            "subscribe", self.client_id, body={topic_filter: int32(qos)},
            message_id=ulong(packet_id)))
        return int(dlv.remote_state)


class ContractPeer:
    """A proton client engine on a socket to the core (``port``: its AMQP listener)."""

    def __init__(self, port: int, container: str) -> None:
        self.conn = Connection()
        self.conn.container = container
        self.transport = Transport()
        self.transport.bind(self.conn)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.closed = False
        self.conn.open()
        self._tags = 0
        self.got: dict[Any, list[tuple[Message, Any]]] = {}

    def client(self, client_id: str) -> ContractClient:
        return ContractClient(self, client_id)

    @staticmethod
    def answered(link: Link) -> bool:
        """The core answered the attach (for a refusal: and detached it)."""
        return bool(link.state & (Endpoint.REMOTE_ACTIVE | Endpoint.REMOTE_CLOSED))

    @staticmethod
    def refused(link: Link) -> tuple[str, str] | None:
        """The refusal's condition (name, description) once detached, or None."""
        if not link.state & Endpoint.REMOTE_CLOSED or link.remote_condition is None:
            return None
        return link.remote_condition.name, link.remote_condition.description or ""

    def opened(self) -> bool:
        return bool(self.conn.state & Endpoint.REMOTE_ACTIVE) and not self.closed and not (
            self.conn.state & Endpoint.REMOTE_CLOSED)

    def send(self, link: Link, message: Message) -> Delivery:
        """Send unsettled and wait for the core's outcome."""
        assert self.wait(lambda: link.credit > 0), f"no credit on {link.name}"
        self._tags += 1
        dlv = link.delivery(b"t%d" % self._tags)
        link.send(message.encode())
        link.advance()
        assert self.wait(lambda: dlv.remote_state != 0), "no outcome from the core"
        return dlv

    def take(self, link: Link, n: int, timeout: float = TIMEOUT) -> list[tuple[Message, Any]]:
        """The next ``n`` messages on ``link`` (waits for them, within ``timeout``)."""
        box = self.got.setdefault(link, [])
        assert self.wait(lambda: len(box) >= n, timeout), f"{len(box)} of {n} on {link.name}"
        taken, box[:] = box[:n], box[n:]
        return taken

    def wait(self, until: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
        """Move bytes both ways until ``until()`` holds, the core closes the socket or
        ``timeout`` passes; whether ``until()`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            self.transport.tick(time.monotonic())
            out = drain(self.transport)
            if out and not self.closed:
                try:
                    self.sock.sendall(out)
                except OSError:
                    self.closed = True
            self._collect()
            if until() or self.closed:
                return until()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            readable, _, _ = select.select([self.sock], [], [], min(left, 0.5))
            if not readable:
                continue
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.closed = True
                self.transport.close_tail()
                continue
            while data and self.transport.capacity() > 0:
                n = min(len(data), self.transport.capacity())
                self.transport.push(data[:n])
                data = data[n:]

    def _collect(self) -> None:
        link = self.conn.link_head(Endpoint.REMOTE_ACTIVE)
        while link is not None:
            if link.is_receiver:
                while True:
                    dlv = link.current
                    if dlv is None or not dlv.readable or dlv.partial:
                        break
                    data = link.recv(dlv.pending)
                    link.advance()
                    message = Message()
                    message.decode(data)
                    self.got.setdefault(link, []).append((message, dlv))
            link = link.next(Endpoint.REMOTE_ACTIVE)

    def close(self) -> None:
        self.sock.close()
