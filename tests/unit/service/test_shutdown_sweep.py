"""``BrokerService``'s sweeps of the MQTT clients at a stop (``_stop``) and when the
leadership is lost (``_stop_serving``): every open connection is reached — a socket
that never sent CONNECT, a connected client, one closing — though the MQTT factory
keeps no table of them all (``mqtt.opened.OpenConnections``).  A memory reactor and
``StringTransport``s: no socket is opened."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.testing import MemoryReactorClock, StringTransport

from mqttamqp import service
from mqttamqp.core.limits import Limits
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Connect, Disconnect


def _service(tmp_path: Any) -> tuple[Any, MemoryReactorClock]:
    reactor = MemoryReactorClock()
    svc = service.BrokerService(str(tmp_path / "data"), Limits(sys_interval=0),
                                reactor=reactor)
    return svc, reactor


def _clients(svc: Any) -> list[StringTransport]:
    """Three MQTT sockets: one that never sends CONNECT, one connected, one closing
    after its DISCONNECT (not yet lost)."""
    transports = []
    for packets in ([], [Connect("MQTT", 4, "on", True, 0)],
                    [Connect("MQTT", 4, "off", True, 0), Disconnect()]):
        proto = svc.mqtt_factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        if packets:
            proto.dataReceived(b"".join(encode(p) for p in packets))
        transports.append(transport)
    assert [t.disconnecting for t in transports] == [False, False, True]
    assert len(svc.mqtt_factory.opened.all()) == 3
    return transports


def test_stop_closes_a_client_that_never_sent_connect(tmp_path: Any) -> None:
    """Stopping the service closes every open MQTT socket, the one that never sent
    CONNECT and the connected one too."""
    svc, reactor = _service(tmp_path)
    silent, live, _closing = _clients(svc)
    stopped = Deferred.fromCoroutine(svc._stop())
    reactor.advance(0)
    assert stopped.called
    assert silent.disconnecting and live.disconnecting


def test_losing_the_leadership_aborts_every_mqtt_client(tmp_path: Any,
                                                        monkeypatch: Any) -> None:
    """``_stop_serving`` aborts each open MQTT socket once: before CONNECT, connected
    and closing."""
    statuses: list[int] = []
    monkeypatch.setattr(service, "_exit_status_after_stop", statuses.append)
    svc, _reactor = _service(tmp_path)
    transports = _clients(svc)
    aborted: list[StringTransport] = []
    for t in transports:
        t.abortConnection = lambda t=t: aborted.append(t)  # type: ignore[method-assign]
    svc._stop_serving("the serving lock's connection failed (gone)")
    assert sorted(map(id, aborted)) == sorted(map(id, transports))
    assert statuses == [1]
