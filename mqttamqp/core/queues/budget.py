"""The durable queues' aggregate bounds on disk: when publishers to ``$queue/`` wait.

What it owns: the storage alarm of the durable queues.  It is raised when the
queues' stored payload bytes in all reach ``--queue-max-total-bytes``, or when the
file system the storage writes to (the data directory's, or the ``--storage``
file's or SQLite directory's) has less than ``--disk-free-limit`` free (as
RabbitMQ's ``disk_free_limit``), and cleared once both are back under their marks
with some room (the stored bytes under 90 % of the bound, the free space above the
limit and a tenth of it), so that a queue at its bound does not flap.  While it is
raised, publishers to queues are *blocked*, not dropped: their protocols hold
their publishes (MQTT) or withhold credit (AMQP) and register here how to resume;
they resume when it clears.  One log line when an episode starts and one when it
ends; the state is read by ``$SYS``, the metrics and the console.

The free space is asked of an injected function (the service gives one that calls
``os.statvfs`` on the storage's directory) every ``interval`` seconds on the injected
clock; the stored bytes are given by the queue manager whenever they change in a
way that matters (``QueueManager`` calls ``check_total``).

What it must not do: touch files itself (the core does no I/O), read sockets, or
know queues (the queue manager decides what to do with a publish while blocked).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.ratelog import LogLimiter

__all__ = ["StorageAlarm", "FreeSpace", "MB"]

MB = 1 << 20

# Free bytes of the storage's file system (None: not known).
FreeSpace = Callable[[], "int | None"]

TOTAL, DISK = "total", "disk"


def _mb(n: float) -> str:
    return f"{n / MB:,.0f} MB"


class StorageAlarm:
    """Whether publishers to durable queues are blocked, and who waits for it."""

    log = Logger()

    def __init__(self, clock: Clock, max_total: int, disk_free_limit: int,
                 free_space: FreeSpace | None = None, interval: float = 2.0) -> None:
        self.clock = clock
        self.max_total = max_total               # 0: no bound
        self.disk_free_limit = disk_free_limit   # 0: no watermark
        self._free_space = free_space if disk_free_limit > 0 else None
        self.interval = interval
        self.total = 0                 # the queues' stored payload bytes, as last told
        self.free: int | None = None   # the last free space read
        self.over_total = False        # (read by an append, ``QueueLogs._append``)
        self._disk_low = False
        # Appends not yet committed are over their bound (``QueueManager``): the
        # writer is behind.  It pauses publishers too, but is no alarm: no log line,
        # no refusal (it passes in a commit or two).
        self._behind = False
        self.since: float | None = None   # when the current episode began
        self.episodes = 0
        self.blocked_seconds = 0.0        # of the episodes that ended
        # publisher key -> what resumes it (MQTT: read again; AMQP: credit again)
        self._waiting: dict[int, Callable[[], None]] = {}
        self._timer: DelayedCall | None = None
        self._stopped = False
        self._log_limit = LogLimiter(clock.seconds)

    # -- state ---------------------------------------------------------------------

    @property
    def blocked(self) -> bool:
        """The alarm is raised: a disk bound is reached."""
        return self.over_total or self._disk_low

    @property
    def paused(self) -> bool:
        """Publishers to queues wait: the alarm, or the writer behind."""
        return self.over_total or self._disk_low or self._behind

    def set_behind(self, behind: bool) -> None:
        if behind == self._behind:
            return
        self._behind = behind
        if not self.paused:
            self._resume_all()

    @property
    def reason(self) -> str | None:
        """Why publishers to queues are blocked (None: they are not)."""
        parts = []
        if self.over_total:
            parts.append(f"the durable queues hold {_mb(self.total)} "
                         f"(--queue-max-total-bytes {self.max_total})")
        if self._disk_low and self.free is not None:
            parts.append(f"the storage's file system has {_mb(self.free)} free "
                         f"(--disk-free-limit {self.disk_free_limit // MB} MB)")
        return "; ".join(parts) or None

    @property
    def causes(self) -> tuple[str, ...]:
        """``total`` and/or ``disk`` while blocked."""
        return tuple(c for c, on in ((TOTAL, self.over_total), (DISK, self._disk_low))
                     if on)

    @property
    def waiting(self) -> int:
        """Publishers blocked now (not read, or without credit)."""
        return len(self._waiting)

    # -- checks ----------------------------------------------------------------------

    def start(self) -> None:
        """Read the free space now and then every ``interval`` seconds."""
        if self._free_space is not None and self._timer is None and not self._stopped:
            self._poll()

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._waiting.clear()

    def _poll(self) -> None:
        self._timer = None
        try:
            self.check_disk()
        except Exception as exc:   # (the next poll tries again: never stop polling)
            self._failed("checking the free disk space", exc)
        finally:
            if not self._stopped:
                self._timer = self.clock.callLater(self.interval, self._poll)

    def check_disk(self) -> None:
        if self._free_space is None:
            return
        try:
            free = self._free_space()
        except OSError:
            free = None
        self.free = free
        if free is None:
            return
        limit = self.disk_free_limit
        if not self._disk_low and free < limit:
            self._set(disk=True)
        elif self._disk_low and free >= limit + limit // 10:
            self._set(disk=False)

    def check_total(self, total: int) -> None:
        """The queues' stored bytes are now ``total`` (cheap: called on appends and,
        while over the bound, on removals)."""
        self.total = total
        bound = self.max_total
        if bound <= 0:
            return
        if not self.over_total and total >= bound:
            self._set(total=True)
        elif self.over_total and total < bound - bound // 10:
            self._set(total=False)

    def _set(self, total: bool | None = None, disk: bool | None = None) -> None:
        was = self.blocked
        before = self.reason
        if total is not None:
            self.over_total = total
        if disk is not None:
            self._disk_low = disk
        now = self.clock.seconds()
        if self.blocked and not was:
            self.since = now
            self.episodes += 1
            self.log.warn("durable queues full: publishers to $queue/ are blocked until "
                          "there is room ({why})", why=self.reason)
        elif was and not self.blocked:
            lasted = now - (self.since if self.since is not None else now)
            self.blocked_seconds += lasted
            self.since = None
            self.log.info("durable queues have room again after {s:.1f} s: publishers to "
                          "$queue/ resume ({why})", s=lasted,
                          why=before if before is not None else "")
            if not self.paused:
                self._resume_all()

    # -- blocked publishers ----------------------------------------------------------

    def wait(self, key: int, resume: Callable[[], None]) -> None:
        """Publisher ``key`` stopped (is not read, or has no credit); ``resume`` it
        when the alarm clears (at once if it has cleared already)."""
        if not self.paused:
            resume()
            return
        self._waiting[key] = resume

    def forget(self, key: int) -> None:
        self._waiting.pop(key, None)

    def _resume_all(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for resume in waiting.values():
            try:
                resume()
            except Exception as exc:   # (one publisher's failure must not hold the rest)
                self._failed("resuming a publisher to $queue/", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        """One line per cause a minute, with the traceback of the first."""
        held = self._log_limit.allow(what)
        if held is not None:
            self.log.failure("durable queues' storage alarm: {what} failed ({h} more "
                             "since the last such line)", what=what, h=held)
