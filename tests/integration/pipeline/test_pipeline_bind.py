"""Where the report job listens: its real command line in local mode, in a child
process without ``SPARK_LOCAL_IP`` (``spark_bind_probe``), on a machine whose name
resolves to loopback and which has another address (Spark's own choice would be
that one). Every listening socket of the driver's JVM and of the job's Python
process must be on loopback; the UI only with ``--spark-ui``.

Marked ``spark`` for the whole module; it starts one JVM in the child, none here.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_data import write_archive, write_part_one

pytest_plugins = ["spark_support"]
SPARK_TESTS = True
PROBE = Path(__file__).resolve().parents[2] / "support" / "spark_bind_probe.py"


def on_loopback(listener: str) -> bool:
    return ipaddress.ip_address(listener.rpartition(":")[0]).is_loopback


def test_job_listens_on_loopback_only_and_starts_the_ui_only_when_asked(
        tmp_path: Path) -> None:
    """By default the driver binds 127.0.0.1 and there is no UI; --spark-ui starts
    the UI, on 127.0.0.1 too."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java: apt-get install default-jre-headless")
    pytest.importorskip("pyspark")
    archive = tmp_path / "archive"
    write_archive(archive, write_part_one)
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_LOCAL_IP", "PYSPARK_SUBMIT_ARGS")}
    done = subprocess.run(
        [sys.executable, str(PROBE), str(archive), str(tmp_path / "out"),
         "--master", "local[1]", "--conf", "spark.driver.memory=512m",
         "--conf", "spark.driver.extraJavaOptions=-XX:+UseSerialGC",
         "--conf", "spark.sql.shuffle.partitions=1"],
        env=env, capture_output=True, text=True, timeout=420, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    probe = json.loads(done.stdout.splitlines()[-1])
    assert probe["codes"] == [0, 0], done.stderr[-4000:]
    default, with_ui = probe["records"]

    conf = default["conf"]
    assert (conf["spark.driver.host"], conf["spark.driver.bindAddress"],
            conf["spark.ui.enabled"]) == ("127.0.0.1", "127.0.0.1", "false")
    assert default["ui"] is None
    assert f"127.0.0.1:{conf['spark.driver.port']}" in default["jvm"]

    conf = with_ui["conf"]
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.ui.enabled"] == "true"
    assert with_ui["ui"].startswith("http://127.0.0.1:")
    ui_port = with_ui["ui"].rpartition(":")[2]
    assert f"127.0.0.1:{ui_port}" in with_ui["jvm"]
    assert f"Spark UI at {with_ui['ui']}" in done.stderr

    for record in (default, with_ui):
        assert record["jvm"] and record["python"]   # the driver and py4j listen
        assert [s for s in record["jvm"] + record["python"] if not on_loopback(s)] == []
    assert done.stderr.count("full run: 4 files read, 23 rows read") == 2
