"""The durable queues' aggregate bounds (issue 26, section 2) against the real broker
with raw MQTT clients on loopback: under ``--queue-memory-budget`` a queue nobody
consumes grows on disk, not in the broker's memory, and a consumer that comes later
gets every message in order; at ``--queue-max-total-bytes`` an MQTT 3.1.1 publisher's
PUBLISHes to queues wait (no PUBACK) until a consumer drains the queue and an MQTT 5 publisher
gets PUBACK 0x97 at once; below ``--disk-free-limit`` (the data directory's file
system, read with ``statvfs``) the same, shown in ``/metrics``.

Waits are on events with timeouts (packets, the broker's log lines); the one
negative check ("no PUBACK while blocked") gives the broker a second to answer."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from rawclient import RawClient

from mqttamqp.mqtt.packets import Pingreq, Pingresp, Puback, Publish

pytestmark = pytest.mark.timeout(180)

KB = 1024
MB = 1 << 20


def rss_kb(proc: BrokerProcess) -> int:
    assert proc.proc is not None
    with open(f"/proc/{proc.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def body(i: int, size: int = 64 * KB) -> bytes:
    return b"%08d" % i + bytes([65 + i % 26]) * (size - 8)


def flood(client: RawClient, topic: str, count: int, size: int = 64 * KB,
          window: int = 32) -> None:
    """``count`` QoS 1 messages, at most ``window`` unacknowledged at a time."""
    outstanding: list[int] = []
    for i in range(count):
        pid = client.next_pid()
        client.send(Publish(topic, body(i, size), 1, False, False, pid))
        outstanding.append(pid)
        if len(outstanding) >= window:
            client.expect(Puback, outstanding.pop(0))
    for pid in outstanding:
        client.expect(Puback, pid)


def consume(port: int, topic_filter: str, count: int) -> list[bytes]:
    """Subscribe at QoS 1 and acknowledge ``count`` messages; their payloads."""
    c = RawClient(port)
    try:
        c.connect("reader-1")
        assert c.subscribe((topic_filter, 1)) == (1,)
        got = []
        for _ in range(count):
            p = c.receive(timeout=30)
            got.append(p.payload)
            assert p.packet_id is not None
            c.send(Puback(p.packet_id))
        return got
    finally:
        c.close()


@pytest.fixture
def data(tmp_path: Path) -> str:
    return str(tmp_path / "data")


def test_a_queue_flood_stays_within_the_memory_budget(data: str) -> None:
    """60 MB into a queue nobody reads raise RSS by far less than 60 MB (budget 8 MB);
    a later consumer gets all 960 messages in order, read back from storage."""
    with BrokerProcess(data, "--queue-memory-budget", "8") as proc:
        pub = RawClient(proc.mqtt_port)
        pub.connect("flooder")
        flood(pub, "$queue/big/x", 32)               # (warm up: buffers, caches)
        before = rss_kb(proc)
        flood(pub, "$queue/big/x", 928)
        grown_mb = (rss_kb(proc) - before) / KB
        pub.close()
        # (measured 2026-11-29: 33-38 MB with the 8 MB budget, 40 on a loaded CI run
        # (commits lag, the allocator keeps freed blocks), ~80 MB without a budget)
        assert grown_mb < 50, f"RSS grew by {grown_mb:.0f} MB for 58 MB queued"
        got = consume(proc.mqtt_port, "$queue/big/#", 960)
        assert [int(p[:8]) for p in got] == list(range(32)) + list(range(928))
        assert all(p == body(int(p[:8])) for p in got)


def test_the_total_bound_blocks_queue_publishers_until_a_consumer_drains(
        data: str) -> None:
    """At --queue-max-total-bytes: a 3.1.1 publisher gets no PUBACK (it is not read)
    until a consumer drains; an MQTT 5 one gets 0x97 at once; nothing is lost."""
    with BrokerProcess(data, "--queue-max-total-bytes", str(MB)) as proc:
        pub = RawClient(proc.mqtt_port)
        pub.connect("producer")
        for i in range(16):                           # 16 x 64 KB: the bound
            pub.publish("$queue/jobs/x", body(i), qos=1)
        proc.wait_for_line(r"publishers to \$queue/ are blocked")
        pid = pub.next_pid()
        pub.send(Publish("$queue/jobs/x", body(16), 1, False, False, pid))
        try:
            pub.expect(Puback, pid, timeout=1.0)
        except AssertionError:
            pass
        else:
            raise AssertionError("a PUBACK while the queues are full")
        v5 = RawClient(proc.mqtt_port, level=5)
        v5.connect("producer5")
        v5_pid = v5.next_pid()
        v5.send(Publish("$queue/jobs/x", b"refused", 1, False, False, v5_pid))
        refused = v5.expect(Puback, v5_pid)
        assert isinstance(refused, Puback) and refused.reason_code == 0x97
        v5.close()
        got = consume(proc.mqtt_port, "$queue/jobs/#", 17)
        proc.wait_for_line(r"durable queues have room again")
        assert isinstance(pub.expect(Puback, pid, timeout=10), Puback)
        assert [int(p[:8]) for p in got] == list(range(17))
        pub.close()


def test_a_blocked_worker_is_still_read_for_its_acknowledgements(data: str) -> None:
    """A client that consumes a full queue and publishes to another is blocked, yet
    its PINGREQ and PUBACKs are read: the queue drains, the alarm clears, and its own
    publish then gets its PUBACK (no deadlock)."""
    with BrokerProcess(data, "--queue-max-total-bytes", str(MB)) as proc:
        worker = RawClient(proc.mqtt_port)
        worker.connect("worker")
        assert worker.subscribe(("$queue/jobs/#", 1)) == (1,)
        pub = RawClient(proc.mqtt_port)
        pub.connect("producer")
        for i in range(16):                           # 16 x 64 KB: the bound
            pub.publish("$queue/jobs/x", body(i), qos=1)
        proc.wait_for_line(r"publishers to \$queue/ are blocked")
        jobs = [worker.receive(timeout=10) for _ in range(16)]
        result_pid = worker.next_pid()
        worker.send(Publish("$queue/results/x", b"result", 1, False, False, result_pid))
        # Handled after the PUBLISH (one socket, in order): the worker is still read.
        worker.send(Pingreq())
        assert isinstance(worker.expect(Pingresp, timeout=10), Pingresp)
        for job in jobs:
            assert job.packet_id is not None
            worker.send(Puback(job.packet_id))
        proc.wait_for_line(r"durable queues have room again", timeout=20)
        assert isinstance(worker.expect(Puback, result_pid, timeout=10), Puback)
        worker.close()
        pub.close()
        assert consume(proc.mqtt_port, "$queue/results/#", 1) == [b"result"]


def test_free_disk_watermark_blocks_and_shows_in_metrics(data: str) -> None:
    """Below --disk-free-limit (statvfs of the data directory) queue publishers are
    blocked from the first check on, and /metrics says so."""
    st = os.statvfs(os.path.dirname(data))
    free_mb = st.f_bavail * st.f_frsize // MB
    with BrokerProcess(data, "--disk-free-limit", str(free_mb * 4 + 1024),
                       listeners=("--mqtt", "--metrics")) as proc:
        # (checked at start, before the listeners: logged before they are)
        blocked = [line for line in proc.log if "publishers to $queue/ are blocked" in line]
        assert len(blocked) == 1 and "--disk-free-limit" in blocked[0]
        v5 = RawClient(proc.mqtt_port, level=5)
        v5.connect("producer5")
        pid = v5.next_pid()
        v5.send(Publish("$queue/jobs/x", b"m", 1, False, False, pid))
        refused = v5.expect(Puback, pid)
        assert isinstance(refused, Puback) and refused.reason_code == 0x97
        v5.close()
        url = f"http://127.0.0.1:{proc.ports['METRICS']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        assert "mqttamqp_queue_publishers_blocked 1.0" in text
        pub = RawClient(proc.mqtt_port)
        pub.connect("producer")
        pub.send(Publish("$queue/jobs/x", b"m", 1, False, False, pub.next_pid()))
        pub.expect(Puback)      # (stored: what was read before the pause)
        pub.close()
