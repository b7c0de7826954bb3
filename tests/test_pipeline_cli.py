"""The report's command line without Spark: defaults, time parsing and the
one-sentence messages for a missing PySpark, a missing Java or an unreachable
master."""

from __future__ import annotations

import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from mqttamqp.pipeline import cli


def test_defaults_and_window_parsing() -> None:
    args = cli.parse_args([])
    assert args.master == "local[*]" and not args.incremental
    assert args.archive.endswith("archive") and args.out.endswith("report")
    args = cli.parse_args(["--since", "2026-11-24", "--until", "2026-11-24T08:30+01:00"])
    assert args.since == datetime(2026, 11, 24, tzinfo=UTC)
    assert args.until == datetime(2026, 11, 24, 7, 30, tzinfo=UTC)


def test_bad_window_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--since", "2026-11-25", "--until", "2026-11-24"])
    with pytest.raises(SystemExit):
        cli.parse_args(["--since", "yesterday"])
    assert "ISO 8601" in capsys.readouterr().err


def test_missing_java_names_the_debian_package(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    pytest.importorskip("pyspark")
    assert cli.main(["--archive", str(tmp_path)]) == cli.EXIT_SETUP
    err = capsys.readouterr().err
    assert "Java is not installed" in err and "apt-get install default-jre-headless" in err


def test_missing_pyspark_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)
    assert cli.main([]) == cli.EXIT_SETUP
    assert "pip install 'mqttamqp[report]'" in capsys.readouterr().err


def test_unreachable_master_is_reported() -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(cli.SetupError, match=f"cannot reach the Spark master "
                                             f"spark://127.0.0.1:{port}"):
        cli.check_master(f"spark://127.0.0.1:{port}", timeout=2)
    cli.check_master("local[*]")  # nothing to reach


def test_reachable_master_passes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        cli.check_master(f"spark://127.0.0.1:{s.getsockname()[1]}", timeout=2)


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
