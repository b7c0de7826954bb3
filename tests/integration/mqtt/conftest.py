"""Fixtures shared by the MQTT integration tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from brokerproc import BrokerProcess
from gateway_proc import mark_gateway_differences
from rawclient import OpenClient, client_factory


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[OpenClient]:
    """Connected raw clients on the module's broker (a module may define its own)."""
    yield from client_factory(lambda: broker.mqtt_port)


@pytest.fixture(autouse=True)
def _gateway_differences(request: pytest.FixtureRequest) -> None:
    """A test whose module broker is a gateway (``through_gateway``) and that cannot
    pass through one is marked xfail with the reason (``GATEWAY_DIFFERS``)."""
    mark_gateway_differences(request)
