"""The protocol adapters' toolkit (``mqttamqp.adapter``) on its own: the delivery
meter's counters and its one sampling rule, and the publish throttle's pause,
growth and resume, on a ``task.Clock`` with a fake budget."""

from __future__ import annotations

from twisted.internet.task import Clock

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.adapter.throttle import PublishThrottle
from mqttamqp.core.stats import DELIVER_SAMPLE_MASK, BrokerStats
from mqttamqp.security.admission import PublishRate

EVERY = DELIVER_SAMPLE_MASK + 1


def _stats(now: float = 100.0) -> BrokerStats:
    return BrokerStats(seconds=lambda: now)


def test_an_mqtt_delivery_counts_message_and_bytes() -> None:
    """``delivered`` counts the message and its bytes on the wire."""
    stats = _stats()
    meter = DeliveryMeter(stats)
    meter.delivered(99.0, 70)
    meter.delivered(99.0, 30)
    assert (stats.messages_sent, stats.bytes_sent, stats.messages_sent_amqp) == (2, 100, 0)


def test_an_amqp_transfer_counts_the_message_for_amqp_too_but_not_bytes() -> None:
    """``transferred`` counts the message in the total and AMQP's share; bytes are
    counted per socket write (``sent_bytes``)."""
    stats = _stats()
    meter = DeliveryMeter(stats)
    meter.transferred(99.0)
    meter.sent_bytes(40)
    assert (stats.messages_sent, stats.messages_sent_amqp, stats.bytes_sent) == (1, 1, 40)


def test_one_delivery_in_every_mask_plus_one_is_sampled_whatever_the_protocol() -> None:
    """The delivery that makes ``messages_sent`` a multiple of MASK + 1 is sampled,
    MQTT and AMQP deliveries counting alike."""
    stats = _stats(now=100.0)
    meter = DeliveryMeter(stats)
    for i in range(3 * EVERY):
        if i % 2:
            meter.delivered(99.5, 10)
        else:
            meter.transferred(99.5)
    assert stats.deliver_latency.count == 3
    assert stats.deliver_latency.total == 1.5


def test_a_transfer_that_is_no_message_takes_its_turn_without_a_sample() -> None:
    """A pubrel or control reply (no timestamp) on the sampled count observes nothing;
    the next sampled delivery is MASK + 1 later."""
    stats = _stats()
    meter = DeliveryMeter(stats)
    for _ in range(EVERY - 1):
        meter.transferred(99.0)
    meter.transferred()             # the sampled turn: not a message
    assert stats.deliver_latency.count == 0
    for _ in range(EVERY):
        meter.transferred(99.0)
    assert stats.deliver_latency.count == 1


def test_refusals_errors_limits_and_gauges_land_in_the_core_counters() -> None:
    """Every other write of the adapters goes to the counter ``$SYS`` reads."""
    stats = _stats()
    meter = DeliveryMeter(stats)
    meter.received_bytes(5)
    meter.refused()
    meter.protocol_error()
    meter.limit_hit("amqp_links")
    meter.limit_hit("amqp_links")
    meter.turn_yielded()
    meter.links_attached(7)
    meter.received_amqp()
    meter.amqp_only()
    assert (stats.bytes_received, stats.connections_refused, stats.protocol_errors) == (5, 1, 1)
    assert stats.limits == {"amqp_links": 2}
    assert (stats.mqtt_turns_yielded, stats.amqp_links) == (1, 7)
    assert (stats.messages_received_amqp, stats.messages_amqp_only) == (1, 1)


class _Budget:
    """A budget that answers the waits it is given, in order (then 0)."""

    def __init__(self, *waits: float) -> None:
        self.waits = list(waits)
        self.charged: list[int] = []

    def take(self, size: int) -> float:
        self.charged.append(size)
        return self.waits.pop(0) if self.waits else 0.0


class _Publisher:
    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []

    def paused(self, wait: float) -> None:
        self.events.append(("pause", wait))

    def resumed(self) -> None:
        self.events.append(("resume", 0.0))


def test_within_budget_the_publisher_is_never_paused() -> None:
    """A charge the budget covers changes nothing and arms no timer."""
    clock, pub, budget = Clock(), _Publisher(), _Budget(0.0, 0.0)
    throttle = PublishThrottle(budget, clock, pub.paused, pub.resumed)
    throttle.charge(10)
    throttle.charge(20)
    assert budget.charged == [10, 20] and pub.events == [] and not clock.getDelayedCalls()
    assert not throttle.paused


