"""Liveness and readiness, with their reasons.

Liveness (``/healthz``) is the reactor answering: the check runs on the reactor
thread, so an answer at all is the proof.  Readiness (``/readyz``) is what a load
balancer or an orchestrator waits for before sending clients: the store is open
and its data directory writable, the last commit succeeded, every listener is
bound, and the will grace after a restart is over (until then the wills of
clients connected before the restart are undecided).

What it owns: the checks and their wording.  What it must not do: wait on the
disk on the reactor thread: the data directory's write probe runs in the
reactor's thread pool, at most every ``probe_interval`` seconds, and readiness
reports its last result.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool

from mqttamqp.core.broker import Broker

__all__ = ["Check", "Readiness", "WriteProbe", "liveness"]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason}


class Listener(Protocol):
    kind: str
    description: str
    port: Any


def liveness(broker: Broker, reactor_lag: float | None = None) -> dict[str, Any]:
    """The reactor answered (this runs on it); with how late it last ran a timer."""
    body: dict[str, Any] = {"status": "ok", "uptime_seconds": round(
        max(0.0, broker.clock.seconds() - broker.stats.started), 3)}
    if reactor_lag is not None:
        body["reactor_lag_seconds"] = round(reactor_lag, 6)
    return body


class WriteProbe:
    """Whether a file can be created in ``directory``, checked off the reactor thread.

    ``result()`` returns the last answer at once and starts a new probe when that
    answer is older than ``interval`` seconds (and none is running)."""

    def __init__(self, reactor: Any, directory: str, interval: float = 10.0) -> None:
        self.reactor = reactor
        self.directory = directory
        self.interval = interval
        self._last: tuple[bool, str] | None = None
        self._at = float("-inf")
        self._running = False

    def result(self) -> tuple[bool, str] | None:
        """(writable, reason), or None while the first probe runs."""
        if not self._running and self.reactor.seconds() - self._at >= self.interval:
            self.start()
        return self._last

    def start(self) -> Deferred[None]:
        self._running = True
        d: Deferred[tuple[bool, str]] = deferToThreadPool(
            self.reactor, self.reactor.getThreadPool(), _probe, self.directory)
        return d.addCallback(self._done)

    def _done(self, result: tuple[bool, str]) -> None:
        self._last = result
        self._at = self.reactor.seconds()
        self._running = False


def _probe(directory: str) -> tuple[bool, str]:
    path = os.path.join(directory, f".ready-probe-{os.getpid()}")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.unlink(path)
    except OSError as e:
        return False, f"cannot write to {directory}: {e.strerror or e}"
    return True, f"{directory} is writable"


class Readiness:
    """The readiness checks of one broker service."""

    def __init__(self, broker: Broker, store_open: Callable[[], bool],
                 listeners: Callable[[], Sequence[Listener]],
                 probe: WriteProbe | None = None,
                 role: Callable[[], str] | None = None) -> None:
        """``role``: under --ha, the broker's (standby, leader, fenced)."""
        self.broker = broker
        self.role = role
        self.store_open = store_open
        self.listeners = listeners
        self.probe = probe

    def checks(self) -> list[Check]:
        broker = self.broker
        stats = broker.stats
        out = []
        role = self.role() if self.role is not None else ""
        if role == "standby":
            out.append(Check("role", False, "standby: another broker holds the serving "
                                            "lock; this one takes over when it goes"))
        elif role:
            out.append(Check("role", role == "leader", role))
        if broker.stopping:
            out.append(Check("running", False, "the broker is stopping"))
        if not self.store_open():
            out.append(Check("store", False, "the store is not open"))
        elif self.probe is not None:
            probed = self.probe.result()
            if probed is None:
                out.append(Check("store", False, "checking that the data directory is "
                                                 "writable"))
            else:
                out.append(Check("store", *probed))
        else:
            out.append(Check("store", True, "open"))
        if stats.storage_failing:
            out.append(Check("commits", False, f"the last commit failed "
                                               f"({stats.storage_error})"))
        else:
            out.append(Check("commits", True, f"{stats.commits} commit(s), the last one "
                                              "succeeded" if stats.commits else
                             "no commit has failed"))
        unbound = [f"{x.kind} {x.description}" for x in self.listeners() if x.port is None]
        out.append(Check("listeners", not unbound,
                         "not bound: " + ", ".join(unbound) if unbound
                         else "every listener is bound"))
        grace = broker.wills_in_grace
        out.append(Check("will_grace", grace == 0,
                         f"{grace} will(s) of clients connected before the restart are "
                         "still in their grace period" if grace else "over"))
        return out

    def report(self) -> tuple[bool, dict[str, Any]]:
        """(ready, the JSON body)."""
        checks = self.checks()
        ready = all(c.ok for c in checks)
        standby = self.role is not None and self.role() == "standby"
        return ready, {"status": "ready" if ready else "standby" if standby else "not ready",
                       "checks": {c.name: c.as_json() for c in checks}}
