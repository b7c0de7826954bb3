"""AMQP flow control: a sender link feeding congested subscribers gets no credit, and a
receiver that stops reading its socket pauses (Twisted back-pressure) whoever feeds it.

Real broker process (``twistd -n mqttamqp``) with MQTT, AMQP and the console on
loopback, port 0; python-qpid-proton's ``BlockingConnection`` as the AMQP publisher,
and as the subscriber either paho-mqtt with manual acknowledgements (an online
MQTT session that takes messages but does not PUBACK them) or an AMQP receiver
that grants no credit.

What the broker promises (``IncomingLink.top_up`` / ``block_until_drained`` in
``mqttamqp/amqp/incoming.py``, ``Broker.publish`` / ``pause_until_drained`` /
``_pause_expired`` and ``Session.over_high_water``):

* a subscriber is congested while it is online and more than half of
  ``--max-queued-messages`` wait in its queue (beyond the ``--max-inflight``
  window);
* an AMQP sender link whose publish fed a congested subscriber is granted no more
  credit until that subscriber is below its high-water mark again;
* after ``--stall-timeout`` without progress the subscriber is marked stalled and
  stops holding publishers back (its queue then drops at its bound, counted).

A negative ("no credit is granted") is shown without sleeping: after every
delivery was answered, a probe message goes out on another link of the *same*
connection and comes back on a receiver of that connection; any flow frame the
broker sent for the withheld link would have been read before the probe, so credit
still being 0 then means none was sent.  The console (``/api/client``) shows the
broker's own view: the credit it has outstanding on the link, and the queue of an
MQTT subscriber.
"""

from __future__ import annotations

import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from amqp_clients import (
    ACCEPTED,
    TIMEOUT,
    Paho,
    amqp,
    body_bytes,
    receiver,
    take,
    uid,
    wait_messages,
)
from amqp_messages import publish_message
from brokerproc import BrokerProcess
from console_support import ConsoleHTTP, initial_password
from proton import Delivery
from proton.utils import BlockingConnection, BlockingSender

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Connect, Publish

pytestmark = pytest.mark.timeout(120)

QUEUE_LIMIT = 300              # --max-queued-messages
INFLIGHT = 10                  # --max-inflight
HIGH_WATER = QUEUE_LIMIT // 2  # congested while more than this many are queued
LONG_STALL = 30.0              # --stall-timeout where stalls must not interfere
SHORT_STALL = 3.0              # --stall-timeout of the stall test (slow CI: room to spare)
# More credit than this would mean the broker never withheld any: even with the
# whole queue and window filled the subscriber could take no more without drops.
CREDIT_CEILING = QUEUE_LIMIT + INFLIGHT


# -- the broker, its console, the publisher ----------------------------------------------

class FlowBroker:
    """A broker of the test's own with small queues, and its console logged in."""

    def __init__(self, data_dir: str, stall_timeout: float,
                 queue_limit: int = QUEUE_LIMIT) -> None:
        self.proc = BrokerProcess(
            data_dir, "--max-queued-messages", str(queue_limit), "--max-inflight",
            str(INFLIGHT), "--stall-timeout", str(stall_timeout), "--sys-interval", "0",
            listeners=("--mqtt", "--amqp", "--web"))
        self.proc.start()
        self.http = ConsoleHTTP(self.proc.ports["WEB"])
        assert self.http.login(initial_password(data_dir)) == 303

    def session(self, client_id: str) -> dict[str, Any]:
        """The console's view of an MQTT client's session (queue, window, drops)."""
        reply = self.http.get("/api/client", session=client_id)
        assert reply.code == 200, reply.text
        session: dict[str, Any] = reply.json()["session"]
        return session

    def incoming_link(self, conn: BlockingConnection, address: str) -> dict[str, Any]:
        """The broker's side of the link ``conn`` sends to ``address`` on."""
        assert conn.conn is not None
        container = conn.conn.container
        rows = self.http.get("/api/clients", q=container).json()["items"]
        keys = [row["key"] for row in rows if row["client_id"] == container]
        assert len(keys) == 1, rows
        links = self.http.get("/api/client", key=keys[0]).json()["link_list"]
        found = [link for link in links
                 if link["role"] == "receiver" and link["address"] == address]
        assert len(found) == 1, links
        return found[0]


