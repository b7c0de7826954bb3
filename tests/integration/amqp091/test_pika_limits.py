"""--max-connections on the shared AMQP port: AMQP 1.0 and 0.9.1 connections count
together (pika and a raw AMQP 1.0 header against the real broker)."""

from __future__ import annotations

import os
import socket

import pika
import pytest
from brokerproc import BrokerProcess
from pikaparams import parameters

pytestmark = pytest.mark.timeout(60)


def amqp10_answer(port: int) -> bytes:
    """What the broker answers an AMQP 1.0 SASL header with, until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"AMQP\x03\x01\x00\x00")
        data = b""
        while len(data) < 8:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:   # (refused sockets are aborted)
                break
            if not chunk:
                break
            data += chunk
        return data


def test_amqp10_and_091_share_the_connection_bound(tmp_path: os.PathLike[str]) -> None:
    """With --max-connections 1, an open 0.9.1 connection leaves no room for an AMQP
    1.0 one; once it is closed, AMQP 1.0 gets its SASL header again."""
    with BrokerProcess(os.path.join(str(tmp_path), "data"), "--max-connections", "1",
                       listeners=("--mqtt", "--amqp")) as broker:
        port = broker.ports["AMQP"]
        assert amqp10_answer(port).startswith(b"AMQP\x03\x01\x00\x00")
        conn = pika.BlockingConnection(parameters(broker))
        try:
            assert amqp10_answer(port) == b""
            broker.wait_for_line(r"--max-connections \(1\) reached")
        finally:
            conn.close()
        broker.wait_for_line(r"amqp0-9-1 client .* disconnected")
        assert amqp10_answer(port).startswith(b"AMQP\x03\x01\x00\x00")
