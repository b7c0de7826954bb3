"""A report summary and an archive on disk for the console's Traffic page
and the page rendered and served over loopback with the console's headers, for the
in-process tests and the ones in Chromium."""

from __future__ import annotations

import http.server
import json
import math
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock

from mqttamqp.console.rendering import make_environment, static_dir
from mqttamqp.console.traffic import SUMMARY_FILE, TrafficSource
from mqttamqp.console.web import CSP

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


def render(view: dict[str, Any], clock: Clock) -> str:
    env = make_environment(clock.seconds)
    return env.get_template("traffic.html").render(
        user="admin", csrf_token="tok", flash=[], url=lambda p, **_: p, version="test",
        here="/traffic", nav="traffic", t=view)


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
