"""A real broker process and its file descriptors: its descriptor table is grown at
start for --max-connections; out of descriptors, it refuses connections with one log
line a spell and counts them."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


def _fdsize(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("FDSize:"))


@contextmanager
def _soft_limit_raised(to: int) -> Iterator[int]:
    """This process's soft descriptor limit raised to ``to`` (at most the hard one),
    for the processes it starts meanwhile; yields the limit they get."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < to:
        pytest.skip(f"a hard descriptor limit of {hard} leaves nothing to tell apart")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, to), hard))
    try:
        yield max(soft, to)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_descriptor_table_is_grown_at_start_for_max_connections(tmp_path: Any) -> None:
    """The broker grows its descriptor table once at start (``net.fdtable``), for
    --max-connections of MQTT and of AMQP (counted apart): a table that doubles under
    load makes each ``accept`` that needs a bigger one wait for an RCU grace period,
    the reactor stopped.  Before, a broker that had just started had the few hundred
    slots its own files needed."""
    from brokerproc import BrokerProcess

    from mqttamqp.net.fdtable import HEADROOM

    with _soft_limit_raised(8192):
        broker = BrokerProcess(str(tmp_path / "data"), "--no-archive", "--max-connections",
                               "3000", listeners=("--mqtt", "--amqp"))
        broker.start()
    try:
        assert broker.proc is not None
        assert _fdsize(broker.proc.pid) >= 2 * 3000 + HEADROOM
    finally:
        broker.stop()


def test_a_gateway_grows_its_descriptor_table_at_start(tmp_path: Any) -> None:
    """A gateway (``--upstream``) too: its clients are its descriptors, one each."""
    from gateway_proc import start_gateway

    from mqttamqp.net.fdtable import HEADROOM

    with _soft_limit_raised(8192):
        gateway = start_gateway(tmp_path, "amqp://127.0.0.1:9", "--max-connections", "3000",
                                wait_open=False)
    try:
        assert gateway.proc is not None
        assert _fdsize(gateway.proc.pid) >= 3000 + HEADROOM
    finally:
        gateway.stop()


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
