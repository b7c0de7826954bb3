"""The examples of README.md and of every page of docs/, run (issue 24, item 9; docs/
since issue 25), so that the documentation cannot drift from the code: every fenced
block is either run here or marked in its page itself by ``<!-- not run: REASON -->``
on the line before its fence.  A new block that is neither fails
``test_readme_example`` with its page and line.

How a block runs (each against its own broker on 127.0.0.1 port 0, in a temporary
directory where ``DATA`` and ``mqttamqp-data`` are that broker's data directory):

- ``sh``: command by command, in bash.  ``mosquitto_pub``/``mosquitto_sub`` get
  ``-h 127.0.0.1 -p PORT`` first (the command's own options still win), a default port
  (``127.0.0.1:8080``, ``-p 8883``, ...) becomes the broker's, ``NAME`` and ``HOST``
  become ``127.0.0.1``, ``mqttamqp-admin`` is given the password it asks for on its
  standard input.  A subscriber that runs until stopped (no ``-C``, ``-W`` or ``-E``)
  goes on in the background once its SUBACK is in; a ``twistd ... mqttamqp`` command is
  the block's broker (its listeners on port 0 and loopback, the others off).  Every
  command must succeed (``mosquitto_sub -W`` may end with its time-out status, 27), and
  every ``#  -> TEXT`` line must show in the block's output (``...`` stands for
  anything, runs of whitespace are one space).  Only these programs run: a new one needs
  its place here, or the marker.
- ``python``: the script, with the ports replaced; ``print(...)  # TEXT`` must print TEXT.
- ``toml``: a ``[[queue]]`` file through the ``--queues`` loader, any other through
  ``--config`` (the real option parser).
- ``text``: an ACL file through the real parser, then a broker started with it, where
  a user it lets write publishes to a user it lets read (and a topic it does not grant
  is not delivered); or a ``twistd mqttamqp: --config FILE, line N: KEY: ...`` error,
  reproduced with a file holding that key at that line.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions
import pytest
from brokerproc import TWISTD, BrokerProcess
from console_support import CHEAP
from readme_blocks import BLOCKS, Block

from mqttamqp.security.acl import CONFIGURE, READ, WRITE, covers, parse_acl
from mqttamqp.security.userstore import UserStore

pytestmark = pytest.mark.timeout(120)

BIN = os.path.dirname(sys.executable)
PASSWORD = "a password for the README"
WAIT = 20.0        # seconds for any one event (a SUBACK, an expected line, a listener)

# -- output and processes -------------------------------------------------------------


class Output:
    """What a block's commands printed, waited on line by line."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.changed = threading.Condition()

    def add(self, text: str) -> None:
        with self.changed:
            self.parts.append(text)
            self.changed.notify_all()

    def text(self) -> str:
        with self.changed:
            return "".join(self.parts)

    def wait_for(self, found: Callable[[str], bool], timeout: float = WAIT) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not found("".join(self.parts)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return True


def _squeeze(text: str) -> str:
    return " ".join(text.split())


def shows(expected: str) -> Callable[[str], bool]:
    """A test of an output for ``expected`` ('...': anything; whitespace runs: one space)."""
    pattern = re.compile(".*?".join(re.escape(_squeeze(piece)) for piece in
                                    expected.split("...")), re.S)
    return lambda text: pattern.search(_squeeze(text)) is not None


class Background:
    """A process of a block that runs until stopped (a subscriber, the block's broker)."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], output: Output) -> None:
        self.own = Output()
        self.output = output
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def wait(self, timeout: float) -> int:
        """Its exit status once it ended and every line it wrote was read (the
        reading thread can be behind the exit)."""
        status = self.proc.wait(timeout=timeout)
        self._reader.join(timeout)
        return status

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.own.add(line)
            self.output.add(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)   # its own session: bash and its child
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


class Place:
    """A block's directory, broker, environment and background processes."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.data = tmp / "mqttamqp-data"
        self.ports: dict[str, int] = {}
        self.env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""),
                        README_PASSWORD=PASSWORD)
        self.output = Output()
        self.background: list[Background] = []
        self.broker: BrokerProcess | None = None

    def start_broker(self, *extra: str) -> None:
        self.broker = BrokerProcess(str(self.data), *extra,
                                    listeners=("--mqtt", "--amqp", "--web", "--metrics"))
        self.broker.start()
        os.symlink("mqttamqp-data", self.dir / "DATA")
        self.ports = dict(self.broker.ports)

    def close(self) -> None:
        for proc in reversed(self.background):
            proc.stop()
        if self.broker is not None:
            self.broker.stop()


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    here = Place(tmp_path)
    yield here
    here.close()


# -- the ports and placeholders README writes ----------------------------------------

