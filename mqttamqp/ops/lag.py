"""How late the reactor runs a timer: the event loop's lag, the one number that
says whether the broker answers promptly (a long commit on the reactor thread, a
flood of work, a starved CPU all show here first).

What it owns: a timer every ``interval`` seconds that measures how late it fired,
and a collector for ``mqttamqp_reactor_lag_seconds`` (the last measurement) and
``mqttamqp_reactor_lag_max_seconds`` (the largest since the last scrape).  What it
must not do: do any work of its own on the reactor beyond reading the clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mqttamqp.core.clock import DelayedCall

__all__ = ["ReactorLag"]


class ReactorLag(Collector):
    def __init__(self, reactor: Any, interval: float = 1.0) -> None:
        self.reactor = reactor
        self.interval = interval
        self.last = 0.0
        self.peak = 0.0
        self._due = 0.0
        self._call: DelayedCall | None = None

    def start(self) -> None:
        self._arm()

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _arm(self) -> None:
        self._due = self.reactor.seconds() + self.interval
        self._call = self.reactor.callLater(self.interval, self._fired)

    def _fired(self) -> None:
        self.last = max(0.0, self.reactor.seconds() - self._due)
        self.peak = max(self.peak, self.last)
        self._arm()

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("mqttamqp_reactor_lag_seconds", "How late the reactor ran "
                                "its last lag timer (measured every second).", self.last)
        peak, self.peak = self.peak, self.last
        yield GaugeMetricFamily("mqttamqp_reactor_lag_max_seconds", "The largest reactor "
                                "lag since the last scrape.", peak)

    def describe(self) -> Iterator[Metric]:
        return iter(())
