"""Issue #26 §3 against the real broker: no acknowledged message dropped.

A shared group of three members that read but never PUBACK and one that acks: every
QoS 1 message acknowledged to the publisher reaches the acker (the others' windows
fill, the group holds the rest and holds the publisher back; what the stuck members
held moves when they leave).  A new subscriber to more retained messages than its
queue holds gets every one of them, at QoS 1 and QoS 0.

The clients are raw sockets driven by one ``select`` loop with the project's codec
(several clients must make progress at once, and a publisher the broker stops
reading must not block the test).  Every wait is that loop, with a deadline.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable

import pytest
from brokerproc import BrokerProcess

from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Puback,
    Publish,
    Suback,
    Subscribe,
)

pytestmark = pytest.mark.timeout(180)


class Client:
    """A non-blocking MQTT 3.1.1 client: ``pending`` bytes go out as the socket
    takes them, ``inbox`` collects what the broker sent; ``on_publish`` may answer."""

    def __init__(self, port: int, client_id: str, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:   # (a slow reader: the kernel holds little for it)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.decoder = Decoder()
        self.pending = bytearray()
        self.inbox: list[Packet] = []
        self.closed = False
        self.on_publish: Callable[[Client, Publish], None] | None = None
        self.send(Connect("MQTT", 4, client_id, True, 60))

    def send(self, *packets: Packet) -> None:
        for packet in packets:
            self.pending += encode(packet)

    def take(self, kind: type) -> list[Packet]:
        taken = [p for p in self.inbox if isinstance(p, kind)]
        self.inbox = [p for p in self.inbox if not isinstance(p, kind)]
        return taken

    def readable(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        self.decoder.feed(data)
        for packet in self.decoder:
            if isinstance(packet, Publish) and self.on_publish is not None:
                self.on_publish(self, packet)
            self.inbox.append(packet)

    def writable(self) -> None:
        try:
            sent = self.sock.send(self.pending)
        except BlockingIOError:
            return
        del self.pending[:sent]

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def run(clients: list[Client], until: Callable[[], bool], timeout: float) -> bool:
    """Move bytes for every open client until ``until()`` or the deadline."""
    deadline = time.monotonic() + timeout
    while not until():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        live = [c for c in clients if not c.closed]
        readers = [c.sock for c in live]
        writers = [c.sock for c in live if c.pending]
        r, w, _ = select.select(readers, writers, [], min(left, 0.5))
        for c in live:
            if c.sock in w:
                c.writable()
            if c.sock in r:
                c.readable()
    return True


def connected(clients: list[Client]) -> None:
    assert run(clients, lambda: all(any(isinstance(p, Connack) for p in c.inbox)
                                    for c in clients), 10)
    for c in clients:
        [ack] = c.take(Connack)
        assert ack.return_code == 0  # type: ignore[attr-defined]


def subscribed(clients: list[Client], topic_filter: str, qos: int) -> None:
    for c in clients:
        c.send(Subscribe(1, ((topic_filter, qos),)))
    assert run(clients, lambda: all(any(isinstance(p, Suback) for p in c.inbox)
                                    for c in clients), 10)
    for c in clients:
        [ack] = c.take(Suback)
        assert ack.return_codes == (qos,)  # type: ignore[attr-defined]


def ack_each(client: Client, packet: Publish) -> None:
    if packet.qos == 1 and packet.packet_id is not None:
        client.send(Puback(packet.packet_id))


def test_a_shared_group_with_stuck_members_delivers_every_acknowledged_message(
        tmp_path: os.PathLike[str]) -> None:
    """Issue #26 §3 at a smaller scale: three members that never PUBACK, one that
    does, 2,000 QoS 1 messages; every one acknowledged to the publisher reaches the
    acker (before the fix: the stuck members' queues dropped most of theirs)."""
    n = 2000
    with BrokerProcess(os.path.join(str(tmp_path), "data"), "--max-queued-messages", "50",
                       "--max-inflight", "10", "--stall-timeout", "0.5") as broker:
        port = broker.mqtt_port
        stuck = [Client(port, f"stuck-{i}") for i in range(3)]
        acker = Client(port, "acker")
        acker.on_publish = ack_each
        members = [*stuck, acker]
        connected(members)
        subscribed(members, "$share/workers/jobs", 1)
        pub = Client(port, "producer")
        connected([pub])
        pub.send(*[Publish("jobs", b"%d" % i, 1, False, False, i + 1) for i in range(n)])
        everyone = [*members, pub]
        got: set[bytes] = set()
        pubacks = 0

        def all_acknowledged() -> bool:
            nonlocal pubacks
            pubacks += len(pub.take(Puback))
            for message in acker.take(Publish):
                got.add(message.payload)  # type: ignore[attr-defined]
            return pubacks == n

        assert run(everyone, all_acknowledged, 60), f"{pubacks} PUBACKs of {n}"
        for member in stuck:
            member.inbox.clear()
            member.send(Disconnect())
        assert run(everyone, lambda: all(not m.pending for m in stuck), 10)
        for member in stuck:
            member.close()

        def all_delivered() -> bool:
            all_acknowledged()
            return len(got) == n

        run(everyone, all_delivered, 30)
        assert len(got) == n, f"the acker got {len(got)} of {n} acknowledged messages"
        assert not [line for line in broker.log if "Traceback" in line]


@pytest.mark.parametrize("qos", [1, 0])
def test_a_new_subscriber_gets_every_retained_message(tmp_path: os.PathLike[str],
                                                      qos: int) -> None:
    """Issue #26 §3: 2,000 retained messages of 8 KB and a queue bound of 100; a new
    subscriber (with a small socket buffer) gets all of them, at QoS 1 and at QoS 0
    (before the fix: a queue's worth at QoS 1, and what the congestion bound left at
    QoS 0)."""
    n = 2000
    with BrokerProcess(os.path.join(str(tmp_path), "data"), "--max-queued-messages",
                       "100") as broker:
        port = broker.mqtt_port
        pub = Client(port, "retainer")
        connected([pub])
        for i in range(n):
            pub.send(Publish(f"kept/{i}", b"%05d" % i + b"x" * 8187, 1, True, False, i + 1))
        assert run([pub], lambda: len(pub.inbox) >= n, 60)
        sub = Client(port, "late", rcvbuf=64 * 1024)
        sub.on_publish = ack_each
        connected([sub])
        sub.send(Subscribe(1, (("kept/#", qos),)))
        got: set[bytes] = set()

        def everything() -> bool:
            for message in sub.take(Publish):
                assert message.retain  # type: ignore[attr-defined]
                got.add(message.payload[:5])  # type: ignore[attr-defined]
            return len(got) == n

        run([sub], everything, 60)
        assert len(got) == n, f"the subscriber got {len(got)} of {n} retained messages"
        assert not [line for line in broker.log if "Traceback" in line]
