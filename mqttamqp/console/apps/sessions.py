"""Sessions and wills: persistent sessions online and offline, the stored wills
(MQTT and AMQP), and clearing a session, firing or discarding a will.
"""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console import views
from mqttamqp.console.actions import ConsoleActions
from mqttamqp.console.web import (
    ActionCall,
    Area,
    Gate,
    Pages,
    action_routes,
    flag,
    list_args,
    param,
)
from mqttamqp.core.broker import Broker

__all__ = ["SessionsApp"]


class SessionsApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, broker: Broker,
                 actions: ConsoleActions) -> None:
        super().__init__(gate, pages)
        self.broker = broker
        self.actions = actions

    @app.route("/sessions", methods=["GET"])
    def sessions_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        args = list_args(request, views.SESSION_SORTS)
        state = param(request, "state", "all")
        page = views.list_sessions(self.broker.view, state=state, **args)
        partial = flag(request, "partial")
        return self.pages.render(request,
                                 "_session_rows.html" if partial else "sessions.html",
                                 auth, nav="sessions", page=page, args=args, state=state,
                                 extra_state=state)

    @app.route("/api/sessions", methods=["GET"])
    def sessions_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        page = views.list_sessions(self.broker.view, state=param(request, "state", "all"),
                                   **list_args(request, views.SESSION_SORTS))
        return self.pages.json(request, page.as_json())

    def _wills(self) -> list[dict[str, Any]]:
        return [views.will_json(w) for w in self.broker.view.wills()]

    @app.route("/wills", methods=["GET"])
    def wills_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "wills.html", auth, nav="wills",
                                 wills=self._wills())

    @app.route("/api/wills", methods=["GET"])
    def wills_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, {"items": self._wills()})

    # -- actions ------------------------------------------------------------------------

    def _clear_session(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.clear_session(auth.user, param(request, "client_id"))

    def _fire_will(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.fire_will(auth.user, param(request, "owner"))

    def _discard_will(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.discard_will(auth.user, param(request, "owner"))

    action_routes(app, (
        ("/sessions/clear", _clear_session, "/sessions"),
        ("/wills/fire", _fire_will, "/wills"),
        ("/wills/discard", _discard_will, "/wills"),
    ))
