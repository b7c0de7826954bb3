"""Retained messages: those matching a filter (paged), one with its payload, how
many a filter matches, and deleting one or all that match (after a confirmation
page that names the count).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console import views
from mqttamqp.console.actions import ActionError, ActionResult, ConsoleActions
from mqttamqp.console.web import (
    ActionCall,
    Area,
    Auth,
    Gate,
    HTTPError,
    Pages,
    action_routes,
    number,
    param,
)
from mqttamqp.core.broker import Broker
from mqttamqp.core.topics import validate_topic_filter

__all__ = ["RetainedApp"]


class RetainedApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, broker: Broker,
                 actions: ConsoleActions) -> None:
        super().__init__(gate, pages)
        self.broker = broker
        self.actions = actions

    def _retained(self, request: Request) -> tuple[str, str | None, views.Page]:
        topic_filter = param(request, "filter", "#") or "#"
        problem = validate_topic_filter(topic_filter)
        messages = [] if problem else self.broker.view.retained_matching(topic_filter)
        page = views.list_retained(messages, number(request, "page", 1),
                                   number(request, "per_page", 50))
        return topic_filter, problem, page

    @app.route("/retained", methods=["GET"])
    def retained_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        topic_filter, problem, page = self._retained(request)
        return self.pages.render(request, "retained.html", auth, nav="retained", page=page,
                                 filter=topic_filter, problem=problem,
                                 extra_filter=topic_filter,
                                 args={"query": "", "sort": "", "desc": False,
                                       "per_page": page.per_page})

    @app.route("/api/retained", methods=["GET"])
    def retained_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        topic_filter, problem, page = self._retained(request)
        if problem:
            raise HTTPError(400, f"invalid topic filter: {problem}")
        return self.pages.json(request, {"filter": topic_filter, **page.as_json()})

    def _message(self, request: Request) -> dict[str, Any]:
        topic = param(request, "topic")
        message = self.broker.view.retained(topic) if topic else None
        if message is None:
            raise HTTPError(404, "no retained message on that topic")
        return views.retained_detail(message, param(request, "view", "auto"))

    @app.route("/retained/message", methods=["GET"])
    def retained_message_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "retained_message.html", auth, nav="retained",
                                 msg=self._message(request))

    @app.route("/api/retained/message", methods=["GET"])
    def retained_message_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, self._message(request))

    def _count(self, topic_filter: str) -> int:
        try:
            return self.actions.count_retained(topic_filter)
        except ActionError as e:
            raise HTTPError(e.status, e.message) from None

    @app.route("/retained/delete-matching", methods=["GET"])
    def retained_confirm_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        topic_filter = param(request, "filter", "#") or "#"
        count = self._count(topic_filter)
        return self.pages.render(request, "retained_confirm.html", auth, nav="retained",
                                 filter=topic_filter, count=count,
                                 sample=[views.retained_row(m) for m in
                                         self.broker.view.retained_matching(topic_filter)[:10]])

    @app.route("/api/retained/count", methods=["GET"])
    def retained_count_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        topic_filter = param(request, "filter", "#") or "#"
        count = self._count(topic_filter)
        return self.pages.json(request, {"filter": topic_filter, "count": count})

    # -- actions ------------------------------------------------------------------------

    def _delete(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.delete_retained(auth.user, param(request, "topic"))

    def _delete_matching(self, request: Request) -> ActionCall:
        def act(auth: Auth) -> Awaitable[ActionResult]:
            raw = param(request, "expected")
            expected = number(request, "expected", 0) if raw else None
            return self.actions.delete_retained_matching(
                auth.user, param(request, "filter"), expected)
        return act

    action_routes(app, (
        ("/retained/delete", _delete, "/retained"),
        ("/retained/delete-matching", _delete_matching, "/retained"),
    ))
