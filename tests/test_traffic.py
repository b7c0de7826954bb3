"""The console's Traffic page: ``TrafficSource`` (summary and archive on disk), the
template (escaping, empty and broken reports) and the page in Chromium under the
console's Content-Security-Policy, with a screenshot in ``test-artifacts/``.

The page is not mounted in ``mqttamqp.console.app`` by this module; the browser test serves
the rendered template and the static files with the console's headers.
"""

from __future__ import annotations

import html
import http.server
import json
import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock

from mqttamqp.console.rendering import make_environment, static_dir
from mqttamqp.console.traffic import SUMMARY_FILE, TrafficSource
from mqttamqp.console.web import CSP

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
NOW = 1795507200.0 + 7200  # 2026-11-24T10:00:00Z
EVIL = '<script>alert("x")</script>/temp'


def make_summary(minutes: int = 60) -> dict[str, Any]:
    """A report summary shaped like ``mqttamqp.pipeline.report``'s."""
    stamps = [f"2026-11-24T08:{m:02d}:00Z" for m in range(minutes)]
    topics = ["plant/1/temp", "plant/2/hum", "office/door", EVIL]
    series = {t: [int(20 + 15 * math.sin((m + 9 * i) / 7)) + 5 * i for m in range(minutes)]
              for i, t in enumerate(topics)}
    series["(other)"] = [3] * minutes
    total = sum(sum(v) for v in series.values())
    return {
        "version": 1, "generated_at": "2026-11-24T08:30:00Z",
        "window": {"since": None, "until": None, "first_minute": stamps[0],
                   "last_minute": stamps[-1]},
        "input": {"incremental": True, "files_read": 3, "rows_read": 120},
        "totals": {"messages": total, "bytes": total * 40, "retained": 12, "topics": 9},
        "qos": {"0": total - 700, "1": 600, "2": 100},
        "per_minute": {"minutes": stamps,
                       "series": [{"name": n, "values": v} for n, v in series.items()]},
        "top_topics": [{"topic": t, "messages": sum(series[t]), "bytes": 40 * sum(series[t]),
                        "publishers": 2} for t in topics],
        "top_publishers": [{"publisher": "dev1", "user": "u1", "messages": 900,
                            "bytes": 36000, "topics": 2},
                           {"publisher": None, "user": None, "messages": 4, "bytes": 8,
                            "topics": 1}],
        "topic_tree": [],
        "sessions": {"count": 40, "clients": 7, "reconnects": 33,
                     "duration_histogram": [{"le": b, "count": c} for b, c in zip(
                         [10, 60, 600, 3600, 21600, 86400, None],
                         [12, 5, 9, 7, 4, 2, 1], strict=True)],
                     "disconnect_causes": [{"cause": "keepalive", "count": 12},
                                           {"cause": "lost", "count": 3}],
                     "flap_threshold": 10,
                     "flapping": [{"client_id": "<i>flappy</i>", "connects": 14,
                                   "reconnects": 13, "max_reconnects_per_hour": 13}]},
        "wills": {"per_hour": [{"hour": f"2026-11-24T0{h}:00:00Z", "count": c}
                               for h, c in ((6, 2), (7, 5), (8, 1))],
                  "top": [{"client_id": "dev2", "topic": "plant/2/status", "count": 8}]},
        "auth_failures": [{"address": "10.0.0.5", "user": "bob", "count": 4,
                           "first": stamps[0], "last": stamps[-1]}],
    }


def write_summary(report: Path, summary: Any) -> None:
    report.mkdir(parents=True, exist_ok=True)
    (report / SUMMARY_FILE).write_text(json.dumps(summary))


def make_archive(root: Path) -> None:
    part = root / "messages" / "date=2026-11-24" / "hour=08"
    part.mkdir(parents=True)
    (part / "part-1.parquet").write_bytes(b"x" * 1000)
    (part / "part-2.parquet").write_bytes(b"x" * 24)
    (part / ".part-3.parquet.tmp").write_bytes(b"x" * 99)  # unfinished: not counted


def source(tmp_path: Path, clock: Clock, stats: Any = None, **kw: Any) -> TrafficSource:
    return TrafficSource(str(tmp_path / "report"), str(tmp_path / "archive"),
                         clock.seconds, stats, **kw)


@pytest.fixture
def clock() -> Clock:
    c = Clock()
    c.advance(NOW)
    return c


