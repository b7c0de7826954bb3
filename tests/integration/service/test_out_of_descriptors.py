"""A real broker process and its file descriptors: its descriptor table is grown at
start for --max-connections; out of descriptors, it refuses connections with one log
line a spell and counts them."""

from __future__ import annotations

import os
import resource
import socket
from typing import Any

import pytest


def _fdsize(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("FDSize:"))


def test_the_descriptor_table_is_grown_at_start_for_max_connections(tmp_path: Any) -> None:
    """The broker grows its descriptor table once at start (``net.fdtable``): a table
    that doubles under load makes each ``accept`` that needs a bigger one wait for an
    RCU grace period, the reactor stopped.  Before, a broker that had just started
    had the few hundred slots its own files needed."""
    from brokerproc import BrokerProcess

    from mqttamqp.net.fdtable import HEADROOM

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < 2048:
        pytest.skip(f"a descriptor limit of {soft} leaves nothing to tell apart")
    want = 3000 + HEADROOM
    if soft != resource.RLIM_INFINITY:
        want = min(want, soft)
    broker = BrokerProcess(str(tmp_path / "data"), "--no-archive", "--max-connections",
                           "3000")
    broker.start()
    try:
        assert broker.proc is not None
        assert _fdsize(broker.proc.pid) >= want
    finally:
        broker.stop()


def test_a_broker_out_of_descriptors_refuses_with_one_line_and_counts(
        tmp_path: Any) -> None:
    """A real broker whose descriptor limit is lowered under it: new connections are
    closed at once, the log says so in one line (not Twisted's three a connection),
    and each refusal is counted in /metrics."""
    from brokerproc import BrokerProcess
    from console_support import ConsoleHTTP
    from prometheus_client.parser import text_string_to_metric_families

    connect = bytes([0x10, 13]) + b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"
    broker = BrokerProcess(str(tmp_path / "data"), "--no-archive",
                           listeners=("--mqtt", "--metrics"))
    broker.start()
    clients: list[socket.socket] = []
    try:
        assert broker.proc is not None
        pid = broker.proc.pid
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE,
                         (len(os.listdir(f"/proc/{pid}/fd")) + 4, limits[1]))
        refused = 0
        for i in range(60):                  # bounded: refusals start after ~4
            client = socket.create_connection(("127.0.0.1", broker.mqtt_port), timeout=10)
            clients.append(client)
            try:
                client.sendall(connect[:-1] + bytes([ord("a") + i % 26]))
                answer = client.recv(4)
            except ConnectionResetError:
                answer = b""
            refused += not answer
            if refused >= 20:
                break
        assert refused >= 20
        broker.wait_for_line("refusing new connections: the broker is out of file "
                             "descriptors")
        for client in clients:
            client.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        reply = ConsoleHTTP(broker.ports["METRICS"]).request("GET", "/metrics")
        assert reply.code == 200
        hits = [s.value for family in text_string_to_metric_families(reply.text)
                for s in family.samples if s.name == "mqttamqp_limit_hits_total"
                and s.labels == {"limit": "file_descriptors"}]
        assert hits == [refused]
        log = broker.output()
        assert log.count("refusing new connections") == 1
        assert "EMFILE encountered" not in log and "EMFILE recovery" not in log
    finally:
        for client in clients:
            client.close()
        broker.stop()
