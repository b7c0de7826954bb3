"""Regressions of the 0.9.1 adapter review: a channel in process against an
in-memory broker, a fake transport and a ``Clock``."""

from __future__ import annotations

from typing import Any

from core_broker import make_broker
from pamqp import commands
from twisted.internet.testing import StringTransport

from mqttamqp.amqp091.connection import AMQP091Factory
from mqttamqp.amqp091.frames import FrameReader, method_frame
from mqttamqp.amqp091.handshake import Settings
from mqttamqp.core.message import Message, MessageProperties

C, B, Q = commands.Connection, commands.Basic, commands.Queue


def frames_of(transport: StringTransport) -> list[Any]:
    data = transport.value()
    transport.clear()
    return [f for _, f in FrameReader(1 << 20).feed(data)]


def opened(**settings: Any) -> tuple[Any, StringTransport, Any, Any, AMQP091Factory]:
    broker, clock, _ = make_broker()
    factory = AMQP091Factory(broker, clock, Settings(**settings))
    conn = factory.buildProtocol(None)
    transport = StringTransport()
    conn.makeConnection(transport)
    conn.dataReceived(
        method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        + method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/"))
        + method_frame(1, commands.Channel.Open()))
    frames_of(transport)
    return conn, transport, broker, clock, factory


def consuming(queue: str = "q") -> tuple[Any, StringTransport, Any, Any, AMQP091Factory]:
    conn, t, broker, clock, factory = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue=queue, durable=True))
                      + method_frame(1, B.Consume(queue=queue, consumer_tag="c")))
    frames_of(t)
    return conn, t, broker, clock, factory


def bodies(frames: list[Any]) -> list[bytes]:
    return [f.value for f in frames if f.name == "ContentBody"]


def test_long_mqtt5_properties_reach_a_091_consumer_without_them() -> None:
    """An MQTT 5 content type, response topic and correlation data over 255 bytes
    are left out (counted) and the message is delivered."""
    _, t, broker, clock, _ = consuming()
    props = MessageProperties(content_type="x" * 300, response_topic="r" * 300,
                              correlation_data=b"c" * 300,
                              user_properties=(("k" * 200, "v"), ("ok", "yes")))
    broker.publish(Message("$queue/q", b"hello", 1, False, "p", clock.seconds(),
                           props=props))
    clock.advance(1)
    got = frames_of(t)
    assert bodies(got) == [b"hello"]
    [header] = [f for f in got if f.name == "ContentHeader"]
    assert header.properties.content_type is None
    assert header.properties.reply_to is None
    assert header.properties.correlation_id is None
    assert header.properties.headers == {"ok": "yes"}
    assert broker.stats.limits.get("amqp091_property_dropped") == 1


def test_poison_does_not_wedge_the_consumer() -> None:
    """A message after one that needed its properties cut is delivered, and the
    channel holds exactly the deliveries the client saw."""
    conn, t, broker, clock, _ = consuming()
    broker.publish(Message("$queue/q", b"long", 1, False, "p", clock.seconds(),
                           props=MessageProperties(response_topic="r" * 300)))
    broker.publish(Message("$queue/q", b"normal", 1, False, "p", clock.seconds()))
    clock.advance(1)
    got = frames_of(t)
    assert bodies(got) == [b"long", b"normal"]
    tags = [f.delivery_tag for f in got if f.name == "Basic.Deliver"]
    assert list(conn.channels[1].unacked) == tags


def test_long_topic_through_amq_topic_comes_from_the_default_exchange() -> None:
    """An MQTT topic over 255 bytes reaching a queue bound to amq.topic is
    delivered with the queue's name as routing key."""
    conn, t, broker, clock, _ = opened()
    conn.dataReceived(
        method_frame(1, Q.Declare(queue="tq", durable=True))
        + method_frame(1, Q.Bind(queue="tq", exchange="amq.topic", routing_key="#"))
        + method_frame(1, B.Consume(queue="tq", consumer_tag="c")))
    frames_of(t)
    broker.publish(Message("a/" + "b" * 300, b"x", 1, False, "p", clock.seconds()))
    clock.advance(1)
    got = frames_of(t)
    [deliver] = [f for f in got if f.name == "Basic.Deliver"]
    assert (deliver.exchange, deliver.routing_key) == ("", "tq")
    assert bodies(got) == [b"x"]


