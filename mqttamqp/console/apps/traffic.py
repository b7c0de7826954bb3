"""Traffic: the report job's summary and the archive's figures (read from files,
off the reactor), and starting the report job now.
"""

from __future__ import annotations

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console.actions import ConsoleActions
from mqttamqp.console.context import RunInThread
from mqttamqp.console.traffic import TrafficSource
from mqttamqp.console.web import ActionCall, Area, Gate, Pages, action_routes

__all__ = ["TrafficApp"]


class TrafficApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, source: TrafficSource,
                 actions: ConsoleActions, run_in_thread: RunInThread) -> None:
        super().__init__(gate, pages)
        self.source = source
        self.actions = actions
        self.run_in_thread = run_in_thread

    @app.route("/traffic", methods=["GET"])
    async def traffic_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        view = await self.run_in_thread(self.source.view)  # reads files: off the reactor
        return self.pages.render(request, "traffic.html", auth, nav="traffic", t=view)

    @app.route("/api/traffic", methods=["GET"])
    async def traffic_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, await self.run_in_thread(self.source.view))

    def _run_report(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.run_report(auth.user)

    action_routes(app, (("/traffic/run-report", _run_report, "/traffic"),))
