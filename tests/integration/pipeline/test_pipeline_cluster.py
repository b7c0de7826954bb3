"""The report on a Spark standalone cluster: a master and one worker started from
the installed pyspark on 127.0.0.1, the job run as ``python -m mqttamqp.pipeline
--master spark://...`` in a child process, and the same summary as local mode."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

pyspark = pytest.importorskip("pyspark")

pytest_plugins = ["spark_support"]
SPARK_TESTS = True
SPARK_HOME = os.path.dirname(pyspark.__file__)


class Daemon:
    """A Spark daemon (``spark-class``) whose log lines we can wait for."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [os.path.join(SPARK_HOME, "bin", "spark-class"), *args], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self.lines.empty()):
                raise AssertionError(f"{pattern!r} not seen; log:\n" + "".join(self.log))
            try:
                line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            self.log.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    env = dict(os.environ, SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOG_DIR=str(tmp_path / "log"),
               SPARK_DAEMON_JAVA_OPTS="-XX:+UseSerialGC", SPARK_DAEMON_MEMORY="256m",
               PYSPARK_PYTHON=sys.executable)
    master = Daemon(env, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", "0", "--webui-port", "0")
    daemons = [master]
    try:
        url = master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)")[1]
        worker = Daemon(env, "org.apache.spark.deploy.worker.Worker", url, "--host",
                        "127.0.0.1", "--webui-port", "0", "--cores", "1",
                        "--memory", "768m")
        daemons.append(worker)
        worker.wait_for(r"Successfully registered with master")
        yield url
    finally:
        for d in reversed(daemons):
            d.stop()


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in ("generated_at", "input")}


def test_cluster_report_equals_local_report(
        full_report: tuple[Path, Path, dict[str, Any]], cluster: str,
        tmp_path: Path) -> None:
    """The job on a loopback standalone cluster, with no address settings of its
    own, writes the summary local mode writes."""
    archive, _, local = full_report
    out = tmp_path / "cluster"
    # No SPARK_LOCAL_IP and no spark.driver.* for the job: it finds its address
    # (the one it reached the master from) by itself.
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    env["PYSPARK_PYTHON"] = sys.executable
    done = subprocess.run(
        [sys.executable, "-m", "mqttamqp.pipeline", "--master", cluster,
         "--archive", str(archive), "--out", str(out),
         "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=1",
         "--conf", "spark.sql.shuffle.partitions=1"],
        env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (f"report written to {out}: 27 messages, 4 topics; full run: 4 files read, "
            "61 rows read") in done.stderr
    cluster_summary = json.loads((out / "summary.json").read_text())
    assert comparable(cluster_summary) == comparable(local)
