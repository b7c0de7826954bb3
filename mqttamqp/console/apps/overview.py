"""The overview: the front page, its JSON twin, and the live feed that keeps it
current (Server-Sent Events of the broker's counters and rates, ``StatsFeed``).
"""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.web.server import Request

from mqttamqp.console import views
from mqttamqp.console.context import ConsoleContext
from mqttamqp.console.feed import EventStream, StatsFeed
from mqttamqp.console.web import Area, Gate, HTTPError, Pages
from mqttamqp.core.clock import Clock

__all__ = ["OverviewApp"]


class OverviewApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, context: ConsoleContext, clock: Clock) -> None:
        super().__init__(gate, pages)
        self.context = context
        self.broker = context.broker
        self.clock = clock
        self.feed = StatsFeed(clock, self._live_snapshot, self._counters)

    def _overview(self, history: bool) -> dict[str, Any]:
        data = views.overview(self.context, self.broker.view, self.clock.seconds(),
                              self.feed.rates)
        if history:
            data["history"] = list(self.feed.history)
        return data

    def _live_snapshot(self) -> dict[str, Any]:
        return views.overview(self.context, self.broker.view, self.clock.seconds(),
                              self.feed.rates, include_storage=True)

    def _counters(self) -> tuple[int, int]:
        stats = self.broker.stats
        return stats.messages_received, stats.messages_sent

    @app.route("/", methods=["GET"])
    def overview_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "overview.html", auth, nav="overview",
                                 o=self._overview(False))

    @app.route("/api/overview", methods=["GET"])
    def overview_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, self._overview(True))

    @app.route("/api/events", methods=["GET"])
    def events(self, request: Request) -> Deferred[None] | bytes:
        auth = self.gate.require(request, api=True)
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"x-accel-buffering", b"no")
        stream = EventStream(request, self.gate.still_allowed(auth))
        if not self.feed.subscribe(stream):
            raise HTTPError(503, "too many live streams open")
        return stream.done
