"""A gateway process's own console (``--web``) and metrics (``--metrics``), against
a real core: its upstream connection and a paho client on it appear on the pages and
in the API, and the ``mqttamqp_gateway_*`` series count the client and its messages."""

from __future__ import annotations

import re
import urllib.request
import uuid
from pathlib import Path

from brokerproc import BrokerProcess
from console_support import ConsoleHTTP, initial_password
from gateway_proc import start_gateway
from pahoclient import PahoClient


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as resp:
        return str(resp.read().decode())


def test_gateway_console_and_metrics(tmp_path: Path, core: BrokerProcess) -> None:
    """The console lists the open upstream connection and the client (id, address,
    which connection); /metrics counts the client, the open connection and a message
    each way; the broker's pages are not served."""
    gw = start_gateway(tmp_path, f"amqp://127.0.0.1:{core.ports['AMQP']}",
                       "--upstream-connections", "1",
                       listeners=("--mqtt", "--web", "--metrics"))
    try:
        cid = f"web-{uuid.uuid4().hex[:8]}"
        client = PahoClient(gw.mqtt_port, cid)
        try:
            assert client.subscribe((f"{cid}/t", 1)) == [1]
            client.publish(f"{cid}/t", b"hello", qos=1)
            assert client.get().payload == b"hello"
            console = ConsoleHTTP(gw.ports["WEB"])
            assert console.login(initial_password(gw.data_dir)) == 303
            api = console.get("/api/gateway").json()
            (link,) = api["links"]
            assert link["state"] == "open" and link["clients"] == 1
            assert api["counters"]["upstream_up"] == 1
            clients = console.get("/api/clients").json()
            (row,) = clients["items"]
            assert row["client_id"] == cid and row["upstream"] == 0
            assert row["address"].startswith("127.0.0.1:")
            assert cid in console.get("/clients").text
            assert f"127.0.0.1:{core.ports['AMQP']}" in console.get("/").text
            assert console.get("/sessions").code == 404
            text = _metrics(gw.ports["METRICS"])
            assert "mqttamqp_gateway_clients 1.0" in text
            assert "mqttamqp_gateway_upstream_connections_up 1.0" in text
            for direction in ("to_core", "to_clients"):
                m = re.search('mqttamqp_gateway_messages_total' + re.escape(
                    '{direction="' + direction + '"}') + r' (\S+)', text)
                assert m is not None and float(m.group(1)) >= 1, direction
        finally:
            client.stop()
    finally:
        gw.stop()
