"""The ops endpoints of a real broker process (``--metrics``, ``--metrics-token-file``,
``--log-format json``) over real HTTP, with real MQTT (paho) and AMQP (proton)
traffic moving the numbers, and ``$SYS`` saying the same as ``/metrics``.

The HTTP client is urllib (``console_support.ConsoleHTTP``, the suite's client for a
broker process): treq would need a reactor running in the test process."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from brokerproc import BrokerProcess
from console_support import ConsoleHTTP, web_broker_process
from pahoclient import PahoClient
from prometheus_client.parser import text_string_to_metric_families
from proton import Message
from proton.utils import BlockingConnection

TIMEOUT = 20.0
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


@pytest.fixture(scope="module")
def ops_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("ops-data")), "--sys-interval", "1",
                         listeners=("--mqtt", "--amqp", "--metrics"))
    proc.start()
    yield proc
    proc.stop()


def scrape(port: int, path: str = "/metrics", headers: dict[str, str] | None = None
           ) -> Samples:
    reply = ConsoleHTTP(port).request("GET", path, headers=headers)
    assert reply.code == 200, reply.text
    assert reply.header("content-type").startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by(samples: Samples, name: str, **labels: str) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(samples[name].values())


def sys_value_reaching(port: int, topic: str, wanted: float) -> float:
    """The value of ``$SYS/broker/<topic>`` once an update says ``wanted`` (the broker
    publishes every second), or the last of ten updates when none did."""
    watcher = PahoClient(port, f"ops-sys-{os.getpid()}")
    try:
        watcher.subscribe(("$SYS/broker/" + topic, 0))
        seen = float("nan")
        for _ in range(10):   # about ten seconds of updates
            seen = float(watcher.get(timeout=TIMEOUT).payload)
            if seen == wanted:
                break
        return seen
    finally:
        watcher.disconnect()


def test_metrics_move_with_real_traffic_and_match_sys(ops_broker: BrokerProcess) -> None:
    """/metrics moves with real MQTT and AMQP traffic and says what $SYS says."""
    port = ops_broker.ports["METRICS"]
    before = scrape(port)
    sub = PahoClient(ops_broker.mqtt_port, "ops-sub")
    sub.subscribe(("ops/#", 1))
    pub = PahoClient(ops_broker.mqtt_port, "ops-pub")
    for i in range(5):
        pub.publish(f"ops/mqtt/{i}", b"21.5", qos=1, retain=i < 2)
    conn = BlockingConnection(f"127.0.0.1:{ops_broker.ports['AMQP']}", timeout=TIMEOUT)
    try:
        sender = conn.create_sender("ops/amqp")
        for i in range(3):
            sender.send(Message(body=f"m{i}"))
        got = [sub.get(timeout=TIMEOUT).topic for _ in range(8)]
        assert sorted(got) == sorted([f"ops/mqtt/{i}" for i in range(5)] + ["ops/amqp"] * 3)
        during = scrape(port)
        assert by(during, "mqttamqp_connections", protocol="amqp") == 1
        assert by(during, "mqttamqp_connections", protocol="mqtt") >= 2
    finally:
        conn.close()
    pub.disconnect()
    sub.disconnect()
    # (the line is logged as the count moves; the two come in either order, and
    # waiting for one in turn consumed the other's line when it came first)
    waiting = {"ops-pub", "ops-sub"}
    while waiting:
        line = ops_broker.wait_for_line(r"ops-(pub|sub) .*disconnected: clean", TIMEOUT)
        waiting.discard("ops-pub" if "ops-pub" in line else "ops-sub")
    after = scrape(port)
    for protocol, n in (("mqtt", 5), ("amqp", 3)):
        assert (by(after, "mqttamqp_messages_received_total", protocol=protocol)
                - by(before, "mqttamqp_messages_received_total", protocol=protocol)) == n
    assert (by(after, "mqttamqp_messages_sent_total", protocol="mqtt")
            - by(before, "mqttamqp_messages_sent_total", protocol="mqtt")) >= 8
    assert (by(after, "mqttamqp_connects_total", protocol="amqp")
            - by(before, "mqttamqp_connects_total", protocol="amqp")) == 1
    assert (by(after, "mqttamqp_disconnects_total", cause="clean")
            - by(before, "mqttamqp_disconnects_total", cause="clean")) >= 2
    assert after["mqttamqp_received_bytes_total"][()] > before["mqttamqp_received_bytes_total"][()]
    assert after["mqttamqp_retained_messages"][()] == 2
    assert after["mqttamqp_commits_total"][()] > 0   # the retained messages were stored
    assert after["mqttamqp_commit_latency_seconds_count"][()] == after[
        "mqttamqp_commits_total"][()]
    assert 0 <= after["mqttamqp_reactor_lag_seconds"][()] < 60
    assert after["process_open_fds"][()] > 0
    # $SYS and /metrics read the same numbers (no traffic now: $SYS is not counted).
    received = total(after, "mqttamqp_messages_received_total")
    assert sys_value_reaching(ops_broker.mqtt_port, "messages/received", received) == received
    assert total(scrape(port), "mqttamqp_messages_received_total") == received
    assert sys_value_reaching(ops_broker.mqtt_port, "retained messages/count", 2) == 2


def test_healthz_and_readyz(ops_broker: BrokerProcess) -> None:
    """/healthz and /readyz of a running broker answer JSON: alive, and ready with every
    check passed."""
    http = ConsoleHTTP(ops_broker.ports["METRICS"])
    live = http.get("/healthz")
    assert live.code == 200 and live.header("content-type") == "application/json"
    assert live.json()["status"] == "ok" and live.json()["reactor_lag_seconds"] >= 0
    ready = http.get("/readyz")
    assert ready.code == 200, ready.text
    body = ready.json()
    assert body["status"] == "ready"
    assert {name: c["ok"] for name, c in body["checks"].items()} == {
        "store": True, "commits": True, "listeners": True, "will_grace": True}
    assert "writable" in body["checks"]["store"]["reason"]


def test_metrics_on_the_console_need_the_token(tmp_path: Any) -> None:
    """With a metrics token file, /metrics moves to the console and needs the bearer token;
    no metrics listener opens."""
    token_file = tmp_path / "metrics-token"
    token_file.write_text("tok-0123456789abcdef-xyz\n")
    proc = web_broker_process(str(tmp_path / "data"), "--metrics-token-file",
                              str(token_file)).start()
    try:
        http = ConsoleHTTP(proc.ports["WEB"])
        refused = http.get("/metrics")
        assert refused.code == 401 and refused.header("www-authenticate").startswith("Bearer")
        assert http.request("GET", "/metrics",
                            headers={"Authorization": "Bearer nope"}).code == 401
        samples = scrape(proc.ports["WEB"], headers={
            "Authorization": "Bearer tok-0123456789abcdef-xyz"})
        assert "mqttamqp_messages_received_total" in samples
        assert http.get("/api/clients").code == 401      # the console is unchanged
        assert "METRICS" not in proc.ports                 # no metrics listener
    finally:
        proc.stop()


def test_log_format_json_every_line_is_an_object(tmp_path: Any) -> None:
    """With --log-format json every log line is a JSON object with the stable fields."""
    proc = BrokerProcess(str(tmp_path / "data"), "--log-format", "json")
    proc.start()
    try:
        client = PahoClient(proc.mqtt_port, "json-logger")
        client.disconnect()
        proc.wait_for_line(r"json-logger .*disconnected", TIMEOUT)
    finally:
        proc.stop()
    lines = [json.loads(line) for line in proc.log if line.strip()]
    assert len(lines) >= 5
    for line in lines:
        assert {"time", "level", "namespace", "event"} <= set(line), line
    gone = [x for x in lines if "disconnected" in x["event"] and x.get("client") == "json-logger"]
    assert len(gone) == 1 and gone[0]["remote"].startswith("127.0.0.1:")
    assert gone[0]["level"] == "info"


def test_metrics_none_opens_no_metrics_listener(tmp_path: Any) -> None:
    """--metrics none opens no metrics listener."""
    proc = BrokerProcess(str(tmp_path / "data"), "--metrics", "none").start()
    try:
        assert "METRICS" not in proc.ports
        assert not any("listening for metrics" in line for line in proc.log)
    finally:
        proc.stop()


def test_otel_export_reaches_an_otlp_endpoint(tmp_path: Any) -> None:
    """--otel-endpoint: the broker's OTLP/HTTP exporter posts the metrics to a
    collector (here an HTTP server in the test, on loopback)."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    import http.server
    import queue
    import threading

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    posts: queue.Queue[bytes] = queue.Queue()

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posts.put(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/metrics"
    proc = BrokerProcess(str(tmp_path / "data"), "--otel-endpoint", url,
                         "--otel-interval", "1").start()
    try:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(posts.get(timeout=TIMEOUT))
        names = {m.name for rm in request.resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics}
        assert {"mqttamqp_messages_received", "mqttamqp_connections",
                "mqttamqp_commits"} <= names
    finally:
        proc.stop()
        server.shutdown()


def test_sighup_changes_the_log_level(tmp_path: Any) -> None:
    """log-level in the --config file: SIGHUP applies a new level at once."""
    import signal

    conf = tmp_path / "mqttamqp.toml"
    conf.write_text('log-level = "info"\n')
    with BrokerProcess(str(tmp_path / "data"), "--config", str(conf), "--no-archive"
                       ) as broker:
        assert broker.proc is not None
        conf.write_text('log-level = "warn"\nmax-inflight = 7\n')
        os.kill(broker.proc.pid, signal.SIGHUP)
        # A warning, logged after the level changed: the reload is done.
        broker.wait_for_line(r"applied only at a restart: max-inflight", TIMEOUT)
        PahoClient(broker.mqtt_port, "quiet-one").disconnect()   # info lines: not logged
        conf.write_text('log-level = "info"\nmax-inflight = 7\n')
        os.kill(broker.proc.pid, signal.SIGHUP)
        broker.wait_for_line(r"reloaded log level: log-level changed", TIMEOUT)
        PahoClient(broker.mqtt_port, "loud-one").disconnect()
        broker.wait_for_line(r"loud-one .*disconnected", TIMEOUT)
    assert not any("quiet-one" in line for line in broker.log)
