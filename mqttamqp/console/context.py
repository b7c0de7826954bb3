"""The console's one window on the process around it (``ConsoleContext``), and
the shape of the thread runner it is given for blocking work (``RunInThread``).
It holds no state of its own and serves no route.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred

from mqttamqp.console.traffic import ReportRunner
from mqttamqp.core.broker import Broker

__all__ = ["ConsoleContext", "RunInThread"]

RunInThread = Callable[..., "Deferred[Any]"]


@dataclass(frozen=True)
class ConsoleContext:
    """What the console needs from the process around it, and nothing more: the
    broker's façade, where the admin users live, the clock, and the listeners and
    storage figures the overview shows."""

    broker: Broker
    data_dir: str
    clock: Any
    listeners: Callable[[], list[dict[str, str]]]
    storage_stats: Callable[[], dict[str, Any] | None]
    archive_dir: str | None = None        # None: the archive is off
    report_dir: str | None = None         # where the traffic report is written
    report_job: ReportRunner | None = None
    ha: Callable[[], dict[str, Any]] | None = None   # --ha: the role and its times
    # [[bridge]] tables: each bridge's figures (``mqttamqp.bridge.service.Bridges``)
    bridges: Callable[[], list[dict[str, Any]]] | None = None

    @classmethod
    def of(cls, service: Any) -> ConsoleContext:
        """The context of a ``BrokerService`` (or anything shaped like one)."""
        def listeners() -> list[dict[str, str]]:
            return [{"kind": ls.kind, "description": ls.description, "address": ls.address}
                    for ls in getattr(service, "listeners", [])]

        def storage_stats() -> dict[str, Any] | None:
            stats_fn = getattr(getattr(service, "store", None), "stats", None)
            return stats_fn() if callable(stats_fn) else None

        def bridges() -> list[dict[str, Any]]:
            # (read when asked: the bridges are built after the web listener)
            built = getattr(service, "bridges", None)
            return built.figures() if built is not None else []

        return cls(service.broker, service.data_dir, service.reactor, listeners,
                   storage_stats, getattr(service, "archive_dir", None),
                   getattr(service, "report_dir", None),
                   getattr(service, "report_job", None),
                   ha.figures if (ha := getattr(service, "ha", None)) is not None else None,
                   bridges)