_KIND = {"1883": "MQTT", "8883": "MQTT", "5672": "AMQP", "5671": "AMQP", "8080": "WEB",
         "8443": "WEB", "9108": "METRICS", "8083": "MQTT-WS"}


def localize(text: str, ports: dict[str, int]) -> str:
    """``text`` with README's default ports made the broker's and NAME/HOST loopback."""
    def port(number: str) -> str:
        kind = _KIND.get(number)
        return str(ports[kind]) if kind in ports else number

    text = re.sub(r"\b(?:NAME|HOST|localhost|127\.0\.0\.1):(\d+)\b",
                  lambda m: f"127.0.0.1:{port(m.group(1))}", text)
    text = re.sub(r"(?<=\s)-p (\d+)\b", lambda m: f"-p {port(m.group(1))}", text)
    return re.sub(r"\b(?:NAME|HOST)\b", "127.0.0.1", text)


# -- sh ----------------------------------------------------------------------------------

# (stdbuf: a subscriber's lines, and its SUBACK, as they come, not when it exits)
PRELUDE = """
mosquitto_sub() { stdbuf -oL mosquitto_sub -h 127.0.0.1 -p "$README_MQTT_PORT" "$@"; }
mosquitto_pub() { command mosquitto_pub -h 127.0.0.1 -p "$README_MQTT_PORT" "$@"; }
mqttamqp-admin() {
  printf '%s\\n%s\\n' "$README_PASSWORD" "$README_PASSWORD" | command mqttamqp-admin "$@"
}
"""
RUNS = frozenset({"mosquitto_sub", "mosquitto_pub", "mqttamqp-admin", "curl", "twistd"})
_ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)


@dataclass(frozen=True)
class Command:
    page: str
    text: str
    line: int              # the page's line where it starts
    program: str
    background: bool


def sh_commands(block: Block) -> tuple[list[Command], list[str]]:
    """The commands of ``block`` (continuations joined) and its '#  -> ' lines."""
    commands: list[Command] = []
    expected: list[str] = []
    pending = ""
    start = 0
    for number, raw in enumerate(block.text.splitlines(), block.line + 1):
        line = raw.strip()
        if not pending:
            if not line:
                continue
            arrow = re.match(r"#\s*->\s?(.*)$", line)
            if arrow:
                expected.append(arrow.group(1))
                continue
            if line.startswith("#"):
                continue
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = pending + line, ""
        words = shlex.split(text, comments=True)
        background = bool(words) and words[-1] == "&"
        if background:
            words.pop()
            text = text[:text.rindex("&")].rstrip()
        assignment = _ASSIGNMENT.match(words[0]) if words else None
        if assignment:
            inner = re.search(r"\$\(\s*(\S+)", text)
            program = inner.group(1) if inner else "?"
        else:
            program = words[0] if words else "?"
        if program == "mosquitto_sub" and not {"-C", "-W", "-E"} & set(words):
            background = True   # a subscriber that runs until stopped
        commands.append(Command(block.page, text, start, program, background))
    return commands, expected


def run_sh(block: Block, place: Place) -> None:
    commands, expected = sh_commands(block)
    strangers = sorted({c.program for c in commands} - RUNS)
    assert not strangers, (f"{block.page} line {block.line}: the sh block runs {strangers}, "
                           "which tests/test_readme_examples.py does not run: teach it, or "
                           "mark the block <!-- not run: why -->")
    if not any(c.program == "twistd" for c in commands):
        place.start_broker()
    variables: dict[str, str] = {}
    for command in commands:
        where = f"{command.page} line {command.line}: {command.text}"
        if command.program == "twistd":
            start_twistd(command, place)
            continue
        text = localize(command.text, place.ports)
        env = dict(place.env, **variables,
                   README_MQTT_PORT=str(place.ports.get("MQTT", 1883)))
        if command.program == "mosquitto_sub" and command.background:
            text = text.replace("mosquitto_sub", "mosquitto_sub -d", 1)
            sub = Background(["bash", "-c", PRELUDE + text], place.dir, env, place.output)
            place.background.append(sub)
            assert sub.own.wait_for(lambda t: "received SUBACK" in t), (
                f"{where}: no SUBACK within {WAIT}s:\n{sub.own.text()}")
            continue
        if command.background:
            place.background.append(
                Background(["bash", "-c", PRELUDE + text], place.dir, env, place.output))
            continue
        assignment = _ASSIGNMENT.match(text)
        script = PRELUDE + text
        if assignment:
            script += f'\nprintf "%s" "${assignment.group(1)}"'
        done = subprocess.run(["bash", "-c", script], cwd=place.dir, env=env,
                              capture_output=True, text=True, timeout=60,
                              start_new_session=True)
        allowed = {0, 27} if command.program == "mosquitto_sub" and " -W " in text else {0}
        assert done.returncode in allowed, (
            f"{where}: exit status {done.returncode}\n{done.stdout}{done.stderr}")
        if assignment:
            variables[assignment.group(1)] = done.stdout
        place.output.add(done.stdout + done.stderr)
    for line in expected:
        assert place.output.wait_for(shows(line)), (
            f"{block.page} line {block.line}: the block never printed {line!r}; it printed:\n"
            + place.output.text())