@pytest.fixture
def start_broker(tmp_path: os.PathLike[str]) -> Iterator[Callable[..., FlowBroker]]:
    started: list[FlowBroker] = []

    def start(stall_timeout: float, queue_limit: int = QUEUE_LIMIT) -> FlowBroker:
        broker = FlowBroker(os.path.join(str(tmp_path), "data"), stall_timeout, queue_limit)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.proc.stop()


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """``closing(client)``: stopped/closed after the test, whatever happened."""
    made: list[Any] = []

    def keep(client: Any) -> Any:
        made.append(client)
        return client

    yield keep
    for client in reversed(made):
        try:
            if isinstance(client, Paho):
                client.stop()
            else:
                client.close()
        except Exception:
            pass


def publisher(flow: FlowBroker, topic: str, closing: Callable[[Any], Any]
              ) -> tuple[BlockingConnection, BlockingSender, Probe]:
    """An AMQP connection with a sender on ``topic`` and a probe beside it."""
    conn = closing(amqp(flow.proc))
    return conn, conn.create_sender(topic), Probe(conn)


class Probe:
    """A message out and back on another topic over the publisher's own connection."""

    def __init__(self, conn: BlockingConnection) -> None:
        self.conn = conn
        topic = uid("probe") + "/p"
        self.rcv = receiver(conn, topic, credit=10)
        self.snd = conn.create_sender(topic)
        self.count = 0

    def round_trip(self) -> None:
        self.count += 1
        body = b"probe-%d" % self.count
        assert self.snd.send(publish_message(None, body, qos=1)).remote_state == ACCEPTED
        message, _ = take(self.conn, self.rcv)
        self.rcv.accept()
        assert body_bytes(message) == body


def burst(conn: BlockingConnection, snd: BlockingSender, bodies: list[bytes]) -> None:
    """Send ``bodies`` (within the link's credit) as QoS 1, unsettled, all at once;
    wait until the broker has answered every one and check each was Accepted."""
    assert len(bodies) <= snd.link.credit
    deliveries: list[Delivery] = []
    for body in bodies:
        delivery = snd.link.send(publish_message(None, body, qos=1, durable=True))
        assert isinstance(delivery, Delivery)
        deliveries.append(delivery)
    conn.wait(lambda: all(d.settled for d in deliveries), timeout=TIMEOUT,
              msg=f"the broker answering {len(deliveries)} message(s)")
    states = [d.remote_state for d in deliveries]
    for d in deliveries:
        d.settle()
    assert states == [ACCEPTED] * len(deliveries)


def send_all(conn: BlockingConnection, snd: BlockingSender, bodies: list[bytes]) -> None:
    """Send ``bodies`` in bursts of the credit granted, waiting for credit (bounded)."""
    i = 0
    while i < len(bodies):
        conn.wait(lambda: snd.link.credit > 0, timeout=TIMEOUT,
                  msg=f"credit for message {i} of {len(bodies)} (withheld?)")
        n = min(snd.link.credit, len(bodies) - i)
        burst(conn, snd, bodies[i:i + n])
        i += n


def send_until_withheld(conn: BlockingConnection, snd: BlockingSender, probe: Probe,
                        sent: list[bytes]) -> int:
    """Send while the broker grants credit; stop once it grants none.

    "None" means: credit 0 after every delivery was answered *and* after a probe
    round trip on the same connection.  Fails if the broker granted more than
    ``CREDIT_CEILING`` in all.  Appends the bodies sent to ``sent``; returns the
    number of messages sent here (= the credit granted to the link so far).
    """
    granted = 0
    while True:
        credit = snd.link.credit
        if credit <= 0:
            probe.round_trip()
            if snd.link.credit <= 0:
                return granted
            continue
        assert granted + credit < CREDIT_CEILING, (
            f"the broker kept granting credit ({granted + credit} messages so far) although "
            f"a subscriber with a {QUEUE_LIMIT}-message queue and a {INFLIGHT}-message "
            f"window took none of them")
        bodies = [b"m-%d" % (len(sent) + i) for i in range(credit)]
        burst(conn, snd, bodies)
        sent.extend(bodies)
        granted += credit


