"""``$SYS`` accounting (received = sent + dropped + queued) in a real broker process: an
AMQP receiver without credit, and every burst of an MQTT fan-in."""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from amqp_clients import Paho, amqp, receiver, take
from brokerproc import BrokerProcess
from rawclient import RawClient, uid

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Disconnect, Puback, Publish


@pytest.mark.parametrize("qos", [0, 1])
def test_identity_holds_at_every_burst_under_fan_in(tmp_path: Any, qos: int) -> None:
    """20 publishers → 1 subscriber that reads nothing until the broker logs that
    it kept the publishers paused for the whole stall timeout, then drains.  Every
    $SYS burst balances; a backlog really built (QoS 1: queued > 0 in some burst;
    QoS 0 is never queued, it goes out or is dropped); at the end everything sent
    was read and nothing is left queued."""
    proc = BrokerProcess(str(tmp_path / "data"), "--sys-interval", "0.2",
                         "--stall-timeout", str(STALL)).start()
    deadline = time.monotonic() + DEADLINE
    watcher = RawClient(proc.mqtt_port)
    monitor = Monitor(watcher)
    sub: RawClient | None = None
    socks: list[socket.socket] = []
    threads: list[threading.Thread] = []
    try:
        assert watcher.connect(uid("sys")).return_code == 0
        watcher.subscribe(*Monitor.FILTERS)
        threads.append(threading.Thread(target=monitor.run, daemon=True))
        threads[-1].start()
        sub, _ = _subscribe_slow(proc, qos)
        for _ in range(PUBLISHERS):
            client = RawClient(proc.mqtt_port)
            assert client.connect(uid("pub")).return_code == 0
            # Small send buffers: a paused publisher soon finds its socket full.
            client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
            socks.append(client.sock)
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                _publish_all(socks, qos, deadline)
            except BaseException as exc:
                errors.append(exc)

        threads.append(threading.Thread(target=publish, daemon=True))
        threads[-1].start()
        # Publishers paused for a subscriber that made no progress (the broker's word).
        proc.wait_for_line(r"made no progress for", timeout=max(0.1, deadline - time.monotonic()))
        if qos:
            monitor.wait_for(lambda s: s["queued"] > 0, deadline - time.monotonic())
        total = PUBLISHERS * PER_PUBLISHER
        # Drain: read until every copy the broker sent is here and nothing is queued.
        got = _drain(sub, qos, lambda n: _settled(monitor, total, n), deadline,
                     lambda: monitor.samples[-2:])
        threads[1].join(max(0.1, deadline - time.monotonic()))
        assert not errors, errors
        final = _settled(monitor, total, got)
        assert final, monitor.samples[-3:]
        assert final["queued"] == 0 and final["sent"] == got
        assert final["sent"] + final["dropped"] == total
        samples = list(monitor.samples)
        assert len(samples) >= 5
        wrong = [s for s in samples if not _balances(s)]
        assert not wrong, (len(wrong), len(samples), wrong[:5])
        assert any(0 < s["received"] < total for s in samples)   # sampled mid-load
    finally:
        monitor.stop = True
        for s in socks:
            s.close()
        if sub is not None:
            sub.close()
        for t in threads:
            t.join(5.0)
        watcher.close()
        proc.stop()


def test_amqp_receiver_without_credit(tmp_path: Any) -> None:
    """An AMQP topic receiver that grants no credit: the in-flight window is handed
    to the proton engine (sent: it waits there for credit), the rest waits in the
    session (queued); once credit comes, everything is sent.  Every burst balances."""
    proc = BrokerProcess(str(tmp_path / "data"), "--sys-interval", "0.2",
                         "--max-inflight", "4", listeners=("--mqtt", "--amqp")).start()
    watcher = RawClient(proc.mqtt_port)
    monitor = Monitor(watcher)
    thread = threading.Thread(target=monitor.run, daemon=True)
    conn = publisher = None
    try:
        assert watcher.connect(uid("sys")).return_code == 0
        watcher.subscribe(*Monitor.FILTERS)
        thread.start()
        conn = amqp(proc)
        rcv = receiver(conn, "acct/amqp", credit=None)
        publisher = Paho(proc.mqtt_port, uid("pub"))
        for i in range(20):
            publisher.publish("acct/amqp", b"m%d" % i, qos=1)
        waiting = monitor.wait_for(lambda s: s["received"] == 20, 10.0)
        assert waiting == {"received": 20, "sent": 4, "dropped": 0, "queued": 16}
        rcv.flow(20)
        for _ in range(20):
            take(conn, rcv)
            rcv.accept()
        monitor.wait_for(lambda s: s["sent"] == 20, 10.0)
        with monitor.cond:
            samples = list(monitor.samples)
        assert samples[-1] == {"received": 20, "sent": 20, "dropped": 0, "queued": 0}
        assert all(_balances(s) for s in samples), samples
    finally:
        monitor.stop = True
        if publisher is not None:
            publisher.stop()
        if conn is not None:
            conn.close()
        thread.join(5.0)
        watcher.close()
        proc.stop()


PUBLISHERS = 20


PER_PUBLISHER = 1500


DEADLINE = 25.0           # the whole load, from the first byte to the last check


STALL = 1.0               # --stall-timeout: how long publishers stay paused


