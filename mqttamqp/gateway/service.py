"""The process in gateway mode (``twistd mqttamqp --upstream amqp://core``): MQTT
listeners served through the upstream pool, and nothing else.

What it owns: building the pool (TCP, or TLS checked with service-identity for
``amqps://``), the MQTT factory of the gateway (with the broker's authenticator over
the user store of ``--data`` and ``--users``), the listeners of ``--mqtt`` and
``--mqtt-ws``, starting the pool with the listeners and closing clients and
connections at the end.  ``--mqtt-ws`` listeners put the broker's WebSocket front
(``mqtt.websocket``) before the same MQTT side (``websocket``).

What it must not do: open a store, build the core's broker, or start the broker's
console, archive, bridges or AMQP listeners: a gateway keeps no state
(``.importlinter`` checks that nothing here imports them).  Its own console and
metrics are built outside this package (``mqttamqp.gatewayweb``) and handed to
``add_listener``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, ClassVar

from twisted.application import service
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from mqttamqp import logbridge
from mqttamqp.core.limits import Limits
from mqttamqp.gateway.engine import UpstreamConnection
from mqttamqp.gateway.frontend import GatewayFactory
from mqttamqp.gateway.pool import UpstreamPool
from mqttamqp.gateway.target import Upstream, parse_upstream, tls_options
from mqttamqp.listeners import ListenerService
from mqttamqp.net.fdtable import grow_descriptor_table
from mqttamqp.security.storeauth import StoreAuthenticator
from mqttamqp.security.userstore import UserStore

__all__ = ["GatewayService", "make_gateway"]


class _Once(Factory):
    """The factory of one connection attempt (quiet: no line per attempt)."""

    noisy = False

    def __init__(self, conn: UpstreamConnection) -> None:
        self.conn = conn

    def buildProtocol(self, addr: Any) -> UpstreamConnection:
        return self.conn


def _connector(reactor: Any, upstream: Upstream, timeout: float) -> Any:
    endpoint: Any = TCP4ClientEndpoint(reactor, upstream.host, upstream.port,
                                       timeout=max(1, int(timeout)))
    if upstream.tls:
        endpoint = wrapClientTLS(tls_options(upstream), endpoint)

    def connect(conn: UpstreamConnection) -> Deferred[Any]:
        d: Deferred[Any] = endpoint.connect(_Once(conn))
        return d

    return connect


class GatewayService(service.MultiService):
    """A gateway: MQTT in front, the core's AMQP services behind."""

    log: ClassVar[Logger] = Logger()

    def __init__(self, upstream: Upstream, limits: Limits, connections: int,
                 idle_timeout: float, reactor: Any = None, max_clients: int = 150) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.reactor = reactor if reactor is not None else global_reactor
        self.upstream = upstream
        container = f"mqttamqp-gateway:{socket.gethostname()}:{os.getpid()}"
        self.pool = UpstreamPool(
            self.reactor, upstream, _connector(self.reactor, upstream, limits.connect_timeout),
            connections, container, idle_timeout,
            max(512, min(limits.max_packet_size + 1024, 1 << 20)), max_clients)
        self.mqtt_factory = GatewayFactory(self.pool, self.reactor, limits,
                                           limits.max_inflight)
        self.listeners: list[ListenerService] = []
        self.ws_factory: Any = None
        self.max_connections = limits.max_connections

    def add_mqtt_listener(self, description: str) -> ListenerService:
        svc = ListenerService("MQTT", description, self.mqtt_factory, self.reactor, "anyone")
        svc.setServiceParent(self)  # type: ignore[no-untyped-call]
        self.listeners.append(svc)
        return svc

    def add_mqtt_ws_listener(self, description: str, allowed_origins: Sequence[str] = ()
                             ) -> ListenerService:
        """MQTT over WebSockets, the broker's WebSocket front over this gateway."""
        from mqttamqp.gateway.websocket import WebSocketSide
        from mqttamqp.mqtt.websocket import MQTTWebSocketFactory, OriginRule

        if self.ws_factory is None:
            side: Any = WebSocketSide(self.mqtt_factory)
            self.ws_factory = MQTTWebSocketFactory(
                side, self.reactor, OriginRule.from_options(allowed_origins), self.reactor)
        svc = ListenerService("MQTT-WS", description, self.ws_factory, self.reactor, "anyone")
        svc.setServiceParent(self)  # type: ignore[no-untyped-call]
        self.listeners.append(svc)
        return svc

    def add_listener(self, kind: str, description: str, factory: Any,
                     access: str = "users") -> ListenerService:
        """Another listener started with the MQTT ones (the console, the metrics:
        ``mqttamqp.gatewayweb``, outside this package, builds their sites)."""
        svc = ListenerService(kind, description, factory, self.reactor, access)
        svc.setServiceParent(self)  # type: ignore[no-untyped-call]
        self.listeners.append(svc)
        return svc

    def startService(self) -> None:
        logbridge.install()
        grow_descriptor_table(self.max_connections)   # (``net.fdtable``: no stall at accept)
        for listener in self.listeners:
            listener.listen()
        self.log.info("gateway mode: MQTT clients are served by the core at {u} over "
                      "{n} AMQP connections; this process keeps no session state",
                      u=self.upstream.display, n=len(self.pool.slots))
        self.pool.start()
        super().startService()  # type: ignore[no-untyped-call]

    def stopService(self) -> Deferred[None]:
        self.mqtt_factory.close_all("the gateway stops")
        self.pool.stop()
        d: Deferred[None] = super().stopService()  # type: ignore[no-untyped-call]
        return d


def _authenticator(options: Any) -> StoreAuthenticator:
    """MQTT clients are checked as a broker checks them: the user store of ``--data``
    (users.json) and a ``--users`` file, anonymous clients by the same rule."""
    legacy = None
    if options["users"]:
        from mqttamqp.security.users import UserFile

        legacy = UserFile(options["users"], global_reactor)
    return StoreAuthenticator(UserStore(os.path.abspath(options["data"])),
                              bool(options["allow-anonymous"]), legacy, global_reactor)


def make_gateway(options: Any, limits: Limits) -> GatewayService:
    """The gateway of ``options`` (``--upstream`` given; checked when parsed)."""
    svc = GatewayService(parse_upstream(options["upstream"]), limits,
                         options["upstream-connections"], options["amqp-idle-timeout"],
                         max_clients=options["upstream-max-clients"])
    svc.mqtt_factory.authenticator = _authenticator(options)
    for description in options["mqtt"]:
        svc.add_mqtt_listener(description)
    for description in options["mqtt-ws"]:
        svc.add_mqtt_ws_listener(description, options["ws-allowed-origin"])
    return svc
