"""A bridge's figures over time, on a memory reactor and the core broker: the rates
out and in (messages/s over each sample) and its ``$SYS/broker/connection/<client
id>/...`` topics, retained, every ``--sys-interval``."""

from __future__ import annotations

from core_broker import connect, make_broker, subscribe
from twisted.internet.testing import MemoryReactorClock

from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.bridge.service import SAMPLE, Bridges, figures

TABLE = {"name": "hq", "address": "mqtt://127.0.0.1:1884", "client-id": "here.hq",
         "topics": ["sensors/# out 1"]}


def test_rates_and_sys_topics() -> None:
    """Rates come from the counters' growth per sample; every sys interval the $SYS
    topics of each bridge are published with its figures."""
    broker, _, _ = make_broker(sys_interval=10.0)
    reactor = MemoryReactorClock()
    bridges = Bridges(broker, reactor, [BridgeSettings.from_table(TABLE)])
    session, link, _ = connect(broker, "watcher")
    subscribe(broker, session, ("$SYS/broker/connection/#", 0))
    bridges.start()
    (bridge,) = bridges.bridges
    bridge.sent, bridge.received = 50, 10
    reactor.advance(SAMPLE)
    f = figures(bridge)
    assert (f["rate_out"], f["rate_in"]) == (50 / SAMPLE, 10 / SAMPLE)
    before = len(link.sent)
    reactor.advance(SAMPLE)   # (10 s since the start: the $SYS topics go out)
    got = {t: p for t, p, *_ in link.sent[before:]}
    p = "$SYS/broker/connection/here.hq/"
    assert got[p + "messages/sent"] == b"50" and got[p + "messages/received"] == b"10"
    assert got[p + "messages/sent/per-second"] == b"0"   # (no growth in this sample)
    assert got[p + "backlog/messages"] == b"0" and got[p + "backlog/dropped"] == b"0"
    bridges.stop()
    assert not [c for c in reactor.getDelayedCalls() if c.active()]