def start_twistd(command: Command, place: Place) -> None:
    """The block's own broker: its listeners on port 0 and loopback, the rest off."""
    words = shlex.split(command.text, comments=True)
    assert words[0] == "twistd" and "mqttamqp" in words, command.text
    argv = [TWISTD, *words[1:]]
    named: list[str] = []
    for i, word in enumerate(argv[:-1]):
        if word in ("--mqtt", "--amqp", "--web", "--mqtt-ws", "--metrics"):
            description = re.sub(r"^(tcp|ssl):\d+", r"\1:0", argv[i + 1])
            if "interface=" not in description:
                description += ":interface=127.0.0.1"
            argv[i + 1] = description
            named.append(word[2:].upper())
    for option in ("--mqtt", "--amqp", "--web", "--mqtt-ws", "--metrics"):
        if option[2:].upper() not in named:
            argv += [option, "none"]
    broker = Background(argv, place.dir, place.env, place.output)
    place.background.append(broker)
    listening = re.compile(r"listening for ([\w-]+) on 127\.0\.0\.1:(\d+)")
    assert broker.own.wait_for(
        lambda t: {m.group(1).upper() for m in listening.finditer(t)} >= set(named)
        or broker.proc.poll() is not None), broker.own.text()
    found = {m.group(1).upper(): int(m.group(2)) for m in listening.finditer(broker.own.text())}
    assert set(found) >= set(named), (f"{command.page} line {command.line}: the broker did not "
                                      f"start:\n{broker.own.text()}")
    place.ports = found


# -- python ------------------------------------------------------------------------------


def run_python(block: Block, place: Place) -> None:
    place.start_broker()
    script = place.dir / "example.py"
    script.write_text(localize(block.text, place.ports), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=place.dir, env=place.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (f"{block.page} line {block.line}: the script failed:\n"
                                  f"{done.stdout}{done.stderr}")
    for printed in re.findall(r"^\s*print\(.*\)\s+#\s*(.+?)\s*$", block.text, re.M):
        assert shows(printed)(done.stdout), (f"{block.page} line {block.line}: expected "
                                             f"{printed!r}, got:\n{done.stdout}")


# -- toml ------------------------------------------------------------------------------


def run_toml(block: Block, place: Place) -> None:
    path = place.dir / "example.toml"
    path.write_text(block.text, encoding="utf-8")
    if re.search(r"^\s*\[\[queue\]\]", block.text, re.M):
        from mqttamqp.queuesfile import load_queue_rules

        assert load_queue_rules(str(path)), f"{block.page} line {block.line}: no rule read"
        return
    from mqttamqp.options import Options

    options = Options()
    try:
        options.parseOptions(["--config", str(path), "--data", str(place.data)])
    except SystemExit as e:
        pytest.fail(f"{block.page} line {block.line}: --config refuses it: {e.code}")


# -- text: ACL files and error lines -----------------------------------------------------

_CONFIG_ERROR = re.compile(r"^twistd mqttamqp: --config (\S+), line (\d+): ([\w-]+): ")


def run_text(block: Block, place: Place) -> None:
    first = block.text.strip().splitlines()[0]
    if _CONFIG_ERROR.match(first):
        run_config_error(block, place)
        return
    rules = [line.split(None, 1)[0] for line in block.text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    if {"queue", "exchange"} & set(rules):
        run_resource_acl(block, place)
        return
    assert rules and set(rules) <= {"topic", "pattern", "user"}, (
        f"{block.page} line {block.line}: a text block that is neither an ACL file nor an "
        "error line: run it in tests/test_readme_examples.py or mark it "
        "<!-- not run: why -->")
    run_acl(block, place)


def run_resource_acl(block: Block, place: Place) -> None:
    """An ACL file with AMQP 0.9.1 queue lines: parsed, then in force in a broker,
    where the first user it lets configure a queue by its plain name declares that
    queue over AMQP 0.9.1 (pika), and is refused (403, the connection kept) a queue
    the file does not grant."""
    rules = parse_acl(block.text, f"{block.page} line {block.line}")
    user, queue = next((name, r.filter) for name, granted in rules.users.items()
                       for r in granted if r.kind == "queue" and r.access & CONFIGURE
                       and not r.pattern and "*" not in r.filter)
    store = UserStore(str(place.data))
    for name in rules.users:
        store.set_password(name, f"{name} {PASSWORD}", **CHEAP)
    acl = place.dir / "acl.txt"
    acl.write_text(block.text, encoding="utf-8")
    place.start_broker("--acl", str(acl))
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", place.ports["AMQP"], connection_attempts=1, socket_timeout=10,
        credentials=pika.PlainCredentials(user, f"{user} {PASSWORD}")))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare(f"not-granted-to-{user}", durable=True)
        assert refused.value.reply_code == 403
        assert connection.is_open
    finally:
        connection.close()


