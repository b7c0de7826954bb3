"""The broker's "Run report now" with the real report job: PySpark in a child process
over the archive of real traffic (paho through the running broker).

Marked ``spark`` for the whole module (``-m "not spark"`` skips it); it starts no
Spark session in the test process, only the broker's child does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from console_support import ConsoleHTTP, Paho, initial_password, web_broker_process

pytest_plugins = ["spark_support"]
SPARK_TESTS = True


def test_run_now_runs_the_real_report_job_on_real_traffic(tmp_path: Path) -> None:
    """"Run report now" runs the real PySpark report over the archive of real paho traffic,
    and the Traffic page shows it."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java: apt-get install default-jre-headless")
    pytest.importorskip("pyspark")
    data = tmp_path / "data"
    loopback = {"SPARK_LOCAL_IP": "127.0.0.1"}   # the job's Spark: loopback only
    proc = web_broker_process(str(data))
    proc.env = loopback
    proc.start()
    try:
        publisher = Paho(proc.mqtt_port, "spark-pub")
        for i in range(5):
            publisher.publish("plant/line1/temp", b"%d" % i, qos=1)
        publisher.disconnect()
    finally:
        proc.stop()   # a clean stop closes the archive's segments
    proc = web_broker_process(str(data))
    proc.env = loopback
    proc.start()
    try:
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(str(data))) == 303
        assert http.post("/traffic/run-report", back="/traffic").code == 303
        proc.wait_for_line(r"report job (finished|failed)", timeout=600)
        traffic = http.get("/api/traffic").json()
        assert traffic["job"]["last"]["ok"] is True, traffic["job"]
        assert traffic["report"]["totals"]["messages"] == 5
    finally:
        proc.stop()
