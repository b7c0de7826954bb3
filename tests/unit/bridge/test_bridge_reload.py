"""SIGHUP reload of ``[[bridge]]`` tables (``Bridges.configure``) on a
``MemoryReactorClock``: an unchanged bridge runs on untouched, a changed one restarts
on its session (backlog kept), a new one starts, a removed one stops and its session
is held, unsubscribed with its backlog kept (the SIGHUP itself:
tests/integration/bridge/test_bridge_sighup.py)."""

from __future__ import annotations

from typing import Any

import pytest
from bridge_remote import TABLE
from core_broker import pub
from fakes import NullStore
from twisted.internet.testing import MemoryReactorClock

from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.bridge.service import Bridges
from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits


def _settings(name: str, **extra: Any) -> BridgeSettings:
    return BridgeSettings.from_table({**TABLE, "name": name, **extra})


def test_reload_keeps_restarts_adds_and_removes_bridges() -> None:
    """Unchanged: same object, still running; changed: new object on the same session
    with its backlog; added: started; removed: stopped, its session held."""
    reactor = MemoryReactorClock()
    broker = Broker(reactor, NullStore(), Limits())
    bridges = Bridges(broker, reactor, [_settings("keep"), _settings("change"),
                                        _settings("gone")])
    bridges.start()
    assert len(reactor.tcpClients) == 3
    pub(broker, "sensors/t", b"waiting", qos=1)
    keep = bridges.bridges[0]
    bridges.configure([_settings("keep"), _settings("change", keepalive=30),
                       _settings("new")])
    reactor.advance(0)
    by_name = {b.settings.name: b for b in bridges.bridges}
    assert set(by_name) == {"keep", "change", "new"}
    assert by_name["keep"] is keep and keep.state == "connecting"
    assert by_name["change"].settings.keepalive == 30
    assert by_name["change"].state == "connecting" and by_name["new"].state == "connecting"
    assert len(reactor.tcpClients) == 5   # (the changed one and the new one connect)
    gone = broker.sessions["$bridge/gone"]
    assert not gone.subscriptions and len(gone.queue) == 1   # (held, not queuing)
    assert len(broker.sessions["$bridge/change"].queue) == 1   # (its backlog stays)
    assert "$bridge/new" in broker.sessions



def test_a_reload_that_fails_to_build_a_bridge_changes_nothing() -> None:
    """A new bridge that cannot be built (its connector raises): the changed and
    removed bridges were not stopped, the running set stays."""
    reactor = MemoryReactorClock()
    broker = Broker(reactor, NullStore(), Limits())
    bridges = Bridges(broker, reactor, [_settings("change"), _settings("gone")])
    bridges.start()
    before = list(bridges.bridges)
    build = bridges._connector

    def connector(settings: BridgeSettings) -> Any:
        if settings.name == "bad":
            raise OSError("tls-ca: no such file")
        return build(settings)

    bridges._connector = connector   # type: ignore[method-assign]
    with pytest.raises(OSError):
        bridges.configure([_settings("change", keepalive=30), _settings("bad")])
    assert bridges.bridges == before
    assert all(b.state == "connecting" for b in before)


def test_bridges_never_started_publish_nothing_when_stopped() -> None:
    """An --ha standby's bridges (never started): stop and a reload publish no $SYS
    state into the broker."""
    reactor = MemoryReactorClock()
    broker = Broker(reactor, NullStore(), Limits())
    bridges = Bridges(broker, reactor, [_settings("hq"), _settings("lab")])
    bridges.configure([_settings("hq", keepalive=30)])
    bridges.stop()
    assert not [m for m in broker.retained if m.topic.startswith("$SYS/broker/connection/")]
    assert broker.stats.messages_received == 0