def send_unhindered(conn: BlockingConnection, snd: BlockingSender, probe: Probe,
                    bodies: list[bytes]) -> None:
    """Send ``bodies`` in bursts without ever waiting for credit: whenever the credit is
    used up, a probe round trip must find that the broker has already granted more."""
    i = 0
    while i < len(bodies):
        if snd.link.credit <= 0:
            probe.round_trip()
            assert snd.link.credit > 0, f"credit withheld again after {i} of {len(bodies)}"
        n = min(snd.link.credit, len(bodies) - i)
        burst(conn, snd, bodies[i:i + n])
        i += n


def wait_for_credit(conn: BlockingConnection, snd: BlockingSender, timeout: float) -> None:
    conn.wait(lambda: snd.link.credit > 0, timeout=timeout,
              msg="waiting for the broker to grant credit again")


# -- the subscribers ----------------------------------------------------------------------

class SlowSubscriber(Paho):
    """An online MQTT subscriber (paho, persistent session) that takes the messages
    but sends PUBACK only when the test says so (paho's manual acknowledgements)."""

    def __init__(self, port: int, client_id: str) -> None:
        self._lock = threading.Lock()
        self._unacked: list[int] = []
        self._acking = False
        super().__init__(port, client_id, clean=False)
        self.c.manual_ack_set(True)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self._lock:
            if self._acking:
                client.ack(msg.mid, msg.qos)
            else:
                self._unacked.append(msg.mid)
        super()._on_message(client, userdata, msg)

    def ack_received(self) -> int:
        """PUBACK what arrived so far; later messages stay unacknowledged."""
        with self._lock:
            for mid in self._unacked:
                self.c.ack(mid, 1)
            n = len(self._unacked)
            self._unacked.clear()
        return n

    def ack_everything(self) -> None:
        """From now on PUBACK every message, including those already here."""
        with self._lock:
            self._acking = True
            for mid in self._unacked:
                self.c.ack(mid, 1)
            self._unacked.clear()

    def bodies(self, n: int) -> list[bytes]:
        """The payloads of the next ``n`` messages (each waited for, bounded)."""
        return [bytes(self.get().payload) for _ in range(n)]


class CreditlessReceiver:
    """An AMQP receiver on a topic (its own connection) that grants no credit until told."""

    def __init__(self, conn: BlockingConnection, topic: str) -> None:
        self.conn = conn
        self.rcv = receiver(conn, topic, credit=None)
        assert self.rcv.fetcher is not None
        self.fetcher: Any = self.rcv.fetcher   # proton's Fetcher (not public)
        self.got: list[bytes] = []

    def _accept_next(self) -> None:
        message = self.fetcher.pop()
        self.rcv.accept()
        self.got.append(body_bytes(message))

    def take_and_accept(self, n: int) -> None:
        """Grant ``n`` credit, and accept each of the ``n`` messages as it arrives."""
        self.rcv.link.flow(n)
        for _ in range(n):
            wait_messages(self.conn, self.rcv, 1)
            self._accept_next()

    def accept_held(self) -> None:
        """Accept the messages that arrived but were not yet taken."""
        while self.fetcher.has_message:
            self._accept_next()


# -- tests --------------------------------------------------------------------------------

def _withheld(flow: FlowBroker, conn: BlockingConnection, snd: BlockingSender, topic: str,
              probe: Probe) -> None:
    """Credit is 0 on both ends: the client's link after a probe round trip, and the
    credit the broker itself has outstanding on its side of the link."""
    probe.round_trip()
    assert snd.link.credit == 0
    assert flow.incoming_link(conn, topic)["credit"] == 0