def test_a_delivery_that_cannot_be_encoded_is_rejected_not_stuck(monkeypatch: Any) -> None:
    """A delivery the adapter cannot encode takes no delivery tag, is rejected on
    the next turn (to the queue's dead letters) and the next message goes out."""
    import mqttamqp.amqp091.channel as channel_module

    conn, t, broker, clock, _ = consuming()
    real = channel_module.for_consumer

    def broken(message: Message, *args: Any) -> Any:
        if message.payload == b"bad":
            raise TypeError("cannot encode")
        return real(message, *args)

    monkeypatch.setattr(channel_module, "for_consumer", broken)
    broker.publish(Message("$queue/q", b"bad", 1, False, "p", clock.seconds()))
    broker.publish(Message("$queue/q", b"good", 1, False, "p", clock.seconds()))
    clock.advance(1)
    clock.advance(1)
    got = frames_of(t)
    assert bodies(got) == [b"good"]
    [deliver] = [f for f in got if f.name == "Basic.Deliver"]
    assert deliver.delivery_tag == 1
    assert list(conn.channels[1].unacked) == [1]
    assert broker.stats.limits.get("amqp091_undeliverable") == 1
    assert [m.payload for m in broker.queues.queues["q"].log.values()] == [b"good"]


_BINARY_TABLE = b"\x01bS\x00\x00\x00\x02\xff\xfe"   # header b: a long string, not UTF-8


def publish_raw(conn: Any, routing_key: str, props: bytes, mandatory: bool = False) -> None:
    import struct

    header = struct.pack(">HHQ", 60, 0, 2) + props
    conn.dataReceived(
        method_frame(1, B.Publish(exchange="", routing_key=routing_key, mandatory=mandatory))
        + struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce"
        + struct.pack(">BHI", 3, 1, 2) + b"hi\xce")


def binary_props(content_type: bytes = b"") -> bytes:
    flags = 0x2000 | (0x8000 if content_type else 0)
    ct = bytes((len(content_type),)) + content_type if content_type else b""
    return (flags.to_bytes(2, "big") + ct + len(_BINARY_TABLE).to_bytes(4, "big")
            + _BINARY_TABLE)


def test_binary_header_survives_a_requeue() -> None:
    """A long-string header that is not UTF-8 (py-amqp sends bytes so) does not
    break the redelivery after a nack with requeue: x-delivery-count is added."""
    conn, t, _, clock, _ = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="h", durable=True)))
    clock.advance(1)
    frames_of(t)
    publish_raw(conn, "h", binary_props(b"text/plain"))
    conn.dataReceived(method_frame(1, B.Consume(queue="h", consumer_tag="c")))
    clock.advance(1)
    [tag] = [f.delivery_tag for f in frames_of(t) if f.name == "Basic.Deliver"]
    conn.dataReceived(method_frame(1, B.Nack(delivery_tag=tag, requeue=True)))
    clock.advance(1)
    got = frames_of(t)
    assert [f.name for f in got] == ["Basic.Deliver", "ContentHeader", "ContentBody"]
    assert got[0].redelivered
    props = got[1].properties
    assert props.content_type == "text/plain"
    assert props.headers == {"b": b"\xff\xfe", "x-delivery-count": 1}


def test_binary_header_survives_a_mandatory_return() -> None:
    """basic.return of an unroutable mandatory publish with a non-UTF-8 header
    sends the properties as published, not a 541."""
    conn, t, _, _, _ = opened()
    publish_raw(conn, "nobody", binary_props(), mandatory=True)
    got = frames_of(t)
    assert [f.name for f in got] == ["Basic.Return", "ContentHeader", "ContentBody"]
    assert got[1].properties.headers == {"b": b"\xff\xfe"}


def test_headers_are_set_in_the_raw_table_keeping_earlier_deaths() -> None:
    """The added headers replace their namesakes in the published table; a new
    x-death goes before the earlier ones; unreadable bytes come back unchanged."""
    from pamqp import encode

    from mqttamqp.amqp091.properties import _with_headers

    table = encode.field_table({"x-delivery-count": 7, "x-death": [{"queue": "old"}]})
    raw = (0xA000).to_bytes(2, "big") + b"\x03a/b" + table
    out = _with_headers(raw, {"x-delivery-count": 2, "x-death": [{"queue": "new"}]})
    from pamqp.header import ContentHeader

    header = ContentHeader()
    header.unmarshal(b"\x00\x3c\x00\x00" + bytes(8) + out)
    assert header.properties.content_type == "a/b"
    assert header.properties.headers == {
        "x-delivery-count": 2, "x-death": [{"queue": "new"}, {"queue": "old"}]}
    assert _with_headers(b"\x20\x00\x00\x00\x00\x09", {"x": 1}) == b"\x20\x00\x00\x00\x00\x09"


