"""AMQP 0.9.1 at the frame level against the real broker (a raw socket and pamqp's
frames, where pika would not misbehave): heartbeats from a silent client, frame
errors closing the connection with their reply code, methods in one socket read."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from amqp091_target import Target, target, uname
from brokerproc import BrokerProcess
from pamqp import body, commands, frame, header

from mqttamqp.amqp091.frames import FrameReader

pytestmark = pytest.mark.timeout(60)
B, C, Q = commands.Basic, commands.Connection, commands.Queue


@pytest.fixture(scope="module")
def amqp091(request: pytest.FixtureRequest) -> Iterator[Target]:
    with target(request) as t:
        yield t


class Raw:
    """A 0.9.1 client on a raw socket: sends frames, reads them back."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = FrameReader(1 << 20)
        self.frames: list[object] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def method(self, channel: int, method: object) -> None:
        self.send(frame.marshal(method, channel))

    def next(self, timeout: float = 10.0) -> object | None:
        """The next frame, or None when the broker closed the socket."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:   # (aborted: a silent peer is not waited for)
                return None
            if not data:
                return None
            self.frames.extend(f for _, f in self.reader.feed(data))
        return self.frames.pop(0)

    def open(self, heartbeat: int = 0) -> None:
        self.send(b"AMQP\x00\x00\x09\x01")
        assert getattr(self.next(), "name", "") == "Connection.Start"
        self.method(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        assert getattr(self.next(), "name", "") == "Connection.Tune"
        self.method(0, C.TuneOk(2047, 131072, heartbeat))
        self.method(0, C.Open("/"))
        assert getattr(self.next(), "name", "") == "Connection.OpenOk"

    def expect(self, name: str) -> object:
        """The next method frame (content frames before it skipped), named ``name``."""
        f = self.next()
        while isinstance(f, (header.ContentHeader, body.ContentBody)):
            f = self.next()
        assert getattr(f, "name", f) == name
        return f

    def close(self) -> None:
        self.sock.close()


def test_a_silent_client_is_dropped_after_two_heartbeats(broker091: BrokerProcess) -> None:
    """With heartbeat 1 s the broker sends heartbeats, and drops a client that sends
    nothing for two intervals."""
    raw = Raw(broker091.ports["AMQP"])
    try:
        raw.open(heartbeat=1)
        names = []
        while True:
            f = raw.next(timeout=10)
            if f is None:
                break
            names.append(getattr(f, "name", ""))
        assert "Heartbeat" in names
        broker091.wait_for_line(r"missed heartbeats from the client")
    finally:
        raw.close()


@pytest.mark.parametrize("data, code", [
    (b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0a\x00", 501),       # no frame end
    (b"\x01\x00\x00\x00\x00\x00\x04\x00\x63\x00\x01\xce", 503),       # unknown method
    (frame.marshal(commands.Basic.Qos(), 7), 504),                    # unopened channel
    (b"\x03\x00\x00\x00\x00\x00\x01x\xce", 505),                      # body on channel 0
])
def test_frame_errors_close_with_their_code(broker091: BrokerProcess, data: bytes,
                                            code: int) -> None:
    """A frame error is connection.close with the spec's reply code, then the end."""
    raw = Raw(broker091.ports["AMQP"])
    try:
        raw.open()
        raw.send(data)
        close = raw.next()
        assert getattr(close, "name", "") == "Connection.Close"
        assert close.reply_code == code  # type: ignore[attr-defined]
        raw.method(0, C.CloseOk())
        assert raw.next() is None
    finally:
        raw.close()


def test_an_ack_and_queue_delete_if_empty_in_one_read(amqp091: Target) -> None:
    """basic.ack of a queue's last message and queue.delete with if-empty in one write
    (so one socket read): delete-ok, as RabbitMQ answers.  The broker takes an
    acknowledged message out of the queue's log at the end of the read; before
    this it answered 406 "not empty" (aio-pika's test of two consumers did, once,
    under load; pika never sends two methods in one write)."""
    name = uname("raw-ifempty")
    raw = Raw(amqp091.port)
    try:
        raw.open()
        raw.method(1, commands.Channel.Open())
        raw.expect("Channel.OpenOk")
        raw.method(1, Q.Declare(queue=name, durable=True))
        raw.expect("Queue.DeclareOk")
        raw.method(1, commands.Confirm.Select())
        raw.expect("Confirm.SelectOk")
        raw.send(frame.marshal(B.Publish(routing_key=name), 1)
                 + frame.marshal(header.ContentHeader(0, 3, B.Properties()), 1)
                 + frame.marshal(body.ContentBody(b"one"), 1))
        raw.expect("Basic.Ack")
        raw.method(1, B.Consume(queue=name, consumer_tag="c"))
        raw.expect("Basic.ConsumeOk")
        deliver = raw.expect("Basic.Deliver")
        raw.send(frame.marshal(B.Ack(deliver.delivery_tag), 1)  # type: ignore[attr-defined]
                 + frame.marshal(Q.Delete(queue=name, if_empty=True), 1))
        ok = raw.expect("Queue.DeleteOk")
        assert ok.message_count == 0  # type: ignore[attr-defined]
    finally:
        raw.close()
