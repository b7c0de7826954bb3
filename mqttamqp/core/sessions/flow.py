"""Flow control: publishers paused for the sake of slow subscribers, and the stall
rule that keeps one stuck subscriber from pausing them for good.

What it owns: the paused publishers (each with the resume callback its protocol
gave and the congested sessions it fed), waking them when those sessions drain,
and the stall timer: a publisher waits at most ``stall_timeout``; whoever still
kept it waiting then is marked stalled (it stops slowing publishers and drops at
its bound instead, counted) until it acknowledges something again.

What it must not do: stop or start reading sockets itself (the protocols do,
through the callbacks they register) or decide what congestion is (the session
does, ``Session.over_high_water``, and a shared group for its backlog,
``SharedGroup.over_high_water``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from twisted.logger import Logger

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.limits import Limits
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.sessions.session import Session

__all__ = ["Congestible", "FlowControl", "QueueBoundLog"]


class Congestible(Protocol):
    """What a publisher may wait for: a subscriber's session, or a shared group
    whose backlog is past its high-water mark."""

    stalled: bool

    @property
    def client_id(self) -> str: ...

    def over_high_water(self) -> bool: ...


class FlowControl:
    log = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, clock: Clock, stall_timeout: float,
                 online: Callable[[], Iterable[Session]]) -> None:
        self.clock = clock
        self.stall_timeout = stall_timeout
        self._online = online    # every session with a link (for "any subscriber")
        # paused publisher key -> (resume callback, the congested sessions it fed);
        # read (never changed) by ``Settlement`` on every acknowledgement
        self.paused: dict[
            int, tuple[Callable[[], None], list[Congestible] | None, DelayedCall]] = {}

    def pause_until_drained(self, key: int, resume: Callable[[], None],
                            sessions: Sequence[Congestible] | None = None) -> None:
        """Publisher ``key`` stopped reading; call ``resume`` once ``sessions`` (the
        congested subscribers it fed; None = any) are below their high-water mark,
        or after ``stall_timeout`` at the latest."""
        known = self.paused.get(key)
        fed = list(sessions) if sessions is not None else None
        if known is not None:
            if known[1] is not None and fed is not None:
                # Usually the same one or two subscribers, message after message.
                new = [s for s in fed if s not in known[1]]
                if not new and known[0] == resume:
                    return
                fed = known[1] + new
            timer = known[2]
        else:
            timer = self.clock.callLater(self.stall_timeout, self._expired, key)
        self.paused[key] = (resume, fed, timer)

    def forget(self, key: int) -> None:
        entry = self.paused.pop(key, None)
        if entry is not None and entry[2].active():
            entry[2].cancel()

    def stop(self) -> None:
        for key in list(self.paused):
            self.forget(key)

    def _expired(self, key: int) -> None:
        """A publisher waited ``stall_timeout``: whoever kept it waiting is stalled."""
        entry = self.paused.pop(key, None)
        if entry is None:
            return
        resume, sessions, _ = entry
        suspects: Sequence[Congestible] = (
            sessions if sessions is not None else list(self._online()))
        if sessions is not None and any(getattr(s, "backlog_bound", None) is not None
                                        and s.over_high_water()
                                        for s in sessions):
            # A bound that blocks (a bridge's backlog, ``on-full = "block"``): the
            # publisher waits until it drains, however long the remote is away.
            self.paused[key] = (resume, sessions,
                                self.clock.callLater(self.stall_timeout, self._expired, key))
            return
        for session in suspects:
            if session.over_high_water():   # (a session's is False while offline)
                session.stalled = True
                self.log.warn(
                    "subscriber {c} made no progress for {t:g}s; publishers are no longer "
                    "slowed down for it (its queue drops at its limit, counted)",
                    c=session.client_id, t=self.stall_timeout)
        resume()

    def drained(self, session: Session | None) -> None:
        """A congested link can take more again: send its queue, wake publishers."""
        if session is not None:
            session.pump()
        self.resume_paused()

    def resume_paused(self) -> None:
        if not self.paused:
            return
        any_congested: bool | None = None
        ready: list[Callable[[], None]] = []
        for key, (resume, sessions, timer) in list(self.paused.items()):
            if sessions is None:
                if any_congested is None:
                    any_congested = any(s.over_high_water() for s in self._online())
                if any_congested:
                    continue
            elif any(s.over_high_water() for s in sessions):
                continue
            del self.paused[key]
            if timer.active():
                timer.cancel()
            ready.append(resume)
        for resume in ready:
            resume()


class QueueBoundLog:
    """What a stuck subscriber costs in the log: the QoS 1/2 deliveries dropped at a
    session's queue bound, a line per session a minute, and 20 a minute in all
    (thousands of stuck sessions must not flood the log)."""

    log = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, clock: Clock, limits: Limits) -> None:
        self.limits = limits
        self._drop_lines = LogLimiter(clock.seconds)
        self._drop_lines_all = LogLimiter(clock.seconds, burst=20)

    def dropped(self, session: Session) -> None:
        """A QoS 1/2 delivery to ``session`` was dropped at its queue bound (counted by
        the session): one line per session a minute, with the count."""
        lines = self._drop_lines
        if not lines.ready(session.client_id):
            lines.allow(session.client_id)    # (counted, not logged)
            return
        # The global limit first: a line it refuses must not use up the session's.
        others = self._drop_lines_all.allow("queue_full")
        if others is None:
            return
        held = lines.allow(session.client_id)
        if held is None:
            return
        # (a bridge's session has its own bound: the bridge's max-backlog-* keys)
        limits = session.limits
        self.log.warn(
            "{c}: {n} QoS 1/2 message(s) dropped at its queue bound ({o1} "
            "{m}, {o2} {b}){why}; {t} dropped in all{o}",
            c=session.client_id, n=held + 1, m=limits.max_queued_messages,
            b=limits.max_queued_bytes, t=session.dropped,
            o1="--max-queued-messages" if limits is self.limits else "max-backlog-messages",
            o2="--max-queued-bytes" if limits is self.limits else "max-backlog-bytes",
            why=(" while it made no progress" if session.stalled else
                 "" if session.link is not None else " while offline"),
            o=f" ({others} such lines of other sessions not logged)" if others else "")
