"""A client that sends connection.close and stops reading, against the real broker:
the broker answers close-ok and, the socket still full of deliveries the client
never reads, aborts it after 5 s (loseConnection alone waits for the send buffer to
drain, forever, and the connection stays registered meanwhile)."""

from __future__ import annotations

import os
import socket
import time

import pika
import pytest
from amqp091_target import amqp_url, start_broker
from pamqp import frame, header
from pamqp.commands import Basic, Channel, Connection

from mqttamqp.amqp091.frames import FrameReader

pytestmark = pytest.mark.timeout(120)

N, SIZE = 24, 1_000_000


def _until(sock: socket.socket, reader: FrameReader, name: str, timeout: float = 10.0
           ) -> None:
    """Read frames until one named ``name`` (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        data = sock.recv(65536)
        assert data, f"closed before {name}"
        if any(getattr(f, "name", "") == name for _, f in reader.feed(data)):
            return
    raise AssertionError(f"no {name} within {timeout}s")


def test_a_client_that_closes_and_stops_reading_is_aborted(tmp_path: os.PathLike[str]) -> None:
    """The raw client is sent the deliveries of a 24 MB queue, sends connection.close
    and reads nothing more: the broker ends the socket (its disconnect line is logged;
    before, the socket stayed open, the connection registered, for as long as the
    client did not read), and another consumer gets all 24 messages."""
    broker = start_broker(os.path.join(str(tmp_path), "data"))
    try:
        url = amqp_url(broker)
        pub = pika.BlockingConnection(pika.URLParameters(url))
        ch = pub.channel()
        ch.queue_declare("big", durable=True)
        ch.confirm_delivery()
        for i in range(N):
            ch.basic_publish("", "big", b"%03d" % i + bytes(SIZE),
                             pika.BasicProperties(delivery_mode=2))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # (a small receive buffer: what the broker sends stays in its own buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", broker.ports["AMQP"]))
        reader = FrameReader(1 << 20)
        try:
            sock.sendall(frame.marshal(header.ProtocolHeader(), 0))
            _until(sock, reader, "Connection.Start")
            sock.sendall(frame.marshal(Connection.StartOk(
                mechanism="PLAIN", response="\x00guest\x00guest"), 0))
            _until(sock, reader, "Connection.Tune")
            sock.sendall(frame.marshal(Connection.TuneOk(2047, 131072, 0), 0)
                         + frame.marshal(Connection.Open("/"), 0)
                         + frame.marshal(Channel.Open(), 1)
                         + frame.marshal(Basic.Consume(queue="big", consumer_tag="h"), 1))
            _until(sock, reader, "Basic.Deliver")   # (the first of many it will not read)
            sock.sendall(frame.marshal(Connection.Close(200, "bye", 0, 0), 0))
            # (the raw client reads nothing from here on): the broker's one line for
            # the disconnect comes when the socket is gone, within the 5 s bound
            broker.wait_for_line(r"disconnected: .*closed by the client \(200 bye\)", 30)
            got = []
            for method, _, body in ch.consume("big", inactivity_timeout=30):
                assert method is not None, f"only {len(got)} of {N} came back within 30 s"
                got.append(body[:3])
                ch.basic_ack(method.delivery_tag)
                if len(got) == N:
                    break
            assert sorted(got) == [b"%03d" % i for i in range(N)]
        finally:
            sock.close()
        pub.close()
    finally:
        broker.stop()
