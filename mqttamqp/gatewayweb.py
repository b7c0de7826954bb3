"""The process in gateway mode with its web listeners: the gateway of
``mqttamqp.gateway.service.make_gateway``, and for ``--web`` its own console
(``console.gatewaysite``) and for ``--metrics`` its ``mqttamqp_gateway_*`` series
(``ops.gatewaymetrics``), both reading ``gateway.figures.GatewayFigures``.

Why here and not in ``mqttamqp.gateway``: the gateway package imports neither the
console nor ``ops`` (the import contract ``gateway-keeps-no-state``), and they do not
import the gateway; this module joins them, as ``service`` does for a broker.

What it must not do: build a store or the core's broker.
"""

from __future__ import annotations

from typing import Any

from mqttamqp.core.limits import Limits
from mqttamqp.gateway.figures import GatewayFigures
from mqttamqp.gateway.service import GatewayService, make_gateway

__all__ = ["make_gateway_process"]


def make_gateway_process(options: Any, limits: Limits) -> GatewayService:
    """The gateway of ``options``, with its console and metrics listeners."""
    svc = make_gateway(options, limits)
    figures = GatewayFigures(svc.mqtt_factory, svc.pool, svc.reactor)
    svc.figures = figures  # type: ignore[attr-defined]
    if options["web"]:
        from mqttamqp.console.gatewaysite import make_gateway_site

        site = make_gateway_site(figures, options["data"], svc.reactor, svc)
        for description in options["web"]:
            svc.add_listener("web", description, site, "users")
    if options["metrics"]:
        from mqttamqp.ops.gatewaymetrics import gateway_ops_site, gateway_registry

        registry = gateway_registry(figures.counters)
        svc.add_listener("metrics", options["metrics"],
                         gateway_ops_site(registry, figures.counters), "open")
    return svc
