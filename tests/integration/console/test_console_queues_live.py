"""The Queues page and ``/api/queues`` of a real broker process (``twistd mqttamqp
--mqtt --web``): queues filled with mosquitto_pub, read by a paho consumer, then
purged, bounded and deleted from the console, with a restart proving that what
the console changed is durable."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from console_support import ConsoleHTTP, initial_password, web_broker_process
from paho.mqtt.client import MQTTv311
from pahoclient import PahoClient

pytestmark = pytest.mark.timeout(180)


def mosquitto_pub(port: int, topic: str, lines: list[str]) -> None:
    """Publish one QoS 1 message per line (``-l``); returns once every PUBACK came."""
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-i", "producer",
                    "-q", "1", "-t", topic, "-l"], input="\n".join(lines) + "\n",
                   text=True, check=True, timeout=30, capture_output=True)


def _queues(http: ConsoleHTTP) -> dict[str, Any]:
    reply = http.get("/api/queues")
    assert reply.code == 200
    return {row["name"]: row for row in reply.json()["items"]}


def _login(proc: Any, data: str) -> ConsoleHTTP:
    http = ConsoleHTTP(proc.ports["WEB"])
    assert http.login(initial_password(data)) == 303
    return http


def test_console_reads_and_changes_real_queues_durably(tmp_path: Any) -> None:
    """The console of a real broker reads queues filled by mosquitto_pub, and its purge,
    retention and delete hold across a restart."""
    data = str(tmp_path / "data")
    proc = web_broker_process(data).start()
    try:
        http = _login(proc, data)
        mosquitto_pub(proc.mqtt_port, "$queue/jobs/x", [f"job {i}" for i in range(5)])
        mosquitto_pub(proc.mqtt_port, "$queue/mail/eu", [f'{{"to": {i}}}' for i in range(4)])
        queues = _queues(http)
        assert queues["jobs"]["depth"] == 5 and queues["mail"]["depth"] == 4
        assert queues["jobs"]["groups"] == 0
        page = http.get("/queues/queue", name="mail").text
        assert "$queue/mail/eu" in page and "{&#34;to&#34;: 0}" in page
        message = http.get("/api/queues/message", name="mail", offset="3").json()
        assert message["view"]["mode"] == "json" and message["publisher"] == "producer"

        # A QoS 0 member acknowledges on send: once it has them, the queue is empty.
        worker = PahoClient(proc.mqtt_port, "worker-1", MQTTv311)
        try:
            assert worker.subscribe(("$queue/jobs/#", 0)) == [0]
            got = sorted(worker.get().payload for _ in range(5))
            assert got == [f"job {i}".encode() for i in range(5)]
            jobs = http.get("/api/queues/queue", name="jobs").json()
            assert jobs["depth"] == 0 and jobs["acknowledged"] == 5
            [group] = jobs["group_list"]
            assert group["id"] == "worker" and group["members"] == ["worker-1"]
        finally:
            worker.stop()

        assert http.post("/queues/retention", name="mail", max_messages="2",
                         max_age="", max_bytes="").code == 303
        assert _queues(http)["mail"]["depth"] == 2
        assert http.post("/queues/purge", name="jobs").code == 303
        mosquitto_pub(proc.mqtt_port, "$queue/temp/x", ["a", "b"])
        assert http.post("/queues/delete", name="temp").code == 303
        assert "temp" not in _queues(http)
        proc.wait_for_line(r"audit: user='admin' action=queue-delete queue='temp'")
    finally:
        proc.stop()
    proc = web_broker_process(data).start()
    try:
        http = _login(proc, data)
        queues = _queues(http)
        assert "temp" not in queues
        assert queues["mail"]["depth"] == 2
        assert queues["mail"]["retention"]["max_messages"] == 2
        mosquitto_pub(proc.mqtt_port, "$queue/mail/eu", ["late"])
        assert _queues(http)["mail"]["depth"] == 2         # the bound still holds
        detail = http.get("/api/queues/queue", name="mail").json()
        assert [m["offset"] for m in detail["messages"]] == [3, 4]
    finally:
        proc.stop()
