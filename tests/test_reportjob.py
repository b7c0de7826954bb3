"""The scheduled report job (``mqttamqp.reportjob``) and its place on the Traffic page.

Unit tests drive ``ReportJob`` with a fake process runner and ``task.Clock``; the
integration tests run the real child process through the real broker with a tiny
fake report command (no Spark needed); one ``spark`` test runs the real job.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock
from webui_support import (
    CHEAP,
    PASSWORD,
    Client,
    ConsoleHTTP,
    initial_password,
    make_console,
    web_broker_process,
)

from mqttamqp.reportjob import INSTALL_HINT, ReportJob, parse_duration


class FakeProcess:
    def __init__(self, pid: int, argv: Sequence[str], on_output: Callable[[bytes], None],
                 on_exit: Callable[[int | None, int | None], None]) -> None:
        self.pid = pid
        self.argv = list(argv)
        self.output = on_output
        self.exit = on_exit
        self.signals: list[int] = []

    def kill(self, signo: int) -> None:
        self.signals.append(signo)


class FakeRunner:
    def __init__(self) -> None:
        self.started: list[FakeProcess] = []

    def start(self, argv: Sequence[str], on_output: Callable[[bytes], None],
              on_exit: Callable[[int | None, int | None], None]) -> FakeProcess:
        process = FakeProcess(1000 + len(self.started), argv, on_output, on_exit)
        self.started.append(process)
        return process


def make_job(every: float | None = 3600.0, available: bool = True
             ) -> tuple[ReportJob, FakeRunner, Clock]:
    clock = Clock()
    clock.advance(1_700_000_000)
    runner = FakeRunner()
    job = ReportJob(clock, runner, "/data/archive", "/data/report", every=every,
                    available=lambda: available, stop_grace=5.0)
    return job, runner, clock


def test_durations() -> None:
    assert parse_duration("1h") == 3600
    assert parse_duration("30m") == 1800
    assert parse_duration("1h30m") == 5400
    assert parse_duration("1d") == 86400
    assert parse_duration(" 90S ") == 90
    for bad in ("", "1", "h", "1x", "0m", "-1h", "1h 30m", "1.5h"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)


def test_the_schedule_runs_the_incremental_report_and_keeps_the_last_run() -> None:
    job, runner, clock = make_job()
    job.start()
    assert job.state()["next_run"] == clock.seconds() + 3600
    clock.advance(3599)
    assert runner.started == []
    clock.advance(1)
    [process] = runner.started
    assert process.argv == [sys.executable, "-m", "mqttamqp.pipeline", "--archive",
                            "/data/archive", "--out", "/data/report", "--incremental"]
    state = job.state()
    assert (state["state"], state["running_since"], state["pid"]) == (
        "running", clock.seconds(), 1000)
    clock.advance(42)
    process.output(b"stage 1/3\n")
    process.exit(0, None)
    state = job.state()
    assert state["state"] == "idle" and state["running_since"] is None
    assert state["last"] == {"trigger": "schedule", "started_at": clock.seconds() - 42,
                             "finished_at": clock.seconds(), "duration": 42, "exit_code": 0,
                             "signal": None, "ok": True, "error": None, "output_tail": None}
    clock.advance(3600 - 42)
    assert len(runner.started) == 2


def test_a_run_due_while_one_runs_is_skipped_and_logged_once(log_lines: list[str]) -> None:
    job, runner, clock = make_job(every=60.0)
    job.start()
    clock.advance(60)
    assert job.run_now("console user admin") == (False, "a report is already running")
    clock.advance(60)
    clock.advance(60)
    assert len(runner.started) == 1
    assert len([line for line in log_lines if "is skipped" in line]) == 1
    runner.started[0].exit(0, None)
    clock.advance(60)
    assert len(runner.started) == 2
    assert job.run_now("console user admin")[0] is False
    assert len([line for line in log_lines if "is skipped" in line]) == 2


def test_a_failed_run_keeps_the_last_lines_of_its_output() -> None:
    job, runner, _clock = make_job(every=None)
    assert job.run_now("console user admin") == (True, "the report job has started")
    process = runner.started[0]
    process.output(b"".join(b"line %d\n" % i for i in range(30)))
    process.output(b"progress 10%\rprogress 50%\rJava not found: apt-get install def")
    process.output(b"ault-jre-headless")   # a line that comes in two reads
    process.exit(2, None)
    last = job.state()["last"]
    assert (last["ok"], last["exit_code"], last["trigger"]) == (False, 2, "console user admin")
    assert len(last["output_tail"]) == 20
    assert last["output_tail"][-1] == "Java not found: apt-get install default-jre-headless"
    assert last["output_tail"][-2] == "line 29"


def test_without_pyspark_nothing_starts_and_the_state_says_how_to_install() -> None:
    job, runner, clock = make_job(every=60.0, available=False)
    job.start()
    clock.advance(120)
    assert job.run_now("console user admin") == (False, INSTALL_HINT)
    assert runner.started == []
    state = job.state()
    assert state["available"] is False and "pip install '.[report]'" in state["hint"]


def test_a_given_command_needs_no_pyspark() -> None:
    job, runner, _clock = make_job(every=None, available=False)
    job.set_command(["fake-report", "-v"])
    assert job.run_now("schedule")[0] is True
    assert runner.started[0].argv[:2] == ["fake-report", "-v"]


def test_stop_sends_sigterm_then_sigkill_after_the_bound() -> None:
    job, runner, clock = make_job()
    job.start()
    clock.advance(3600)
    process = runner.started[0]
    done = job.stop()
    assert process.signals == [signal.SIGTERM] and not done.called
    clock.advance(4.9)
    assert process.signals == [signal.SIGTERM]
    clock.advance(0.1)
    assert process.signals == [signal.SIGTERM, signal.SIGKILL]
    process.exit(None, signal.SIGKILL)
    assert done.called
    assert job.state()["last"]["signal"] == signal.SIGKILL
    clock.advance(7200)
    assert len(runner.started) == 1     # no more runs once stopped
    assert job.run_now("console user admin") == (False, "the broker is stopping")


def test_stop_of_an_idle_job_fires_at_once() -> None:
    job, _runner, _clock = make_job()
    job.start()
    assert job.stop().called


# -- the console ------------------------------------------------------------------------


def console_with_job(tmp_path: Path, available: bool = True) -> tuple[Client, FakeRunner]:
    console, _service, clock = make_console(tmp_path)
    runner = FakeRunner()
    job = ReportJob(clock, runner, str(tmp_path / "archive"), str(tmp_path / "report"),
                    available=lambda: available)
    console.traffic.source.job = job
    console.actions.report_job = job
    console.users.set_password("viewer", PASSWORD, role="read-only", **CHEAP)
    client = Client(console)
    assert client.login().code == 303
    return client, runner


def test_run_report_now_from_the_traffic_page_is_audited(tmp_path: Path,
                                                         log_lines: list[str]) -> None:
    client, runner = console_with_job(tmp_path)
    page = client.get("/traffic")
    assert "Run report now" in page.text and 'action="/traffic/run-report"' in page.text
    reply = client.post("/traffic/run-report", back="/traffic")
    assert reply.code == 303 and reply.header("location") == "/traffic"
    assert len(runner.started) == 1
    assert any("action=run-report" in line and "-> started" in line for line in log_lines)
    api = client.get("/api/traffic").json()
    assert api["job"]["state"] == "running" and api["job"]["pid"] == 1000
    assert "Started the report job" in client.get("/traffic").text
    # a second press while it runs is refused with the reason, and audited
    reply = client.post_json("/api/traffic/run-report", {},
                             headers={"X-CSRF-Token": client.csrf})
    assert reply.code == 409 and "already running" in reply.json()["error"]
    assert any("action=run-report" in line and "refused" in line for line in log_lines)
    runner.started[0].output(b"boom\n")
    runner.started[0].exit(1, None)
    page = client.get("/traffic").text
    assert "failed, exit status 1" in page and "boom" in page


def test_run_report_needs_csrf_and_a_role_that_may_act(tmp_path: Path) -> None:
    client, runner = console_with_job(tmp_path)
    assert client.post("/traffic/run-report", csrf=False).code == 403
    viewer = Client(client.console)
    assert viewer.login("viewer").code == 303
    assert viewer.post("/traffic/run-report").code == 403
    assert runner.started == []


def test_without_pyspark_the_page_says_how_to_install(tmp_path: Path) -> None:
    client, runner = console_with_job(tmp_path, available=False)
    page = client.get("/traffic").text
    assert "pip install &#39;.[report]&#39;" in page
    assert client.get("/api/traffic").json()["job"]["hint"] == INSTALL_HINT
    reply = client.post("/traffic/run-report")
    assert reply.code == 303
    assert "PySpark is not installed" in client.get("/traffic").text
    assert runner.started == []


# -- the real child process through the real broker ------------------------------------------

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


def _ran(report_dir: Path) -> dict[str, Any] | None:
    path = report_dir / "ran.json"
    return json.loads(path.read_text()) if path.exists() else None


def _fake_command(tmp_path: Path) -> str:
    script = tmp_path / "fake_report.py"
    script.write_text(_FAKE_REPORT)
    return f"{sys.executable} {script}"


def test_the_broker_runs_the_job_on_its_schedule_niced_in_its_own_group(
        tmp_path: Path) -> None:
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


def test_report_every_is_off_by_default_and_checked() -> None:
    from mqttamqp.options import Options

    options = Options()
    options.parseOptions([])
    assert options["report-every"] is None
    options = Options()
    options.parseOptions(["--report-every", "30m"])
    assert options["report-every"] == "30m"     # kept as written (--print-config)
    from mqttamqp.service import makeService
    assert makeService(options).report_job.every == 1800.0
    with pytest.raises(SystemExit, match="--report-every: '90' is not a duration"):
        Options().parseOptions(["--report-every", "90"])
