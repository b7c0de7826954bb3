"""The console's Traffic page: what the report job's ``summary.json`` says, and how
big the archive is, as one dict for the page and for ``/api/traffic``.

``TrafficSource`` owns reading those two things safely on the reactor thread:
the summary is read only when its modification time changes and only up to
``max_summary_bytes``; the archive's size and file count come from a directory
walk done at most every ``disk_interval`` seconds and bounded to ``max_files``
entries. It must not import PySpark or run the report (a child process does), and
it must not trust the summary: it is data for autoescaped templates and JSON only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

__all__ = ["TrafficSource", "ReportRunner", "SUMMARY_FILE", "NO_REPORT_HINT"]

SUMMARY_FILE = "summary.json"
SUMMARY_VERSION = 2
# Versions the console reads: 1 differs only in its ``input`` keys, which it ignores.
READABLE_VERSIONS = (1, 2)
NO_REPORT_HINT = ("No report yet. Run mqttamqp-report --archive {archive} --out {report} "
                  "(pip install 'mqttamqp[report]' first).")


class ReportRunner(Protocol):
    """What the page needs of the broker's report job (``mqttamqp.reportjob``)."""

    def state(self) -> dict[str, Any]: ...

    def run_now(self, trigger: str) -> tuple[bool, str]: ...


@dataclass
class _Cached:
    key: tuple[int, int]      # (mtime_ns, size)
    summary: dict[str, Any] | None
    error: str | None


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class TrafficSource:
    """Reads the report summary and measures the archive for the Traffic page."""

    def __init__(self, report_dir: str, archive_dir: str | None, now: Callable[[], float],
                 archive_stats: Callable[[], dict[str, int]] | None = None, *,
                 job: ReportRunner | None = None,
                 max_summary_bytes: int = 8 << 20, disk_interval: float = 30.0,
                 max_files: int = 200_000) -> None:
        self.report_dir = report_dir
        self.archive_dir = archive_dir
        self.now = now
        self.archive_stats = archive_stats
        self.job = job
        self.max_summary_bytes = max_summary_bytes
        self.disk_interval = disk_interval
        self.max_files = max_files
        self._cached: _Cached | None = None
        self._disk: dict[str, Any] | None = None
        self._disk_at = float("-inf")

    # -- the summary ----------------------------------------------------------------------

    def _read_summary(self) -> tuple[dict[str, Any] | None, str | None]:
        path = os.path.join(self.report_dir, SUMMARY_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._cached = None
            return None, None
        except OSError as e:
            return None, f"cannot read {path}: {e.strerror}"
        key = (st.st_mtime_ns, st.st_size)
        if self._cached is not None and self._cached.key == key:
            return self._cached.summary, self._cached.error
        summary: dict[str, Any] | None = None
        error: str | None = None
        if st.st_size > self.max_summary_bytes:
            error = (f"{path} is {st.st_size} bytes, more than the "
                     f"{self.max_summary_bytes} this page reads; lower --top")
        else:
            try:
                with open(path, "rb") as f:
                    data = json.loads(f.read(self.max_summary_bytes + 1))
            except (OSError, ValueError) as e:
                error = f"cannot read {path}: {e}"
            else:
                if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
                    error = (f"{path} is not a version {SUMMARY_VERSION} report summary; "
                             "run the report again with this version")
                else:
                    summary = data
        self._cached = _Cached(key, summary, error)
        return summary, error

    # -- the archive on disk ----------------------------------------------------------------

    def _measure(self) -> dict[str, Any] | None:
        if self.archive_dir is None:
            return None
        now = self.now()
        if self._disk is not None and now - self._disk_at < self.disk_interval:
            return self._disk
        files = size = 0
        complete = True
        for root, _dirs, names in os.walk(self.archive_dir):
            for name in names:
                if not name.endswith(".parquet") or name.startswith("."):
                    continue
                files += 1
                try:
                    size += os.stat(os.path.join(root, name)).st_size
                except OSError:
                    pass
                if files >= self.max_files:
                    complete = False
                    break
            if not complete:
                break
        self._disk = {"directory": self.archive_dir, "files": files, "bytes": size,
                      "complete": complete}
        self._disk_at = now
        return self._disk

    # -- the view ---------------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """Everything the Traffic page and ``/api/traffic`` show."""
        summary, error = self._read_summary()
        now = self.now()
        generated = _epoch(summary.get("generated_at")) if summary else None
        archive: dict[str, Any] = {"enabled": self.archive_stats is not None}
        disk = self._measure()
        if disk is not None:
            archive["disk"] = disk
        if self.archive_stats is not None:
            archive["writer"] = dict(self.archive_stats())
        return {
            "report": summary,
            "report_error": error,
            "report_dir": self.report_dir,
            "report_generated": generated,
            "report_age_seconds": None if generated is None else max(0.0, now - generated),
            "hint": None if summary is not None else NO_REPORT_HINT.format(
                archive=self.archive_dir or "DATA/archive", report=self.report_dir),
            "archive": archive,
            "job": None if self.job is None else self.job.state(),
        }