def test_a_silent_peer_is_aborted_and_its_deliveries_go_back() -> None:
    """Missed heartbeats abort the socket (a peer that stopped reading never lets
    loseConnection finish) and end the channels at once: the unacknowledged
    delivery goes to another consumer."""
    broker, clock, _ = make_broker()
    factory = AMQP091Factory(broker, clock, Settings(heartbeat=2))
    conns = []
    for _ in range(2):
        conn = factory.buildProtocol(None)
        t = StringTransport()
        conn.makeConnection(t)
        conn.dataReceived(
            method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
            + method_frame(0, C.TuneOk(2047, 131072, 2)) + method_frame(0, C.Open("/"))
            + method_frame(1, commands.Channel.Open())
            + method_frame(1, Q.Declare(queue="hb", durable=True))
            + method_frame(1, B.Qos(prefetch_count=1))
            + method_frame(1, B.Consume(queue="hb", consumer_tag="c")))
        frames_of(t)
        conns.append((conn, t))
    broker.publish(Message("$queue/hb", b"job", 1, False, "p", clock.seconds()))
    clock.advance(0.1)
    holder = [i for i, (_, t) in enumerate(conns) if b"job" in t.value()]
    assert len(holder) == 1
    silent, silent_t = conns[holder[0]]
    live, live_t = conns[1 - holder[0]]
    live_t.clear()
    for _ in range(9):   # the live one keeps talking; the other says nothing
        clock.advance(0.5)
        live.dataReceived(b"\x08\x00\x00\x00\x00\x00\x00\xce")
    assert silent_t.disconnected and not live_t.disconnecting
    assert not silent.channels
    assert b"job" in live_t.value()


def test_no_close_ok_in_time_aborts() -> None:
    """A connection.close the peer does not answer within 5 s aborts the socket."""
    conn, t, _, clock, _ = opened()
    conn.close("test")
    assert [f.name for f in frames_of(t)] == ["Connection.Close"]
    clock.advance(4.9)
    assert not t.disconnecting
    clock.advance(0.2)
    assert t.disconnected


def test_a_refused_exclusive_consume_leaves_no_lock() -> None:
    """An exclusive basic.consume the queue refuses (a bad x-stream-offset) is a
    406 channel error, sends no consume-ok, and leaves the queue free for others."""
    conn, t, _, _, factory = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="s", durable=True,
                                                arguments={"x-queue-type": "stream"})))
    frames_of(t)
    conn.dataReceived(method_frame(1, B.Consume(queue="s", consumer_tag="c", exclusive=True,
                                                arguments={"x-stream-offset": "garbage"})))
    got = frames_of(t)
    assert [(f.name, f.reply_code) for f in got] == [("Channel.Close", 406)]
    assert "s" not in factory.exclusive
    conn.dataReceived(method_frame(1, commands.Channel.CloseOk())
                      + method_frame(2, commands.Channel.Open())
                      + method_frame(2, B.Consume(queue="s", consumer_tag="d")))
    assert [f.name for f in frames_of(t)] == ["Channel.OpenOk", "Basic.ConsumeOk"]


def test_consume_ok_comes_before_the_first_delivery() -> None:
    """basic.consume on a queue with messages answers consume-ok before any deliver."""
    conn, t, broker, clock, _ = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="ready", durable=True)))
    broker.publish(Message("$queue/ready", b"m", 1, False, "p", clock.seconds()))
    clock.advance(1)
    frames_of(t)
    conn.dataReceived(method_frame(1, B.Consume(queue="ready", consumer_tag="c")))
    clock.advance(1)
    names = [f.name for f in frames_of(t)]
    assert names[:2] == ["Basic.ConsumeOk", "Basic.Deliver"]


