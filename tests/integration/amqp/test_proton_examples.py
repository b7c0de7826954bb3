"""python-qpid-proton's own example scripts against the broker, run as proton's
``test_examples.py`` runs them (issue 30): each script a subprocess of the venv's
python, its output checked line by line.

The scripts are Debian's (``libqpid-proton11-dev-examples``, installed by
``.ci/setup``) in /usr/share/proton/examples/python, used as they are: the ones
that take ``-a`` get ``127.0.0.1:PORT/examples``; the ones that hard-code
``localhost:5672`` (helloworld.py, helloworld_blocking.py, server_tx.py,
queue_browser.py, tx_recv_interactive.py) run through ``proton_example.py``,
which answers the name lookup of localhost:5672 with the test broker's port.
The node ``examples`` is a durable queue (``--amqp-queues examples``), as
proton's README asks of a broker (qpidd ``--queue-patterns '.*'``); every test
has a broker of its own, so no test sees another's messages.

Proton's ten broker examples (test_examples.py, less the tornado variants and
those that need no broker) all pass: helloworld, helloworld_blocking,
simple_send/simple_recv, client/server, sync_client/server, client/server_tx,
sync_client/server_tx, db_send/db_recv, tx_send/tx_recv, colour_send/
selected_recv.  Beyond proton's list: tx_recv_interactive (commit and abort)
and queue_browser (a source with distribution-mode copy: ``test_queue_browse.py``)
pass.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from linequeue import next_line

pytestmark = pytest.mark.timeout(300)

EXAMPLES = Path("/usr/share/proton/examples/python")
LAUNCHER = str(Path(__file__).parents[2] / "support" / "proton_example.py")
TIMEOUT = 60.0
SEQUENCES = [f"{{'sequence': {i + 1}}}" for i in range(100)]
LINES = ["Twas brillig, and the slithy toves", "Did gire and gymble in the wabe.",
         "All mimsy were the borogroves,", "And the mome raths outgrabe."]

if not (EXAMPLES / "tx_send.py").exists():
    pytest.skip("proton's examples are not installed (libqpid-proton11-dev-examples, "
                ".ci/setup installs it)", allow_module_level=True)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path / "data"), "--amqp-queues", "examples",
                         listeners=("--amqp",))
    proc.start()
    yield proc
    proc.stop()


Run = Callable[..., list[str]]


class Examples:
    """Runs example scripts against one broker, in a working directory of the test's."""

    def __init__(self, broker: BrokerProcess, cwd: Path) -> None:
        self.port = broker.ports["AMQP"]
        self.cwd = cwd
        self.started: list[subprocess.Popen[str]] = []

    def args(self, script: str, *extra: str) -> list[str]:
        path = str(EXAMPLES / script)
        if script in ("helloworld.py", "helloworld_blocking.py", "server_tx.py",
                      "queue_browser.py", "tx_recv_interactive.py"):
            return [sys.executable, LAUNCHER, str(self.port), path, *extra]
        return [sys.executable, path, "-a", f"127.0.0.1:{self.port}/examples", *extra]

    def run(self, script: str, *extra: str, timeout: float = TIMEOUT) -> list[str]:
        """Run ``script`` to its end; its stdout lines (stripped); it must exit 0."""
        done = subprocess.run(self.args(script, *extra), cwd=self.cwd,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
        return [line.strip() for line in done.stdout.splitlines()]

    def start(self, script: str, *extra: str) -> subprocess.Popen[str]:
        """Start ``script`` (ended by ``stop_all``, by its own PID)."""
        proc = subprocess.Popen(self.args(script, *extra), cwd=self.cwd, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.started.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[str]) -> list[str]:
        """Wait for a started script to end by itself; its stdout lines."""
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, f"failed:\n{out}\n{err}"
        return [line.strip() for line in out.splitlines()]

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()


@pytest.fixture
def examples(broker: BrokerProcess, tmp_path: Path) -> Iterator[Examples]:
    runner = Examples(broker, tmp_path)
    yield runner
    runner.stop_all()


# -- proton's test_examples.py ------------------------------------------------------------

@pytest.mark.parametrize("script", ["helloworld.py", "helloworld_blocking.py"])
def test_helloworld(examples: Examples, script: str) -> None:
    """helloworld receives the one message it sent through the examples node."""
    assert examples.run(script) == ["Hello World!"]


@pytest.mark.parametrize(("recv", "send"), [
    ("simple_recv.py", "simple_send.py"),
    ("tx_recv.py", "tx_send.py"),
], ids=["simple", "tx"])
def test_send_recv(examples: Examples, recv: str, send: str) -> None:
    """The receiver prints the 100 messages the sender sent (tx: in transactions of
    10, each committed by the sender and acknowledged by the receiver in one)."""
    receiver = examples.start(recv)
    examples.run(send)
    assert examples.finish(receiver) == SEQUENCES


@pytest.mark.parametrize(("client", "server"), [
    ("client.py", "server.py"),
    ("sync_client.py", "server.py"),
    ("client.py", "server_tx.py"),
    ("sync_client.py", "server_tx.py"),
], ids=["client-server", "sync_client-server", "client-server_tx",
        "sync_client-server_tx"])
def test_client_server(examples: Examples, client: str, server: str) -> None:
    """Requests through the examples node, replies to the client's dynamic address
    (server_tx: each reply sent and each request accepted in one transaction)."""
    examples.start(server)
    assert examples.run(client) == [f"{line} => {line.upper()}" for line in LINES]


def test_db_send_recv(examples: Examples) -> None:
    """db_send sends 100 records of a database, db_recv inserts them in another."""
    for name in ("src_db", "dst_db"):
        subprocess.run([sys.executable, str(EXAMPLES / "db_ctrl.py"), "init", f"./{name}"],
                       cwd=examples.cwd, check=True, timeout=TIMEOUT)
    subprocess.run([sys.executable, str(EXAMPLES / "db_ctrl.py"), "insert", "./src_db"],
                   cwd=examples.cwd, check=True, timeout=TIMEOUT, text=True,
                   input="".join(f"Message-{i + 1}\n" for i in range(100)))
    receiver = examples.start("db_recv.py", "-m", "100")
    examples.run("db_send.py", "-m", "100")
    assert examples.finish(receiver) == [f"inserted message {i + 1}" for i in range(100)]
    listed = subprocess.run([sys.executable, str(EXAMPLES / "db_ctrl.py"), "list",
                             "./dst_db"], cwd=examples.cwd, capture_output=True, text=True,
                            timeout=TIMEOUT, check=True)
    assert [line.strip() for line in listed.stdout.splitlines()] == [
        f"({i + 1}, 'Message-{i + 1}')" for i in range(100)]


def test_selected_recv(examples: Examples) -> None:
    """A receiver with the selector colour = 'green' takes the green messages; the
    red ones stay in the queue for the next receiver."""
    examples.run("colour_send.py")
    assert examples.run("selected_recv.py", "-m", "50") == [
        f"green {i + 1}" for i in range(100) if i % 2 == 0]
    assert examples.run("simple_recv.py", "-m", "50") == [
        f"red {i + 1}" for i in range(100) if i % 2 == 1]


# -- beyond proton's list ---------------------------------------------------------------

def _lines(stream: object) -> queue.Queue[str]:
    """The lines of a started script's stdout, as they come."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line.strip())
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _expect(lines: queue.Queue[str], wanted: str) -> list[str]:
    """Lines up to and including ``wanted`` (waits for it, with a timeout)."""
    seen: list[str] = []

    def note(line: str) -> bool:
        seen.append(line)
        return line == wanted

    try:
        next_line(lines, note, TIMEOUT, repr(wanted), lambda: repr(seen))
    except (TimeoutError, RuntimeError) as e:
        raise AssertionError(str(e)) from None
    return seen


def test_tx_recv_interactive(examples: Examples) -> None:
    """tx_recv_interactive: a message fetched and committed is consumed; one fetched
    and aborted is released, and the next fetch gets it again."""
    examples.run("simple_send.py", "-m", "2")
    proc = examples.start("tx_recv_interactive.py")
    assert proc.stdin is not None
    lines = _lines(proc.stdout)
    _expect(lines, "transaction declared")

    def command(text: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(text + "\n")
        proc.stdin.flush()

    command("fetch")
    _expect(lines, "{'sequence': 1}")
    command("commit")
    _expect(lines, "transaction committed")
    _expect(lines, "transaction declared")
    command("fetch")
    _expect(lines, "{'sequence': 2}")
    command("abort")
    _expect(lines, "transaction aborted")
    _expect(lines, "transaction declared")
    command("fetch")
    _expect(lines, "{'sequence': 2}")
    command("commit")
    _expect(lines, "transaction committed")
    command("quit")
    proc.stdin.close()
    proc.wait(timeout=TIMEOUT)
    # both consumed: nothing is left for another receiver
    examples.run("simple_send.py", "-m", "1")
    assert examples.run("simple_recv.py", "-m", "1") == ["{'sequence': 1}"]


def test_queue_browser(examples: Examples) -> None:
    """queue_browser prints the queue's messages and leaves them there."""
    examples.run("simple_send.py", "-m", "3")
    browsed = examples.run("queue_browser.py")
    assert browsed and all("sequence" in line for line in browsed)
    assert examples.run("simple_recv.py", "-m", "3", timeout=20) == SEQUENCES[:3]
