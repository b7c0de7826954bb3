"""Gateway processes for the tests: ``twistd mqttamqp --upstream`` in front of a core
broker process, on loopback port 0 (the gateway tests' fixtures and modules import
it; test modules never import a conftest)."""

from __future__ import annotations

from pathlib import Path

from brokerproc import BrokerProcess

__all__ = ["UPSTREAM_OPEN", "start_gateway"]

UPSTREAM_OPEN = r"upstream connection \d+ to \S+ is open"


def start_gateway(tmp_path: Path, upstream: str, *extra: str, wait_open: bool = True,
                  env: dict[str, str] | None = None) -> BrokerProcess:
    """A gateway process in front of ``upstream``; once started, it has an open
    upstream connection (unless not ``wait_open``)."""
    n = len(list(tmp_path.glob("gw*")))
    proc = BrokerProcess(str(tmp_path / f"gw{n}"), "--upstream", upstream, *extra,
                         listeners=("--mqtt",), env=env)
    proc.start()
    if wait_open:
        proc.wait_for_line(UPSTREAM_OPEN, timeout=15)
    return proc
