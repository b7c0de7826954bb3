"""MQTT over WebSockets in gateway mode: the broker's WebSocket front
(``mqtt.websocket``: autobahn's handshake, the Origin rule, the stream transport) in
front of the gateway's MQTT protocol instead of the broker's.

What it owns: ``WebSocketSide``, what ``MQTTWebSocketFactory`` reads of the MQTT
factory it is given (``buildProtocol``, ``broker.limits``, the batch brackets, which
mean nothing here, a meter for what it refuses, and ``slots``: a socket in its HTTP
upgrade is counted under the gateway's --max-connections from its accept, in the
factory's ``upgrading``, until its upgrade ends), over a ``GatewayFactory``.

What it must not do: know MQTT or WebSockets itself (the two modules it joins do).
"""

from __future__ import annotations

from typing import Any

from mqttamqp.core.limits import Limits
from mqttamqp.gateway.frontend import GatewayFactory

__all__ = ["WebSocketSide"]


class _NoBatches:
    """The broker's ``limits`` and batch brackets, as the WebSocket front reads them: a
    gateway commits nothing, so a socket read is no batch."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def begin_batch(self) -> None:
        pass

    def end_batch(self) -> None:
        pass


class _Meter:
    """What the WebSocket front counts: handshakes refused, protocol errors, limits."""

    def __init__(self) -> None:
        self.refused_count = 0
        self.protocol_errors = 0
        self.limit_hits: dict[str, int] = {}

    def refused(self) -> None:
        self.refused_count += 1

    def protocol_error(self) -> None:
        self.protocol_errors += 1

    def limit_hit(self, name: str) -> None:
        self.limit_hits[name] = self.limit_hits.get(name, 0) + 1


class WebSocketSide:
    """The MQTT factory a ``MQTTWebSocketFactory`` serves, in gateway mode."""

    def __init__(self, factory: GatewayFactory) -> None:
        self.factory = factory
        self.broker = _NoBatches(factory.limits)
        self.meter = _Meter()
        self.slots = self   # (``mqtt.websocket.Upgrading``'s four calls)

    def buildProtocol(self, addr: Any) -> Any:
        return self.factory.buildProtocol(addr)

    def admit(self, peer: str) -> bool:
        return not self.factory.full("MQTT over WebSocket", peer)

    def hold(self, ws: Any) -> None:
        self.factory.upgrading.add(ws)

    def release(self, ws: Any) -> None:
        self.factory.upgrading.discard(ws)

    def hand_over(self, ws: Any, peer: str) -> None:
        # (no connection rate here: the place is the gateway connection's count)
        self.factory.upgrading.discard(ws)