def test_an_unacked_delivery_stays_with_its_channel() -> None:
    """A 0.9.1 consumer holding a delivery past the queue's visibility timeout keeps
    it (no takeover by an idle consumer, no redelivery) until its channel ends."""
    conn, t, broker, clock, factory = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="v", durable=True))
                      + method_frame(1, B.Qos(prefetch_count=1))
                      + method_frame(1, B.Consume(queue="v", consumer_tag="w1")))
    other = factory.buildProtocol(None)
    t2 = StringTransport()
    other.makeConnection(t2)
    other.dataReceived(
        method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        + method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/"))
        + method_frame(1, commands.Channel.Open())
        + method_frame(1, B.Qos(prefetch_count=1))
        + method_frame(1, B.Consume(queue="v", consumer_tag="w2")))
    clock.advance(1)
    frames_of(t)
    frames_of(t2)
    broker.publish(Message("$queue/v", b"task", 1, False, "p", clock.seconds()))
    clock.advance(1)
    first = [f for f in frames_of(t) + frames_of(t2) if f.name == "Basic.Deliver"]
    assert len(first) == 1
    holder, idle_t = (conn, t2) if first[0].consumer_tag == "w1" else (other, t)
    for _ in range(12):
        clock.advance(10)
    assert not [f for f in frames_of(t) + frames_of(t2) if f.name == "Basic.Deliver"]
    holder.dataReceived(method_frame(1, commands.Channel.Close(200, "", 0, 0)))
    clock.advance(1)
    again = [f for f in frames_of(idle_t) if f.name == "Basic.Deliver"]
    assert len(again) == 1 and again[0].redelivered


def test_a_got_message_stays_with_its_channel() -> None:
    """A basic.get without ack is not handed out again after the visibility timeout
    while its channel lives."""
    conn, t, broker, clock, _ = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="g1", durable=True)))
    broker.publish(Message("$queue/g1", b"one", 1, False, "p", clock.seconds()))
    clock.advance(1)
    frames_of(t)
    conn.dataReceived(method_frame(1, B.Get(queue="g1")))
    assert bodies(frames_of(t)) == [b"one"]
    for _ in range(12):
        clock.advance(10)
    conn.dataReceived(method_frame(1, B.Get(queue="g1")))
    assert [f.name for f in frames_of(t)] == ["Basic.GetEmpty"]


def publish_body(conn: Any, channel: int, routing_key: str, body: bytes) -> None:
    from mqttamqp.amqp091.frames import content_frames

    conn.dataReceived(content_frames(channel, B.Publish(exchange="", routing_key=routing_key),
                                     b"\x00\x00", body, 131072))


def test_a_body_over_max_body_is_a_406_channel_error() -> None:
    """A body over --amqp091-max-body closes the channel with 406 (counted); its body
    frames are discarded and the connection stays usable."""
    conn, t, broker, clock, _ = opened(max_body=1 << 20)
    conn.dataReceived(method_frame(1, Q.Declare(queue="big", durable=True)))
    clock.advance(1)
    frames_of(t)
    publish_body(conn, 1, "big", b"x" * (2 << 20))
    got = frames_of(t)
    assert [(f.name, f.reply_code) for f in got] == [("Channel.Close", 406)]
    assert "larger than configured max size" in got[0].reply_text
    assert broker.stats.limits.get("amqp091_max_body") == 1
    conn.dataReceived(method_frame(1, commands.Channel.CloseOk())
                      + method_frame(2, commands.Channel.Open()))
    publish_body(conn, 2, "big", b"y" * (1 << 20))
    conn.dataReceived(method_frame(2, Q.Declare(queue="big", passive=True)))
    clock.advance(1)
    got = frames_of(t)
    assert [f.name for f in got] == ["Channel.OpenOk", "Queue.DeclareOk"]
    assert got[1].message_count == 1


def test_a_two_mib_body_is_taken_by_default() -> None:
    """The default bound (16 MiB, RabbitMQ's) takes a 2 MiB body over --max-packet-size."""
    conn, t, _, clock, _ = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="big", durable=True)))
    publish_body(conn, 1, "big", b"x" * (2 << 20))
    conn.dataReceived(method_frame(1, Q.Declare(queue="big", passive=True)))
    clock.advance(1)
    oks = [f for f in frames_of(t) if f.name == "Queue.DeclareOk"]
    assert oks[-1].message_count == 1


