"""Active/standby on a shared PostgreSQL storage (``--ha``).

Every broker started with ``--ha`` on the same database runs the same code; exactly
one serves.  Leadership is PostgreSQL's session advisory lock (the serving lock of
``store.engines``), held on a connection of its own.  A broker that does not hold
it is the *standby*: its client listeners stay closed, ``/readyz`` answers 503
``standby``, and a thread polls ``pg_try_advisory_lock`` every ``--ha-poll``
seconds.  When it gets the lock it claims the next leader epoch
(``store.fencing``), loads the state and opens its listeners: the normal start,
later.  The leader's thread then runs ``SELECT 1`` on the lock's connection every
``--ha-watch`` seconds; when that fails (the connection cut, the database gone)
the leader stops committing at once and stops serving.  A leader whose commit finds
a newer epoch (another broker took over while this one did not notice) does the
same.  docs/ha.md says why nothing acknowledged is lost and nothing is
acknowledged by two leaders.

What it owns: the lock's thread and connection, the role (``standby``, ``leader``,
``fenced``) with its times, and the log lines of a takeover.  What it must not do:
touch the storage (``store``), or block the reactor thread on the database: every
statement runs on the lock's thread, which hands results over with
``callFromThread``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

__all__ = ["HighAvailability", "LeaderLock"]

_log = Logger(namespace="mqttamqp.ha")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class LeaderLock:
    """The serving lock, waited for and then watched, on a thread of its own.

    ``on_acquired()`` and ``on_lost(reason)`` are called on the reactor thread.
    ``close()`` ends the thread and closes the connection (which frees the lock)."""

    def __init__(self, dsn: str, display: str, reactor: Any, poll_seconds: float,
                 watch_seconds: float, on_acquired: Callable[[], None],
                 on_lost: Callable[[str], None]) -> None:
        self.dsn = dsn
        self.display = display
        self.reactor = reactor
        self.poll_seconds = poll_seconds
        self.watch_seconds = watch_seconds
        self.on_acquired = on_acquired
        self.on_lost = on_lost
        self.latency: float | None = None   # the last SELECT 1's round trip (seconds)
        self.polls = 0
        self._conn: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mqttamqp-ha-lock",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread at its next wake-up (``close`` also waits for it)."""
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # (bounded: every statement on this connection has a time-out)
            thread.join(timeout=max(10.0, 3 * self.watch_seconds))
        self._drop()

    # -- on the lock's thread ----------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg2

        # keepalives and tcp_user_timeout: a connection cut by the network fails
        # within a few watch intervals instead of hanging in a read for hours.
        timeout_ms = int(max(2.0, 3 * self.watch_seconds) * 1000)
        conn = psycopg2.connect(self.dsn, application_name="mqttamqp-lock",
                                connect_timeout=max(2, int(self.poll_seconds * 5)),
                                keepalives=1, keepalives_idle=5, keepalives_interval=2,
                                keepalives_count=3, tcp_user_timeout=timeout_ms)
        conn.autocommit = True
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _try(self) -> bool:
        from mqttamqp.store.engines import SERVING_LOCK_KEY

        if self._conn is None:
            self._conn = self._connect()
        started = time.monotonic()
        with self._conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (SERVING_LOCK_KEY,))
            row = cur.fetchone()
        self.latency = time.monotonic() - started
        self.polls += 1
        return bool(row and row[0])

    def _say(self, level: str, fmt: str, **kw: Any) -> None:
        self.reactor.callFromThread(getattr(_log, level), fmt, **kw)

    def _run(self) -> None:
        import psycopg2

        failing = ""
        while not self._stop.is_set():
            try:
                got = self._try()
            except psycopg2.Error as e:
                self._drop()
                if not failing:   # one line a spell, not one a poll
                    self._say("warn", "standby: cannot reach the database {d}: {r}; "
                              "trying again every {s:g}s", d=self.display,
                              r=_first_line(e), s=self.poll_seconds)
                failing = _first_line(e)
                got = False
            else:
                if failing:
                    self._say("info", "standby: the database {d} answers again",
                              d=self.display)
                    failing = ""
            if got:
                break
            self._stop.wait(self.poll_seconds)
        else:
            return
        self.reactor.callFromThread(self.on_acquired)
        while not self._stop.wait(self.watch_seconds):
            try:
                started = time.monotonic()
                with self._conn.cursor() as cur:
                    cur.execute("SELECT 1")
                    cur.fetchone()
                self.latency = time.monotonic() - started
            except Exception as e:
                if self._stop.is_set():
                    return
                self._drop()
                self.reactor.callFromThread(
                    self.on_lost, f"the serving lock's connection failed "
                    f"({_first_line(e)})")
                return


