"""CONNECT and keepalive deadlines of many connections on one reactor timer
(``mqtt.deadlines.Deadlines``), on a ``task.Clock``."""

from __future__ import annotations

from typing import Any


class Item:
    """A connection as ``Deadlines`` sees it: an attribute for its due time."""

    __slots__ = ("due", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.due: float | None = None

    def __repr__(self) -> str:
        return self.name


def test_deadlines_fire_exactly_in_order_on_one_timer() -> None:
    """Keepalive checks of many connections share one reactor timer; each fires at
    its own deadline, a cancelled one never does, and once none is left the timer
    runs at most once more, doing nothing, and is gone."""
    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    clock = Clock()
    fired: list[str] = []
    deadlines = Deadlines(clock, lambda item: fired.append(item.name), "due")
    a, b, c, d = Item("a"), Item("b"), Item("c"), Item("d")
    deadlines.add(a, 10.0)
    deadlines.add(b, 5.0)
    deadlines.add(c, 7.0)
    assert len(clock.getDelayedCalls()) == 1
    deadlines.cancel(c)
    clock.advance(5.0 - 1e-6)
    assert fired == []
    clock.advance(2e-6)
    assert fired == ["b"]
    clock.advance(3.0)
    assert fired == ["b"]                  # (c was cancelled)
    deadlines.add(d, 1.0)                  # earlier than a: the timer moves
    clock.advance(1.0)
    assert fired == ["b", "d"] and len(deadlines) == 1
    deadlines.cancel(a)
    assert len(deadlines) == 0
    clock.advance(10.0)
    assert fired == ["b", "d"] and clock.getDelayedCalls() == []


def test_deadlines_survive_a_failing_check_and_forget_cancelled_entries() -> None:
    """Review findings: one check that raised stopped every later keepalive, and
    cancelled entries piled up until their (possibly distant) deadlines."""
    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    clock = Clock()
    fired: list[str] = []

    def fire(item: Item) -> None:
        if item.name == "bad":
            raise RuntimeError("boom")
        fired.append(item.name)

    deadlines = Deadlines(clock, fire, "due")
    deadlines.add(Item("bad"), 1.0)
    deadlines.add(Item("good"), 2.0)
    clock.advance(1.0)
    clock.advance(1.0)
    assert fired == ["good"]
    keep = Item("live")
    deadlines.add(keep, 1000.0)
    for n in range(1000):
        churn = Item(f"churn{n}")
        deadlines.add(churn, 900.0 + n % 7)
        deadlines.cancel(churn)
    assert deadlines._entries < 100 and len(deadlines) == 1
    deadlines.cancel(keep)
    clock.advance(1000.0)
    assert fired == ["good"] and clock.getDelayedCalls() == []


def test_deadlines_added_and_cancelled_in_turn_keep_one_timer() -> None:
    """A connect storm adds a CONNECT deadline and cancels it at once, connection
    after connection: the reactor timer is set once, not moved each time, and a
    deadline still fires on time afterwards."""
    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    clock = Clock()
    fired: list[str] = []
    deadlines = Deadlines(clock, lambda item: fired.append(item.name), "due")
    calls: list[float] = []
    call_later = clock.callLater

    def counting(delay: float, *a: Any, **kw: Any) -> Any:
        calls.append(delay)
        return call_later(delay, *a, **kw)

    clock.callLater = counting  # type: ignore[method-assign]
    for n in range(100):
        clock.advance(0.001)
        item = Item(f"c{n}")
        deadlines.add(item, 10.0)
        deadlines.cancel(item)
    assert len(calls) == 1 and len(deadlines) == 0
    deadlines.add(Item("late"), 10.0)
    clock.advance(10.0)
    assert fired == ["late"] and clock.getDelayedCalls() == []


def test_deadlines_in_the_wheel_fire_at_their_exact_time_whatever_the_order() -> None:
    """The wheel of one-second buckets keeps each deadline exactly: in a seeded
    random run of adds, replacements, cancels and clock steps (fractions of a
    second and many seconds), every live deadline fires in the first step that
    reaches it, never before, once, and a cancelled or replaced one never."""
    import random

    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    rng = random.Random(31)
    clock = Clock()
    clock.advance(1000.25)
    fired: list[tuple[Item, float]] = []
    deadlines = Deadlines(clock, lambda item: fired.append((item, clock.seconds())), "due")
    items = [Item(f"i{n}") for n in range(40)]
    expected: dict[int, float] = {}   # id(item) -> its due time (the model)
    for _ in range(3000):
        item = rng.choice(items)
        roll = rng.random()
        if roll < 0.45:
            delay = rng.choice((0.0, rng.random(), rng.random() * 5, rng.random() * 90))
            deadlines.add(item, delay)
            expected[id(item)] = clock.seconds() + delay
            if delay == 0.0:
                assert clock.getDelayedCalls()   # (due now: the timer runs next turn)
        elif roll < 0.6:
            deadlines.cancel(item)
            expected.pop(id(item), None)
        else:
            clock.advance(rng.choice((0.01, 0.3, 1.0, rng.random() * 20)))
            now = clock.seconds()
            due_now = {key for key, due in expected.items() if due <= now}
            got = {id(item) for item, _ in fired}
            assert got == due_now and len(fired) == len(got)
            for item, when in fired:
                assert when >= expected.pop(id(item)) and item.due is None
            fired.clear()
        assert len(deadlines) == len(expected)
        assert deadlines._entries <= 2 * len(expected) + 65 + 40
    for item in items:
        deadlines.cancel(item)
    clock.advance(200.0)
    assert fired == [] and clock.getDelayedCalls() == []


def test_a_deadline_added_again_replaces_the_first() -> None:
    """An item has one deadline: adding it again moves it (earlier or later), and
    it fires once, at the new time."""
    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    clock = Clock()
    fired: list[float] = []
    deadlines = Deadlines(clock, lambda item: fired.append(clock.seconds()), "due")
    item = Item("a")
    deadlines.add(item, 5.0)
    deadlines.add(item, 12.5)
    assert len(deadlines) == 1
    clock.advance(12.0)
    assert fired == []
    clock.advance(0.5)
    assert fired == [12.5]
    deadlines.add(item, 30.0)
    deadlines.add(item, 0.25)
    clock.advance(0.25)
    clock.advance(40.0)
    assert fired == [12.5, 12.75] and clock.getDelayedCalls() == []


class Reboxing(Item):
    """An item whose due time reads back as an equal float, not the same object, as
    an attribute of a class compiled with mypyc does (it keeps the double, and makes
    a new float at each read)."""

    __slots__ = ("_due",)

    def __init__(self, name: str) -> None:
        self._due: float | None = None
        super().__init__(name)

    @property  # type: ignore[override]
    def due(self) -> float | None:
        return None if self._due is None else float(repr(self._due))

    @due.setter
    def due(self, value: float | None) -> None:
        self._due = value


def test_due_times_are_compared_by_value_not_identity() -> None:
    """The wheel told a live entry from a replaced one by the identity of its float:
    in a build compiled with mypyc (bench/mypyc_build.py), where no float keeps its
    identity, no deadline ever fired.  Deadlines fire by value, once each."""
    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    clock = Clock()
    fired: list[tuple[str, float]] = []
    deadlines = Deadlines(clock, lambda item: fired.append((item.name, clock.seconds())),
                          "due")
    a, b = Reboxing("a"), Reboxing("b")
    assert a.due is None
    deadlines.add(a, 5.0)
    deadlines.add(b, 2.0)
    deadlines.add(b, 7.0)      # (moved later: its entry at 2 is stale)
    deadlines.add(a, 5.0)      # (the same time again: two entries, one deadline)
    clock.advance(3.0)
    assert fired == []
    clock.advance(2.0)
    assert fired == [("a", 5.0)]
    clock.advance(2.0)
    assert fired == [("a", 5.0), ("b", 7.0)]
    assert len(deadlines) == 0
    clock.advance(10.0)
    assert fired == [("a", 5.0), ("b", 7.0)] and clock.getDelayedCalls() == []


def test_a_cancelled_item_is_no_longer_held_by_the_wheel() -> None:
    """Review finding: cancel left a closed connection in its bucket until its second
    came (up to 1.5 × keepalive), so connection churn kept closed connections alive."""
    import gc
    import weakref

    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    class Conn:
        __slots__ = ("__weakref__", "due")

        def __init__(self) -> None:
            self.due: float | None = None

    clock = Clock()
    deadlines = Deadlines(clock, lambda item: None, "due")
    keep = [Conn() for _ in range(20)]
    for conn in keep:
        deadlines.add(conn, 90.0)
    gone = Conn()
    deadlines.add(gone, 90.0)
    ref = weakref.ref(gone)
    deadlines.cancel(gone)
    del gone
    gc.collect()
    assert ref() is None
    assert len(deadlines) == 20


def test_a_deadline_added_after_the_clock_stepped_back_is_not_late() -> None:
    """Review finding: with the timer set for a bucket's second already past, a clock
    stepped back made a new, earlier deadline fire when the timer ran, not at its time."""
    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    clock = Clock()
    clock.advance(1000.5)
    fired: list[tuple[str, float]] = []
    deadlines = Deadlines(clock, lambda item: fired.append((item.name, clock.seconds())),
                          "due")
    a, b = Item("a"), Item("b")
    deadlines.add(a, 0.2)           # due 1000.7
    clock.rightNow -= 5.0           # the wall clock steps back
    deadlines.add(b, 1000.2 - clock.seconds())
    while clock.getDelayedCalls() and not fired:
        clock.advance(min(c.getTime() for c in clock.getDelayedCalls()) - clock.seconds())
    assert fired and fired[0][0] == "b" and abs(fired[0][1] - 1000.2) < 1e-6


def test_cancels_in_a_large_bucket_in_any_order_keep_few_closed_items() -> None:
    """Review finding: a cancel scanned its whole bucket, so a busy second's items
    cancelled in random order cost quadratic time; a large bucket is not scanned, and
    the compaction keeps the closed items reachable from the wheel few."""
    import gc
    import random
    import weakref

    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    class Conn:
        __slots__ = ("__weakref__", "due")

        def __init__(self) -> None:
            self.due: float | None = None

    clock = Clock()
    deadlines = Deadlines(clock, lambda item: None, "due")
    conns = [Conn() for _ in range(2000)]
    for conn in conns:
        deadlines.add(conn, 90.0)            # all in one second's bucket
    random.Random(7).shuffle(conns)
    closed = conns[:1800]
    refs = [weakref.ref(conn) for conn in closed]
    for conn in closed:
        deadlines.cancel(conn)
    del closed, conn
    conns = conns[1800:]
    gc.collect()
    still = sum(ref() is not None for ref in refs)
    assert len(deadlines) == 200
    assert still <= 200 // 4 + 64


def test_soon_deadlines_arm_only_what_still_needs_one() -> None:
    """``SoonDeadlines`` arms, one turn later, only the items still needing a deadline,
    with the delay less the time the turn took, and leaves no timer behind."""
    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import SoonDeadlines

    clock = Clock()
    clock.advance(50.0)
    armed: list[tuple[str, float]] = []
    done = {"b"}
    soon = SoonDeadlines(clock, 10.0, lambda item: item not in done,
                         lambda item, delay: armed.append((item, delay)))
    soon.add("a")
    soon.add("b")
    soon.add("c")
    assert len(clock.getDelayedCalls()) == 1 and len(soon) == 2
    done.add("c")              # (its CONNECT came in the same turn)
    clock.advance(0.25)        # (the turn took a quarter second)
    assert armed == [("a", 9.75)]
    assert clock.getDelayedCalls() == [] and len(soon) == 0
    soon.add("d")              # (a later turn: a timer of its own again)
    clock.advance(0)
    assert armed[-1] == ("d", 10.0)


def test_connect_read_in_the_accept_turn_arms_no_deadline() -> None:
    """A CONNECT read in the turn that accepted the socket never puts a CONNECT
    deadline in the wheel; a silent socket gets one at the next turn."""
    from mqtt_memory import ACCEPTED, Harness

    h = Harness(connect_timeout=5.0)
    quick = h.client()
    silent = h.client()
    assert quick.connect("q") == [ACCEPTED]
    h.clock.advance(0)
    assert len(h.factory.connect_deadlines) == 1
    assert quick.proto._connect_timer is None and silent.proto._connect_timer == 5.0
    h.clock.advance(5.0 - 0.001)
    assert silent.open
    h.clock.advance(0.002)
    assert not silent.open and quick.open
