"""Pytest plugin for the pipeline tests: the ``spark`` marker and one Spark session
for the whole run.

Test modules load it with ``pytest_plugins = ["spark_support"]`` and never import
it (it would not be assertion-rewritten). Every test that uses the ``spark``
fixture, or lives in a module with ``SPARK_TESTS = True``, is marked ``spark``
here, so ``-m "not spark"`` skips them all. The session is ``local[1]`` with the
UI off, one shuffle partition and the serial GC, and lives until the end of the
run (starting one takes 5-17 s here).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: starts a real Spark (JVM) session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if "spark" in getattr(item, "fixturenames", ()) or getattr(
                module, "SPARK_TESTS", False):
            item.add_marker(pytest.mark.spark)


def java_available() -> bool:
    return shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one Spark session of this test run."""
    if not java_available():
        pytest.skip("no Java: apt-get install default-jre-headless")
    pytest.importorskip("pyspark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("mqttamqp-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.default.parallelism", "1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC")
               .config("spark.driver.memory", "768m")
               # Tiny data: compiling generated code costs more than it saves
               # (test_pipeline.py 269 s -> 205 s).  The report job as deployed, with
               # codegen, runs in test_reportjob_spark.py and test_pipeline_cluster.py.
               .config("spark.sql.codegen.wholeStage", "false")
               .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def full_report(spark: Any, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[Path, Path, dict[str, Any]]:
    """The known archive (both parts) and its full local report, built once."""
    import json

    from pipeline_data import FIXED_NOW, write_archive, write_part_one, write_part_two

    from mqttamqp.pipeline.report import ReportOptions, build_report

    archive = tmp_path_factory.mktemp("archive")
    write_archive(archive, write_part_one, write_part_two)
    out = tmp_path_factory.mktemp("report")
    build_report(spark, ReportOptions(archive=str(archive), out=str(out),
                                      now=lambda: FIXED_NOW))
    return archive, out, json.loads((out / "summary.json").read_text())