def test_no_report_gives_a_hint_and_archive_sizes(tmp_path: Path, clock: Clock) -> None:
    make_archive(tmp_path / "archive")
    view = source(tmp_path, clock, lambda: {"records": 5, "dropped": 2}).view()
    assert view["report"] is None and view["report_error"] is None
    assert "mqttamqp-report --archive" in view["hint"]
    assert view["archive"] == {
        "enabled": True, "writer": {"records": 5, "dropped": 2},
        "disk": {"directory": str(tmp_path / "archive"), "files": 2, "bytes": 1024,
                 "complete": True}}


def test_report_age_and_reread_only_on_change(tmp_path: Path, clock: Clock) -> None:
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


def render(view: dict[str, Any], clock: Clock) -> str:
    env = make_environment(clock.seconds)
    return env.get_template("traffic.html").render(
        user="admin", csrf_token="tok", flash=[], url=lambda p, **_: p, version="test",
        here="/traffic", nav="traffic", t=view)


def test_page_escapes_client_data_and_embeds_json_safely(tmp_path: Path,
                                                         clock: Clock) -> None:
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
    page = render(source(tmp_path, clock).view(), clock)
    assert "No report yet" in page and "archive off" in page


def test_page_with_a_broken_report_shows_the_error(tmp_path: Path, clock: Clock) -> None:
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / SUMMARY_FILE).write_text("[]")
    assert "not a version 2 report summary" in render(source(tmp_path, clock).view(), clock)


def test_vendored_chart_library_carries_version_and_licence() -> None:
    head = (static_dir() / "uplot.min.js").read_text()[:2000]
    assert "uPlot 1.6.32" in head and "MIT License" in head
    assert "Permission is hereby granted" in head


# -- in Chromium ----------------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:
        if self.path == "/favicon.ico":  # as the console answers it
            self.send_response(204)
            self.end_headers()
            return
        if self.path == "/traffic":
            body, ctype = self.page, "text/html; charset=utf-8"
        elif self.path.startswith("/static/") and "/" not in self.path[8:]:
            path = static_dir() / self.path[8:]
            if not path.is_file():
                self.send_error(404)
                return
            body = path.read_bytes()
            ctype = "text/css" if path.suffix == ".css" else "text/javascript"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-security-policy", CSP)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _FailedJob:
    """A report job (``mqttamqp.reportjob``) whose last scheduled run failed."""

    def __init__(self, now: float) -> None:
        self.now = now

    def state(self) -> dict[str, Any]:
        return {"state": "idle", "running_since": None, "pid": None, "every": 3600.0,
                "next_run": self.now + 1800, "available": True, "hint": None,
                "last": {"trigger": "schedule", "started_at": self.now - 1900,
                         "finished_at": self.now - 1800, "duration": 100.0,
                         "exit_code": 2, "signal": None, "ok": False, "error": None,
                         "output_tail": ["stage 2/5", "<b>java</b> not found: apt-get "
                                                      "install default-jre-headless"]}}

    def run_now(self, trigger: str) -> tuple[bool, str]:
        return False, "not here"


@pytest.fixture
def served_page(tmp_path: Path, clock: Clock) -> Iterator[str]:
    write_summary(tmp_path / "report", make_summary(60))
    make_archive(tmp_path / "archive")
    view = source(tmp_path, clock, lambda: {"records": 123456, "segments": 42,
                                            "dropped": 7, "errors": 0},
                  job=_FailedJob(clock.seconds())).view()
    handler = type("Handler", (_Handler,), {"page": render(view, clock).encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/traffic"
    server.shutdown()
    server.server_close()


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed")
def test_traffic_page_draws_its_charts_in_chromium(served_page: str) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu",
                                          "--disable-background-networking",
                                          "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error"
                    else None)
            page.goto(served_page)
            for chart in ("traffic-per-minute", "traffic-durations", "traffic-wills"):
                sync_api.expect(page.locator(f"#{chart}[data-drawn='1'] canvas")
                                ).to_have_count(1, timeout=15_000)
            legend = page.locator("#traffic-per-minute .u-legend").inner_text()
            assert EVIL in legend and "plant/1/temp" in legend
            assert page.evaluate("typeof window.alertCalled") == "undefined"
            job = page.locator("#report-job")
            sync_api.expect(job.get_by_role("button", name="Run report now")).to_be_enabled()
            assert "failed, exit status 2" in job.inner_text()
            assert page.locator("#report-job-output").inner_text().splitlines() == [
                "stage 2/5", "<b>java</b> not found: apt-get install default-jre-headless"]
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "11-traffic.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