@dataclass
class Monitor:
    """A $SYS subscriber of its own: every live burst as one sample of
    messages/received, sent, dropped and queued.  The broker takes a burst's values
    in one reactor turn and publishes the uptime first, then the values that changed
    since its last burst: a sample is the values as one burst left them, taken when
    the next begins."""

    FILTERS = (("$SYS/broker/uptime", 0), ("$SYS/broker/messages/#", 0))

    client: RawClient
    samples: list[dict[str, int]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    stop: bool = False
    error: BaseException | None = None

    def run(self) -> None:
        values: dict[str, int] = {}   # the retained values, then every change
        in_burst = False
        try:
            while not self.stop:
                try:
                    m = self.client.receive(timeout=0.5)
                except AssertionError:
                    continue   # no burst in that time (we stop on ``stop``)
                name = m.topic.rsplit("/", 1)[1]
                if name == "uptime" and not m.retain:
                    if in_burst and len(values) == 4:
                        with self.cond:
                            self.samples.append(dict(values))
                            self.cond.notify_all()
                    in_burst = True
                if name in ("received", "sent", "dropped", "queued"):
                    values[name] = int(m.payload)
        except BaseException as exc:   # reported by the test thread
            self.error = exc
            with self.cond:
                self.cond.notify_all()

    def wait_for(self, test: Any, timeout: float) -> dict[str, int]:
        """The first sample (from now on, or already seen) for which ``test`` holds."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                for sample in self.samples:
                    if test(sample):
                        return sample
                if self.error is not None:
                    raise self.error
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no such $SYS sample in {timeout}s; last: "
                                         f"{self.samples[-3:]}")
                self.cond.wait(left)


def _publish_all(socks: list[socket.socket], qos: int, deadline: float) -> None:
    """Write every publisher's load on non-blocking sockets, as fast as the broker
    reads them, then wait for the broker to close each (after DISCONNECT: it has
    read everything before it)."""
    pending = {s: memoryview(_publisher_data(i, qos)) for i, s in enumerate(socks)}
    for s in socks:
        s.setblocking(False)
    open_socks = set(socks)
    while (pending or open_socks) and time.monotonic() < deadline:
        readable, writable, _ = select.select(list(open_socks), list(pending), [], 0.2)
        for s in writable:
            data = pending[s]
            try:
                n = s.send(data[:65536])
            except BlockingIOError:
                n = 0
            if n == len(data):
                del pending[s]
            else:
                pending[s] = data[n:]
        for s in readable:
            try:
                chunk = s.recv(65536)   # PUBACKs (QoS 1), then the close
            except BlockingIOError:
                continue
            except ConnectionError:
                chunk = b""
            if not chunk:
                open_socks.discard(s)
    assert not pending and not open_socks, "publishers not done before the deadline"


def _subscribe_slow(proc: BrokerProcess, qos: int) -> tuple[RawClient, socket.socket]:
    sub = RawClient(proc.mqtt_port)
    # A small receive buffer: the backlog builds in the broker, not in our kernel.
    sub.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    assert sub.connect(uid("sub")).return_code == 0
    assert sub.subscribe((TOPIC + "#", qos)) == (qos,)
    return sub, sub.sock


def _drain(sub: RawClient, qos: int, until: Any, deadline: float, last: Any) -> int:
    """Read (and acknowledge) PUBLISHes until ``until(count)``; returns the count.
    ``last()``: what to show if the deadline comes first."""
    count = 0
    acks: list[bytes] = []
    while not until(count):
        left = deadline - time.monotonic()
        assert left > 0, (f"subscriber got {count} messages before the deadline; the "
                          f"$SYS bursts never settled: {last()}")
        try:
            packet = sub.recv(timeout=min(left, 0.5))
        except TimeoutError:
            if acks:
                sub.send(b"".join(acks))
                acks = []
            continue
        if isinstance(packet, Publish):
            count += 1
            if qos and packet.packet_id is not None:
                acks.append(encode(Puback(packet.packet_id)))
                if len(acks) >= 8:   # (well within the broker's in-flight window)
                    sub.send(b"".join(acks))
                    acks = []
    if acks:
        sub.send(b"".join(acks))
    return count


def _settled(monitor: Monitor, total: int, got: int) -> dict[str, int] | None:
    """The last burst, if it shows every message received and every copy sent
    (``got`` of them read by the subscriber) or dropped, nothing queued."""
    with monitor.cond:
        if not monitor.samples:
            return None
        last = monitor.samples[-1]
    if (last["received"] == total and last["queued"] == 0 and last["sent"] == got
            and last["sent"] + last["dropped"] == total):
        return last
    return None


def _balances(s: dict[str, int]) -> bool:
    return s["received"] == s["sent"] + s["dropped"] + s["queued"]


TOPIC = "acct/in/"


def _publisher_data(index: int, qos: int) -> bytes:
    """One publisher's whole load, pre-encoded, then DISCONNECT."""
    topic = f"{TOPIC}{index}"
    return b"".join(
        [encode(Publish(topic, PAYLOAD, qos, False, False, (i + 1) if qos else None))
         for i in range(PER_PUBLISHER)] + [encode(Disconnect())])


PAYLOAD = b"x" * 200
