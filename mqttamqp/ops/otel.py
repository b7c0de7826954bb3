"""The optional OpenTelemetry export (``pip install '.[otel]'``, ``--otel-endpoint``):
the same gauges and counters as ``/metrics``, through the OTel SDK's observable
instruments and, in production, its OTLP/HTTP exporter.

Threads: the SDK's reader calls the instruments' callbacks on its own thread,
which must not read the core's live dicts.  So the reactor takes a
``metrics.snapshot`` every ``interval`` seconds (``refresh``) and the callbacks
only read the last one; an export is at most one interval behind.  The
histograms are not exported here (the OTel API has no observable histogram);
Prometheus has them.

What it must not do: import the SDK unless the export is asked for, or wait on
the exporter's network on the reactor thread (its shutdown runs in a thread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from mqttamqp.core.broker import Broker
from mqttamqp.ops.metrics import COUNTER, GAUGE, Family, snapshot

__all__ = ["OTelExport", "otel_available", "otlp_reader"]


def otel_available() -> bool:
    try:
        import opentelemetry.sdk.metrics  # noqa: F401
    except ImportError:
        return False
    return True


def otlp_reader(endpoint: str, interval: float) -> Any:
    """A periodic reader feeding the OTLP/HTTP exporter at ``endpoint``."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    return PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint),
                                         export_interval_millis=interval * 1000.0)


class OTelExport:
    log = Logger(namespace="mqttamqp.ops")

    def __init__(self, broker: Broker, reactor: Any, reader: Any,
                 interval: float = 60.0) -> None:
        from opentelemetry.sdk.metrics import MeterProvider

        self.broker = broker
        self.reactor = reactor
        self.interval = interval
        self.provider = MeterProvider(metric_readers=[reader])
        self._latest: dict[str, Family] = {}
        self._loop: LoopingCall | None = None
        self.refresh()
        meter = self.provider.get_meter("mqttamqp")
        for family in self._latest.values():
            if family.kind == COUNTER:
                meter.create_observable_counter(family.name, [self._observer(family.name)],
                                                unit=family.unit, description=family.doc)
            elif family.kind == GAUGE:
                meter.create_observable_gauge(family.name, [self._observer(family.name)],
                                              unit=family.unit, description=family.doc)

    def refresh(self) -> None:
        """Take the snapshot the callbacks read (on the reactor thread)."""
        self._latest = {f.name: f for f in snapshot(self.broker)}

    def _observer(self, name: str) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def observe(options: Any) -> Iterable[Any]:
            family = self._latest.get(name)
            if family is None:
                return []
            return [Observation(value, labels) for labels, value in family.labelled()]
        return observe

    def start(self) -> None:
        self._loop = LoopingCall(self.refresh)
        self._loop.clock = self.reactor
        self._loop.start(self.interval, now=True).addErrback(
            lambda f: self.log.failure("taking the OpenTelemetry snapshot failed", f))

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        # The last export goes over the network: not on the reactor thread.
        d = deferToThreadPool(self.reactor, self.reactor.getThreadPool(),
                              self.provider.shutdown, timeout_millis=5000)
        d.addErrback(lambda f: self.log.failure("stopping the OpenTelemetry export", f))
