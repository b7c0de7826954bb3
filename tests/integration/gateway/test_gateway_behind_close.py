"""A gateway client closed while far behind (issue #29 §1, the gateway fixes' review):
the gateway is the client socket's streaming producer, and Twisted resumes a
registered producer rather than closing once the socket's buffer drains, so a client
taken over while more than 64 KB behind must still get everything then EOF, and
leave the gateway's client count (--max-connections)."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from gateway_proc import start_gateway, uid
from rawclient import RawClient

pytestmark = pytest.mark.timeout(180)

SIZE = 32_000          # payload bytes of one flood message
WAIT = 20.0            # seconds any one awaited event may take


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as resp:
        text = resp.read().decode()
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    assert m is not None, name
    return float(m.group(1))


def _await_metric(port: int, name: str, ok: Callable[[float], bool], what: str) -> float:
    """Ask the gateway's /metrics (each answer awaited; bounded in time) until
    ``ok(value)``."""
    deadline = time.monotonic() + WAIT
    while True:
        value = _metric(port, name)
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"{what}: still {value} after {WAIT:g} s"


def _beyond_kernel_buffers() -> int:
    """Messages of SIZE whose bytes exceed what the kernel can hold for an unread
    loopback socket (the sender's largest send buffer, the reader's receive buffer,
    which grows only as it reads)
    plus Twisted's 64 KB: the rest stays in the gateway's transport, paused."""
    wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[1])
    return (wmem + 2 * rmem + (64 << 10)) // SIZE + 20


def _read_to_close(sock: socket.socket) -> tuple[int, str | None]:
    """Read ``sock`` until it is closed or WAIT seconds pass without a byte: (bytes
    read, "eof" or "reset" (cut after the gateway's grace), None if still open)."""
    sock.settimeout(WAIT)
    got = 0
    try:
        while True:
            data = sock.recv(1 << 20)
            if not data:
                return got, "eof"
            got += len(data)
    except ConnectionResetError:
        return got, "reset"
    except TimeoutError:
        return got, None


def test_a_client_taken_over_while_far_behind_gets_eof(tmp_path: Path) -> None:
    """A client that has not read more than its socket can hold is taken over: its
    socket is closed (EOF once it read everything, or cut after the grace if it was
    too slow), and the gateway counts it gone."""
    count = _beyond_kernel_buffers()
    window = str(count + 50)   # every flood message in flight at once: all written
    core = BrokerProcess(str(tmp_path / "core"), "--max-inflight", window,
                         listeners=("--mqtt", "--amqp"))
    core.start()
    gw = None
    clients: list[RawClient] = []
    try:
        gw = start_gateway(tmp_path, f"amqp://127.0.0.1:{core.ports['AMQP']}",
                           "--max-inflight", window, listeners=("--mqtt", "--metrics"))
        metrics = gw.ports["METRICS"]
        cid, topic = uid("behind"), uid("flood") + "/t"
        slow = RawClient(gw.mqtt_port)
        clients.append(slow)
        assert slow.connect(cid, keepalive=0).return_code == 0
        assert slow.subscribe((topic, 1)) == (1,)
        pub = RawClient(gw.mqtt_port)
        clients.append(pub)
        assert pub.connect(uid("flooder")).return_code == 0
        for _ in range(count):
            pub.publish(topic, b"x" * SIZE, qos=1)
        written = _await_metric(metrics, 'mqttamqp_gateway_messages_total{direction='
                                '"to_clients"}', lambda v: v >= count,
                                "flood messages written to the slow client")
        assert written >= count
        newer = RawClient(gw.mqtt_port)
        clients.append(newer)
        assert newer.connect(cid, keepalive=0).return_code == 0   # takes the id over
        got, how = _read_to_close(slow.sock)
        assert how is not None, f"read {got} bytes, then the gateway kept the socket open"
        assert how == "reset" or got >= count * SIZE
        _await_metric(metrics, "mqttamqp_gateway_clients", lambda v: v == 2,
                      "the taken-over client leaving the gateway's count")
    finally:
        for client in clients:
            client.close()
        if gw is not None:
            gw.stop()
        core.stop()
