"""Bridges: each ``[[bridge]]`` of the configuration with its state, remote, last
error, connected since, messages out and in, and its out backlog (page and
``/api/bridges``).

What it owns: the two routes.  What it must not do: import the bridges (the console
reads the core's façade and value types only): the figures come from the function
``ConsoleContext.bridges`` hands it (``mqttamqp.bridge.service.Bridges.figures``), and
no bridge is changed from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console.web import Area, Gate, Pages

__all__ = ["BridgesApp", "no_bridges"]

Figures = Callable[[], list[dict[str, Any]]]


def no_bridges() -> list[dict[str, Any]]:
    """The figures when no bridge is configured."""
    return []


class BridgesApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, figures: Figures) -> None:
        super().__init__(gate, pages)
        self.figures = figures

    def _view(self) -> dict[str, Any]:
        items = self.figures()
        return {"items": items,
                "totals": {"bridges": len(items),
                           "connected": sum(1 for b in items if b["state"] == "connected"),
                           "backlog_messages": sum(b["backlog_messages"] for b in items)}}

    @app.route("/bridges", methods=["GET"])
    def bridges_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "bridges.html", auth, nav="bridges", b=self._view())

    @app.route("/api/bridges", methods=["GET"])
    def bridges_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, self._view())
