"""A real Celery worker on the broker's AMQP 0.9.1: tasks end to end, a retry, a broadcast.

The test starts ``celery -A celery_app091 worker`` (solo pool, its own queue, mingle,
gossip and event heartbeats left on as a deployment has them: they declare Celery's
fanout, topic and pidbox exchanges and its ``celeryev.<uuid>`` and
``<host>.celery.pidbox`` queues) as a child process in its own session, waits for its
"ready." log line, sends tasks from this process and reads their results through the
``rpc://`` backend.  The worker's lifetime is bounded (a timer kills it after
``LIFETIME`` seconds) and it is stopped by its PID at the end.  Validated against
RabbitMQ 3.10 first (tests/support/amqp091_target.py).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from amqp091_target import Target, target, uname
from celery import Celery
from celery_app091 import make_app
from linequeue import next_line

pytestmark = pytest.mark.timeout(180)

LIFETIME = 150.0
TIMEOUT = 30.0
SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "support")


@pytest.fixture(scope="module")
def amqp091(request: pytest.FixtureRequest) -> Iterator[Target]:
    with target(request) as t:
        yield t


class Worker:
    """``celery worker`` as a child process; its log lines in a queue."""

    def __init__(self, url: str, task_queue: str, hostname: str, cwd: str) -> None:
        env = dict(os.environ, MQTTAMQP_TEST_CELERY_BROKER=url,
                   MQTTAMQP_TEST_CELERY_QUEUE=task_queue,
                   PYTHONPATH=os.pathsep.join([SUPPORT, os.environ.get("PYTHONPATH", "")]))
        self.hostname = hostname
        self.log: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app091", "worker", "--pool=solo",
             "--hostname", hostname, "--loglevel=INFO", "-Q", task_queue],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
            start_new_session=True)
        self.timer = threading.Timer(LIFETIME, self.kill)
        self.timer.daemon = True
        self.timer.start()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            self.lines.put(line)
        self.lines.put("")

    def wait_ready(self, timeout: float = TIMEOUT) -> None:
        try:
            next_line(self.lines, lambda line: " ready." in line, timeout,
                      "worker ready", lambda: "".join(self.log))
        except (TimeoutError, RuntimeError) as e:
            raise AssertionError(str(e)) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM) by PID, SIGKILL if it lingers."""
        self.timer.cancel()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
                self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def worker(amqp091: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    w = Worker(amqp091.url, uname("celery-tasks"), f"{uname('w')}@t091",
               str(tmp_path_factory.mktemp("worker")))
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def app(amqp091: Target, worker: Worker) -> Iterator[Celery]:
    a = make_app(amqp091.url, worker.proc.args[-1])
    yield a
    a.close()


def test_tasks_run_end_to_end_with_rpc_results(app: Celery, worker: Worker) -> None:
    """Tasks sent to the worker's queue run there; their results come back over rpc://."""
    results = [app.signature("t091.add", (i, i)).delay() for i in range(10)]
    assert [r.get(timeout=TIMEOUT) for r in results] == [2 * i for i in range(10)]
    echoed = app.signature("t091.echo", ({"a": [1, "two", None]},)).delay()
    assert echoed.get(timeout=TIMEOUT) == {"a": [1, "two", None]}


def test_a_task_retries_then_succeeds(app: Celery, worker: Worker) -> None:
    """A task that raises Retry twice is sent again through the broker and succeeds."""
    result = app.signature("t091.flaky", (2,)).delay()
    assert result.get(timeout=TIMEOUT) == 2
    assert sum("t091.flaky" in line and "retry" in line.lower() for line in worker.log) >= 2


def test_broadcast_ping_reaches_the_worker(app: Celery, worker: Worker) -> None:
    """app.control.ping (a broadcast through the pidbox fanout exchange) gets the
    worker's pong on the caller's reply queue."""
    replies = app.control.ping(destination=[worker.hostname], timeout=10.0)
    assert replies == [{worker.hostname: {"ok": "pong"}}], replies
