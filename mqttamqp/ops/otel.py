"""The optional OpenTelemetry export (``pip install '.[otel]'``, ``--otel-endpoint``):
the same gauges and counters as ``/metrics``, through the OTel SDK's observable
instruments and, in production, its OTLP/HTTP exporter.

Threads: the SDK's reader calls the instruments' callbacks on its own thread,
which must not read the core's live dicts.  So the reactor takes a
``metrics.snapshot`` every ``interval`` seconds (``refresh``) and the callbacks
only read the last one; an export is at most one interval behind.  The OTel API
has no observable histogram, so the histograms are mirrored as they are observed
(``core.stats.Histogram.listeners``: a synchronous OTel histogram with the same
bucket bounds records each value; the SDK's instruments are thread-safe).

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


def _histograms(broker: Broker) -> dict[str, tuple[Any, str, str]]:
    """The histograms /metrics shows, by name: (histogram, description, unit)."""
    stats = broker.stats
    return {
        "mqttamqp_commit_latency_seconds": (stats.commit_latency, "From handing a batch "
                                            "to the writer thread to its durable commit.",
                                            "s"),
        "mqttamqp_commit_batch_size": (stats.commit_batch, "Store operations per commit.",
                                       "1"),
        "mqttamqp_publish_deliver_latency_seconds": (
            stats.deliver_latency, "From a message's arrival to its delivery to a client "
            "(one delivery in 1024 sampled).", "s"),
    }


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
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

        histograms = _histograms(broker)
        views = [View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(
            list(h.bounds))) for name, (h, _doc, _unit) in histograms.items()]
        self.provider = MeterProvider(metric_readers=[reader], views=views)
        self._latest: dict[str, Family] = {}
        self._loop: LoopingCall | None = None
        self.refresh()
        meter = self.provider.get_meter("mqttamqp")
        self._mirrors: list[tuple[Any, Callable[[float], None]]] = []
        for name, (h, doc, unit) in histograms.items():
            record = meter.create_histogram(name, unit=unit, description=doc).record
            h.listeners.append(record)
            self._mirrors.append((h, record))
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

    def unmirror(self) -> None:
        """Stop mirroring the histograms (part of ``stop``)."""
        for h, record in self._mirrors:
            if record in h.listeners:
                h.listeners.remove(record)
        self._mirrors = []

    def start(self) -> None:
        self._loop = LoopingCall(self.refresh)
        self._loop.clock = self.reactor
        self._loop.start(self.interval, now=True).addErrback(
            lambda f: self.log.failure("taking the OpenTelemetry snapshot failed", f))

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self.unmirror()
        # The last export goes over the network: not on the reactor thread.
        d = deferToThreadPool(self.reactor, self.reactor.getThreadPool(),
                              self.provider.shutdown, timeout_millis=5000)
        d.addErrback(lambda f: self.log.failure("stopping the OpenTelemetry export", f))
