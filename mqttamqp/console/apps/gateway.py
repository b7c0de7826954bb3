"""A gateway's own pages (``--web`` in gateway mode, docs/gateway.md): its upstream
connections with its counters (``/``, ``/api/gateway``) and its MQTT clients
(``/clients``, ``/api/clients``: paged, searchable by client id or address).

What it owns: the four routes.  What it must not do: import the gateway or the
core's broker (a gateway has none): the figures come from the object
``GatewayConsole`` hands it (``mqttamqp.gateway.figures.GatewayFigures``: ``counters``,
``links``, ``clients``), and nothing is changed from here.
"""

from __future__ import annotations

from typing import Any, Protocol

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console.web import Area, Gate, Pages, number, param

__all__ = ["GatewayApp", "GatewaySource"]


class GatewaySource(Protocol):
    """What the pages read (``GatewayFigures``)."""

    def counters(self) -> dict[str, Any]: ...

    def links(self) -> list[dict[str, Any]]: ...

    def clients(self, query: str = "", page: int = 1, per_page: int = 50
                ) -> dict[str, Any]: ...


class GatewayApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, source: GatewaySource) -> None:
        super().__init__(gate, pages)
        self.source = source

    def _overview(self) -> dict[str, Any]:
        return {"counters": self.source.counters(), "links": self.source.links()}

    def _clients(self, request: Request) -> dict[str, Any]:
        return self.source.clients(param(request, "q")[:200], number(request, "page", 1),
                                   number(request, "per_page", 50))

    @app.route("/", methods=["GET"])
    def upstream_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "gateway_upstream.html", auth, nav="upstream",
                                 g=self._overview())

    @app.route("/api/gateway", methods=["GET"])
    def upstream_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, self._overview())

    @app.route("/clients", methods=["GET"])
    def clients_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "gateway_clients.html", auth, nav="clients",
                                 c=self._clients(request))

    @app.route("/api/clients", methods=["GET"])
    def clients_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, self._clients(request))
