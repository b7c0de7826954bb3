"""Durable queues: the list of queues and dead-letter queues with their rates, one
queue with its groups and a page of its messages, one message, and what an
operator does to a queue: purge, delete, requeue dead letters, change retention.
What a queue shows and what each action does is ``mqttamqp.console.queues``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console.queues import (
    BROWSE_DEFAULT,
    QueueActions,
    QueueRates,
    find_queue,
    message_detail,
    queue_detail,
    queue_list,
)
from mqttamqp.console.web import (
    ActionCall,
    Area,
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

__all__ = ["QueuesApp"]


class QueuesApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, broker: Broker,
                 audit: Callable[..., None], clock: Clock) -> None:
        super().__init__(gate, pages)
        self.broker = broker
        self.rates = QueueRates(clock.seconds)
        self.actions = QueueActions(broker, audit)

    @app.route("/queues", methods=["GET"])
    def queues_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        partial = flag(request, "partial")
        return self.pages.render(request, "_queue_rows.html" if partial else "queues.html",
                                 auth, nav="queues", q=queue_list(self.broker, self.rates))

    @app.route("/api/queues", methods=["GET"])
    def queues_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, queue_list(self.broker, self.rates))

    def _queue(self, request: Request, browse: bool = True) -> dict[str, Any] | None:
        name = param(request, "name")
        if not name:
            raise HTTPError(400, "give name=<queue> ($dlq/<queue> for a dead-letter queue)")
        view = find_queue(self.broker, name)
        if view is None:
            return None
        return queue_detail(self.broker, view, self.rates, number(request, "start", 0),
                            number(request, "limit", BROWSE_DEFAULT), browse)

    @app.route("/queues/queue", methods=["GET"])
    def queue_page(self, request: Request) -> bytes:
        """The page; ``partial=1`` its figures and groups (live, browsing nothing),
        ``partial=messages`` its first page of messages (live)."""
        auth = self.gate.require(request, api=False)
        messages = param(request, "partial") == "messages"
        partial = messages or flag(request, "partial")
        detail = self._queue(request, browse=messages or not partial)
        if detail is None and not partial:
            raise HTTPError(404, "no such queue")
        template = ("_queue_messages.html" if messages else
                    "_queue_live.html" if partial else "queue.html")
        return self.pages.render(request, template, auth, nav="queues", qd=detail,
                                 name=param(request, "name"))

    @app.route("/api/queues/queue", methods=["GET"])
    def queue_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        detail = self._queue(request)
        if detail is None:
            raise HTTPError(404, "no such queue")
        return self.pages.json(request, detail)

    def _message(self, request: Request) -> dict[str, Any]:
        found = message_detail(self.broker, param(request, "name"),
                               number(request, "offset", -1), param(request, "view", "auto"))
        if found is None:
            raise HTTPError(404, "no such message in that queue")
        return found

    @app.route("/queues/message", methods=["GET"])
    def queue_message_page(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False)
        return self.pages.render(request, "queue_message.html", auth, nav="queues",
                                 msg=self._message(request))

    @app.route("/api/queues/message", methods=["GET"])
    def queue_message_api(self, request: Request) -> bytes:
        self.gate.require(request, api=True)
        return self.pages.json(request, self._message(request))

    # -- actions ------------------------------------------------------------------------

    def _purge(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.purge(auth.user, param(request, "name"))

    def _delete(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.delete(auth.user, param(request, "name"))

    def _requeue(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.requeue(
            auth.user, param(request, "name"), param(request, "offset"))

    def _retention(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.retention(
            auth.user, param(request, "name"), param(request, "max_age"),
            param(request, "max_bytes"), param(request, "max_messages"),
            param(request, "max_priority"))

    action_routes(app, (
        ("/queues/purge", _purge, "/queues"),
        ("/queues/delete", _delete, "/queues"),
        ("/queues/requeue", _requeue, "/queues"),
        ("/queues/retention", _retention, "/queues"),
    ))