def test_over_budget_it_pauses_once_and_resumes_when_the_wait_is_over() -> None:
    """One pause (told the wait), one timer, one resume when it fires."""
    clock, pub = Clock(), _Publisher()
    throttle = PublishThrottle(_Budget(0.5), clock, pub.paused, pub.resumed)
    throttle.charge(10)
    assert pub.events == [("pause", 0.5)] and throttle.paused
    clock.advance(0.5 - 1e-6)
    assert pub.events == [("pause", 0.5)]
    clock.advance(1e-6)
    assert pub.events == [("pause", 0.5), ("resume", 0.0)]
    assert not throttle.paused and not clock.getDelayedCalls()


def test_a_charge_while_paused_makes_the_pause_longer_not_a_second_one() -> None:
    """What the publisher still had in flight pays by a longer pause: the timer is
    reset to the new wait, the publisher is not paused twice."""
    clock, pub = Clock(), _Publisher()
    throttle = PublishThrottle(_Budget(0.5, 0.75), clock, pub.paused, pub.resumed)
    throttle.charge(10)
    clock.advance(0.25)
    throttle.charge(10)             # resumes 0.75 from now: at 1.0, not at 0.5
    assert pub.events == [("pause", 0.5)]
    clock.advance(0.5)
    assert pub.events == [("pause", 0.5)]
    clock.advance(0.25)
    assert pub.events == [("pause", 0.5), ("resume", 0.0)]


def test_stop_cancels_the_resume() -> None:
    """A publisher gone while paused leaves no timer behind and is not resumed."""
    clock, pub = Clock(), _Publisher()
    throttle = PublishThrottle(_Budget(1.0), clock, pub.paused, pub.resumed)
    throttle.charge(10)
    throttle.stop()
    assert not clock.getDelayedCalls() and not throttle.paused
    clock.advance(2.0)
    assert pub.events == [("pause", 1.0)]


def test_a_stopped_publisher_and_its_throttle_are_freed_without_the_cycle_collector() -> None:
    """A publisher holds its throttle and the throttle the publisher's callbacks;
    once stopped, dropping the publisher frees both by reference counting."""
    import gc
    import weakref

    pub = _Publisher()
    pub.throttle = PublishThrottle(_Budget(1.0), Clock(), pub.paused, pub.resumed)  # type: ignore[attr-defined]
    gone = weakref.ref(pub)
    pub.throttle.stop()  # type: ignore[attr-defined]
    gc.disable()
    try:
        del pub
        assert gone() is None
    finally:
        gc.enable()


def test_with_the_cores_publish_rate_the_pause_pays_for_the_excess() -> None:
    """With the core's ``PublishRate`` (2 messages a second, bursts of 2) the third
    message in one instant pauses the publisher for half a second."""
    clock, pub = Clock(), _Publisher()
    throttle = PublishThrottle(PublishRate(clock.seconds, 2.0, 0.0), clock, pub.paused,
                               pub.resumed)
    for _ in range(3):
        throttle.charge(1)
    assert pub.events == [("pause", 0.5)]
    clock.advance(0.5)
    assert pub.events[-1] == ("resume", 0.0)


def test_the_close_grace_cuts_only_a_connection_still_there() -> None:
    """A cut whose call fires once its connection is gone (closed in time, the call
    not cancelled) is no cut: not counted, not logged, nothing aborted; over TLS the
    TCP transport below says so.  One still there is cut, counted and logged."""
    from loglines import LogLines
    from twisted.internet.testing import StringTransport
    from twisted.logger import Logger

    from mqttamqp.adapter.grace import CloseGrace

    class Socket(StringTransport):
        aborted = 0

        def abortConnection(self) -> None:
            self.aborted += 1

    class Tls:   # (a wrapper with no flag of its own: TLSMemoryBIOProtocol)
        def __init__(self, below: Socket) -> None:
            self.transport = below
            self.aborted = 0

        def abortConnection(self) -> None:
            self.aborted += 1

    clock, counted = Clock(), []
    grace = CloseGrace(clock, 2.0, Logger(), "MQTT", lambda: counted.append(1))
    gone, under_tls, there = Socket(), Socket(), Socket()
    gone.disconnected = under_tls.disconnected = True
    tls = Tls(under_tls)
    with LogLines("--close-grace") as lines:
        for transport in (gone, tls, there):
            grace.arm(transport, "c")
        clock.advance(2.0)
    assert (gone.aborted, tls.aborted, there.aborted) == (0, 0, 1)
    assert grace.cut == 1 and counted == [1] and len(lines) == 1
