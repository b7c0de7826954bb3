"""SIGHUP to a running broker process: the webhooks of the new configuration take over,
and the drops of a hook that is down show in ``$SYS``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from hookserver import HookServer
from pahoclient import PahoClient

pytestmark = pytest.mark.timeout(90)



def test_sighup_swaps_the_webhooks_of_a_running_broker(
        tmp_path: Path, endpoint: HookServer) -> None:
    """SIGHUP to a running broker swaps the webhooks of its configuration: the next events
    go to the new hook."""
    conf = tmp_path / "mqttamqp.toml"
    conf.write_text(f"""
[[webhook]]
url = "{endpoint.url}/first"
events = ["connect"]
max-delay = 0
""")
    with BrokerProcess(str(tmp_path / "data"), "--config", str(conf), "--no-archive") as broker:
        PahoClient(broker.mqtt_port, "before").stop()
        got = endpoint.next_request()
        assert got.path == "/hook/first"
        assert [(e["kind"], e["client"]) for e in got.events()] == [("connect", "before")]

        conf.write_text(f"""
max-inflight = 7
[[webhook]]
url = "{endpoint.url}/second"
events = ["connect", "disconnect"]
max-delay = 0
""")
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGHUP)
        broker.wait_for_line(r"reloaded webhooks: webhook changed")
        broker.wait_for_line(r"applied only at a restart: max-inflight")
        PahoClient(broker.mqtt_port, "after").stop()
        kinds = []
        while len(kinds) < 2:
            got = endpoint.next_request()
            assert got.path == "/hook/second"
            kinds += [(e["kind"], e["client"]) for e in got.events()]
        assert kinds == [("connect", "after"), ("disconnect", "after")]

        conf.write_text("max-inflight = 'seven'\n")
        os.kill(broker.proc.pid, signal.SIGHUP)
        broker.wait_for_line(r"configuration not reloaded, the running one stays: .*"
                             r"line 1: max-inflight: must be an integer")
        assert broker.proc.poll() is None


def test_drops_of_a_hook_that_is_down_show_in_sys(tmp_path: Path) -> None:
    """The events a hook that is down could not take are counted in $SYS."""
    conf = tmp_path / "mqttamqp.toml"
    # Port 9 (discard) on loopback: nothing listens, every attempt is refused.
    conf.write_text("""
[[webhook]]
url = "http://127.0.0.1:9/down"
events = ["connect"]
queue = 1
max-batch = 1
retries = 100
backoff = 60
""")
    with BrokerProcess(str(tmp_path / "data"), "--config", str(conf), "--no-archive",
                       "--sys-interval", "1") as broker:
        for i in range(4):
            PahoClient(broker.mqtt_port, f"c{i}").stop()
        watcher = PahoClient(broker.mqtt_port, "watcher")
        try:
            watcher.subscribe(("$SYS/broker/webhooks/dropped", 0))
            # One batch is backing off, one event is queued: the rest were dropped.
            # $SYS is retained and refreshed every second: read until it counts them.
            for _ in range(30):
                value = int(watcher.get().payload)
                if value >= 3:
                    break
            assert value == 3
        finally:
            watcher.stop()


@pytest.fixture
def endpoint() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.close()
