"""The report job on a local Spark session: exact numbers from a known archive,
the time window, ``--incremental`` against a full run, and an empty archive.

The archive is written by the real ``Archive`` writer (see ``spark_support``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pipeline_data import FIXED_NOW, write_archive, write_part_one, write_part_two

pytest.importorskip("pyspark")

from mqttamqp.pipeline.report import (
    TABLES,
    EmptyArchive,
    ReportOptions,
    build_report,
)

pytest_plugins = ["spark_support"]


def run(spark: Any, archive: Path, out: Path, **kw: Any) -> dict[str, Any]:
    opts = ReportOptions(archive=str(archive), out=str(out), now=lambda: FIXED_NOW, **kw)
    result = build_report(spark, opts)
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(result.summary))
    return on_disk


def table(spark: Any, out: Path, name: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.read.parquet(str(out / "tables" / name)).collect()]


@pytest.fixture
def full(full_report: tuple[Path, Path, dict[str, Any]]) -> tuple[Path, Path, dict[str, Any]]:
    archive, out, summary = full_report
    return archive, out, json.loads(json.dumps(summary))  # a copy each test may change


def test_totals_qos_and_top_tables(full: tuple[Path, Path, dict[str, Any]]) -> None:
    _, _, s = full
    assert s["totals"] == {"messages": 27, "bytes": 397, "retained": 2, "topics": 4}
    assert s["qos"] == {"0": 7, "1": 17, "2": 3}
    assert [(t["topic"], t["messages"], t["bytes"], t["publishers"])
            for t in s["top_topics"]] == [
        ("plant/1/temp", 22, 94, 3), ("plant/2/hum", 3, 300, 1),
        ("office/door", 1, 1, 0), ("office/light", 1, 2, 1)]
    assert [(p["publisher"], p["user"], p["messages"], p["bytes"], p["topics"])
            for p in s["top_publishers"]] == [
        ("flappy", None, 12, 36, 1), ("dev1", None, 7, 32, 2), ("dev2", "u2", 7, 328, 2),
        (None, None, 1, 1, 1)]
    assert [(n["level"], n["prefix"], n["messages"]) for n in s["topic_tree"]] == [
        (1, "plant", 25), (1, "office", 2), (2, "plant/1", 22), (2, "plant/2", 3),
        (2, "office/door", 1), (2, "office/light", 1)]
    assert s["window"] == {"since": None, "until": None,
                           "first_minute": "2026-11-24T07:58:00Z",
                           "last_minute": "2026-11-24T08:36:00Z"}
    assert s["generated_at"] == "2026-11-24T09:58:00Z"


def test_per_minute_series_stacked_by_topic(full: tuple[Path, Path, dict[str, Any]]
                                            ) -> None:
    _, _, s = full
    pm = s["per_minute"]
    assert pm["minutes"][:3] == ["2026-11-24T07:58:00Z", "2026-11-24T07:59:00Z",
                                 "2026-11-24T08:00:00Z"]
    series = {s["name"]: s["values"] for s in pm["series"]}
    assert [s["name"] for s in pm["series"]] == [
        "plant/1/temp", "plant/2/hum", "office/door", "office/light"]
    assert series["plant/1/temp"][:3] == [7, 3, 0]
    assert series["plant/2/hum"][:3] == [0, 0, 3]
    assert sum(sum(v) for v in series.values()) == 27


def test_topic_minute_table(spark: Any, full: tuple[Path, Path, dict[str, Any]]) -> None:
    _, out, _ = full
    rows = {(r["minute"].strftime("%H:%M"), r["topic"]): r
            for r in table(spark, out, "topic_minute")}
    r = rows[("07:58", "plant/1/temp")]
    assert (r["messages"], r["bytes"], r["qos0"], r["qos1"], r["qos2"], r["retained"],
            r["publishers"]) == (7, 43, 3, 4, 0, 0, 2)
    r = rows[("08:00", "plant/2/hum")]
    assert (r["messages"], r["qos2"], r["retained"], r["publishers"]) == (3, 3, 1, 1)
    assert sum(r["messages"] for r in rows.values()) == 27
    assert sorted(p.name for p in (out / "tables").iterdir()) == sorted(TABLES)


def test_sessions_flapping_causes_wills_and_auth(spark: Any,
                                                 full: tuple[Path, Path, dict[str, Any]]
                                                 ) -> None:
    _, out, s = full
    ss = s["sessions"]
    assert (ss["count"], ss["clients"], ss["reconnects"]) == (15, 3, 12)
    assert [b["count"] for b in ss["duration_histogram"]] == [12, 0, 2, 0, 0, 0, 0]
    assert ss["disconnect_causes"] == [{"cause": "keepalive", "count": 12},
                                       {"cause": "clean", "count": 1},
                                       {"cause": "lost", "count": 1}]
    assert ss["flapping"] == [{"client_id": "flappy", "connects": 12, "reconnects": 11,
                               "max_reconnects_per_hour": 11}]
    assert s["wills"] == {"per_hour": [{"hour": "2026-11-24T08:00:00Z", "count": 1}],
                          "top": [{"client_id": "dev2", "topic": "plant/2/status",
                                   "count": 1}]}
    assert [(a["address"], a["user"], a["count"]) for a in s["auth_failures"]] == [
        ("10.0.0.5", "bob", 2), ("::1", None, 1)]
    sessions = {(r["client_id"], r["connected_at"].strftime("%H:%M:%S")): r
                for r in table(spark, out, "sessions")}
    dev1 = sessions[("dev1", "07:58:00")]
    assert (dev1["duration_seconds"], dev1["cause"]) == (100.0, "clean")
    assert sessions[("dev2", "07:58:01")]["duration_seconds"] == 129.0
    still = sessions[("dev1", "08:36:40")]
    assert still["disconnected_at"] is None and still["cause"] is None


def test_window_selects_only_its_time(spark: Any, tmp_path: Path,
                                      full: tuple[Path, Path, dict[str, Any]]) -> None:
    archive, _, _ = full
    s = run(spark, archive, tmp_path / "report",
            since=datetime(2026, 11, 24, 8, 0, tzinfo=UTC),
            until=datetime(2026, 11, 24, 8, 30, tzinfo=UTC))
    assert s["totals"] == {"messages": 4, "bytes": 301, "retained": 2, "topics": 2}
    assert s["sessions"]["count"] == 0 and len(s["auth_failures"]) == 2
    assert s["window"]["since"] == "2026-11-24T08:00:00Z"


def test_incremental_twice_equals_one_full_run(spark: Any, tmp_path: Path,
                                               full: tuple[Path, Path, dict[str, Any]]
                                               ) -> None:
    _, full_out, full_summary = full
    archive, out = tmp_path / "archive", tmp_path / "report"
    write_archive(archive, write_part_one)
    first = run(spark, archive, out, incremental=True)
    assert first["totals"]["messages"] == 14 and first["input"]["new_rows"] > 0
    write_archive(archive, write_part_two)
    second = run(spark, archive, out, incremental=True)
    assert second["input"]["new_rows"] == 12 * 3 + 2  # only the new files were read
    for summary in (second, full_summary):
        summary.pop("input")
    assert second == full_summary
    for name in ("topic_minute", "sessions", "clients", "auth_failures"):
        assert table(spark, out, name) == table(spark, full_out, name), name


def test_empty_archive_says_so(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "archive").mkdir()
    with pytest.raises(EmptyArchive):
        run(spark, tmp_path / "archive", tmp_path / "report")
