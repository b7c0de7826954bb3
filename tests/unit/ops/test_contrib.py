"""The files in ``contrib/``: the Grafana dashboard queries only metrics the broker
exposes, and the systemd unit runs the broker as docs/production.md says."""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path

from fakes import NullStore
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import Clock

from mqttamqp.core.broker import Broker
from mqttamqp.core.recorder import NoRecorder
from mqttamqp.ops.lag import ReactorLag
from mqttamqp.ops.metrics import broker_registry, exposition

CONTRIB = Path(__file__).resolve().parents[3] / "contrib"


class _ArchiveCounters(NoRecorder):
    """The archive's counters, as a broker with the archive on reports them."""

    def stats(self) -> dict[str, int]:
        return {"records": 0, "dropped": 0, "errors": 0, "segments": 0}


def exposed_names() -> set[str]:
    """Every sample name a broker can expose (counters with no sample yet included)."""
    broker = Broker(Clock(), NullStore(), recorder=_ArchiveCounters())
    registry = broker_registry(broker)
    registry.register(ReactorLag(Clock()))   # as the service's OpsWiring adds it
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition(registry).decode()):
        names |= {s.name for s in family.samples}
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        names.add(family.name)
    return names


def test_the_dashboard_uses_only_exposed_metrics() -> None:
    """The Grafana dashboard queries only metrics the broker exposes."""
    dashboard = json.loads((CONTRIB / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    used = {name for e in exprs for name in re.findall(r"\bmqttamqp_[a-z_]+", e)}
    assert used - exposed_names() == set()
    assert {"mqttamqp_commit_latency_seconds_bucket", "mqttamqp_messages_received_total",
            "mqttamqp_connections"} <= used


def test_the_systemd_unit() -> None:
    """The systemd unit runs twistd with the config file and data directory as README says,
    unprivileged and hardened."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((CONTRIB / "mqttamqp.service").read_text())
    service = unit["Service"]
    assert re.search(r"/twistd -n --pidfile= mqttamqp --config /etc/mqttamqp\.toml",
                     service["ExecStart"])
    assert service.get("DynamicUser") == "yes" or service.get("User") not in (None, "root")
    assert service["StateDirectory"] == "mqttamqp"
    assert "--data /var/lib/mqttamqp" in service["ExecStart"]
    assert int(service["LimitNOFILE"]) >= 65536
    assert service["NoNewPrivileges"] == "yes"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
