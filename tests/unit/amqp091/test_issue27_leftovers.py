"""Issue #27's leftovers in the 0.9.1 adapter: a client-initiated close bounded
in time, prefetch 0, the decode caches' bounds, x-death history.  A channel in
process against an in-memory broker, a fake transport and a ``Clock``."""

from __future__ import annotations

from typing import Any

from pamqp import commands
from test_amqp091_review import bodies, frames_of, opened

from mqttamqp.amqp091.frames import content_frames, method_frame
from mqttamqp.core.message import Message
from mqttamqp.core.queues.deaths import DEATHS_MAX, add_death, read_deaths

C, B, Q = commands.Connection, commands.Basic, commands.Queue


def content(channel: int, body: bytes, **properties: Any) -> bytes:
    """A content header and body frame (what follows a basic.publish)."""
    return content_frames(channel, b"", B.Properties(**properties).marshal(), body, 131072)


def test_a_client_close_then_silence_is_aborted() -> None:
    """After a client's connection.close the broker answers close-ok and, if the
    socket has not closed within 5 s (a client that stopped reading), aborts it."""
    conn, t, _, clock, _ = opened()
    conn.dataReceived(method_frame(0, C.Close(200, "bye", 0, 0)))
    assert [f.name for f in frames_of(t)] == ["Connection.CloseOk"]
    assert t.disconnecting and not t.disconnected
    clock.advance(4.9)
    assert not t.disconnected
    clock.advance(0.2)
    assert t.disconnected


def _published(broker: Any, clock: Any, n: int, queue: str = "q") -> None:
    for i in range(n):
        broker.publish(Message("$queue/" + queue, b"m%d" % i, 1, False, "p",
                               clock.seconds()))
    clock.advance(0.1)


def test_prefetch_zero_is_unlimited_up_to_max_unacked() -> None:
    """A consumer without basic.qos (prefetch 0) gets every ready message, not the
    broker's --queue-prefetch 16, up to --amqp091-max-unacked."""
    conn, t, broker, clock, _ = opened(max_unacked=40)
    conn.dataReceived(method_frame(1, Q.Declare(queue="q", durable=True))
                      + method_frame(1, B.Consume(queue="q", consumer_tag="c")))
    frames_of(t)
    _published(broker, clock, 50)
    assert len(bodies(frames_of(t))) == 40
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=0, multiple=True)))
    clock.advance(0.1)
    assert len(bodies(frames_of(t))) == 10


def test_a_raised_global_qos_raises_the_queue_side_cap() -> None:
    """basic.qos global=true raised from 20 to 30 after the consumer started: the
    consumer then holds 30 unacknowledged deliveries, not 20."""
    conn, t, broker, clock, _ = opened()
    conn.dataReceived(method_frame(1, Q.Declare(queue="q", durable=True))
                      + method_frame(1, B.Qos(prefetch_count=20, global_=True))
                      + method_frame(1, B.Consume(queue="q", consumer_tag="c")))
    frames_of(t)
    _published(broker, clock, 50)
    assert len(bodies(frames_of(t))) == 20
    conn.dataReceived(method_frame(1, B.Qos(prefetch_count=30, global_=True)))
    clock.advance(0.1)
    assert len(bodies(frames_of(t))) == 10


def _headers(frames: list[Any]) -> list[dict[str, Any]]:
    return [f.properties.headers or {} for f in frames if f.name == "ContentHeader"]