def test_a_failed_auto_delete_is_logged_with_its_failure(monkeypatch: Any) -> None:
    """A failing auto-delete after basic.cancel logs the message with the failure
    (not the failure as the format, which logs "Unable to format event")."""
    from twisted.internet.defer import fail

    conn, t, broker, _, _ = consuming()
    logged: list[tuple[Any, Any]] = []

    class Log:
        def failure(self, fmt: Any, failure: Any = None, **kw: Any) -> None:
            logged.append((fmt, failure))

    conn.log = Log()
    monkeypatch.setattr(broker.exchanges, "consumer_cancelled",
                        lambda queue: fail(RuntimeError("storage")))
    conn.dataReceived(method_frame(1, B.Cancel(consumer_tag="c")))
    assert [f.name for f in frames_of(t)] == ["Basic.CancelOk"]
    [(fmt, failure)] = logged
    assert fmt == "deleting an auto-delete queue"
    assert failure.check(RuntimeError)


def test_tune_fields_are_bounded() -> None:
    """--amqp091-channel-max and --amqp091-heartbeat over 65535 are refused at
    parse time; Settings built in code clamp them, so tune encodes and the
    handshake completes."""
    import pytest

    from mqttamqp.options import Options

    for option in ("--amqp091-channel-max", "--amqp091-heartbeat"):
        with pytest.raises(SystemExit, match=r"from \d to 65535"):
            Options().parseOptions([option, "70000"])
    with pytest.raises(SystemExit, match="from 4096"):
        Options().parseOptions(["--amqp091-frame-max", "100"])
    broker, clock, _ = make_broker()
    factory = AMQP091Factory(broker, clock, Settings(channel_max=70000, heartbeat=70000))
    conn = factory.buildProtocol(None)
    t = StringTransport()
    conn.makeConnection(t)
    frames_of(t)
    conn.dataReceived(method_frame(0, C.StartOk(mechanism="PLAIN",
                                                 response="\x00guest\x00guest")))
    [tune] = frames_of(t)
    assert (tune.name, tune.channel_max, tune.heartbeat) == ("Connection.Tune", 65535, 65535)


def gets(conn: Any, t: StringTransport, queue: str, n: int) -> tuple[list[bytes], int]:
    """``n`` basic.gets: the bodies got, and how many answered get-empty."""
    got: list[bytes] = []
    empty = 0
    for _ in range(n):
        conn.dataReceived(method_frame(1, B.Get(queue=queue)))
        frames = frames_of(t)
        got += bodies(frames)
        empty += sum(1 for f in frames if f.name == "Basic.GetEmpty")
    return got, empty


def test_gets_past_the_session_window_lose_nothing() -> None:
    """More unacknowledged basic.gets than --max-inflight each get a message; an
    ack of all acknowledges only what the client got, and every message is seen
    exactly once."""
    conn, t, broker, clock, _ = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="g2", durable=True)))
    for i in range(100):
        broker.publish(Message("$queue/g2", b"%d" % i, 1, False, "p", clock.seconds()))
    clock.advance(1)
    frames_of(t)
    first, empty = gets(conn, t, "g2", 40)
    assert (len(first), empty) == (40, 0)
    conn.dataReceived(method_frame(1, B.Ack(0, multiple=True)))
    second, empty = gets(conn, t, "g2", 70)
    assert (len(second), empty) == (60, 10)
    assert len(conn.channels[1].unacked) == 60
    conn.dataReceived(method_frame(1, B.Ack(0, multiple=True)))
    clock.advance(1)
    assert sorted(first + second) == sorted(b"%d" % i for i in range(100))
    assert not broker.queues.queues["g2"].log


def test_a_getter_sends_nothing_unasked() -> None:
    """basic.get's session is congested except while a basic.get is answered."""
    conn, t, broker, clock, _ = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="g3", durable=True)))
    broker.publish(Message("$queue/g3", b"a", 1, False, "p", clock.seconds()))
    clock.advance(1)
    frames_of(t)
    got, _ = gets(conn, t, "g3", 1)
    assert got == [b"a"]
    getter = conn.channels[1].getter
    assert getter.congested and not getter.answering


