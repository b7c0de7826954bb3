"""The bridges of a broker as one Twisted service: each started once the broker's
state is loaded (a child of ``BrokerService``, started after it), stopped with it.

What it owns: building each ``Bridge`` with a TCP connector on the reactor.  What it
must not do: anything of a bridge itself (``bridge``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.application.service import Service
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import IReactorTCP
from twisted.internet.protocol import Factory

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.client import BridgeClient
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.core.broker import Broker

__all__ = ["BridgeService"]


class _Once(Factory):
    """The factory of one connection attempt (quiet: no line per attempt)."""

    noisy = False

    def __init__(self, client: BridgeClient) -> None:
        self.client = client

    def buildProtocol(self, addr: Any) -> BridgeClient:
        return self.client


class BridgeService(Service):
    """Every ``[[bridge]]`` of the configuration."""

    def __init__(self, broker: Broker, reactor: Any, settings: Sequence[BridgeSettings]
                 ) -> None:
        self.broker = broker
        self.reactor = reactor
        self.bridges = [Bridge(broker, reactor, s, self._connector(s)) for s in settings]

    def _connector(self, settings: BridgeSettings) -> Any:
        reactor: IReactorTCP = self.reactor

        def connect(client: BridgeClient) -> Any:
            endpoint = TCP4ClientEndpoint(reactor, settings.host, settings.port,
                                          timeout=max(1, int(settings.connect_timeout)))
            return endpoint.connect(_Once(client))  # type: ignore[arg-type]

        return connect

    def startService(self) -> None:
        super().startService()   # type: ignore[no-untyped-call]
        for bridge in self.bridges:
            bridge.start()

    def stopService(self) -> None:
        for bridge in self.bridges:
            bridge.stop()
        super().stopService()   # type: ignore[no-untyped-call]