def test_a_dlx_ttl_retry_loop_counts_every_death() -> None:
    """W rejects into R, R's x-message-ttl expires the message back into W: each
    round the consumer of W sees x-death with both entries, their counts growing
    (a consumer can stop retrying after N), the latest death first."""
    conn, t, _, clock, _ = opened()
    conn.dataReceived(
        method_frame(1, Q.Declare(queue="R", durable=True, arguments={
            "x-message-ttl": 1000, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "W"}))
        + method_frame(1, Q.Declare(queue="W", durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "R"}))
        + method_frame(1, B.Consume(queue="W", consumer_tag="c")))
    frames_of(t)
    conn.dataReceived(method_frame(1, B.Publish(exchange="", routing_key="W"))
                      + content(1, b"job", headers={"app": "x"}))
    clock.advance(0.1)
    seen = []
    for _ in range(3):
        got = frames_of(t)
        [deliver] = [f for f in got if f.name == "Basic.Deliver"]
        [headers] = _headers(got)
        seen.append(headers)
        conn.dataReceived(method_frame(1, B.Reject(delivery_tag=deliver.delivery_tag,
                                                   requeue=False)))
        for _ in range(30):   # (bounded: R's TTL is 1 s)
            clock.advance(0.1)
            if t.value():
                break
    assert "x-death" not in seen[0] and seen[0]["app"] == "x"
    for n, headers in enumerate(seen[1:], start=1):
        deaths = [(d["queue"], d["reason"], d["count"]) for d in headers["x-death"]]
        assert deaths == [("R", "expired", n), ("W", "rejected", n)]
        assert headers["x-first-death-queue"] == "W"
        assert headers["x-first-death-reason"] == "rejected"
        assert headers["x-last-death-queue"] == "R"
        w = headers["x-death"][1]
        assert (w["exchange"], w["routing-keys"]) == ("", ["W"])
        r = headers["x-death"][0]
        assert (r["exchange"], r["routing-keys"]) == ("", ["R"])
        assert headers["app"] == "x"


def test_death_history_keeps_per_queue_and_reason_entries_bounded() -> None:
    """add_death counts a repeated (queue, reason), moves it to the front with its
    first time kept, and keeps at most DEATHS_MAX entries; junk reads as none."""
    value = add_death(None, "a", "rejected", 10, "", "a")
    value = add_death(value, "b", "expired", 20, "", "b")
    value = add_death(value, "a", "rejected", 30, "x", "y")
    assert read_deaths(value) == [("a", "rejected", 2, 10, 30, "", "a"),
                                  ("b", "expired", 1, 20, 20, "", "b")]
    for i in range(DEATHS_MAX + 5):
        value = add_death(value, f"q{i}", "expired", 40, None, None)
    assert len(read_deaths(value)) == DEATHS_MAX
    assert read_deaths("not json") == [] and read_deaths('[["a"]]') == []


def test_the_deliver_frame_cache_is_bounded_and_skips_long_keys() -> None:
    """basic.deliver frames are the same with or without the cache; it never holds
    more than DELIVER_CACHE_MAX entries nor a key over DELIVER_CACHE_ITEM characters."""
    from pamqp import frame

    from mqttamqp.amqp091 import frames

    frames._DELIVER_CACHE.clear()
    long_key = "k" * 250
    for i in range(frames.DELIVER_CACHE_MAX + 10):
        data = frames.deliver_frame(1, "c", i + 1, False, "ex", f"r{i}")
        assert len(frames._DELIVER_CACHE) <= frames.DELIVER_CACHE_MAX
    assert data == frame.marshal(B.Deliver("c", i + 1, False, "ex", f"r{i}"), 1)
    before = len(frames._DELIVER_CACHE)
    for tag in (7, 8):
        data = frames.deliver_frame(1, "c", tag, True, "amq.topic", long_key)
        assert data == frame.marshal(B.Deliver("c", tag, True, "amq.topic", long_key), 1)
    assert len(frames._DELIVER_CACHE) == before


def test_the_close_timers_are_close_grace() -> None:
    """Review finding: the 0.9.1 close had its own 5 s; it is --close-grace (here
    2 s): a close-ok not answered, and a client's close then silence, are aborted at
    the grace, not before, each counted ($SYS/broker/limits/close_grace)."""
    from core_broker import make_broker
    from twisted.internet.testing import StringTransport

    from mqttamqp.amqp091.connection import AMQP091Factory
    from mqttamqp.amqp091.handshake import Settings

    broker, clock, _ = make_broker(close_grace=2.0)
    factory = AMQP091Factory(broker, clock, Settings())
    for n, client_closes in enumerate((False, True), 1):
        conn = factory.buildProtocol(None)
        t = StringTransport()
        conn.makeConnection(t)
        conn.dataReceived(
            method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
            + method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/")))
        if client_closes:
            conn.dataReceived(method_frame(0, C.Close(200, "bye", 0, 0)))
        else:
            conn.close("test")
        clock.advance(2.0 - 1e-6)
        assert not t.disconnected
        clock.advance(2e-6)
        assert t.disconnected and conn.closed
        assert broker.stats.limits.get("close_grace") == n
