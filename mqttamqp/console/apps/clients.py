"""Clients: who is connected (MQTT and AMQP, filtered, sorted, paged), one client's
detail, and what an operator does to clients: force the will, disconnect, debug
its packets, act on many at once, ban and lift a ban.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console import views
from mqttamqp.console.actions import ActionResult, ConsoleActions
from mqttamqp.console.web import (
    ActionCall,
    Area,
    Auth,
    Gate,
    HTTPError,
    Pages,
    action_routes,
    flag,
    list_args,
    number,
    param,
    param_list,
)
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock

__all__ = ["ClientsApp"]


class ClientsApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, broker: Broker, actions: ConsoleActions,
                 clock: Clock) -> None:
        super().__init__(gate, pages)
        self.broker = broker
        self.actions = actions
        self.clock = clock
        self.rates = views.ClientRates(clock.seconds)

    def _filters(self, request: Request) -> views.ClientFilters:
        def choice(name: str, allowed: tuple[str, ...]) -> str:
            value = param(request, name)
            if value and value not in allowed:
                raise HTTPError(400, f"parameter {name} must be one of {', '.join(allowed)}")
            return value
        return views.ClientFilters(
            protocol=choice("protocol", ("mqtt", "mqtt3.1", "mqtt3.1.1", "mqtt5", "amqp",
                                         "amqp0-9-1")),
            user=param(request, "user")[:200], remote=param(request, "remote")[:200],
            kind=choice("kind", ("clean", "persistent")), will=choice("will", ("yes", "no")))

    def _clients(self, request: Request
                 ) -> tuple[dict[str, Any], views.ClientFilters, views.Page]:
        args = list_args(request, views.CLIENT_SORTS)
        filters = self._filters(request)
        page = views.list_clients(self.broker.view, filters=filters, rates=self.rates, **args)
        return args, filters, page

    @app.route("/clients", methods=["GET"])
    def clients_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        args, filters, page = self._clients(request)
        partial = flag(request, "partial")
        return self.pages.render(request, "_client_rows.html" if partial else "clients.html",
                                 auth, nav="clients", page=page, args=args,
                                 sorts=views.CLIENT_SORTS, filters=filters,
                                 extra=filters.as_params())

    @app.route("/api/clients", methods=["GET"])
    def clients_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        _, filters, page = self._clients(request)
        return self.pages.json(request, {**page.as_json(), "filters": filters.as_params()})

    def _client(self, request: Request) -> dict[str, Any] | None:
        key = param(request, "key")
        session_id = param(request, "session")
        model = self.broker.view
        if key:
            client = model.client(key)
            if client is not None:
                detail = views.client_detail(client)
                detail["rates"] = self.rates.rates(key, detail["counters"])
                return detail
            if key.startswith("mqtt:"):
                session_id = key[5:]
        if session_id:
            session = model.session(session_id)
            if session is not None:
                holder = model.client_holding(session_id)
                if holder is not None:
                    return views.client_detail(holder)
                return views.session_detail(session, model.will(session_id))
        if not key and not session_id:
            raise HTTPError(400, "give key=<connection key> or session=<client id>")
        return None

    @app.route("/client", methods=["GET"])
    def client_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        detail = self._client(request)
        partial = flag(request, "partial")
        template = "_client_live.html" if partial else "client.html"
        # A live refresh of a client that left gets a fragment saying so, not an error.
        status = 200 if detail is not None or partial else 404
        return self.pages.render(request, template, auth, status,
                                 nav="clients", c=detail,
                                 key=param(request, "key"),
                                 session_id=param(request, "session"),
                                 found=detail is not None)

    @app.route("/api/client", methods=["GET"])
    def client_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        detail = self._client(request)
        if detail is None:
            raise HTTPError(404, "no such client or session")
        return self.pages.json(request, detail)

    def _bans(self) -> list[dict[str, Any]]:
        return [views.ban_json(b, self.clock.seconds()) for b in self.broker.view.bans()]

    @app.route("/bans", methods=["GET"])
    def bans_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "bans.html", auth, nav="bans", bans=self._bans(),
                                 kind=param(request, "kind", "client_id"),
                                 value=param(request, "value"),
                                 durations=views.BAN_DURATIONS)

    @app.route("/api/bans", methods=["GET"])
    def bans_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, {"items": self._bans()})

    # -- actions ------------------------------------------------------------------------

    def _force_will(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.force_will(
            auth.user, param(request, "key"), flag(request, "keep_connected"))

    def _disconnect(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.disconnect(
            auth.user, param(request, "key"), flag(request, "with_will"))

    def _debug_client(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.debug_client(
            auth.user, param(request, "client_id"), number(request, "minutes", 10))

    def _bulk(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.bulk(
            auth.user, param(request, "action"), param_list(request, "keys"),
            flag(request, "with_will"))

    def _ban(self, request: Request) -> ActionCall:
        def act(auth: Auth) -> Awaitable[ActionResult]:
            raw = param(request, "seconds")
            try:
                seconds = float(raw) if raw and raw not in ("0", "forever") else None
            except ValueError:
                raise HTTPError(400, "seconds must be a number (or 0 / forever)") from None
            return self.actions.ban(auth.user, param(request, "kind"),
                                    param(request, "value"), seconds,
                                    param(request, "reason"), flag(request, "disconnect"))
        return act

    def _unban(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.unban(auth.user, param(request, "kind"),
                                               param(request, "value"))

    action_routes(app, (
        ("/clients/force-will", _force_will, "/clients"),
        ("/clients/disconnect", _disconnect, "/clients"),
        ("/clients/debug", _debug_client, "/clients"),
        ("/clients/bulk", _bulk, "/clients"),
        ("/bans/add", _ban, "/bans"),
        ("/bans/remove", _unban, "/bans"),
    ))
