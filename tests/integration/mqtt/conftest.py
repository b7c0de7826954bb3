"""Fixtures shared by the MQTT integration tests of this folder: the module's broker
and a test's own brokers, run directly and, in a module marked ``through_gateway``,
also through a gateway in front of one (``gateway_proc``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from brokerproc import BrokerProcess
from gateway_proc import broker_or_gateway, mark_gateway_differences, through_gateway
from rawclient import OpenClient, client_factory

KINDS = ("direct", "gateway")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """In a module marked ``through_gateway``, a test using the module's ``broker`` or
    ``start_broker`` runs against a broker and through a gateway; one marked
    ``core_only(why)`` (it is about the core itself) against a broker only."""
    if metafunc.definition.get_closest_marker("through_gateway") is None:
        return
    kinds = (["direct"] if metafunc.definition.get_closest_marker("core_only")
             else list(KINDS))
    if "broker" in metafunc.fixturenames:
        metafunc.parametrize("broker", kinds, indirect=True, scope="module")
    if "start_broker" in metafunc.fixturenames:
        metafunc.parametrize("start_broker", kinds, indirect=True)


def _setting(request: pytest.FixtureRequest, name: str, default: tuple[str, ...]
             ) -> tuple[str, ...]:
    """The ``through_gateway`` mark's ``options``/``listeners`` (the module broker's)."""
    mark = request.node.get_closest_marker("through_gateway")
    return tuple(mark.kwargs.get(name, default)) if mark is not None else default


@pytest.fixture(scope="module")
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[BrokerProcess]:
    """One broker for the whole module (``--sys-interval 1``, or the mark's options),
    or a gateway in front of one when parametrized so."""
    yield from through_gateway(
        getattr(request, "param", "direct"), str(tmp_path_factory.mktemp("data")),
        *_setting(request, "options", ("--sys-interval", "1")),
        listeners=_setting(request, "listeners", ("--mqtt",)))


@pytest.fixture
def start_broker(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]
                 ) -> Iterator[Callable[..., BrokerProcess]]:
    """``start_broker(*options)``: a broker of the test's own, or a gateway (with the
    options a gateway takes: the MQTT rules it applies) in front of one."""
    kind = getattr(request, "param", "direct")
    started: list[BrokerProcess] = []

    def start(*options: str) -> BrokerProcess:
        where = os.path.join(str(tmp_path), f"data{len(started)}")
        started.append(broker_or_gateway(kind, where, *options))
        return started[-1].start()

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[OpenClient]:
    """Connected raw clients on the module's broker (a module may define its own)."""
    yield from client_factory(lambda: broker.mqtt_port)


@pytest.fixture(autouse=True)
def _gateway_differences(request: pytest.FixtureRequest) -> None:
    """A test whose module broker is a gateway (``through_gateway``) and that cannot
    pass through one is marked xfail with the reason (``GATEWAY_DIFFERS``)."""
    mark_gateway_differences(request)
