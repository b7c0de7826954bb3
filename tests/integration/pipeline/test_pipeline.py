"""The report job on a local Spark session: exact numbers from a known archive,
the time window, full and ``--incremental`` runs mixed in several orders over a
growing archive against one full run, and an empty archive.

The archive is written by the real ``Archive`` writer (see ``spark_support``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from pipeline_data import (
    FIXED_NOW,
    write_archive,
    write_part_one,
    write_part_three,
    write_part_two,
)

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
    """The report of a known archive has its exact totals, QoS counts, top topics, top
    publishers and topic tree."""
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
    """The per-minute series are stacked by topic, busiest first, and add up to every
    message."""
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
    """The topic_minute table has each minute's counts per topic, and every table is
    written."""
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
    """The report's sessions, flapping clients, disconnect causes, wills and authentication
    failures are exact."""
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
    """--since/--until select only the records of that window."""
    archive, _, _ = full
    s = run(spark, archive, tmp_path / "report",
            since=datetime(2026, 11, 24, 8, 0, tzinfo=UTC),
            until=datetime(2026, 11, 24, 8, 30, tzinfo=UTC))
    assert s["totals"] == {"messages": 4, "bytes": 301, "retained": 2, "topics": 2}
    assert s["sessions"]["count"] == 0 and len(s["auth_failures"]) == 2
    assert s["window"]["since"] == "2026-11-24T08:00:00Z"


PARTS = {"1": write_part_one, "2": write_part_two, "3": write_part_three}
OLD = 40 * 86400   # seconds: "3old" adds part three with files this much older


@dataclass(frozen=True)
class Report:
    summary: dict[str, Any]          # without "input" (what one run read)
    tables: dict[str, list[dict[str, Any]]]


def report_of(spark: Any, out: Path, summary: dict[str, Any]) -> Report:
    tables = {name: sorted(table(spark, out, name),
                           key=lambda r: json.dumps(r, default=str, sort_keys=True))
              for name in TABLES}
    return Report({k: v for k, v in summary.items() if k != "input"}, tables)


def archive_files(archive: Path) -> dict[str, int]:
    """Every complete archive file and its rows."""
    return {str(f): pq.read_metadata(f).num_rows for f in archive.rglob("part-*.parquet")}


def add_part(archive: Path, step: str) -> None:
    before = set(archive_files(archive)) if archive.exists() else set()
    write_archive(archive, PARTS[step[0]])
    if step.endswith("old"):   # e.g. restored from a backup with its times kept
        for name in set(archive_files(archive)) - before:
            stamp = os.stat(name).st_mtime - OLD
            os.utime(name, (stamp, stamp))


@pytest.fixture(scope="module")
def references(spark: Any, tmp_path_factory: pytest.TempPathFactory,
               full_report: tuple[Path, Path, dict[str, Any]]) -> dict[str, Report]:
    """One full run over each stage of the growing archive: parts "1", "12", "123"."""
    _, full_out, full_summary = full_report
    found = {"12": report_of(spark, full_out, full_summary)}
    for parts in ("1", "123"):
        archive = tmp_path_factory.mktemp(f"archive{parts}")
        write_archive(archive, *(PARTS[p] for p in parts))
        out = tmp_path_factory.mktemp(f"report{parts}")
        found[parts] = report_of(spark, out, run(spark, archive, out))
    return found


@pytest.mark.parametrize("steps", ["1 F 2 I I", "1 I 2 F 3 I", "1 F 2 F 3 I",
                                   "1 I 2 I 3old I"])
def test_any_mix_of_runs_equals_one_full_run(spark: Any, tmp_path: Path,
                                             references: dict[str, Report],
                                             steps: str) -> None:
    """Full (F) and incremental (I) runs in any order as the archive grows (1, 2, 3)
    report, after every run, what one full run over the same archive reports."""
    archive, out = tmp_path / "archive", tmp_path / "report"
    parts, read_before, have_state = "", set[str](), False
    for step in steps.split():
        if step != "F" and step != "I":
            add_part(archive, step)
            parts += step[0]
            continue
        files = archive_files(archive)
        summary = run(spark, archive, out, incremental=step == "I")
        added_to_state = step == "I" and have_state
        expected = set(files) - read_before if added_to_state else set(files)
        assert report_of(spark, out, summary).summary == references[parts].summary, \
            f"{steps}: {step} on {parts}"
        assert summary["input"] == {
            "incremental": added_to_state, "files_read": len(expected),
            "rows_read": sum(files[f] for f in expected)}, f"{steps}: {step} on {parts}"
        read_before, have_state = set(files), True
    assert report_of(spark, out, summary) == references[parts]


def test_the_same_archive_by_another_path_is_not_read_twice(
        spark: Any, tmp_path: Path, references: dict[str, Report]) -> None:
    """A full run through a symbolic link, then an incremental run by the real path:
    the second reads only the new files."""
    archive, out = tmp_path / "archive", tmp_path / "report"
    add_part(archive, "1")
    (tmp_path / "link").symlink_to(archive)
    run(spark, tmp_path / "link", out)
    add_part(archive, "2")
    summary = run(spark, archive, out, incremental=True)
    assert report_of(spark, out, summary) == references["12"]
    assert summary["input"] == {"incremental": True, "files_read": 2, "rows_read": 38}


def test_incremental_without_complete_state_starts_over(
        spark: Any, tmp_path: Path, references: dict[str, Report]) -> None:
    """A report folder whose state was not finished (or was left by an older
    version, without ``state.json``) is rebuilt by the next incremental run."""
    archive, out = tmp_path / "archive", tmp_path / "report"
    add_part(archive, "1")
    run(spark, archive, out)
    (out / "_state" / "state.json").unlink()
    add_part(archive, "2")
    summary = run(spark, archive, out, incremental=True)
    assert report_of(spark, out, summary) == references["12"]
    assert summary["input"] == {"incremental": False, "files_read": 6, "rows_read": 61}
    assert (out / "_state" / "state.json").exists()


def test_empty_archive_says_so(spark: Any, tmp_path: Path) -> None:
    """An empty archive raises EmptyArchive."""
    (tmp_path / "archive").mkdir()
    with pytest.raises(EmptyArchive):
        run(spark, tmp_path / "archive", tmp_path / "report")
