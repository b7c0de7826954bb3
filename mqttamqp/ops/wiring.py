"""What ``ops`` adds to a ``BrokerService``: one object the service holds, so the
service's own code grows by a few calls.

It builds, on demand, the broker's private metrics registry, the readiness
checks and the metrics listener's site; puts ``/metrics`` on the console with
its token; starts and stops the OpenTelemetry export; and gives twistd's
application the log observer of ``--log-format`` / ``--log-level``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from twisted.logger import ILogObserver
from twisted.web.server import Site

from mqttamqp.ops.health import Readiness, WriteProbe, liveness
from mqttamqp.ops.lag import ReactorLag
from mqttamqp.ops.logs import level_filter, make_observer, open_destination, set_level
from mqttamqp.ops.metrics import StoreCollector, broker_registry
from mqttamqp.ops.web import MetricsResource, ops_site, with_metrics

__all__ = ["OpsWiring"]


class OpsWiring:
    def __init__(self, service: Any) -> None:
        self.service = service
        self.token: str | None = None
        self.otel_endpoint: str | None = None
        self.otel_interval = 60.0
        self.otel: Any = None
        self.log_format = "text"
        self.log_level: str | None = None
        self.log_destination: tuple[str | None, bool] = (None, True)
        self.under_twistd = False       # twistd's own options were there (the plugin)
        self.level_filter: Any = None   # the installed observer's, for SIGHUP
        self._registry: CollectorRegistry | None = None
        self._readiness: Readiness | None = None
        self.lag: ReactorLag | None = None

    def configure(self, options: Any) -> None:
        """Take the ops options (``Options``) and twistd's own, when there are any."""
        self.token = options.get("metrics-token")
        self.otel_endpoint = options.get("otel-endpoint")
        self.otel_interval = options.get("otel-interval", 60.0)
        self.log_format = options.get("log-format", "text")
        self.log_level = options.get("log-level")
        parent = getattr(options, "parent", None)   # twistd's ServerOptions
        if parent is not None:
            self.log_destination = (parent.get("logfile"), bool(parent.get("nodaemon")))
            self.under_twistd = not parent.get("syslog")   # syslog: twistd's own observer
            if parent.get("syslog"):
                self.log_format, self.log_level = "text", None

    @property
    def registry(self) -> CollectorRegistry:
        if self._registry is None:
            self._registry = broker_registry(self.service.broker)
            self.lag = ReactorLag(self.service.reactor)
            self._registry.register(self.lag)
            store = getattr(self.service, "store", None)

            def store_stats() -> dict[str, Any] | None:
                opened = getattr(store, "opened", None)
                return opened.stats() if opened is not None else None

            self._registry.register(StoreCollector(store_stats))
            if self.service.ha is not None:
                from mqttamqp.ops.metrics import HACollector

                self._registry.register(HACollector(self.service.ha.figures))
            from mqttamqp.ops.metrics import BridgeCollector

            # (read at each scrape: the bridges may be built after the registry)
            self._registry.register(BridgeCollector(
                lambda: b.figures() if (b := getattr(self.service, "bridges", None)) else []))
        return self._registry

    @property
    def readiness(self) -> Readiness:
        if self._readiness is None:
            svc = self.service
            self._readiness = Readiness(
                svc.broker, lambda: svc.store.opened is not None, lambda: svc.listeners,
                WriteProbe(svc.reactor, svc.data_dir),
                (lambda: svc.ha.role) if svc.ha is not None else None)
        return self._readiness

    def site(self) -> Site:
        """The metrics listener's site: /metrics, /healthz, /readyz."""
        broker = self.service.broker
        registry = self.registry
        lag = self.lag
        return ops_site(registry, self.readiness,
                        lambda: liveness(broker, lag.last if lag is not None else None))

    def mount_on_console(self, site: Site) -> None:
        if self.token is not None:
            with_metrics(site, MetricsResource(self.registry, self.token))

    def start(self) -> None:
        # Only with a metrics listener (it built the readiness checks): the first
        # /readyz after the start then has the write probe's answer.
        probe = self._readiness.probe if self._readiness is not None else None
        if probe is not None:
            probe.start()
        if self.lag is not None:
            self.lag.start()
        if self.otel_endpoint:
            from mqttamqp.ops.otel import OTelExport, otlp_reader

            svc = self.service
            self.otel = OTelExport(svc.broker, svc.reactor,
                                   otlp_reader(self.otel_endpoint, self.otel_interval),
                                   self.otel_interval)
            self.otel.start()
            svc.log.info("exporting metrics through OpenTelemetry to {u} every {s:g}s",
                         u=self.otel_endpoint, s=self.otel_interval)

    def stop(self) -> None:
        if self.lag is not None:
            self.lag.stop()
        if self.otel is not None:
            self.otel.stop()
            self.otel = None

    def set_log_observer(self, parent: Any) -> None:
        """On twistd's application (a Componentized), the observer twistd logs to:
        under the twistd plugin always (to the same place twistd would log, so SIGHUP
        can change the level), elsewhere (a .tac file) when a format or level was
        asked for; otherwise twistd's own is left."""
        if not self.under_twistd and self.log_format == "text" and self.log_level is None:
            return
        set_component = getattr(parent, "setComponent", None)
        if set_component is None:
            return
        stream = open_destination(*self.log_destination)
        self.level_filter = level_filter(self.log_level or "debug")
        set_component(ILogObserver, make_observer(stream, self.log_format,
                                                  predicate=self.level_filter))

    def reload_log_level(self, options: Any) -> None:
        """SIGHUP: the new --log-level (none: everything) applies at once."""
        level = options.get("log-level") or "debug"
        if self.level_filter is None:
            self.service.log.warn("--log-level {l} applies at the next start (the log "
                                  "goes through twistd's own observer)", l=level)
            return
        set_level(self.level_filter, level)
        self.log_level = options.get("log-level")
