"""``$SYS/broker/retained messages/count`` counts the retained messages clients stored,
not the broker's own retained ``$SYS`` topics (issue 13)."""

from __future__ import annotations

from core_broker import make_broker, pub


def test_retained_count_leaves_out_the_sys_topics() -> None:
    """$SYS/broker/retained messages/count counts the clients' retained messages, not the
    $SYS topics."""
    broker, clock, _ = make_broker(sys_interval=5)
    broker.start()
    try:
        clock.advance(5)  # a second round: the $SYS topics are now retained themselves
        sys_topics = [m.topic for m in broker.retained.match("$SYS/#")]
        assert len(sys_topics) > 10
        count = broker.retained.get("$SYS/broker/retained messages/count")
        assert count is not None and count.payload == b"0"
        pub(broker, "plant/1/temp", b"21.5", retain=True)
        pub(broker, "plant/2/temp", b"19.0", retain=True)
        pub(broker, "plant/3/temp", b"", retain=True)  # deletes nothing, stores nothing
        clock.advance(5)
        count = broker.retained.get("$SYS/broker/retained messages/count")
        assert count is not None and count.payload == b"2"
        pub(broker, "plant/1/temp", b"", retain=True)  # an empty payload deletes it
        clock.advance(5)
        count = broker.retained.get("$SYS/broker/retained messages/count")
        assert count is not None and count.payload == b"1"
    finally:
        broker.stop()
