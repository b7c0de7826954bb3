"""The open connections of an MQTT listener factory, found without a table of
their own.

What it owns: ``OpenConnections``, the factory's view of its open connections
(admitted and not yet lost: before CONNECT, connected, closing) as
``--max-connections`` counts them and the shutdown sweeps reach them.  A table of
every open connection cost an idle client 40-76 bytes of RSS at 5,000 (its entry,
and the old tables a growing dict leaves in the C heap), so it is two tables that
exist anyway: the registry's live table (``LiveConnections.mqtt``, an MQTT
connection from its CONNACK until it closes) and ``unregistered``, every other
open connection (before CONNACK, and closing after it until lost), each with why it
closes (a protocol error's reason, read when it is lost: not a slot of every
connection), and every WebSocket socket still in its HTTP upgrade (the
``MQTTWebSocketProtocol``, put there and taken out by ``websocket.UpgradeSlots``:
its MQTT connection takes its place when the upgrade is done; the sweeps call its
``server_stopping`` or abort its transport as they do a connection's).  Idle
clients are all in the first; the second holds a connect storm's moment, and gives
its table back once the storm is over.

The connection keeps the two apart (``protocol.MQTTProtocol``): its
``connectionMade`` puts it in ``unregistered`` itself (``count`` and the entry
inlined: no call on a connect storm's path), ``registered`` right after the
registry's ``register_client`` and at ``connectionLost``, ``closing`` when it closes
after its CONNACK.  Not every close takes the same way: ``_lose`` calls ``closing``
after the registry's ``unregister_client``, a protocol violation (``_violation``)
calls it before; an abort skips ``_lose`` (a server_stopping before CONNACK or to a
3.1.1 client, the HA sweep, a refused admission, the close-grace cut), and the
connection stays in the table it was in until it is lost (``connectionLost``'s
``registered``; the registry's own unregistering).

What it must not do: close or count a connection itself (the shutdown sweep and
``Gate.admit`` do), or touch the registry's table (``LiveConnections`` owns it).
"""

from __future__ import annotations

import sys
from typing import Any

from mqttamqp.core.clients.live import LiveConnections

__all__ = ["OpenConnections"]

# An empty ``unregistered`` keeps a table up to this size (~100 entries): a slow
# trickle of connects does not make one again for each.
_KEPT_TABLE_BYTES = 4096
# Held at most this many since it was last empty, it cannot have grown past that
# (an emptied dict's table reaches 4 KiB only after a resize at 86 entries or
# more: 4,688 B by sys.getsizeof on 3.11; 43 entries leave 2,264): not measured.
_FEW = 8


class OpenConnections:
    """A listener factory's open MQTT connections: the live table's (those whose
    ``factory`` is ``owner``) and ``unregistered``."""

    __slots__ = ("live", "most", "owner", "unregistered")

    def __init__(self, live: LiveConnections, owner: object) -> None:
        self.live = live
        self.owner = owner
        # (the value: why it closes, a protocol error's reason, for its end)
        self.unregistered: dict[Any, str] = {}
        # (about the most ``unregistered`` held since it was last empty: every entry
        # leaves through ``registered``, which notes it)
        self.most = 0

    def count(self) -> int:
        """How many are open (what ``--max-connections`` bounds; the live table's
        MQTT connections of every factory of the broker: the TCP and WebSocket
        listeners share one; and the WebSocket sockets in their upgrade)."""
        return len(self.live.mqtt) + len(self.unregistered)

    def closing(self, connection: Any, detail: str | None = None) -> None:
        """``connection`` closes (out of the live table, or never in it) and is not
        lost yet; ``detail``: why (a protocol error's reason, kept here rather than
        in a slot of every connection), or None to keep what was said."""
        if detail is None:
            self.unregistered.setdefault(connection, "")
        else:
            self.unregistered[connection] = detail

    def registered(self, connection: Any) -> str:
        """``connection`` is in the live table now (CONNACK), or lost: the detail
        of why it closed (``closing``), "" if none."""
        unregistered = self.unregistered
        detail = unregistered.pop(connection, "")
        if not unregistered:
            # (a storm handled a connect at a time empties it at each: no measuring)
            if self.most:
                if self.most > _FEW and sys.getsizeof(unregistered) > _KEPT_TABLE_BYTES:
                    unregistered.clear()   # (a storm's table given back)
                self.most = 0
        elif len(unregistered) >= self.most:
            self.most = len(unregistered) + 1
        return detail

    def all(self) -> list[Any]:
        """Every open connection of ``owner``, each once (a list: the sweep closes
        them as it goes)."""
        owner = self.owner
        found: dict[Any, None] = {
            c: None for c in self.live.mqtt.values() if getattr(c, "factory", None) is owner}
        found.update(self.unregistered)
        return list(found)
