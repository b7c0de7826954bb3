"""When the storage is packed: on the clock, and whenever it has grown.

Every durable change the broker makes leaves something behind in the storage:
FileStorage appends each new revision and keeps the old ones, and history-free
RelStorage keeps the BTree buckets a queue no longer reaches.  Both are reclaimed only
by a pack.  Packing once a day (``--pack-interval``) lets a busy broker's storage grow
by gigabytes in between, so ``PackSchedule`` also packs when the storage has grown
by ``growth_bytes`` since the last pack ended (``--pack-growth``).  It looks every
``check_seconds`` (a ``stat`` of a file or three, on the reactor thread) and never
starts a pack while one runs.

The bound this keeps, in steady flow: the storage stays under about twice its live
state plus ``growth_bytes`` plus what arrives during one check interval and one pack.
A pack of FileStorage copies the live records to a new file while the old one still
serves, hence the "twice".

It only decides and asks the store: ``size()`` and ``pack()`` are injected, and time
is the injected clock's.  One log line per pack, when it ends, with why it ran;
failures are logged once per failing spell.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

__all__ = ["PackSchedule"]

_log = Logger(namespace="mqttamqp.store.packing")


class PackSchedule:
    """Packs every ``interval_seconds`` (0: never on the clock) and whenever
    ``size()`` has grown by ``growth_bytes`` (0: never on growth) since the last
    pack ended."""

    def __init__(self, clock: Any, size: Callable[[], int],
                 pack: Callable[[], Deferred[None]], *, interval_seconds: float,
                 growth_bytes: int, check_seconds: float = 2.0) -> None:
        self._clock = clock   # an IReactorTime (a task.Clock in tests)
        self._size = size
        self._pack = pack
        self.interval = interval_seconds
        self.growth = growth_bytes
        self.check_seconds = check_seconds
        self.baseline = 0          # size when the last pack ended (or at start)
        self.packing = False
        self.packs = 0             # packs started by this schedule
        self.growth_packs = 0      # of which on growth
        self.failures = 0
        self._failing = False
        self._why = ""
        self._started = 0.0
        self._loops: list[LoopingCall] = []

    def start(self) -> None:
        self.baseline = self._size()
        if self.interval > 0:
            self._loops.append(self._every(self.interval, self.on_clock))
        if self.growth > 0:
            self._loops.append(self._every(self.check_seconds, self.check_growth))

    def stop(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops.clear()

    def _every(self, seconds: float, f: Callable[[], Any]) -> LoopingCall:
        loop = LoopingCall(f)
        loop.clock = self._clock
        loop.start(seconds, now=False)
        return loop

    def on_clock(self) -> None:
        self._start(f"every {self.interval / 3600:g} h")

    def check_growth(self) -> None:
        if self.packing:
            return
        size = self._size()
        if size - self.baseline >= self.growth:
            self.growth_packs += 1
            self._start(f"grown to {size / 1e6:.1f} MB, {(size - self.baseline) / 1e6:.1f} "
                        "MB since the last pack")

    def _start(self, why: str) -> None:
        if self.packing:
            return
        self.packing = True
        self.packs += 1
        self._why = why
        self._started = self._clock.seconds()
        d = self._pack()
        d.addCallbacks(self._packed, self._failed)

    def _packed(self, _: object) -> None:
        self.packing = False
        self._failing = False
        self.baseline = self._size()
        _log.info("storage packed ({why}): now {mb:.1f} MB, in {s:.1f} s", why=self._why,
                  mb=self.baseline / 1e6, s=self._clock.seconds() - self._started)

    def _failed(self, failure: Any) -> None:
        self.packing = False
        self.failures += 1
        # Try again only after as much growth again, not at every check.
        self.baseline = self._size()
        if not self._failing:
            self._failing = True
            _log.failure("packing the storage failed", failure)
