"""Fixtures shared by the MQTT integration tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from brokerproc import BrokerProcess
from rawclient import OpenClient, client_factory


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[OpenClient]:
    """Connected raw clients on the module's broker (a module may define its own)."""
    yield from client_factory(lambda: broker.mqtt_port)
