"""SIGHUP reload of ``[[bridge]]`` tables (``Bridges.configure``) on a
``MemoryReactorClock``: an unchanged bridge runs on untouched, a changed one restarts
on its session (backlog kept), a new one starts, a removed one stops and its session
is held, unsubscribed with its backlog kept (the SIGHUP itself:
tests/integration/bridge/test_bridge_sighup.py)."""

from __future__ import annotations

from typing import Any

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

