"""What a gateway shows of itself (its console and its metrics): its clients, its
upstream connections and its counters, as plain dicts read at the moment asked.

What it owns: the shape of those dicts (``GatewayFigures``), read from the MQTT
factory (``frontend``) and the pool (``pool``); the names of the causes a CONNECT is
refused for (by CONNACK code, ``REFUSAL_CAUSES``); the bound of a client listing
(``MAX_PAGE``).

What it must not do: change anything it reads, keep any state, or know the console
or the metrics library: they take these dicts (``console.gatewaysite``,
``ops.gatewaymetrics``), through the wiring outside this package (``gatewayweb``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mqttamqp.core.clock import Clock

if TYPE_CHECKING:
    from mqttamqp.gateway.frontend import GatewayFactory, GatewayProtocol
    from mqttamqp.gateway.pool import UpstreamPool

__all__ = ["GatewayFigures", "REFUSAL_CAUSES", "MAX_PAGE", "refusal_cause"]

MAX_PAGE = 500   # clients in one listing (a gateway may hold tens of thousands)

# CONNACK code (3.1.1 and MQTT 5) -> the cause it is counted under.
REFUSAL_CAUSES: dict[int, str] = {
    1: "protocol_version", 0x84: "protocol_version",
    2: "client_id", 0x85: "client_id",
    3: "server_unavailable", 0x88: "server_unavailable",
    4: "bad_credentials", 0x86: "bad_credentials",
    5: "not_authorized", 0x87: "not_authorized",
    0x8C: "authentication_method",
}
CAUSES = ("authentication_method", "bad_credentials", "client_id", "not_authorized",
          "other", "protocol_version", "server_unavailable")
_LEVELS = {3: "MQTT 3.1", 4: "MQTT 3.1.1", 5: "MQTT 5"}


def refusal_cause(code: int) -> str:
    return REFUSAL_CAUSES.get(code, "other")


class GatewayFigures:
    """The figures of one gateway (``factory``, ``pool``), read on the reactor."""

    def __init__(self, factory: GatewayFactory, pool: UpstreamPool, clock: Clock,
                 started: float | None = None) -> None:
        self.factory = factory
        self.pool = pool
        self.clock = clock
        self.started = clock.seconds() if started is None else started

    def _slot_index(self) -> dict[int, int]:
        return {id(s.conn): s.index for s in self.pool.slots if s.conn is not None}

    def _client(self, p: GatewayProtocol, slots: dict[int, int]) -> dict[str, Any]:
        channel = p.channel
        return {
            "client_id": p.client_id,
            "protocol": _LEVELS.get(p.level, f"MQTT level {p.level}"),
            "address": p.peer,
            "state": p.rules.state.name.lower(),
            "connected_since": p.since,
            "inflight": len(p.outbound.inflight) + len(p.outbound.releasing),
            "awaiting_core": len(p.acks),
            "clean_session": p.clean,
            "upstream": slots.get(id(channel.conn)) if channel is not None else None,
        }

    def clients(self, query: str = "", page: int = 1, per_page: int = 50) -> dict[str, Any]:
        """One page of the clients (sorted by client id; ``query`` a part of the id or
        address), at most ``MAX_PAGE``."""
        per_page = max(1, min(per_page, MAX_PAGE))
        page = max(1, page)
        found = [p for p in self.factory.connections
                 if not query or query in p.client_id or query in p.peer]
        found.sort(key=lambda p: (p.client_id, p.peer))
        slots = self._slot_index()
        start = (page - 1) * per_page
        items = [self._client(p, slots) for p in found[start:start + per_page]]
        return {"items": items, "total": len(found), "page": page, "per_page": per_page,
                "query": query}

    def links(self) -> list[dict[str, Any]]:
        """Each upstream connection: state, address, clients on it, last error,
        reconnects."""
        on: dict[int, int] = {}
        for p in self.factory.connections:
            if p.channel is not None:
                key = id(p.channel.conn)
                on[key] = on.get(key, 0) + 1
        rows = []
        for s in self.pool.slots:
            conn = s.conn
            rows.append({
                "index": s.index,
                "state": s.state,
                "address": self.pool.upstream.display,
                "container": f"{self.pool.container_id}/{s.index}",
                "clients": on.get(id(conn), 0) if conn is not None else 0,
                "sessions": conn.load if conn is not None and s.state == "open" else 0,
                "since": s.since if s.state == "open" else 0.0,
                "last_error": s.last_error,
                "reconnects": max(0, s.opens - 1),
                "failed_attempts": s.attempts,
            })
        return rows

    def counters(self) -> dict[str, Any]:
        """The gateway's totals."""
        f = self.factory
        refused = dict.fromkeys(CAUSES, 0)
        for code, n in f.refused.items():
            refused[refusal_cause(code)] += n
        return {
            "clients": len(f.connections),
            "connected": sum(1 for p in f.connections if p.channel is not None),
            "upstream_connections": len(self.pool.slots),
            "upstream_up": sum(1 for s in self.pool.slots if s.state == "open"),
            "upstream_opens": self.pool.connects,
            "upstream_losses": self.pool.losses,
            "connects": f.connected_total,
            "connects_refused": refused,
            "connections_refused": f.refused_connections,
            "upstream_full": self.pool.full,
            "messages_to_core": f.published,
            "messages_to_clients": f.delivered,
            "reading_pauses": f.reading_pauses,
            "held_deliveries": f.held_deliveries,
            "cut_after_grace": f.close_grace.cut,
            "started": self.started,
            "upstream": self.pool.upstream.display,
        }
