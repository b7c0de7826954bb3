"""The out backlog's own bound (``max-backlog-bytes``, ``max-backlog-messages``,
``on-full``), on the broker's core with a fake remote and ``task.Clock``: ``drop``
drops and counts beyond it as any session's bound does; ``block`` holds the local
publishers that feed it while the remote is away, longer than the stall time-out,
and lets them go once the remote took the backlog."""

from __future__ import annotations

from typing import Any

import pytest
from bridge_remote import TABLE, Remote, accept
from core_broker import make_broker

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.bridge.service import figures
from mqttamqp.core.message import Message
from mqttamqp.mqtt.packets import Puback, Publish
from mqttamqp.ops.config import TableKeyError


def _bridge(**keys: Any) -> tuple[Bridge, Remote, Any, Any]:
    broker, clock, _ = make_broker()
    remote = Remote()   # (down: the backlog grows)
    bridge = Bridge(broker, clock, BridgeSettings.from_table(
        {**TABLE, "topics": ["sensors/# out 1"], **keys}), remote)
    bridge.start()
    return bridge, remote, broker, clock


def _publish(broker: Any, payload: bytes) -> Any:
    return broker.publish(Message("sensors/t", payload, 1, False, "p", 0.0))


def test_drop_beyond_max_backlog_messages_counted() -> None:
    """on-full = "drop": beyond max-backlog-messages a message is dropped and counted;
    the broker's own --max-queued-messages does not apply to the bridge."""
    bridge, _, broker, _ = _bridge(**{"max-backlog-messages": 3, "on-full": "drop"})
    for i in range(5):
        _publish(broker, b"m%d" % i)
    session = broker.sessions["$bridge/hq"]
    assert [e.message.payload for e in session.queue] == [b"m0", b"m1", b"m2"]
    f = figures(bridge)
    assert (f["backlog_messages"], f["backlog_dropped"]) == (3, 2)


def test_drop_beyond_max_backlog_bytes() -> None:
    """The byte bound: payload bytes beyond max-backlog-bytes are dropped, counted."""
    bridge, _, broker, _ = _bridge(**{"max-backlog-bytes": 10, "on-full": "drop"})
    for _ in range(3):
        _publish(broker, b"1234")
    f = figures(bridge)
    assert (f["backlog_bytes"], f["backlog_dropped"]) == (8, 1)


def test_block_holds_publishers_while_the_remote_is_away() -> None:
    """on-full = "block": at the bound the publish says congested, the publisher stays
    paused past the stall time-out (the remote may be away for long), nothing is
    dropped below twice the bound, and it resumes once the remote took the backlog."""
    bridge, remote, broker, clock = _bridge(**{"max-backlog-messages": 2, "on-full": "block"})
    assert not _publish(broker, b"a").congested
    result = _publish(broker, b"b")
    assert [s.client_id for s in result.congested] == ["$bridge/hq"]
    resumed: list[bool] = []
    broker.pause_until_drained(1, lambda: resumed.append(True), result.congested)
    _publish(broker, b"c")           # (what the paused publisher had sent already)
    clock.advance(30)                # (stall_timeout is 2 s)
    assert resumed == [] and bridge.backlog.blocking and bridge.backlog.blocked == 1
    session = broker.sessions["$bridge/hq"]
    assert len(session.queue) == 3 and session.dropped == 0 and not session.stalled
    remote.up = True
    clock.advance(10)                # (the next attempt)
    accept(remote)
    clock.advance(0)
    sent = [p for p in remote.packets() if isinstance(p, Publish)]
    assert [p.payload for p in sent] == [b"a", b"b", b"c"]
    for p in sent:
        assert p.packet_id is not None
        remote.send(Puback(p.packet_id))
    assert resumed == [True] and not bridge.backlog.blocking


def test_block_lets_publishers_go_when_the_bridge_stops() -> None:
    """A bridge stopped (removed on reload) no longer holds its publishers."""
    bridge, _, broker, _ = _bridge(**{"max-backlog-messages": 1, "on-full": "block"})
    result = _publish(broker, b"a")
    resumed: list[bool] = []
    broker.pause_until_drained(1, lambda: resumed.append(True), result.congested)
    bridge.stop()
    assert resumed == [True]
    assert broker.sessions["$bridge/hq"].limits is broker.limits


@pytest.mark.parametrize(("key", "value"), [("on-full", "wait"), ("max-backlog-bytes", 0),
                                            ("max-backlog-messages", 30_001)])
def test_bad_bound_keys_are_refused(key: str, value: object) -> None:
    """A bad bound key names itself."""
    with pytest.raises(TableKeyError) as caught:
        BridgeSettings.from_table({**TABLE, key: value})
    assert caught.value.key == key


def test_block_is_the_default() -> None:
    """Without on-full, a full backlog pauses its publishers instead of dropping (below
    twice the bound nothing is dropped while the remote is away)."""
    bridge, _, broker, _ = _bridge(**{"max-backlog-messages": 2})
    for i in range(4):
        _publish(broker, b"m%d" % i)
    assert figures(bridge)["backlog_dropped"] == 0


def test_block_resumes_below_three_quarters_not_at_every_acknowledgement() -> None:
    """A remote slower than its publishers: once blocked, publishers stay paused until
    a quarter of the bound has drained (one block and two log lines, not one per
    acknowledgement)."""
    bridge, _, broker, _ = _bridge(**{"max-backlog-messages": 8, "on-full": "block"})
    for i in range(8):
        _publish(broker, b"m%d" % i)
    session = broker.sessions["$bridge/hq"]
    guard = bridge.backlog
    assert guard.over(session) and guard.blocked == 1
    session.queue.popleft()          # (one taken by the remote: 7 of 8)
    assert guard.over(session)
    session.queue.popleft()          # (6 of 8: three quarters)
    assert guard.over(session)
    session.queue.popleft()          # (5 of 8)
    assert not guard.over(session)
    assert guard.blocked == 1
