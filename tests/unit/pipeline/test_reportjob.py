"""The scheduled report job (``mqttamqp.reportjob``) and its place on the Traffic page.

Unit tests drive ``ReportJob`` with a fake process runner and ``task.Clock``; the
integration tests run the real child process through the real broker with a tiny
fake report command (no Spark needed); one ``spark`` test runs the real job.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from console_support import (
    CHEAP,
    PASSWORD,
    Client,
    make_console,
)
from twisted.internet.task import Clock

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
    """Durations like 1h30m, 1d and 90s parse; bare numbers, zero, negatives and fractions
    are refused."""
    assert parse_duration("1h") == 3600
    assert parse_duration("30m") == 1800
    assert parse_duration("1h30m") == 5400
    assert parse_duration("1d") == 86400
    assert parse_duration(" 90S ") == 90
    for bad in ("", "1", "h", "1x", "0m", "-1h", "1h 30m", "1.5h"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)


def test_the_schedule_runs_the_incremental_report_and_keeps_the_last_run() -> None:
    """The schedule starts the incremental report every interval and keeps the last run's
    state and output."""
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
    """A run due while one runs is skipped, logged once per run, and run-now is refused
    meanwhile."""
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
    """A failed run keeps its exit status and the last 20 lines of its output, lines joined
    across reads."""
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
    """Without PySpark nothing starts, and the state says how to install it."""
    job, runner, clock = make_job(every=60.0, available=False)
    job.start()
    clock.advance(120)
    assert job.run_now("console user admin") == (False, INSTALL_HINT)
    assert runner.started == []
    state = job.state()
    assert state["available"] is False and "pip install '.[report]'" in state["hint"]


def test_a_given_command_needs_no_pyspark() -> None:
    """A job given its own command runs it even without PySpark."""
    job, runner, _clock = make_job(every=None, available=False)
    job.set_command(["fake-report", "-v"])
    assert job.run_now("schedule")[0] is True
    assert runner.started[0].argv[:2] == ["fake-report", "-v"]


def test_stop_sends_sigterm_then_sigkill_after_the_bound() -> None:
    """Stop sends SIGTERM, then SIGKILL after the bound, fires when the process ends, and
    no run starts after."""
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
    """Stopping a job with nothing running fires at once."""
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
    """"Run report now" on the Traffic page starts the job and is audited; a second press
    while it runs is refused (409)."""
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
    """Running the report needs the CSRF token and a role that may act."""
    client, runner = console_with_job(tmp_path)
    assert client.post("/traffic/run-report", csrf=False).code == 403
    viewer = Client(client.console)
    assert viewer.login("viewer").code == 303
    assert viewer.post("/traffic/run-report").code == 403
    assert runner.started == []


def test_without_pyspark_the_page_says_how_to_install(tmp_path: Path) -> None:
    """Without PySpark the Traffic page and its API say how to install it, and pressing the
    button starts nothing."""
    client, runner = console_with_job(tmp_path, available=False)
    page = client.get("/traffic").text
    assert "pip install &#39;.[report]&#39;" in page
    assert client.get("/api/traffic").json()["job"]["hint"] == INSTALL_HINT
    reply = client.post("/traffic/run-report")
    assert reply.code == 303
    assert "PySpark is not installed" in client.get("/traffic").text
    assert runner.started == []


# -- the real child process through the real broker ------------------------------------------

def test_report_every_is_off_by_default_and_checked() -> None:
    """--report-every is off by default, kept as written, turned into seconds, and a bad
    duration is refused."""
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
