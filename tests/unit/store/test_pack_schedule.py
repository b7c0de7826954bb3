"""``PackSchedule``: packs on the clock and on growth, one at a time, on a ``Clock``.

The storage is a number (its size) and packing is a Deferred the test fires, so
each rule is checked exactly: when a pack starts, that none starts while one runs,
that growth is counted from the size the last pack left, and that a failing pack
is logged once per spell, not at every check.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from mqttamqp.store.packing import PackSchedule

MB = 1_000_000


class FakeStorage:
    def __init__(self, size: int = 0) -> None:
        self.size = size
        self.packs: list[Deferred[None]] = []

    def pack(self) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self.packs.append(d)
        return d


def schedule(clock: Clock, store: FakeStorage, *, interval: float = 0.0,
             growth: int = 24 * MB) -> PackSchedule:
    s = PackSchedule(clock, lambda: store.size, store.pack, interval_seconds=interval,
                     growth_bytes=growth, check_seconds=2.0)
    s.start()
    return s


def test_growth_below_the_threshold_starts_no_pack() -> None:
    """A storage under 24 MB over many checks: no pack."""
    clock, store = Clock(), FakeStorage(5 * MB)
    schedule(clock, store)
    store.size = 24 * MB - 1
    clock.pump([2.0] * 50)
    assert store.packs == []


def test_a_storage_over_the_threshold_at_start_is_packed_at_the_first_check() -> None:
    """Growth counts from nothing at start: a broker restarted more often than
    --pack-interval, each run adding less than --pack-growth, still packs (it never
    did: the baseline was the size at start)."""
    clock, store = Clock(), FakeStorage(200 * MB)
    s = schedule(clock, store)
    clock.advance(2.0)
    assert len(store.packs) == 1 and s.growth_packs == 1
    store.size = 3 * MB
    store.packs[0].callback(None)
    clock.pump([2.0] * 10)
    assert len(store.packs) == 1 and s.baseline == 3 * MB


def test_a_pack_that_raises_at_once_is_a_failed_pack(log_lines: list[str]) -> None:
    """pack() raising (the store closed under it) is logged as a failed pack, and the
    schedule goes on: not stuck "packing" for ever, its loop not dead."""
    clock, store = Clock(), FakeStorage(0)

    def broken() -> Deferred[None]:
        raise RuntimeError("store is closed")

    s = PackSchedule(clock, lambda: store.size, broken, interval_seconds=0,
                     growth_bytes=24 * MB, check_seconds=2.0)
    s.start()
    store.size = 30 * MB
    clock.advance(2.0)
    assert not s.packing and s.failures == 1
    assert len([line for line in log_lines if "packing the storage failed" in line]) == 1
    assert clock.getDelayedCalls()      # the check goes on


def test_growth_past_the_threshold_packs_at_the_next_check() -> None:
    """Growth of 24 MB since the last pack is seen at the next 2-second check."""
    clock, store = Clock(), FakeStorage(0)
    s = schedule(clock, store)
    store.size = 24 * MB
    clock.advance(1.9)
    assert store.packs == []
    clock.advance(0.1)
    assert len(store.packs) == 1 and s.growth_packs == 1


def test_no_second_pack_while_one_runs_and_growth_counts_from_after_the_pack() -> None:
    """While a pack runs, checks start nothing; afterwards the baseline is the size
    the pack left, so the next pack needs 24 MB more than that."""
    clock, store = Clock(), FakeStorage(0)
    s = schedule(clock, store)
    store.size = 30 * MB
    clock.advance(2.0)
    store.size = 90 * MB
    clock.pump([2.0] * 10)
    assert len(store.packs) == 1 and s.packing
    store.size = 1 * MB        # what the pack left
    store.packs[0].callback(None)
    assert not s.packing and s.baseline == 1 * MB
    store.size = 24 * MB       # 23 MB more: not yet
    clock.advance(2.0)
    assert len(store.packs) == 1
    store.size = 25 * MB
    clock.advance(2.0)
    assert len(store.packs) == 2


def test_the_clock_interval_packs_without_growth() -> None:
    """--pack-interval still packs on the clock, growth or not."""
    clock, store = Clock(), FakeStorage(MB)
    s = schedule(clock, store, interval=3600.0, growth=0)
    clock.advance(3599)
    assert store.packs == []
    clock.advance(1)
    assert len(store.packs) == 1 and s.growth_packs == 0


def test_zero_for_both_never_packs_and_leaves_no_timer() -> None:
    """Both off: nothing scheduled at all."""
    clock, store = Clock(), FakeStorage(MB)
    schedule(clock, store, interval=0, growth=0)
    assert clock.getDelayedCalls() == []


def test_stop_leaves_no_timer() -> None:
    """stop() cancels both loops."""
    clock, store = Clock(), FakeStorage(MB)
    s = schedule(clock, store, interval=60.0)
    s.stop()
    assert clock.getDelayedCalls() == []


def test_a_failing_pack_is_logged_once_per_spell(log_lines: list[str]) -> None:
    """Two failures in a row: one log line; a success, then a failure: a second one."""
    clock, store = Clock(), FakeStorage(0)
    s = schedule(clock, store)

    def grow_and_fail(ok: bool) -> None:
        store.size += 30 * MB
        clock.advance(2.0)
        d = store.packs[-1]
        if ok:
            d.callback(None)
        else:
            d.errback(RuntimeError("disk full"))

    grow_and_fail(False)
    grow_and_fail(False)
    failed = [line for line in log_lines if "packing the storage failed" in line]
    assert len(failed) == 1 and s.failures == 2
    grow_and_fail(True)
    grow_and_fail(False)
    failed = [line for line in log_lines if "packing the storage failed" in line]
    assert len(failed) == 2


def test_a_pack_logs_one_line_saying_why(log_lines: list[str]) -> None:
    """One line per pack, when it ends, with the reason and the size left."""
    clock, store = Clock(), FakeStorage(0)
    schedule(clock, store)
    store.size = 30 * MB
    clock.advance(2.0)
    store.size = 2 * MB
    store.packs[0].callback(None)
    lines = [line for line in log_lines if "pack" in line]
    assert len(lines) == 1
    assert "grown to 30.0 MB" in lines[0] and "now 2.0 MB" in lines[0]
