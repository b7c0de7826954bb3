"""The bridge's ``in`` direction under the broker's flow rules, on a fake transport and
``task.Clock``: while the durable queues' storage alarm holds the remote is not read
and what it sent after is not acknowledged; it is read again once the alarm clears.  A
queue writer merely behind pauses it too, not counted or logged as the alarm."""

from __future__ import annotations

from typing import Any

from bridge_remote import TABLE, Remote, accept
from core_broker import make_broker
from fakes import ManualMemoryStore
from twisted.logger import globalLogPublisher

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Pingreq, Puback, Publish, Suback, Subscribe


def test_storage_alarm_stops_reading_the_remote_until_it_clears() -> None:
    """A queue publish that raises the alarm is stored and acknowledged; the next one
    waits unread and unacknowledged; once the alarm clears it is taken and acknowledged."""
    broker, clock, _ = make_broker(queue_max_total_bytes=2048)
    remote = Remote()
    remote.up = True
    bridge = Bridge(broker, clock, BridgeSettings.from_table(
        {**TABLE, "topics": ["$queue/jobs/# in 1"]}), remote)
    bridge.start()
    accept(remote)
    (sub,) = remote.packets()
    assert isinstance(sub, Subscribe)
    remote.send(Suback(sub.packet_id, (1,)))
    assert remote.client is not None and remote.transport is not None
    remote.client.dataReceived(
        encode(Publish("$queue/jobs/a", b"x" * 2048, 1, False, False, 1))
        + encode(Publish("$queue/jobs/a", b"y", 1, False, False, 2)))
    assert broker.queues.blocked
    assert remote.packets() == [Puback(1)]
    assert remote.transport.producerState == "paused"
    assert bridge.received == 1 and bridge.held == 1
    clock.advance(30)   # (keepalive 10: a remote not read is not "silent")
    assert remote.client.connected and not remote.transport.disconnecting
    # The alarm clears (as if the queues drained): the waiting one is read, stored
    # (the queue is still over its bound: the alarm is raised again) and acknowledged.
    broker.queues.alarm.check_total(0)
    assert [p for p in remote.packets() if isinstance(p, Puback)] == [Puback(2)]
    assert bridge.received == 2
    assert broker.queues.blocked and remote.transport.producerState == "paused"


def test_a_writer_behind_pauses_the_remote_without_counting_an_alarm() -> None:
    """The queues' writer behind (paused, not blocked): the remote is not read, but
    nothing is counted or logged as the storage alarm; it is read again once the
    writer catches up."""
    store = ManualMemoryStore()
    broker, clock, _ = make_broker(store)
    remote = Remote()
    remote.up = True
    bridge = Bridge(broker, clock, BridgeSettings.from_table(
        {**TABLE, "topics": ["$queue/jobs/# in 1"]}), remote)
    bridge.start()
    store.commit_all()
    accept(remote)
    remote.packets()
    assert remote.client is not None and remote.transport is not None
    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if "reading the remote" in str(event.get("log_format", "")):
            lines.append(str(event["log_format"]))

    globalLogPublisher.addObserver(observe)
    try:
        broker.queues.alarm.set_behind(True)
        assert broker.queues.paused and not broker.queues.blocked
        remote.send(Publish("$queue/jobs/a", b"x", 1, False, False, 1))
        assert remote.client.paused_for == {"alarm"}
        assert remote.transport.producerState == "paused"
        assert bridge.held == 0
        store.commit_all()   # (the writer catches up)
        assert not broker.queues.paused
        assert remote.transport.producerState == "producing"
        assert remote.packets() == [Puback(1)]
    finally:
        globalLogPublisher.removeObserver(observe)
    assert lines == []


def test_keepalive_while_not_reading_pings_and_judges_silence_after_resuming() -> None:
    """Paused: PINGREQs go on and the silence is not judged; once reading resumes, a
    remote silent for one and a half keepalive periods is dropped."""
    broker, clock, _ = make_broker()
    remote = Remote()
    remote.up = True
    bridge = Bridge(broker, clock, BridgeSettings.from_table(dict(TABLE)), remote)
    bridge.start()
    accept(remote)
    remote.packets()
    client, transport = remote.client, remote.transport
    assert client is not None and transport is not None
    client.pause_reading("alarm")
    for _ in range(6):   # (keepalive 10: a minute unread)
        clock.advance(10)
    assert sum(isinstance(p, Pingreq) for p in remote.packets()) == 6
    assert not transport.disconnecting
    client.resume_reading("alarm")
    clock.advance(10)
    assert not transport.disconnecting
    clock.advance(10)
    assert transport.disconnecting and "silent" in client.reason
