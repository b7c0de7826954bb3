"""AMQP 0.9.1's exchanges: the list of exchanges with their bindings in and out
(page and ``/api/exchanges``), one exchange (``/api/exchanges/exchange``), and
what an operator does to them: delete a declared exchange, remove a binding.
What each shows and does is ``mqttamqp.console.exchanges``.
"""

from __future__ import annotations

from collections.abc import Callable

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console.exchanges import ExchangeActions, exchange_detail, exchange_list
from mqttamqp.console.web import ActionCall, Area, Gate, HTTPError, Pages, action_routes, param
from mqttamqp.core.broker import Broker

__all__ = ["ExchangesApp"]


class ExchangesApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, broker: Broker,
                 audit: Callable[..., None]) -> None:
        super().__init__(gate, pages)
        self.broker = broker
        self.actions = ExchangeActions(broker, audit)

    @app.route("/exchanges", methods=["GET"])
    def exchanges_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "exchanges.html", auth, nav="exchanges",
                                 x=exchange_list(self.broker))

    @app.route("/api/exchanges", methods=["GET"])
    def exchanges_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, exchange_list(self.broker))

    @app.route("/api/exchanges/exchange", methods=["GET"])
    def exchange_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        found = exchange_detail(self.broker, param(request, "name"))
        if found is None:
            raise HTTPError(404, "no such exchange")
        return self.pages.json(request, found)

    # -- actions ------------------------------------------------------------------------

    def _delete(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.delete(auth.user, param(request, "name"))

    def _unbind(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.unbind(
            auth.user, param(request, "source"), param(request, "destination"),
            param(request, "destination_kind", "queue"), param(request, "routing_key"),
            param(request, "arguments"))

    action_routes(app, (
        ("/exchanges/delete", _delete, "/exchanges"),
        ("/exchanges/unbind", _unbind, "/exchanges"),
    ))