def test_credit_withheld_while_mqtt_subscriber_congested_then_restored(
        start_broker: Callable[[float], FlowBroker], closing: Callable[[Any], Any]) -> None:
    """An online MQTT subscriber that stops acknowledging: once its queue is past high
    water the AMQP sender gets no more credit (nothing dropped); acknowledging a few
    does not bring it back, draining it does, and every Accepted message arrives once."""
    flow = start_broker(LONG_STALL)
    topic = uid("fl") + "/t"
    sub = closing(SlowSubscriber(flow.proc.mqtt_port, uid("slow")))
    assert sub.subscribe((topic, 1)) == [1]
    conn, snd, probe = publisher(flow, topic, closing)
    sent: list[bytes] = []

    granted = send_until_withheld(conn, snd, probe, sent)
    # It took the window plus more than high water to make the broker stop (it did not
    # stop early), and it stopped before the subscriber's queue could overflow.
    assert INFLIGHT + HIGH_WATER < granted < CREDIT_CEILING
    session = flow.session(sub.client_id)
    assert (session["inflight_count"], session["queued_count"]) == (INFLIGHT, granted - INFLIGHT)
    assert session["queued_count"] > HIGH_WATER
    assert (session["dropped"], session["delivered"]) == (0, 0)
    link = flow.incoming_link(conn, topic)
    assert (link["credit"], link["delivered"]) == (0, granted)
    _withheld(flow, conn, snd, topic, probe)   # still none after the console's requests

    # Some progress, but the queue stays past high water: still no credit.
    assert granted - 2 * INFLIGHT > HIGH_WATER
    first = sub.bodies(INFLIGHT)
    assert sub.ack_received() == INFLIGHT
    second = sub.bodies(INFLIGHT)     # the window refilled: the PUBACKs were processed
    assert flow.session(sub.client_id)["queued_count"] == granted - 2 * INFLIGHT
    _withheld(flow, conn, snd, topic, probe)

    # Drained: credit comes back, and the sender can go on.
    sub.ack_everything()
    wait_for_credit(conn, snd, TIMEOUT)
    rest = [b"rest-%d" % i for i in range(50)]
    send_all(conn, snd, rest)
    sent.extend(rest)
    got = first + second + sub.bodies(len(sent) - 2 * INFLIGHT)
    assert got == sent                                     # each once, in order
    send_all(conn, snd, [b"end"])
    assert sub.get().payload == b"end"                     # nothing after (no duplicates)
    assert flow.session(sub.client_id)["dropped"] == 0


def test_credit_withheld_while_amqp_receiver_gives_no_credit_then_restored(
        start_broker: Callable[[float], FlowBroker], closing: Callable[[Any], Any]) -> None:
    """An AMQP receiver on the topic that grants no credit congests like a slow MQTT
    client: the sender's credit is withheld until the receiver takes its messages."""
    flow = start_broker(LONG_STALL)
    topic = uid("fa") + "/t"
    sub = CreditlessReceiver(closing(amqp(flow.proc)), topic)
    conn, snd, probe = publisher(flow, topic, closing)
    sent: list[bytes] = []

    granted = send_until_withheld(conn, snd, probe, sent)
    assert INFLIGHT + HIGH_WATER < granted < CREDIT_CEILING
    _withheld(flow, conn, snd, topic, probe)

    # Take and accept one window's worth; the next window arriving shows the broker
    # processed the acceptances.  The queue is still past high water: no credit.
    assert granted - 2 * INFLIGHT > HIGH_WATER
    sub.take_and_accept(INFLIGHT)
    sub.rcv.link.flow(INFLIGHT)
    wait_messages(sub.conn, sub.rcv, INFLIGHT)
    _withheld(flow, conn, snd, topic, probe)

    # Drained: credit comes back, nothing was lost.
    sub.accept_held()
    sub.take_and_accept(granted - len(sub.got))
    assert sub.got == sent
    wait_for_credit(conn, snd, TIMEOUT)
    rest = [b"rest-%d" % i for i in range(50)]
    send_all(conn, snd, rest)
    sent.extend(rest)
    sub.take_and_accept(len(rest))
    assert sub.got == sent                                 # each once, in order
    send_all(conn, snd, [b"end"])
    sub.take_and_accept(1)
    assert sub.got[-1] == b"end"                           # nothing before it (no duplicates)


