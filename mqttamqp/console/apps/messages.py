"""Messages: publishing one from the console, and watching those routed to a
filter go by (the tail page and its stream of Server-Sent Events, ``TailHub``).
"""

from __future__ import annotations

from collections.abc import Awaitable

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.web.server import Request

from mqttamqp.console.actions import ActionResult, ConsoleActions
from mqttamqp.console.tail import TAIL_MODES, TailHub
from mqttamqp.console.web import (
    ActionCall,
    Area,
    Auth,
    Gate,
    HTTPError,
    Pages,
    action_routes,
    flag,
    number,
    param,
)
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock
from mqttamqp.core.topics import validate_topic_filter

__all__ = ["MessagesApp", "MAX_DRAFT"]

MAX_DRAFT = 256 * 1024     # what a form keeps of what was typed (bytes of text)


class MessagesApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, broker: Broker, actions: ConsoleActions,
                 clock: Clock) -> None:
        super().__init__(gate, pages)
        self.actions = actions
        self.tails = TailHub(broker, clock)

    @app.route("/publish", methods=["GET"])
    def publish_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        draft = dict(auth.session.drafts.get("publish", {})) if auth.session else {}
        if param(request, "topic"):
            draft["topic"] = param(request, "topic")
        return self.pages.render(request, "publish.html", auth, nav="publish", draft=draft)

    def _publish(self, request: Request) -> ActionCall:
        def act(auth: Auth) -> Awaitable[ActionResult]:
            draft = {name: param(request, name)[:MAX_DRAFT]
                     for name in ("topic", "payload", "encoding", "qos", "retain")}
            if auth.session is not None:
                # The form shows what was typed again, after an error or a success.
                auth.session.drafts["publish"] = draft
            return self.actions.publish(
                auth.user, draft["topic"], param(request, "payload"),
                draft["encoding"] or "utf-8", number(request, "qos", 0),
                flag(request, "retain"))
        return act

    action_routes(app, (("/publish", _publish, "/publish"),))

    @app.route("/tail", methods=["GET"])
    def tail_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "tail.html", auth, nav="tail",
                                 filter=param(request, "filter", "#") or "#",
                                 view=param(request, "view", "auto"), modes=TAIL_MODES,
                                 per_second=self.tails.per_second,
                                 max_payload=self.tails.max_payload)

    @app.route("/api/tail", methods=["GET"])
    def tail_stream(self, request: Request) -> Deferred[None] | bytes:
        auth = self.gate.require(request, api=True)
        topic_filter = param(request, "filter", "#") or "#"
        problem = validate_topic_filter(topic_filter)
        if problem is not None:
            raise HTTPError(400, f"invalid topic filter: {problem}")
        mode = param(request, "view", "auto")
        if mode not in TAIL_MODES:
            raise HTTPError(400, f"view must be one of {', '.join(TAIL_MODES)}")
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"x-accel-buffering", b"no")
        tail = self.tails.open(request, auth.user, topic_filter, mode,
                               self.gate.still_allowed(auth))
        if isinstance(tail, str):
            request.setHeader(b"content-type", b"application/json; charset=utf-8")
            raise HTTPError(503 if "at most" in tail else 403, tail)
        return tail.done
