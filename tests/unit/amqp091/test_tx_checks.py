"""AMQP 0.9.1 transactions in process, the review of issue #30: a held
acknowledgement whose delivery is no longer the channel's at commit fails the
commit with 406 and nothing applied; the byte bound counts the raw properties."""

from __future__ import annotations

from pamqp import commands
from test_tx import frames_of, got, opened, publish, queued

from mqttamqp.amqp091.frames import content_frames, method_frame

B, Q, T = commands.Basic, commands.Queue, commands.Tx


def test_a_held_ack_whose_queue_went_fails_the_commit_with_nothing_applied() -> None:
    """An ack held in a transaction whose queue was deleted before tx.commit: the
    commit is refused with 406 (unknown delivery tag, as RabbitMQ) before its
    publish is routed."""
    conn, t, broker = opened()
    publish(conn, b"in")
    [tag] = got(conn, t, 1)
    conn.dataReceived(method_frame(1, T.Select()))
    conn.dataReceived(method_frame(1, B.Ack(delivery_tag=tag)))
    publish(conn, b"result", queue="out")
    frames_of(t)
    conn.dataReceived(method_frame(1, Q.Delete(queue="q")))
    frames_of(t)
    conn.dataReceived(method_frame(1, T.Commit()))
    closes = [f for f in frames_of(t) if f.name == "Channel.Close"]
    assert closes and closes[0].reply_code == 406
    assert f"unknown delivery tag {tag}" in closes[0].reply_text
    assert "nothing of it was applied" in closes[0].reply_text
    assert queued(broker, "out") == []
    assert broker.transactions.committed == 0


def test_the_byte_bound_counts_the_raw_properties() -> None:
    """Publishes with a 1-byte body and large headers count their properties
    against --max-transaction-bytes: past it the channel is closed with 406."""
    conn, t, broker = opened(max_transaction_bytes=4096)
    conn.dataReceived(method_frame(1, T.Select()))
    frames_of(t)
    props = commands.Basic.Properties(headers={"h": "y" * 2000})
    for _ in range(3):
        conn.dataReceived(content_frames(1, B.Publish(exchange="", routing_key="out"),
                                         props.marshal(), b"x", 131072))
    closes = [f for f in frames_of(t) if f.name == "Channel.Close"]
    assert closes and closes[0].reply_code == 406
    assert "--max-transaction-bytes" in closes[0].reply_text
    assert queued(broker, "out") == []
