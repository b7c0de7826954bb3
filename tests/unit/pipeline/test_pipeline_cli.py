"""The report's command line without Spark: defaults, time parsing, the
one-sentence messages for a missing PySpark, a missing Java or an unreachable
master, the settings that keep Spark on loopback, and the line after a run."""

from __future__ import annotations

import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from mqttamqp.pipeline import cli


def test_defaults_and_window_parsing() -> None:
    """The report's command line defaults, and --since/--until read ISO 8601 dates and
    times into UTC."""
    args = cli.parse_args([])
    assert args.master == "local[*]" and not args.incremental
    assert args.archive.endswith("archive") and args.out.endswith("report")
    args = cli.parse_args(["--since", "2026-11-24", "--until", "2026-11-24T08:30+01:00"])
    assert args.since == datetime(2026, 11, 24, tzinfo=UTC)
    assert args.until == datetime(2026, 11, 24, 7, 30, tzinfo=UTC)


def test_bad_window_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A window that ends before it starts, or a time that is not ISO 8601, is refused."""
    with pytest.raises(SystemExit):
        cli.parse_args(["--since", "2026-11-25", "--until", "2026-11-24"])
    with pytest.raises(SystemExit):
        cli.parse_args(["--since", "yesterday"])
    assert "ISO 8601" in capsys.readouterr().err


def test_missing_java_names_the_debian_package(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Without Java the report says so and names the Debian package to install."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    pytest.importorskip("pyspark")
    assert cli.main(["--archive", str(tmp_path)]) == cli.EXIT_SETUP
    err = capsys.readouterr().err
    assert "Java is not installed" in err and "apt-get install default-jre-headless" in err


def test_missing_pyspark_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Without PySpark the report says how to install it."""
    monkeypatch.setitem(sys.modules, "pyspark", None)
    assert cli.main([]) == cli.EXIT_SETUP
    assert "pip install 'mqttamqp[report]'" in capsys.readouterr().err


def test_unreachable_master_is_reported() -> None:
    """A Spark master nobody listens on is reported as unreachable; local masters are not
    checked."""
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(cli.SetupError, match=f"cannot reach the Spark master "
                                             f"spark://127.0.0.1:{port}"):
        cli.check_master(f"spark://127.0.0.1:{port}", timeout=2)
    cli.check_master("local[*]")  # nothing to reach


def test_reachable_master_passes() -> None:
    """A master that accepts is fine, and the address the box reached it from is known."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert cli.check_master(f"spark://127.0.0.1:{s.getsockname()[1]}",
                                timeout=2) == "127.0.0.1"


def test_local_mode_binds_loopback_with_no_ui_unless_asked() -> None:
    """Local mode: the driver binds and advertises 127.0.0.1, the UI is off;
    --spark-ui turns it on."""
    settings = cli.session_settings("local[*]", environ={})
    assert settings["spark.driver.host"] == settings["spark.driver.bindAddress"] == (
        "127.0.0.1")
    assert settings["spark.ui.enabled"] == "false"
    assert cli.session_settings("local[2]", spark_ui=True,
                                environ={})["spark.ui.enabled"] == "true"
    assert cli.parse_args([]).spark_ui is False
    assert cli.parse_args(["--spark-ui"]).spark_ui is True


def test_driver_address_on_a_cluster_and_when_told() -> None:
    """A standalone master: the address the box reached it from; SPARK_LOCAL_IP and
    --conf spark.driver.* win; other masters are left to Spark."""
    on_cluster = cli.session_settings("spark://10.1.0.1:7077", reached_from="10.1.0.7",
                                      environ={})
    assert on_cluster["spark.driver.bindAddress"] == "10.1.0.7"
    assert cli.session_settings("local[*]", environ={"SPARK_LOCAL_IP": "10.1.0.8"}
                                )["spark.driver.host"] == "10.1.0.8"
    told = cli.session_settings("spark://10.1.0.1:7077", reached_from="10.1.0.7",
                                conf=["spark.driver.host=gw.example"], environ={})
    assert told["spark.driver.host"] == "gw.example"
    assert "spark.driver.bindAddress" not in told   # Spark binds the host it advertises
    assert "spark.driver.host" not in cli.session_settings("yarn", environ={})
    assert cli.session_settings("local[*]", conf=["spark.ui.enabled=true"],
                                environ={})["spark.ui.enabled"] == "true"
    with pytest.raises(cli.SetupError, match="expected KEY=VALUE"):
        cli.session_settings("local[*]", conf=["spark.ui.enabled"], environ={})


def test_summary_line_gives_files_and_rows_read_in_both_modes() -> None:
    """The line after a run says how many files and rows it read, full or incremental."""
    def result(incremental: bool, files: int, rows: int) -> SimpleNamespace:
        return SimpleNamespace(summary={"totals": {"messages": 27, "topics": 4}},
                               incremental=incremental, files_read=files, rows_read=rows)

    assert cli.summary_line("R", False, result(False, 6, 61)) == (
        "report written to R: 27 messages, 4 topics; full run: 6 files read, 61 rows read")
    assert cli.summary_line("R", True, result(True, 2, 38)) == (
        "report written to R: 27 messages, 4 topics; incremental run: 2 files read, "
        "38 rows read")
    assert cli.summary_line("R", True, result(False, 6, 61)).endswith(
        "; full run (no complete incremental state of this archive there yet): "
        "6 files read, 61 rows read")


def test_a_second_run_on_the_same_folder_is_refused(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """While one run holds OUT (a manual run beside the broker's --report-every), a
    second one on the same OUT stops at once with exit 4 and changes nothing there;
    once the first has ended, the folder is free again."""
    out = tmp_path / "report"
    held = cli.lock_out(str(out))
    (out / "marker").write_text("first run's")
    before = sorted(p.name for p in out.iterdir())
    assert cli.main(["--archive", str(tmp_path / "archive"), "--out", str(out)]) == 4
    assert "another report run is writing" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before
    held.close()
    again = cli.lock_out(str(out))
    assert again is not None
    again.close()
