"""A valid AMQP 0.9.1 client byte stream, encoded with pamqp, for the 0.9.1 fuzz test.

What a client sends over one connection when it does not wait for the broker's
answers: the protocol header, start-ok (PLAIN guest/guest), tune-ok, open, a channel
in confirm mode, exchange and queue declarations with arguments, a binding, QoS,
publishes (content header and body frames, a body split in two, properties of every
kind), a consumer, ack/nack/reject, get, cancel, purge, delete, a heartbeat, and the
closes.  ``tests/support/fuzzing.py`` mutates it; nothing here opens a socket.
"""

from __future__ import annotations

import datetime

from pamqp import body, frame, header, heartbeat
from pamqp.commands import Basic, Channel, Confirm, Connection, Exchange, Queue

PROTOCOL_HEADER = frame.marshal(header.ProtocolHeader(), 0)


def _publish(ch: int, exchange: str, key: str, payload: bytes, split: int = 0,
             **props: object) -> bytes:
    properties = Basic.Properties(**props)  # type: ignore[arg-type]
    frames = [frame.marshal(Basic.Publish(exchange=exchange, routing_key=key,
                                          mandatory=True), ch),
              frame.marshal(header.ContentHeader(0, len(payload), properties), ch)]
    pieces = [payload[:split], payload[split:]] if split else [payload]
    frames += [frame.marshal(body.ContentBody(p), ch) for p in pieces]
    return b"".join(frames)


def amqp091_stream() -> bytes:
    ch = 1
    parts = [
        PROTOCOL_HEADER,
        frame.marshal(Connection.StartOk(client_properties={
            "product": "fuzz", "capabilities": {"publisher_confirms": True}},
            mechanism="PLAIN", response="\x00guest\x00guest"), 0),
        frame.marshal(Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0), 0),
        frame.marshal(Connection.Open(virtual_host="/"), 0),
        frame.marshal(Channel.Open(), ch),
        frame.marshal(Confirm.Select(), ch),
        frame.marshal(Exchange.Declare(exchange="fz.x", exchange_type="topic",
                                       arguments={"alternate-exchange": "amq.fanout"}), ch),
        frame.marshal(Queue.Declare(queue="fz.q", auto_delete=True, arguments={
            "x-message-ttl": 60000, "x-max-length": 100, "x-overflow": "drop-head",
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "fz.dlq"}), ch),
        frame.marshal(Queue.Bind(queue="fz.q", exchange="fz.x", routing_key="a.*.#"), ch),
        frame.marshal(Basic.Qos(prefetch_count=5), ch),
        _publish(ch, "fz.x", "a.b.c", b"hello", content_type="text/plain",
                 headers={"k": "v", "n": 1, "l": [1, "two"], "t": {"x": True}},
                 delivery_mode=2, priority=3, correlation_id="c1", reply_to="fz.q",
                 expiration="60000", message_id="m1",
                 timestamp=datetime.datetime(2026, 11, 29, tzinfo=datetime.UTC),
                 message_type="t", app_id="fuzz"),
        _publish(ch, "", "fz.q", b"x" * 300, split=100, delivery_mode=1),
        frame.marshal(Basic.Consume(queue="fz.q", consumer_tag="c1"), ch),
        frame.marshal(Basic.Ack(delivery_tag=1), ch),
        frame.marshal(Basic.Nack(delivery_tag=2, requeue=True), ch),
        frame.marshal(Basic.Reject(delivery_tag=3, requeue=False), ch),
        frame.marshal(Basic.Get(queue="fz.q"), ch),
        frame.marshal(Basic.Recover(requeue=True), ch),
        frame.marshal(Basic.Cancel(consumer_tag="c1"), ch),
        frame.marshal(heartbeat.Heartbeat(), 0),
        frame.marshal(Queue.Unbind(queue="fz.q", exchange="fz.x", routing_key="a.*.#"), ch),
        frame.marshal(Queue.Purge(queue="fz.q"), ch),
        frame.marshal(Queue.Delete(queue="fz.q"), ch),
        frame.marshal(Exchange.Delete(exchange="fz.x"), ch),
        frame.marshal(Channel.Close(200, "bye", 0, 0), ch),
        frame.marshal(Connection.Close(200, "bye", 0, 0), 0),
    ]
    return b"".join(parts)
