"""``tac/mqttamqp.tac`` builds the broker's service with the defaults (loaded in process,
as twistd -y loads it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)


ROOT = Path(__file__).resolve().parents[3]


def test_tac_builds_the_broker_service_with_defaults() -> None:
    """tac/mqttamqp.tac, loaded as twistd -y would, defines an application holding the
    broker service with the default MQTT listener (loopback port 1883) and data directory."""
    from twisted.application import service

    from mqttamqp.service import BrokerService

    app = service.loadApplication(str(ROOT / "tac" / "mqttamqp.tac"), "python")
    top = list(service.IServiceCollection(app))
    assert len(top) == 1 and isinstance(top[0], BrokerService)
    svc = top[0]
    assert svc.data_dir == os.path.abspath("mqttamqp-data")
    assert [(ls.kind, ls.description) for ls in svc.listeners if ls.kind == "MQTT"] == [
        ("MQTT", "tcp:1883:interface=127.0.0.1")]
