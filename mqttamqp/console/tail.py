"""The live message tail: the console subscribes to a topic filter and streams
what arrives to the browser as Server-Sent Events.

A tail is an ordinary subscriber to the broker, made through the façade
(``add_topic_receiver``, ``activate``, ``detach_topic_receiver``), at QoS 0 and
without the filter's retained messages: it shows traffic from now on.  It is
bounded three ways: at most ``max_tails`` open at once, at most ``per_second``
messages a second forwarded to one browser (the rest are counted and reported
as skipped), and at most ``max_payload`` bytes of each payload rendered.  The
browser keeps a bounded number of rows and can pause.

Payloads are rendered on the server (``payloads.payload_view``: text, JSON or hex)
and sent as JSON strings; the page inserts them as text, never as markup.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.server import Request

from mqttamqp.console.feed import sse_frame
from mqttamqp.console.payloads import payload_view
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock
from mqttamqp.core.message import Message

__all__ = ["TailHub", "Tail", "TAIL_MODES"]

TAIL_MODES = ("auto", "text", "json", "hex")


class Tail:
    """One browser's tail: a ``ClientLink`` for the broker, a stream for the browser."""

    congested = False        # never holds back publishers: it skips instead
    backlog_bytes = 0

    def __init__(self, hub: TailHub, key: str, request: Request, topic_filter: str, mode: str,
                 still_allowed: Callable[[], bool]) -> None:
        self.hub = hub
        self.key = key
        self.request = request
        self.topic_filter = topic_filter
        self.mode = mode
        self.still_allowed = still_allowed
        self.sent = 0            # forwarded in the current second
        self.skipped = 0         # over the rate since the last report
        self.total = 0
        self.closed = False
        self.done: Deferred[None] = Deferred(lambda _d: self.hub.end(self))

    # -- ClientLink ---------------------------------------------------------------

    def send_publish(self, message: Message, qos: int, packet_id: int | None, dup: bool,
                     retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        if self.closed:
            return
        self.total += 1
        if self.sent >= self.hub.per_second:
            self.skipped += 1
            return
        self.sent += 1
        view = payload_view(message.payload, self.mode, self.hub.max_payload)
        try:
            self.request.write(sse_frame("message", {
                "topic": message.topic, "qos": message.qos, "retain": retain,
                "publisher": message.publisher, "timestamp": message.timestamp,
                "size": len(message.payload), "mode": view["mode"], "body": view["body"],
                "truncated": view["truncated"]}))
        except Exception:
            # Never let a browser that went away break the publisher's routing.
            self.hub.clock.callLater(0, self.hub.end, self)

    def send_pubrel(self, packet_id: int) -> None:
        pass                     # QoS 0 only

    def close(self, reason: str) -> None:
        """Closed by the broker (it is stopping)."""
        self.hub.end(self, reason)

    # -- once a second ------------------------------------------------------------------

    def tick(self) -> None:
        if not self.still_allowed():
            self.hub.end(self, "logged out", "logout")
            return
        frame = sse_frame("tick", {"skipped": self.skipped, "total": self.total,
                                   "per_second": self.hub.per_second})
        self.sent = self.skipped = 0
        self.request.write(frame)


class TailHub:
    log = Logger(namespace="mqttamqp.console")

    def __init__(self, broker: Broker, clock: Clock, max_tails: int = 8,
                 per_second: int = 50, max_payload: int = 4096) -> None:
        self.broker = broker
        self.clock = clock
        self.max_tails = max_tails
        self.per_second = per_second
        self.max_payload = max_payload
        self.tails: dict[str, Tail] = {}
        self._serials = itertools.count(1)
        self._loop: LoopingCall | None = None

    def open(self, request: Request, user: str, topic_filter: str, mode: str,
             still_allowed: Callable[[], bool]) -> Tail | str:
        """A new tail on ``topic_filter``, or why not (the caller answers with it)."""
        if len(self.tails) >= self.max_tails:
            return f"at most {self.max_tails} live tails may be open at once"
        if topic_filter.startswith(("$share/", "$dynamic/")):
            # A tail joining a shared group would take its share of the messages away
            # from the group's workers; dynamic nodes are one receiver's own.
            return f"the live tail does not subscribe to {topic_filter.split('/')[0]}/ filters"
        key = f"console-tail:{next(self._serials)}"
        # The broker's own identity (protocol ""): the console is not bound by the
        # clients' access rules (its users see every topic's retained messages too).
        session = self.broker.add_topic_receiver(key, topic_filter,
                                                 Identity(key, user, ""), 0)
        if session is None:
            return f"subscribing to {topic_filter!r} was refused"
        tail = Tail(self, key, request, topic_filter, mode, still_allowed)
        self.tails[key] = tail
        request.write(b"retry: 5000\n\n" + sse_frame("open", {
            "filter": topic_filter, "per_second": self.per_second,
            "max_payload": self.max_payload}))
        self.broker.activate(session, tail, "console")   # from now on; no retained replay
        self._start()
        self.log.info("console: {u!r} tails {f!r}", u=user, f=topic_filter)
        return tail

    def end(self, tail: Tail, reason: str = "", event: str = "") -> None:
        if tail.closed:
            return
        tail.closed = True
        self.tails.pop(tail.key, None)
        self.broker.detach_topic_receiver(tail.key)
        if event:
            tail.request.write(sse_frame(event, {"reason": reason}))
        if not tail.done.called:
            tail.done.callback(None)
        if not self.tails and self._loop is not None and self._loop.running:
            self._loop.stop()
            self._loop = None

    def stop(self) -> None:
        for tail in list(self.tails.values()):
            self.end(tail, "the console is stopping", "closed")

    def _start(self) -> None:
        if self._loop is None:
            self._loop = LoopingCall(self._tick)
            self._loop.clock = self.clock  # type: ignore[assignment]
            self._loop.start(1.0, now=False).addErrback(
                lambda f: self.log.failure("console live tail failed", f))

    def _tick(self) -> None:
        for tail in list(self.tails.values()):
            try:
                tail.tick()
            except Exception:       # a browser that went away under us
                self.log.failure("dropping a live tail")
                self.end(tail)
