"""A gateway's metrics (``--metrics`` in gateway mode): the ``mqttamqp_gateway_*``
series, read at scrape time from the gateway's counters, with the process' own
figures beside them, and the listener's site (``/metrics``, ``/healthz``,
``/readyz``: ready while an upstream connection is open).

What it owns: the metric names and what each reads (the dict of
``mqttamqp.gateway.figures.GatewayFigures.counters``, handed in as a function).
What it must not do: import the gateway (its counters come through that function)
or the core's broker: a gateway has none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from mqttamqp.ops.web import MetricsResource

__all__ = ["GatewayCollector", "gateway_registry", "gateway_ops_site"]

Counters = Callable[[], dict[str, Any]]

# (metric, gauge?, what it is, the key of the counters)
_PLAIN = (
    ("mqttamqp_gateway_clients", True, "MQTT client connections to this gateway (those "
     "still in CONNECT included).", "clients"),
    ("mqttamqp_gateway_upstream_connections", True, "AMQP connections to the core this "
     "gateway keeps (--upstream-connections).", "upstream_connections"),
    ("mqttamqp_gateway_upstream_connections_up", True, "Upstream connections open now.",
     "upstream_up"),
    ("mqttamqp_gateway_upstream_opens", False, "Upstream connections opened (the first "
     "time and every reconnect).", "upstream_opens"),
    ("mqttamqp_gateway_upstream_losses", False, "Open upstream connections that ended "
     "(their clients were closed).", "upstream_losses"),
    ("mqttamqp_gateway_connects", False, "CONNECTs accepted (CONNACK 0).", "connects"),
    ("mqttamqp_gateway_connections_refused", False, "Sockets closed at --max-connections "
     "before any CONNECT.", "connections_refused"),
    ("mqttamqp_gateway_upstream_full", False, "Clients that found every open upstream "
     "connection full (--upstream-max-clients, the core's channel-max).", "upstream_full"),
    ("mqttamqp_gateway_reading_pauses", False, "Times a client was not read for a while "
     "(no credit from the core, or acknowledgements waiting).", "reading_pauses"),
    ("mqttamqp_gateway_held_deliveries", False, "Deliveries written to a client after "
     "its acknowledgements that awaited the core (PUBREC before the copy of its own "
     "QoS 2 message).", "held_deliveries"),
    ("mqttamqp_gateway_cut_after_grace", False, "Clients closed by the gateway that "
     "did not close within --close-grace: cut.", "cut_after_grace"),
    ("mqttamqp_gateway_start_time_seconds", True, "When the gateway started, seconds "
     "since the epoch.", "started"),
)


class GatewayCollector(Collector):
    """Every ``mqttamqp_gateway_*`` series from ``counters()``, read at each scrape."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self.counters()
        for name, gauge, doc, key in _PLAIN:
            yield (GaugeMetricFamily(name, doc, value=float(c[key])) if gauge
                   else CounterMetricFamily(name, doc, value=float(c[key])))
        refused = CounterMetricFamily("mqttamqp_gateway_connects_refused", "CONNECTs "
                                      "refused, by cause (the CONNACK code's meaning).",
                                      labels=["cause"])
        for cause, n in sorted(c["connects_refused"].items()):
            refused.add_metric([cause], float(n))
        yield refused
        messages = CounterMetricFamily("mqttamqp_gateway_messages", "Messages through "
                                       "the gateway: PUBLISHes of its clients sent to the "
                                       "core (to_core), and the core's deliveries written "
                                       "to clients (to_clients).", labels=["direction"])
        messages.add_metric(["to_clients"], float(c["messages_to_clients"]))
        messages.add_metric(["to_core"], float(c["messages_to_core"]))
        yield messages

    def describe(self) -> Iterable[Any]:
        return ()


def gateway_registry(counters: Counters) -> CollectorRegistry:
    """A registry of this gateway's own, with the process' figures beside it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(counters))
    ProcessCollector(registry=registry)
    return registry


class _Health(Resource):
    isLeaf = True

    def __init__(self, counters: Counters, ready: bool) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counters = counters
        self.ready = ready

    def render_GET(self, request: Request) -> bytes:
        c = self.counters()
        up = c["upstream_up"] > 0
        status = 503 if self.ready and not up else 200
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        body = {"status": "ok" if status == 200 else "unavailable", "mode": "gateway",
                "upstream_up": c["upstream_up"], "clients": c["clients"]}
        return json.dumps(body, sort_keys=True).encode() + b"\n"


class _QuietSite(Site):
    """No access line per scrape."""

    def log(self, request: Any) -> None:
        pass


def gateway_ops_site(registry: CollectorRegistry, counters: Counters) -> Site:
    """The metrics listener's site of a gateway: /metrics, /healthz, and /readyz
    (503 while no upstream connection is open: the gateway refuses every CONNECT)."""
    root = Resource()
    children: dict[bytes, Any] = {b"metrics": MetricsResource(registry),
                                  b"healthz": _Health(counters, False),
                                  b"readyz": _Health(counters, True)}
    for name, child in children.items():
        root.putChild(name, child)
    site = _QuietSite(root)  # type: ignore[no-untyped-call]
    site.displayTracebacks = False
    return site