def test_stalled_subscriber_stops_holding_the_publisher_back(
        start_broker: Callable[[float], FlowBroker], closing: Callable[[Any], Any]) -> None:
    """A subscriber that makes no progress for --stall-timeout is marked stalled (logged):
    the sender's credit returns although its queue is still past high water, more is
    accepted, and what exceeds the queue bound is dropped and counted."""
    flow = start_broker(SHORT_STALL)
    topic = uid("st") + "/t"
    sub = closing(SlowSubscriber(flow.proc.mqtt_port, uid("stuck")))
    assert sub.subscribe((topic, 1)) == [1]
    conn, snd, probe = publisher(flow, topic, closing)
    sent: list[bytes] = []

    started = time.monotonic()
    granted = send_until_withheld(conn, snd, probe, sent)
    assert INFLIGHT + HIGH_WATER < granted < CREDIT_CEILING
    wait_for_credit(conn, snd, SHORT_STALL + TIMEOUT)
    waited = time.monotonic() - started
    # The pause began after the first message went out, so the stall timer cannot
    # have fired sooner than this (small allowance for the two processes' clocks).
    assert waited >= SHORT_STALL - 0.05, f"credit came back after {waited:.3f}s"
    line = flow.proc.wait_for_line(
        rf"subscriber {re.escape(sub.client_id)} made no progress for", TIMEOUT)
    assert "no longer slowed down" in line
    # The subscriber did nothing: the credit came back for the stall, not a drain.
    session = flow.session(sub.client_id)
    assert (session["delivered"], session["inflight_count"], session["queued_count"]) == (
        0, INFLIGHT, granted - INFLIGHT)
    assert session["queued_count"] > HIGH_WATER

    # No longer held back: more than the credit just granted (so the broker has to
    # grant again while the queue is past high water) and enough to overflow the queue
    # is accepted without waiting; the excess is dropped for the stalled subscriber
    # and counted.
    extra = snd.link.credit + 20
    more = [b"m-%d" % (len(sent) + i) for i in range(CREDIT_CEILING + extra - granted)]
    send_unhindered(conn, snd, probe, more)
    sent.extend(more)
    probe.round_trip()
    assert snd.link.credit > 0
    session = flow.session(sub.client_id)
    assert (session["inflight_count"], session["queued_count"], session["dropped"]) == (
        INFLIGHT, QUEUE_LIMIT, extra)
    assert flow.incoming_link(conn, topic)["credit"] > 0

    # Once it acknowledges again it gets everything that was kept, in order, and not
    # the dropped messages.
    sub.ack_everything()
    assert sub.bodies(CREDIT_CEILING) == sent[:CREDIT_CEILING]
    send_all(conn, snd, [b"end"])
    assert sub.get().payload == b"end"



def test_small_queue_bound_caps_the_credit_window(
        start_broker: Callable[..., FlowBroker], closing: Callable[[Any], Any]) -> None:
    """With --max-queued-messages 40 the credit window is at most 20 (the half above
    high water), so credit granted before the subscriber congested cannot overflow its
    queue: nothing is dropped, and every Accepted message arrives once, in order."""
    limit = 40
    flow = start_broker(LONG_STALL, limit)
    topic = uid("sq") + "/t"
    sub = closing(SlowSubscriber(flow.proc.mqtt_port, uid("small")))
    assert sub.subscribe((topic, 1)) == [1]
    conn, snd, probe = publisher(flow, topic, closing)
    conn.wait(lambda: snd.link.credit > 0, timeout=TIMEOUT, msg="first credit")
    assert snd.link.credit <= limit // 2
    sent: list[bytes] = []

    granted = send_until_withheld(conn, snd, probe, sent)
    assert limit // 2 + INFLIGHT < granted <= limit + INFLIGHT
    session = flow.session(sub.client_id)
    assert (session["inflight_count"], session["queued_count"]) == (INFLIGHT, granted - INFLIGHT)
    assert session["dropped"] == 0
    _withheld(flow, conn, snd, topic, probe)

    sub.ack_everything()
    wait_for_credit(conn, snd, TIMEOUT)
    send_all(conn, snd, [b"end"])
    assert sub.bodies(len(sent) + 1) == [*sent, b"end"]
    assert flow.session(sub.client_id)["dropped"] == 0


# -- socket back-pressure ------------------------------------------------------------------

