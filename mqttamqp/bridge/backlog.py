"""The bound of a bridge's out backlog: ``max-backlog-bytes``, ``max-backlog-messages``
and what happens at them (``on-full``).

What it owns: the limits the bridge's session ``$bridge/<name>`` is held to in place of
the broker's ``--max-queued-bytes`` / ``--max-queued-messages`` (the session's own
bound, the one every session has, so the router drops and counts at it as for any
client), and, with ``on-full = "block"``, the session's ``BacklogBound``: while the
backlog is at its bound, local publishers that feed it are paused (the broker's flow
control, as for a slow subscriber, but also while the remote is away, and never
"stalled"), one line when that starts and one when it ends.  With ``block`` the
session's hard bound is twice the configured one: what paused publishers had sent
already is still taken; beyond that it is dropped and counted.

What it must not do: store or drop anything itself (the session does), or pause a
socket (the protocols do, through the flow control).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from twisted.logger import Logger

from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.core.limits import Limits
from mqttamqp.core.sessions.session import Session

__all__ = ["BacklogGuard"]

PACKET_IDS = 65000   # queued + in flight must leave MQTT packet ids (options.py's rule)


class BacklogGuard:
    """One bridge's backlog bound, applied to its session (``apply``)."""

    log: ClassVar[Logger] = Logger()

    __slots__ = ("base", "block", "blocked", "blocking", "limits", "max_bytes",
                 "max_messages", "name")

    def __init__(self, settings: BridgeSettings, base: Limits) -> None:
        self.name = settings.name
        self.base = base
        self.block = settings.on_full == "block"
        self.max_bytes = settings.max_backlog_bytes
        self.max_messages = min(settings.max_backlog_messages,
                                PACKET_IDS - base.max_inflight)
        factor = 2 if self.block else 1
        self.limits = replace(base, max_queued_bytes=self.max_bytes * factor,
                              max_queued_messages=min(self.max_messages * factor,
                                                      PACKET_IDS - base.max_inflight))
        self.blocking = False   # publishers are held now
        self.blocked = 0        # times the bound held publishers

    def apply(self, session: Session) -> None:
        session.limits = self.limits
        session.backlog_bound = self if self.block else None

    def release(self, session: Session) -> None:
        """The bridge stops: the session is held to the broker's bound again and
        publishers are no longer held for it (the caller wakes them)."""
        if session.backlog_bound is self:
            session.backlog_bound = None
        session.limits = self.base
        self.blocking = False

    def over(self, session: Session) -> bool:
        """At the bound (``on-full = "block"``): publishers feeding it wait, until the
        backlog is below three quarters of it (not one message below: a remote slower
        than its publishers would pause and resume them at every acknowledgement)."""
        if self.blocking:
            over = (session.queued_bytes * 4 >= self.max_bytes * 3
                    or len(session.queue) * 4 >= self.max_messages * 3)
        else:
            over = (session.queued_bytes >= self.max_bytes
                    or len(session.queue) >= self.max_messages)
        if over != self.blocking:
            self.blocking = over
            if over:
                self.blocked += 1
                self.log.warn("bridge {n}: the backlog reached its bound ({m} messages, "
                              "{b} bytes; max-backlog-messages {mm}, max-backlog-bytes {mb}): "
                              "publishers on its out topics are paused until it drains",
                              n=self.name, m=len(session.queue), b=session.queued_bytes,
                              mm=self.max_messages, mb=self.max_bytes)
            else:
                self.log.info("bridge {n}: the backlog is below three quarters of its bound "
                              "again: publishers resume", n=self.name)
        return over