def test_reject_without_requeue_and_without_dlx_discards() -> None:
    """basic.reject / nack without requeue on a 0.9.1 queue with no
    x-dead-letter-exchange drops the message (counted), as RabbitMQ: no $dlq/."""
    conn, t, broker, clock, _ = consuming("r")
    for i in range(3):
        broker.publish(Message("$queue/r", b"%d" % i, 1, False, "p", clock.seconds()))
    clock.advance(1)
    tags = [f.delivery_tag for f in frames_of(t) if f.name == "Basic.Deliver"]
    assert len(tags) == 3
    conn.dataReceived(method_frame(1, B.Reject(delivery_tag=tags[0], requeue=False))
                      + method_frame(1, B.Nack(delivery_tag=tags[2], multiple=True,
                                               requeue=False)))
    clock.advance(1)
    assert not [f for f in frames_of(t) if f.name == "Basic.Deliver"]
    assert not broker.queues.queues["r"].log
    assert "$dlq/r" not in broker.queues.queues
    assert broker.queues.stats.rejected == 3


def test_a_deleted_queue_leaves_no_exclusive_entry() -> None:
    """An exclusive consumer cancelled by its queue's deletion leaves
    factory.exclusive."""
    conn, t, _, clock, factory = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="x", durable=True))
                      + method_frame(1, B.Consume(queue="x", consumer_tag="c",
                                                  exclusive=True)))
    assert "x" in factory.exclusive
    conn.dataReceived(method_frame(1, Q.Delete(queue="x")))
    clock.advance(1)
    assert "Queue.DeleteOk" in [f.name for f in frames_of(t)]
    assert "x" not in factory.exclusive


def test_a_confirm_waits_for_the_commit() -> None:
    """A confirmed persistent publish to a durable queue is acked only once its
    commit is done, through the real channel (not _confirmed driven directly)."""
    from fakes import ManualMemoryStore

    store = ManualMemoryStore()
    broker, clock, _ = make_broker(store)
    factory = AMQP091Factory(broker, clock, Settings())
    conn = factory.buildProtocol(None)
    t = StringTransport()
    conn.makeConnection(t)
    conn.dataReceived(
        method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        + method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/"))
        + method_frame(1, commands.Channel.Open())
        + method_frame(1, Q.Declare(queue="c", durable=True))
        + method_frame(1, commands.Confirm.Select()))
    store.commit_all()
    clock.advance(1)
    frames_of(t)
    from mqttamqp.amqp091.frames import content_frames

    conn.dataReceived(content_frames(1, B.Publish(exchange="", routing_key="c"),
                                     B.Properties(delivery_mode=2).marshal(), b"x", 131072))
    for _ in range(5):
        clock.advance(1)
    assert "Basic.Ack" not in [f.name for f in frames_of(t)]
    assert store.pending
    store.commit_all()
    clock.advance(1)
    acks = [f for f in frames_of(t) if f.name == "Basic.Ack"]
    assert [a.delivery_tag for a in acks] == [1]


def test_a_priority_reaches_a_091_consumer_as_its_basic_property() -> None:
    """A message's priority (AMQP 1.0 header priority) is a 0.9.1 consumer's basic
    property priority; a message without one has none."""
    from mqttamqp.amqp091.properties import from_core

    for priority in (6, None):
        message = Message("q/t", b"x", 1, False, None, 0.0, priority=priority)
        props, _count, _again = from_core(message, 0.0)
        assert props.priority == priority


def test_a_consumer_tagged_get_leaves_a_got_message_to_come_back() -> None:
    """A consumer tagged ``get`` beside basic.get's session on one channel has a
    session of its own: an unacknowledged get comes back when the channel closes."""
    conn, t, broker, clock, factory = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="g2", durable=True)))
    broker.publish(Message("$queue/g2", b"one", 1, False, "p", clock.seconds()))
    clock.advance(1)
    conn.dataReceived(method_frame(1, B.Get(queue="g2"))
                      + method_frame(1, B.Consume(queue="g2", consumer_tag="get")))
    assert bodies(frames_of(t)) == [b"one"]
    conn.dataReceived(method_frame(1, commands.Channel.Close(200, "", 0, 0)))
    clock.advance(1)
    other = factory.buildProtocol(None)
    t2 = StringTransport()
    other.makeConnection(t2)
    other.dataReceived(
        method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        + method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/"))
        + method_frame(1, commands.Channel.Open())
        + method_frame(1, B.Consume(queue="g2", consumer_tag="w")))
    clock.advance(1)
    frames = frames_of(t2)
    delivered = [f for f in frames if f.name == "Basic.Deliver"]
    assert bodies(frames) == [b"one"] and delivered[0].redelivered
