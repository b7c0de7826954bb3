"""The live feed: samples the broker's counters every second, keeps a short
history for the rate chart, and pushes each sample to Server-Sent-Event streams.

One sampler serves every open browser tab: the snapshot is computed once per tick,
not once per subscriber.  The number of streams is bounded.  A stream is a
request held open by a Deferred that never fires; Klein cancels it when the
browser goes away, and the canceller unsubscribes.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.server import Request

from mqttamqp.core.clock import Clock

__all__ = ["StatsFeed", "EventStream", "sse_frame"]


def sse_frame(event: str, data: Any) -> bytes:
    """One SSE message.  JSON has no raw newlines, so one ``data:`` line suffices;
    ``<``, ``>`` and ``&`` go as ``\\u`` escapes, so client data is never markup on
    the wire either (whatever a proxy or a careless viewer does with the stream)."""
    text = json.dumps(data, separators=(",", ":")).translate(_JSON_MARKUP)
    return f"event: {event}\ndata: {text}\n\n".encode()


_JSON_MARKUP = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


class EventStream:
    """One open ``text/event-stream`` response."""

    def __init__(self, request: Request, still_allowed: Callable[[], bool]) -> None:
        self.request = request
        self.still_allowed = still_allowed
        self.done: Deferred[None] = Deferred(self._cancelled)
        self.feed: StatsFeed | None = None

    def _cancelled(self, _d: Deferred[None]) -> None:
        if self.feed is not None:
            self.feed.unsubscribe(self)

    def send(self, frame: bytes) -> None:
        self.request.write(frame)

    def close(self, frame: bytes = b"") -> None:
        """End the stream from our side (logged out, broker stopping)."""
        if self.feed is not None:
            self.feed.unsubscribe(self)
        if frame:
            self.request.write(frame)
        if not self.done.called:
            # Firing with None makes Klein finish the response.
            self.done.callback(None)


class StatsFeed:
    log = Logger()

    def __init__(self, clock: Clock, snapshot: Callable[[], dict[str, Any]],
                 counters: Callable[[], tuple[int, int]], interval: float = 1.0,
                 history: int = 300, max_streams: int = 64) -> None:
        self.clock = clock
        self.snapshot = snapshot
        self.counters = counters     # (messages received, messages sent) so far
        self.interval = interval
        self.history: deque[dict[str, float]] = deque(maxlen=history)
        self.max_streams = max_streams
        self.streams: set[EventStream] = set()
        self.rates: dict[str, float] = {"in": 0.0, "out": 0.0}
        self._last: tuple[float, int, int] | None = None
        self._loop: LoopingCall | None = None

    def start(self) -> None:
        if self._loop is None:
            self._loop = LoopingCall(self.tick)
            self._loop.clock = self.clock  # type: ignore[assignment]
            self._loop.start(self.interval, now=True).addErrback(
                lambda f: self.log.failure("console live feed failed", f))

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for stream in list(self.streams):
            stream.close()

    def subscribe(self, stream: EventStream) -> bool:
        if len(self.streams) >= self.max_streams:
            return False
        stream.feed = self
        self.streams.add(stream)
        stream.send(b"retry: 2000\n\n" + sse_frame("history", list(self.history)))
        stream.send(sse_frame("stats", self.snapshot()))
        return True

    def unsubscribe(self, stream: EventStream) -> None:
        self.streams.discard(stream)

    def sample(self) -> dict[str, float]:
        """Rates since the previous sample; appended to the history."""
        now = self.clock.seconds()
        received, sent = self.counters()
        if self._last is not None:
            then, r0, s0 = self._last
            dt = now - then
            if dt > 0:
                self.rates = {"in": max(0, received - r0) / dt, "out": max(0, sent - s0) / dt}
        self._last = (now, received, sent)
        point = {"t": now, "in": round(self.rates["in"], 2), "out": round(self.rates["out"], 2)}
        self.history.append(point)
        return point

    def tick(self) -> None:
        self.sample()
        if not self.streams:
            return
        frame = sse_frame("stats", self.snapshot())
        for stream in list(self.streams):
            if not stream.still_allowed():
                stream.close(sse_frame("logout", {}))
                continue
            try:
                stream.send(frame)
            except Exception:  # a stream whose connection broke under us
                self.log.failure("dropping a live-feed stream")
                self.unsubscribe(stream)
