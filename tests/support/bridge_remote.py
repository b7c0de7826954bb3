"""A fake remote broker for the bridge's unit tests: the connector a ``Bridge`` is
given, connecting its client to a ``StringTransport`` (no socket), with helpers to
read what the bridge sent and to answer it."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.testing import StringTransport

from mqttamqp.bridge.client import BridgeClient
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connack

__all__ = ["TABLE", "Remote", "accept", "remote_received"]

TABLE = {"name": "hq", "address": "mqtt://127.0.0.1:1884",
         "topics": ["sensors/# out 1", "commands/# in 1"], "keepalive": 10,
         "reconnect-min": 1.0, "reconnect-max": 8.0}


class Remote:
    """The connector: refuses while ``up`` is False, else connects the client to a
    ``StringTransport`` and keeps it (``transport``, ``client``)."""

    def __init__(self) -> None:
        self.up = False
        self.attempts = 0
        self.client: BridgeClient | None = None
        self.transport: StringTransport | None = None

    def __call__(self, client: BridgeClient) -> Deferred[Any]:
        self.attempts += 1
        if not self.up:
            return fail(ConnectionRefusedError("refused"))
        self.client, self.transport = client, StringTransport()
        client.makeConnection(self.transport)
        return succeed(client)

    def packets(self) -> list[Any]:
        assert self.transport is not None
        decoder = Decoder(server=True)
        decoder.feed(self.transport.value())
        self.transport.clear()
        return list(decoder)

    def send(self, packet: Any) -> None:
        assert self.client is not None
        self.client.dataReceived(encode(packet))

    def lose(self) -> None:
        assert self.client is not None and self.transport is not None
        self.client.connectionLost(None)


def accept(remote: Remote) -> bytes:
    """Answer CONNECT with CONNACK; the CONNECT's bytes (the server decoder refuses the
    bridge flag's protocol level, as it should, so tests read the bytes)."""
    assert remote.transport is not None
    raw = remote.transport.value()
    assert raw[:1] == b"\x10"
    remote.transport.clear()
    remote.send(Connack(False, 0))
    return raw


def remote_received(remote: Remote, level: int = 5) -> list[Any]:
    """The packets the bridge wrote to ``remote`` since the last read (decoded as a
    server of protocol ``level``); the transport is cleared."""
    assert remote.transport is not None
    decoder = Decoder(server=True, protocol_level=level)
    decoder.feed(remote.transport.value())
    remote.transport.clear()
    return list(decoder)
