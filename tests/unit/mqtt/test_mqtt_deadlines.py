"""CONNECT and keepalive deadlines of many connections on one reactor timer
(``mqtt.deadlines.Deadlines``), on a ``task.Clock``."""

from __future__ import annotations

from typing import Any


def test_deadlines_fire_exactly_in_order_on_one_timer() -> None:
    """Keepalive checks of many connections share one reactor timer; each fires at
    its own deadline, a cancelled one never does, and once none is left the timer
    runs at most once more, doing nothing, and is gone."""
    from twisted.internet.task import Clock

    from mqttamqp.mqtt.deadlines import Deadlines

    clock = Clock()
    fired: list[str] = []
    deadlines = Deadlines(clock, fired.append)
    a = deadlines.add("a", 10.0)
    deadlines.add("b", 5.0)
    c = deadlines.add("c", 7.0)
    assert len(clock.getDelayedCalls()) == 1
    deadlines.cancel(c)
    clock.advance(5.0 - 1e-6)
    assert fired == []
    clock.advance(2e-6)
    assert fired == ["b"]
    clock.advance(3.0)
    assert fired == ["b"]                  # (c was cancelled)
    deadlines.add("d", 1.0)                # earlier than a: the timer moves
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

    def fire(item: str) -> None:
        if item == "bad":
            raise RuntimeError("boom")
        fired.append(item)

    deadlines = Deadlines(clock, fire)
    deadlines.add("bad", 1.0)
    deadlines.add("good", 2.0)
    clock.advance(1.0)
    clock.advance(1.0)
    assert fired == ["good"]
    keep = deadlines.add("live", 1000.0)
    for _ in range(1000):
        deadlines.cancel(deadlines.add("churn", 900.0))
    assert len(deadlines._heap) < 100 and len(deadlines) == 1
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
    deadlines = Deadlines(clock, fired.append)
    calls: list[float] = []
    call_later = clock.callLater

    def counting(delay: float, *a: Any, **kw: Any) -> Any:
        calls.append(delay)
        return call_later(delay, *a, **kw)

    clock.callLater = counting  # type: ignore[method-assign]
    for n in range(100):
        clock.advance(0.001)
        deadlines.cancel(deadlines.add(f"c{n}", 10.0))
    assert len(calls) == 1 and len(deadlines) == 0
    deadlines.add("late", 10.0)
    clock.advance(10.0)
    assert fired == ["late"] and clock.getDelayedCalls() == []
