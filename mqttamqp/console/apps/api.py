"""The JSON API's own routes: its index (every ``/api/`` route the console has,
described by ``mqttamqp.console.apidoc``) and who is calling.
"""

from __future__ import annotations

from collections.abc import Callable

from klein import Klein
from twisted.web.server import Request
from werkzeug.routing import Map

from mqttamqp.console.apidoc import api_index
from mqttamqp.console.web import Area, Gate, Pages

__all__ = ["ApiApp"]


class ApiApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, routes: Callable[[], Map]) -> None:
        super().__init__(gate, pages)
        self.routes = routes      # the whole console's URL map, not only this app's

    @app.route("/api/", methods=["GET"])
    def api_index(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, api_index(self.routes()))

    @app.route("/api/whoami", methods=["GET"])
    def whoami_api(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=True)
        return self.pages.json(request, {
            "user": auth.user, "via": "token" if auth.token else "session",
            "role": auth.role, "read_only": auth.read_only,
            "csrf_token": auth.session.csrf if auth.session is not None else None})