def run_config_error(block: Block, place: Place) -> None:
    """The error README shows for a bad key, from a file with that key at that line."""
    shown = block.text.strip()
    match = _CONFIG_ERROR.match(shown)
    assert match is not None
    readme_path, line, key = match.group(1), int(match.group(2)), match.group(3)
    path = place.dir / "mqttamqp.toml"
    path.write_text("# a comment\n" * (line - 1) + f"{key} = 64\n", encoding="utf-8")
    done = subprocess.run([TWISTD, "-n", "--pidfile=", "mqttamqp", "--config", str(path),
                           "--data", str(place.data), "--mqtt", "none", "--amqp", "none",
                           "--web", "none", "--mqtt-ws", "none", "--metrics", "none"],
                          cwd=place.dir, env=place.env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines()[0] == shown.replace(readme_path, str(path)), done.stderr


def run_acl(block: Block, place: Place) -> None:
    """The ACL file as README writes it: parsed, then in force in a broker, where a
    user it lets write reaches a user it lets read, and a topic it does not grant
    that writer is not delivered."""
    rules = parse_acl(block.text, f"{block.page} line {block.line}")
    writer = next((name for name, granted in rules.users.items()
                   for r in granted if r.access & WRITE and not r.pattern), None)
    assert writer is not None, "the example grants no user a write: choose another check"
    grant = next(r for r in rules.users[writer] if r.access & WRITE)
    topic = "/".join("x" if level in ("+", "#") else level for level in grant.filter.split("/"))
    reader = next((name for name, granted in rules.users.items() for r in granted
                   if r.access & READ and covers(r.filter.split("/"), topic.split("/"))),
                  None)
    assert reader is not None, f"no user of the example may read {topic}"
    read_filter = next(r.filter for r in rules.users[reader]
                       if r.access & READ and covers(r.filter.split("/"), topic.split("/")))
    store = UserStore(str(place.data))
    for name in rules.users:
        store.set_password(name, f"{name} {PASSWORD}", **CHEAP)
    acl = place.dir / "acl.txt"
    acl.write_text(block.text, encoding="utf-8")
    place.start_broker("--acl", str(acl))
    port = str(place.ports["MQTT"])

    def client(program: str, user: str, *args: str) -> list[str]:
        return [program, "-h", "127.0.0.1", "-p", port, "-u", user, "-P", f"{user} {PASSWORD}",
                "-q", "1", *args]

    sub = Background(["stdbuf", "-oL", *client("mosquitto_sub", reader, "-d", "-v", "-C", "1",
                                                "-t", read_filter)],
                     place.dir, place.env, place.output)
    place.background.append(sub)
    assert sub.own.wait_for(lambda t: "received SUBACK" in t), sub.own.text()
    denied = "not/granted/to/" + writer
    for target, payload in ((denied, "refused"), (topic, "granted")):
        subprocess.run(client("mosquitto_pub", writer, "-t", target, "-m", payload),
                       check=True, timeout=60, capture_output=True)
    assert sub.wait(WAIT) == 0, sub.own.text()
    received = [line for line in sub.own.text().splitlines()
                if line.endswith((" granted", " refused"))]
    assert received == [f"{topic} granted"], sub.own.text()


RUNNERS: dict[str, Callable[[Block, Place], None]] = {
    "sh": run_sh, "python": run_python, "toml": run_toml, "text": run_text}


@pytest.mark.integration
@pytest.mark.parametrize("block", BLOCKS,
                         ids=[f"{b.page}:line{b.line}-{b.lang}" for b in BLOCKS])
def test_readme_example(block: Block, place: Place) -> None:
    """The page's fenced block at this line runs as written, or the page says why not."""
    if block.not_run is not None:
        pytest.skip(f"{block.page} line {block.line}: not run: {block.not_run}")
    runner = RUNNERS.get(block.lang)
    assert runner is not None, (
        f"{block.page} line {block.line}: a ```{block.lang} block that tests/"
        "test_readme_examples.py cannot run: teach it, or mark the block "
        "<!-- not run: why -->")
    runner(block, place)
