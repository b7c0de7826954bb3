"""The console's Traffic page: ``TrafficSource`` (summary and archive on disk), the
template (escaping, empty and broken reports) and the page in Chromium under the
console's Content-Security-Policy, with a screenshot in ``test-artifacts/``.

The page is not mounted in ``mqttamqp.console.app`` by this module; the browser test serves
the rendered template and the static files with the console's headers.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pytest
from traffic_reports import (
    EVIL,
    NOW,
    make_archive,
    make_summary,
    render,
    source,
    write_summary,
)
from twisted.internet.task import Clock

from mqttamqp.console.rendering import static_dir
from mqttamqp.console.traffic import SUMMARY_FILE

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
@pytest.fixture
def clock() -> Clock:
    c = Clock()
    c.advance(NOW)
    return c


def test_no_report_gives_a_hint_and_archive_sizes(tmp_path: Path, clock: Clock) -> None:
    """Without a report the Traffic view says how to make one and shows the archive
    writer's counts and its files on disk."""
    make_archive(tmp_path / "archive")
    view = source(tmp_path, clock, lambda: {"records": 5, "dropped": 2}).view()
    assert view["report"] is None and view["report_error"] is None
    assert "mqttamqp-report --archive" in view["hint"]
    assert view["archive"] == {
        "enabled": True, "writer": {"records": 5, "dropped": 2},
        "disk": {"directory": str(tmp_path / "archive"), "files": 2, "bytes": 1024,
                 "complete": True}}


def test_report_age_and_reread_only_on_change(tmp_path: Path, clock: Clock) -> None:
    """The report's age comes from its generated_at, and the summary is read again only
    when its file changes."""
    src = source(tmp_path, clock)
    write_summary(tmp_path / "report", make_summary(3))
    view = src.view()
    assert view["report"]["totals"]["messages"] > 0 and view["hint"] is None
    assert view["report_age_seconds"] == 5400.0 and view["archive"]["enabled"] is False
    first = view["report"]
    assert src.view()["report"] is first  # same file: not read again
    write_summary(tmp_path / "report", make_summary(5) | {"generated_at": "bad"})
    os.utime(tmp_path / "report" / SUMMARY_FILE, ns=(1, 1))
    view = src.view()
    assert len(view["report"]["per_minute"]["minutes"]) == 5
    assert view["report_age_seconds"] is None


def test_broken_foreign_or_huge_summaries_are_reported(tmp_path: Path, clock: Clock) -> None:
    """A summary that is not JSON, of another version or too big is reported as an error,
    not shown."""
    report = tmp_path / "report"
    report.mkdir()
    (report / SUMMARY_FILE).write_text("{not json")
    assert "cannot read" in (source(tmp_path, clock).view()["report_error"] or "")
    write_summary(report, {"version": 99})
    assert "not a version 2" in (source(tmp_path, clock).view()["report_error"] or "")
    write_summary(report, dict(make_summary(3), version=2))    # this version's job
    assert source(tmp_path, clock).view()["report_error"] is None
    write_summary(report, make_summary(3))
    view = source(tmp_path, clock, max_summary_bytes=100).view()
    assert view["report"] is None and "more than the 100" in view["report_error"]


def test_archive_walk_is_cached_and_bounded(tmp_path: Path, clock: Clock) -> None:
    """The walk of the archive on disk is bounded in files and cached for its interval."""
    make_archive(tmp_path / "archive")
    src = source(tmp_path, clock, max_files=1, disk_interval=30)
    assert src.view()["archive"]["disk"]["complete"] is False
    (tmp_path / "archive" / "messages" / "date=2026-11-24" / "hour=08" /
     "part-9.parquet").write_bytes(b"")
    clock.advance(29)
    assert src.view()["archive"]["disk"]["files"] == 1
    src.max_files = 100
    clock.advance(1)
    assert src.view()["archive"]["disk"]["files"] == 3


def test_page_escapes_client_data_and_embeds_json_safely(tmp_path: Path,
                                                         clock: Clock) -> None:
    """The page escapes client data and embeds the report as JSON safely in an attribute."""
    write_summary(tmp_path / "report", make_summary(5))
    page = render(source(tmp_path, clock, lambda: {"records": 1, "segments": 1,
                                                   "dropped": 0, "errors": 0}).view(), clock)
    assert "<script>alert" not in page and "<i>flappy</i>" not in page
    assert "&lt;i&gt;flappy&lt;/i&gt;" in page
    block = page.split('<div id="traffic-data" hidden data-report=\'')[1].split("'")[0]
    assert "<" not in block and '"' in block  # JSON inside a single-quoted attribute
    assert json.loads(html.unescape(block))["top_topics"][3]["topic"] == EVIL
    assert "Messages per minute, by topic" in page and "Flapping clients" in page


def test_page_without_report_shows_the_hint(tmp_path: Path, clock: Clock) -> None:
    """Without a report the page shows the hint and says the archive is off."""
    page = render(source(tmp_path, clock).view(), clock)
    assert "No report yet" in page and "archive off" in page


def test_page_with_a_broken_report_shows_the_error(tmp_path: Path, clock: Clock) -> None:
    """A broken report summary shows as an error on the page."""
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / SUMMARY_FILE).write_text("[]")
    assert "not a version 2 report summary" in render(source(tmp_path, clock).view(), clock)


def test_vendored_chart_library_carries_version_and_licence() -> None:
    """The vendored uPlot carries its version and its MIT licence text."""
    head = (static_dir() / "uplot.min.js").read_text()[:2000]
    assert "uPlot 1.6.32" in head and "MIT License" in head
    assert "Permission is hereby granted" in head
