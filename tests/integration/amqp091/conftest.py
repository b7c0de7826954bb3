"""Fixtures of the AMQP 0.9.1 integration tests: ``broker091``, one broker process
per module with the AMQP port (0.9.1 and 1.0 share it), and ``pika_conn``, pika
``BlockingConnection``s to it, closed at the end of the test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from brokerproc import BrokerProcess
from pikaparams import parameters


@pytest.fixture(scope="module")
def broker091(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker of this module's own, listening for MQTT and AMQP on loopback."""
    data = str(tmp_path_factory.mktemp("broker091"))
    proc = BrokerProcess(os.path.join(data, "data"), listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def pika_conn(broker091: BrokerProcess) -> Iterator[Callable[..., pika.BlockingConnection]]:
    """``pika_conn(**parameters)`` opens a pika BlockingConnection to ``broker091``."""
    made: list[pika.BlockingConnection] = []

    def connect(**kw: Any) -> pika.BlockingConnection:
        conn = pika.BlockingConnection(parameters(broker091, **kw))
        made.append(conn)
        return conn

    yield connect
    for conn in made:
        if conn.is_open:
            try:
                conn.close()
            except Exception:
                pass
