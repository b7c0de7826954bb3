"""What the console, the archive and ``$SYS`` see of an MQTT connection: its key,
peer address, protocol label, the fields of its connect and disconnect events,
and its ``ConnectionInfo``.

``ConnectionView`` is the part of ``protocol.MQTTProtocol`` that answers the
core's ``InspectableConnection`` questions.  Read-only.
"""

from __future__ import annotations

from typing import Any

from mqttamqp.core.clients.connections import ConnectionInfo, EventFields
from mqttamqp.mqtt.connection import ConnectionRules
from mqttamqp.mqtt.link import MQTTLink
from mqttamqp.native import NO_SLOTS, mypyc_attr

__all__ = ["ConnectionView"]

# "mqtt" + version, one string for all connections (not three copies each).
_PROTOCOL_LABELS = {v: "mqtt" + v for v in ("3.1", "3.1.1", "5")}


@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectionView(MQTTLink):
    """The connection as others see it, for ``protocol.MQTTProtocol`` (a base
    class of it)."""

    __slots__ = NO_SLOTS   # (the connection has no __dict__: protocol.MQTTProtocol)

    @property
    def connected(self) -> int:
        """Twisted's ``BaseProtocol.connected``: 1 once ``makeConnection`` gave it a
        transport (nothing here reads it; the transport says it: no slot of
        ``protocol.MQTTProtocol``'s, which with ``_auth`` kept by ``_v5`` has 38, in
        pymalloc's 336-byte class)."""
        return 0 if self.transport is None else 1

    @connected.setter
    def connected(self, value: int) -> None:
        pass   # (Twisted's ``makeConnection`` sets it: the transport says it)

    def logPrefix(self) -> str:
        """Twisted's ``ILoggingContext``."""
        return self.__class__.__name__

    def makeConnection(self, transport: Any) -> None:
        """Twisted's ``BaseProtocol.makeConnection`` without setting ``connected`` (the
        setter above, a call that does nothing)."""
        self.transport = transport
        self.connectionMade()

    @property
    def peer(self) -> str:
        """The client's ``host:port``: the one representation of the address a lean
        TCP transport keeps (``net.tcp.LeanServer.peer``), the TLS layer's too (the
        TCP transport under it); for any other transport (WebSocket, tests'
        fakes) made from its address when read (a few times a CONNECT).  (``hasattr``
        first, not ``getattr`` with a default: compiled by mypyc, that one raises and
        clears an AttributeError for each attribute a transport lacks, ~1,500
        instructions; ``hasattr`` asks without one.)"""
        transport = self.transport
        if transport is None:
            return "?"
        peer = transport.peer if hasattr(transport, "peer") else None
        if type(peer) is str:
            return peer
        inner: Any = transport.transport if hasattr(transport, "transport") else None
        peer = inner.peer if hasattr(inner, "peer") else None
        if type(peer) is str:
            return peer
        client = transport.client if hasattr(transport, "client") else None
        if type(client) is tuple and len(client) >= 2:
            # (a TCP transport's accepted address: what getPeer would wrap)
            return f"{client[0]}:{client[1]}"
        address = transport.getPeer()
        host = address.host if hasattr(address, "host") else "?"
        port = address.port if hasattr(address, "port") else "?"
        return f"{host}:{port}"

    @property
    def rules(self) -> ConnectionRules:
        """The connection's rules: the connection itself (``link.MQTTLink``)."""
        return self

    @property
    def protocol_label(self) -> str:
        """``mqtt3.1``, ``mqtt3.1.1`` or ``mqtt5`` (one shared string each)."""
        return _PROTOCOL_LABELS.get(self.version) or "mqtt" + self.version

    @property
    def key(self) -> str:
        return "mqtt:" + self.client_id

    def event_fields(self) -> EventFields:
        return (self.client_id, self.peer, self.username, self.clean_session, self.keepalive)

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(
            key=self.key, client_id=self.client_id, protocol=self.protocol_label,
            remote=self.peer, user=self.username, connected_since=self.connected_since,
            keepalive=self.keepalive, clean_session=self.clean_session,
            session_id=self.client_id,
            will_owners=(self.client_id,) if self.client_id in self.broker.wills else (),
            messages_in=self.messages_in, messages_out=self.messages_out,
            bytes_in=self.bytes_in, bytes_out=self.bytes_out,
            last_activity=self._last_activity)