class HighAvailability:
    """The role of one broker under ``--ha``, and its moves between roles.

    ``serve(lock)`` (the service's) opens the storage with the lock taken, claims
    the epoch, loads the state and opens the listeners (False: it could not, and
    the process is ending); ``stop_serving(reason)``
    fences the store, closes the client listeners and ends the process."""

    def __init__(self, reactor: Any, dsn: str, display: str, poll_seconds: float,
                 watch_seconds: float, serve: Callable[[LeaderLock], bool],
                 stop_serving: Callable[[str], None]) -> None:
        self.reactor = reactor
        self.display = display
        self.role = "standby"
        self.standby_since = 0.0      # wall clock
        self.leader_since = 0.0
        self.last_takeover_seconds: float | None = None
        self.lost_reason = ""
        self.epoch: Callable[[], int | None] = lambda: None   # the store's, once open
        self._serve = serve
        self._stop_serving = stop_serving
        self.lock = LeaderLock(dsn, display, reactor, poll_seconds, watch_seconds,
                               self._acquired, self.lost)

    def start(self) -> None:
        self.standby_since = self.reactor.seconds()
        _log.info("standby: waiting for the serving lock of {d} (asking every {s:g}s); "
                  "client listeners stay closed meanwhile", d=self.display,
                  s=self.lock.poll_seconds)
        self.lock.start()

    def stop(self) -> None:
        """At shutdown: end the lock's thread (the store's close frees the lock)."""
        self.lock.stop()

    def figures(self) -> dict[str, Any]:
        """For the console and the metrics: the role, this broker's epoch, since when
        it leads (wall clock, 0 while it does not), the last takeover's duration and
        the database's latency (the last lock poll or watch, seconds)."""
        return {"role": self.role, "epoch": self.epoch(), "leader_since": self.leader_since,
                "standby_since": self.standby_since,
                "last_takeover_seconds": self.last_takeover_seconds,
                "database_latency_seconds": self.lock.latency,
                "lost_reason": self.lost_reason}

    def _acquired(self) -> None:
        if self.role != "standby":
            return
        started = time.monotonic()
        waited = self.reactor.seconds() - self.standby_since
        if not self._serve(self.lock):
            self.role = "fenced"     # (the service said why, and is stopping)
            return
        self.last_takeover_seconds = time.monotonic() - started
        self.role = "leader"
        self.leader_since = self.reactor.seconds()
        _log.info("took over as leader of {d} (epoch {e}) after {w:.3f}s as standby: state "
                  "loaded and listeners open in {t:.3f}s", d=self.display,
                  e=self.epoch(), w=waited, t=self.last_takeover_seconds)

    def lost(self, reason: str) -> None:
        """Leadership is gone (the lock's connection failed, or a commit found a newer
        epoch): stop acknowledging and serving, once."""
        if self.role == "fenced":
            return
        was = self.role
        self.role = "fenced"
        self.lost_reason = reason
        served = self.reactor.seconds() - self.leader_since if was == "leader" else 0.0
        _log.critical("lost the leadership of {d}: {r}; stopped committing and "
                      "acknowledging, closing the client listeners and exiting (leader "
                      "for {s:.3f}s)", d=self.display, r=reason, s=served)
        self._stop_serving(reason)
