"""Topics and subscriptions: the topic tree one level at a time (with message
rates), every session's subscriptions, and the shared subscription groups.
"""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console import views
from mqttamqp.console.web import Area, Gate, HTTPError, Pages, flag, number, param
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock
from mqttamqp.core.topics import validate_topic_name

__all__ = ["TopicsApp"]


class TopicsApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, broker: Broker, clock: Clock) -> None:
        super().__init__(gate, pages)
        self.broker = broker
        self.rates = views.TopicRates(clock.seconds)

    def _topics(self, request: Request) -> dict[str, Any]:
        prefix = param(request, "prefix").strip("/")
        if prefix and validate_topic_name(prefix) is not None:
            raise HTTPError(400, f"invalid topic prefix: {validate_topic_name(prefix)}")
        return views.topic_tree(self.broker.view, prefix, self.rates)

    @app.route("/topics", methods=["GET"])
    def topics_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        tree = self._topics(request)
        partial = flag(request, "partial")
        return self.pages.render(request, "_topic_rows.html" if partial else "topics.html",
                                 auth, nav="topics", tree=tree)

    @app.route("/api/topics", methods=["GET"])
    def topics_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, self._topics(request))

    def _subscriptions(self, request: Request) -> tuple[dict[str, Any], views.Page]:
        query = param(request, "q")[:200]
        page = views.list_subscriptions(self.broker.view, query, number(request, "page", 1),
                                        number(request, "per_page", 50))
        return {"query": query, "sort": "", "desc": False, "per_page": page.per_page}, page

    @app.route("/subscriptions", methods=["GET"])
    def subscriptions_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        args, page = self._subscriptions(request)
        return self.pages.render(request, "subscriptions.html", auth, nav="subscriptions",
                                 page=page, args=args, groups=self._shared_groups())

    @app.route("/api/subscriptions", methods=["GET"])
    def subscriptions_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, self._subscriptions(request)[1].as_json())

    def _shared_groups(self) -> list[dict[str, Any]]:
        return [{"name": g.name, "filter": g.topic_filter, "strategy": g.strategy,
                 "members": [{"client_id": c, "given": n, "online": on}
                             for c, n, on in g.members]}
                for g in self.broker.view.shared_groups()]

    @app.route("/api/shared", methods=["GET"])
    def shared_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, {"items": self._shared_groups()})
