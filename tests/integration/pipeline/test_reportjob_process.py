"""The report job as a real child process of a real broker: run on its schedule, niced
in its own process group; a failure shown and a running job ended when the broker stops."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from console_support import (
    ConsoleHTTP,
    initial_password,
    web_broker_process,
)


def test_the_broker_runs_the_job_on_its_schedule_niced_in_its_own_group(
        tmp_path: Path) -> None:
    """The broker runs the report command on its schedule, niced, in its own process group,
    and the console shows the run."""
    data = tmp_path / "data"
    proc = web_broker_process(str(data), "--report-every", "1s",
                              "--report-command", _fake_command(tmp_path)).start()
    try:
        proc.wait_for_line(r"report job finished", timeout=30)
        ran = _ran(data / "report")
        assert ran is not None
        assert ran["argv"] == ["--archive", str(data / "archive"), "--out",
                               str(data / "report"), "--incremental"]
        assert ran["nice"] >= 19 and ran["pgid"] == ran["pid"]
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(str(data))) == 303
        job = http.get("/api/traffic").json()["job"]
        assert job["every"] == 1 and job["last"]["ok"] is True
    finally:
        proc.stop()


def test_run_now_shows_a_failure_and_the_broker_stop_ends_a_running_job(
        tmp_path: Path) -> None:
    """A failed run shows its exit status and output in the console, and stopping the
    broker ends a running job."""
    data = tmp_path / "data"
    proc = web_broker_process(str(data), "--report-command", _fake_command(tmp_path))
    proc.env = {"FAKE_REPORT_MODE": "fail"}
    proc.start()
    try:
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(str(data))) == 303
        assert http.post("/traffic/run-report", back="/traffic").code == 303
        proc.wait_for_line(r"report job failed \(exit status 3\)", timeout=30)
        last = http.get("/api/traffic").json()["job"]["last"]
        assert (last["ok"], last["exit_code"]) == (False, 3)
        assert last["output_tail"] == ["fake report: the archive is empty"]
    finally:
        proc.stop()
    proc = web_broker_process(str(data), "--report-command", _fake_command(tmp_path))
    proc.env = {"FAKE_REPORT_MODE": "hang"}
    proc.start()
    try:
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(str(data))) == 303
        assert http.post("/traffic/run-report", back="/traffic").code == 303
        line = proc.wait_for_line(r"report job started \(console user admin\), pid", 30)
        pid = int(line.rsplit("pid", 1)[1])
        assert http.get("/api/traffic").json()["job"]["pid"] == pid
    finally:
        proc.stop()
    assert any(f"stopping pid {pid}" in line for line in proc.log)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)   # ended and reaped by the broker before it exited


def _ran(report_dir: Path) -> dict[str, Any] | None:
    path = report_dir / "ran.json"
    return json.loads(path.read_text()) if path.exists() else None


def _fake_command(tmp_path: Path) -> str:
    script = tmp_path / "fake_report.py"
    script.write_text(_FAKE_REPORT)
    return f"{sys.executable} {script}"


_FAKE_REPORT = """\
import json, os, signal, sys
out = sys.argv[sys.argv.index("--out") + 1]
os.makedirs(out, exist_ok=True)
record = {"argv": sys.argv[1:], "nice": os.nice(0), "pid": os.getpid(),
          "pgid": os.getpgid(0)}
mode = os.environ.get("FAKE_REPORT_MODE", "ok")
if mode == "fail":
    print("fake report: the archive is empty", flush=True)
    sys.exit(3)
with open(os.path.join(out, "ran.json.tmp"), "w") as f:
    json.dump(record, f)
os.rename(os.path.join(out, "ran.json.tmp"), os.path.join(out, "ran.json"))
if mode == "hang":
    # The long job the broker's stop has to end: it waits for that SIGTERM (bounded
    # at 600 s), then dies of it as an unhandled one would.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if signal.sigtimedwait({signal.SIGTERM}, 600) is not None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.kill(os.getpid(), signal.SIGTERM)
"""
