"""Browsing: reading a queue without taking anything from it (an AMQP 1.0 receiver
whose source asks for distribution-mode ``copy``, proton's ``queue_browser.py``).

A browser is a cursor over one queue's log, not a member of a group: what it reads
is not acquired, not counted as a delivery, not removed, and other consumers still
get it.  It starts at the head (the oldest message some classic group has not
finished) and reads what is there, then new messages as they are committed, each
sent at QoS 0 (no receipt: the receiver's outcome has no effect) while its link has
room (credit).  Nothing of it is stored, and it holds no message back: the log is
trimmed as if it were not there (a message trimmed before the browser reached it is
skipped).  Bodies kept in storage only are read back first, as for members
(``MemoryBudget``), and what a browser reads next (a read-back's worth:
``READ_MESSAGES``, ``READ_BYTES``) is not evicted, or a read would be evicted again
before the browser sent it; that much memory is what a slow browser costs.

What this module must not do: deliver to members or decide acknowledgements (the
layers below), or know the protocol (the session's link sends).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op
from mqttamqp.core.queues.addresses import (
    CLASSIC,
    QUOTA_EXCEEDED,
    Consumer,
    Refusal,
    parse_queue_filter,
    routing_key,
)
from mqttamqp.core.queues.membership import Membership
from mqttamqp.core.queues.metadata import METADATA_PROTOCOLS, with_metadata
from mqttamqp.core.queues.model import QueueLog
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.topics import topic_matches

__all__ = ["Browsing", "Browser"]


class Browser:
    """One browsing session's cursor over a queue (its filter: the routing keys it
    reads, as a group's)."""

    __slots__ = ("filter", "next", "queue", "selector", "session")

    def __init__(self, session: Session, queue: QueueLog, topic_filter: str,
                 selector: Callable[[Message], bool] | None) -> None:
        self.session = session
        self.queue = queue
        self.filter = topic_filter
        self.selector = selector   # (an AMQP receiver's selector: what it reads)
        self.next = queue.first


class Browsing(Membership):
    """Browsers of the queues, fed as members are: on a commit and when their link
    can take more."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._browsers: dict[Session, Browser] = {}
        self._browsed: dict[QueueLog, list[Browser]] = {}

    def subscribe(self, session: Session, topic_filter: str, qos: int, consumer: Consumer
                  ) -> tuple[Refusal | None, list[Op]]:
        if not consumer.browse:
            return super().subscribe(session, topic_filter, qos, consumer)
        address = parse_queue_filter(topic_filter)
        if isinstance(address, str):
            return self._refuse("filter", session.client_id, topic_filter, address), []
        ops: list[Op] = []
        queue = self._queue(address.queue, ops)
        if queue is None:
            return self._refuse("count", session.client_id, topic_filter,
                                "too many queues (--queue-max-queues "
                                f"{self.limits.queue_max_queues})", QUOTA_EXCEEDED), []
        self._stop_browsing(session)
        browser = Browser(session, queue, address.rest, consumer.selector)
        self._browsers[session] = browser
        self._browsed.setdefault(queue, []).append(browser)
        return None, list(self._durable_ops(ops))

    def _stop_browsing(self, session: Session) -> None:
        browser = self._browsers.pop(session, None)
        if browser is None:
            return
        browsers = self._browsed.get(browser.queue)
        if browsers is not None:
            browsers.remove(browser)
            if not browsers:
                del self._browsed[browser.queue]

    def forget_session(self, session: Session) -> list[Op]:
        if self._browsers:
            self._stop_browsing(session)
        return super().forget_session(session)

    def link_drained(self, session: Session) -> None:
        super().link_drained(session)
        if self._browsers:
            browser = self._browsers.get(session)
            if browser is not None:
                self._browse(browser)

    def _pump_queue(self, queue: QueueLog) -> None:
        # (``Dispatch._pump_queue``'s loop, not a ``super()`` call: every publish to a
        # queue comes here)
        for group in list(queue.groups.values()):
            self._pump(group)
        if self._browsed:
            for browser in list(self._browsed.get(queue, ())):
                self._browse(browser)

    def _protected(self, queue: QueueLog) -> set[int]:
        keep = super()._protected(queue)
        browsers = self._browsed.get(queue) if self._browsed else None
        if browsers:
            first = queue.first
            for browser in browsers:
                self._keep_ahead(queue, max(browser.next, first), keep)
        return keep

    def feeding(self, session: Session) -> bool:
        browser = self._browsers.get(session) if self._browsers else None
        if browser is not None:
            return browser.queue.reading
        return super().feeding(session)

    def _browse(self, browser: Browser) -> None:
        """Send ``browser`` what it has not read, while its link has room."""
        queue = browser.queue
        session = browser.session
        if self.queues.get(queue.name) is not queue:
            return   # (deleted: nothing more comes)
        log = queue.log
        groups = [g for g in queue.groups.values() if g.mode == CLASSIC]
        browser.next = max(browser.next, queue.first)
        while browser.next < queue.committed and session.has_room(0):
            offset = browser.next
            message = log.get(offset)
            if message is None or not (
                    topic_filter_takes(browser.filter, queue.name, message.topic)
                    and (not groups or any(offset >= g.floor and offset not in g.done
                                           for g in groups))):
                browser.next = offset + 1   # (gone, not for it, or finished by all)
                continue
            if queue.evicted and offset in queue.evicted:
                self._read_back(queue, offset, None)   # (then ``_pump_queue`` again)
                return
            browser.next = offset + 1
            if browser.selector is not None and not browser.selector(message):
                continue
            if session.protocol in METADATA_PROTOCOLS:
                # (a copy, not an acquisition: never the first acquirer)
                message = with_metadata(message, queue.name, "", offset, 1, True)
            session.deliver(message, 0, False)


def topic_filter_takes(topic_filter: str, queue: str, topic: str) -> bool:
    """Does a browser's filter (``#``: all) take a message published to ``topic``?"""
    if topic_filter == "#":
        return True
    return topic_matches(topic_filter, routing_key(queue, topic))