class StalledAmqpReader:
    """An AMQP receiver on a plain socket (a proton engine pumped by hand) that grants
    plenty of credit and then stops reading its socket, until ``resume``."""

    def __init__(self, port: int, topic: str, credit: int) -> None:
        from proton import Collector, Connection, Link, Transport

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills early
        self.sock.connect(("127.0.0.1", port))
        self.conn = Connection()
        self.conn.container = uid("stall")
        self.trans = Transport()
        self.trans.bind(self.conn)
        self.collector = Collector()
        self.conn.collect(self.collector)
        self.conn.open()
        session = self.conn.session()
        session.open()
        self.link = session.receiver("stalled")
        self.link.source.address = topic
        self.link.snd_settle_mode = Link.SND_SETTLED     # QoS 0 is fine: count bytes
        self.link.open()
        self.link.flow(credit)
        self.payloads: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while not self.link.state & Link.REMOTE_ACTIVE:
            assert time.monotonic() < deadline, "receiver not attached"
            self.io(0.1)

    def io(self, timeout: float) -> None:
        """Write what the engine has, read what the socket has (once), take deliveries."""
        pending = self.trans.pending()
        if pending > 0:
            self.sock.sendall(bytes(self.trans.peek(pending)))
            self.trans.pop(pending)
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if ready:
            data = self.sock.recv(1 << 16)
            assert data, "the broker closed the stalled connection"
            while data:
                n = min(len(data), self.trans.capacity())
                self.trans.push(data[:n])
                data = data[n:]
        while (event := self.collector.peek()) is not None:
            delivery = event.delivery
            if event.type == event.DELIVERY and delivery is not None \
                    and delivery.readable and not delivery.partial:
                self.payloads.append(bytes(self.link.recv(delivery.pending)))
                self.link.advance()
                delivery.settle()
            self.collector.pop()

    def close(self) -> None:
        self.sock.close()


def test_a_stalled_amqp_reader_pauses_its_publishers_not_others(
        start_broker: Callable[..., FlowBroker], closing: Callable[[Any], Any]) -> None:
    """An AMQP receiver that stops reading its socket fills the broker's write buffer:
    the broker pauses that connection's links (Twisted producer back-pressure), which
    pauses the MQTT publisher feeding it (its socket blocks) instead of buffering
    without bound; another MQTT pair meanwhile works normally; once the reader reads
    again the publisher resumes and every message arrives, none dropped."""
    flow = start_broker(LONG_STALL)
    topic, other = uid("bp") + "/t", uid("ok") + "/t"
    reader = closing(StalledAmqpReader(flow.proc.ports["AMQP"], topic, credit=100_000))
    payload = b"p" * 8192
    packet = encode(Publish(topic, payload, 0, False, False, None))
    pub = closing(socket.create_connection(("127.0.0.1", flow.proc.mqtt_port)))
    pub.sendall(encode(Connect("MQTT", 4, uid("bpp"), True, 60)))
    assert pub.recv(4) == b"\x20\x02\x00\x00"
    pub.setblocking(False)

    # Publish QoS 0 without waiting; stop when the socket takes nothing for 2 s
    # (the broker stopped reading it), within a byte budget that an unpaused broker
    # would swallow in a fraction of a second.
    sent = 0
    budget = 64 << 20
    stuck_since: float | None = None
    pending = b""
    while True:
        if not pending:
            assert sent * len(packet) < budget, (
                f"{sent} messages of {len(payload)} B accepted: the publisher was never "
                "paused for the stalled reader")
            pending = packet
        try:
            n = pub.send(pending)
        except BlockingIOError:
            n = 0
        if n:
            pending = pending[n:]
            if not pending:
                sent += 1
            stuck_since = None
            continue
        if stuck_since is None:
            stuck_since = time.monotonic()
        elif time.monotonic() - stuck_since >= 2.0:
            break
        select.select([], [pub], [], 0.2)
    assert sent > 10

    # Nobody else notices: another publisher and subscriber go on at once.
    bystander = closing(Paho(flow.proc.mqtt_port, uid("by")))
    assert bystander.subscribe((other, 1)) == [1]
    closing(Paho(flow.proc.mqtt_port, uid("bp2"))).publish(other, b"hello", qos=1)
    assert bystander.get().payload == b"hello"

    # The reader reads again: the publisher's rest goes through, all arrive in order.
    pub.setblocking(True)
    pub.settimeout(TIMEOUT)
    done = threading.Event()

    def finish() -> None:
        pub.sendall(pending + encode(Publish(topic, b"end", 0, False, False, None)))
        done.set()

    threading.Thread(target=finish, daemon=True).start()
    deadline = time.monotonic() + 4 * TIMEOUT
    while not reader.payloads or not reader.payloads[-1].endswith(b"end"):
        assert time.monotonic() < deadline, f"{len(reader.payloads)} of {sent + 2} arrived"
        reader.io(0.1)
    assert done.wait(TIMEOUT)
    total = sent + (1 if pending else 0)
    assert len(reader.payloads) == total + 1
    assert all(p.endswith(payload) for p in reader.payloads[:-1])

