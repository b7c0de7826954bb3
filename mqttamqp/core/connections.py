"""Read models of live connections, for the console and the JSON API.

Every live connection (an MQTT socket after CONNACK, an AMQP connection after
open) registers with the broker and can describe itself as a ``ConnectionInfo``;
AMQP connections list their links as ``LinkInfo``.  Nothing here changes state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["LinkInfo", "ConnectionInfo", "InspectableConnection"]


@dataclass(frozen=True)
class LinkInfo:
    name: str
    role: str                  # "sender" or "receiver", from the broker's side
    address: str
    snd_settle_mode: str       # "unsettled", "settled" or "mixed"
    rcv_settle_mode: str       # "first" or "second"
    credit: int
    unsettled: int
    delivered: int


@dataclass(frozen=True)
class ConnectionInfo:
    key: str                   # unique per live connection ("mqtt:<client id>", "amqp:<n>")
    client_id: str             # MQTT client id or AMQP container id
    protocol: str              # "mqtt3.1", "mqtt3.1.1" or "amqp"
    remote: str                # "host:port"
    user: str | None
    connected_since: float
    keepalive: int             # seconds (AMQP: idle time-out)
    clean_session: bool | None
    session_id: str | None  # the session it is attached to, if any
    will_owners: tuple[str, ...] = ()   # keys into Broker.wills this connection owns
    links: tuple[LinkInfo, ...] = field(default=())


class InspectableConnection(Protocol):
    def info(self) -> ConnectionInfo:
        ...

    def close(self, reason: str) -> None:
        ...
