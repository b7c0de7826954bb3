"""Start-up and the command line, run as an operator runs them (issue 13).

A broker that cannot start (a port in use, a bad endpoint description, a data
directory it cannot use) stops with one line that says why, exits with status 1, and
leaves nothing running: no "listening for" line, the port it bound first is free
again, the console's first admin user is not created.  A bad option prints its error
and one hint line, not the whole --help.  Every command here is the real ``twistd``
(or ``mqttamqp-admin``) in a child process with a timeout; ports are 0 or held by the
test itself, on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import TWISTD, BrokerProcess, assert_refused_before_start
from compiled import COMPILED

from mqttamqp import __version__

pytestmark = pytest.mark.timeout(120)

LOOPBACK_0 = "tcp:0:interface=127.0.0.1"
ADMIN = os.path.join(os.path.dirname(sys.executable), "mqttamqp-admin")


def twistd(cwd: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        # (absolute, as the child runs elsewhere: it must load the code under test)
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    # The WebSocket listener's default port (8083) is not ours to take in a test.
    ws = () if "--mqtt-ws" in args else ("--mqtt-ws", "none")
    return subprocess.run([*prefix, TWISTD, "-n", "--pidfile=", "--logfile=-", "mqttamqp",
                           *args, *ws], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env)


def assert_stopped_with(out: subprocess.CompletedProcess[str], message: str) -> str:
    """Exit status 1; exactly one error line, the critical one, holding ``message``;
    no traceback; nothing listened; returns the combined output."""
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    errors = [line for line in text.splitlines()
              if "#critical]" in line or "#error]" in line or "#warn]" in line]
    assert len(errors) == 1, text
    assert message in errors[0] and errors[0].endswith("; not started"), text
    assert "Traceback" not in text
    assert "listening for" not in text
    return text


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this test holds (bound and listening)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        s.listen()
        return True


# ----------------------------------------------------------------------------------
# Ports


@pytest.mark.parametrize("busy", ["mqtt", "amqp", "web"])
def test_a_port_in_use_stops_the_broker_before_anything_starts(
        tmp_path: Path, held_port: int, busy: str) -> None:
    """Whichever listener cannot bind, the broker names it and the address, exits 1,
    closes the listeners it had bound, and starts nothing else (no admin user, no
    archive)."""
    listeners = {kind: LOOPBACK_0 for kind in ("mqtt", "amqp", "web")}
    listeners[busy] = f"tcp:{held_port}:interface=127.0.0.1"
    data = tmp_path / "data"
    out = twistd(tmp_path, "--data", str(data),
                 *(arg for kind, d in listeners.items() for arg in (f"--{kind}", d)))
    kind = {"mqtt": "MQTT", "amqp": "AMQP", "web": "web"}[busy]
    text = assert_stopped_with(
        out, f"cannot listen for {kind} on tcp:{held_port}:interface=127.0.0.1 "
             f"(127.0.0.1:{held_port}): Address already in use")
    bound_before = [int(p) for p in re.findall(r"Factory starting on (\d+)", text)]
    assert len(bound_before) == ["mqtt", "amqp", "web"].index(busy)
    for port in bound_before:
        assert port_is_free(port), (port, text)
    assert not (data / "admin-password.txt").exists()
    assert not (data / "archive").exists()
    assert "loaded 0 retained" not in text  # the state was never loaded


# ----------------------------------------------------------------------------------
# Options


@pytest.mark.parametrize(("option", "value", "reason"), [
    ("--mqtt", "tcpp:1234", "Unknown endpoint type: 'tcpp'"),
    ("--mqtt", "tcp:abc", "invalid literal for int()"),
    ("--amqp", "tcp:5672:backlog=lots", "invalid literal for int()"),
    ("--web", "ssl:8443:privateKey=/nonexistent/key.pem", "nonexistent"),
])
def test_a_bad_endpoint_description_names_the_option(
        tmp_path: Path, option: str, value: str, reason: str) -> None:
    """An endpoint description Twisted cannot parse is refused while the options are
    parsed: one line naming the option and the value, no traceback, no hang."""
    out = twistd(tmp_path, "--data", str(tmp_path / "data"), option, value)
    assert_refused_before_start(
        out, f"{option} {value!r} is not a Twisted endpoint description: ", tmp_path)
    assert reason in out.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--max-inflight", "0"], "--max-inflight must be at least 1"),
    (["--connect-timeout", "soon"], "--connect-timeout must be a number, got 'soon'"),
    (["--no-such-option"], "option --no-such-option not recognized"),
])
def test_a_bad_option_prints_its_error_and_one_hint_not_the_help(
        tmp_path: Path, args: list[str], message: str) -> None:
    """twistd with a bad option exits 1 with its error and one hint line, not the whole
    help, and starts nothing."""
    out = twistd(tmp_path, "--data", str(tmp_path / "data"), *args)
    assert_refused_before_start(out, message, tmp_path)


def test_help_describes_mqtt_amqp_and_the_console() -> None:
    """--help says what the broker is (MQTT, AMQP 1.0, the console, loopback defaults),
    and no option's text carries its source indentation."""
    out = subprocess.run([TWISTD, "mqttamqp", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for phrase in ("MQTT 3.1/3.1.1 (--mqtt)", "AMQP 1.0 (--amqp)", "admin console",
                   "(--web)", "loopback only", "'none' disables MQTT",
                   "Print mqttamqp's version"):
        assert phrase in text, phrase
    # Each described line without its option name (the column twistd aligns the
    # descriptions on follows the longest name).
    described = [re.sub(r"^\s*(?:-\w, )?(?:--[\w-]+=?)?\s*", "", line)
                 for line in out.stdout.splitlines() if line.startswith("      ")]
    stray = [d for d in described if re.search(r"\S {2,}\S", d)]
    assert described and stray == [], stray
    listing = subprocess.run([TWISTD, "--help"], capture_output=True, text=True,
                             timeout=60).stdout
    entry = " ".join(listing[listing.index("mqttamqp "):].split())
    assert entry.startswith("mqttamqp MQTT 3.1/3.1.1 and AMQP 1.0 broker"), entry


def test_version_prints_mqttamqps_version() -> None:
    """twistd mqttamqp --version prints mqttamqp's version with Twisted's."""
    out = subprocess.run([TWISTD, "mqttamqp", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith(f"mqttamqp {__version__} (Twisted "), out.stdout


def test_the_start_up_line_names_the_build_these_tests_import(tmp_path: Path) -> None:
    """The broker says at start-up which build it runs (the hot modules compiled by
    mypyc, setup.py's MQTTAMQP_COMPILE, or pure Python): the one these tests import."""
    with BrokerProcess(str(tmp_path / "data")) as broker:
        lines = [line for line in broker.log if "data directory" in line]
    build = "compiled" if COMPILED else "pure Python"
    assert len(lines) == 1 and f"mqttamqp {__version__} ({build}): data directory " in lines[0]


# ----------------------------------------------------------------------------------
# The data directory


def test_a_data_path_that_is_a_file(tmp_path: Path) -> None:
    """A data path that is a file stops the broker with one line saying so."""
    data = tmp_path / "data"
    data.write_text("not a directory")
    out = twistd(tmp_path, "--data", str(data), "--mqtt", LOOPBACK_0, "--amqp", "none",
                 "--web", "none")
    assert_stopped_with(out, f"the data directory {data} is not a directory")


def test_a_data_directory_whose_parent_is_missing(tmp_path: Path) -> None:
    """The data directory is created if missing, but not a whole missing path: a typo
    in --data should not silently make a new tree."""
    data = tmp_path / "no-such-dir" / "data"
    out = twistd(tmp_path, "--data", str(data), "--mqtt", LOOPBACK_0, "--amqp", "none",
                 "--web", "none")
    assert_stopped_with(out, f"cannot create the data directory {data}: "
                             f"{data.parent} does not exist (create it first)")
    assert not data.parent.exists()


def test_a_data_directory_in_use_by_a_running_broker(tmp_path: Path) -> None:
    """A second broker on the same data directory names the pid holding the lock, and
    the first one carries on."""
    data = tmp_path / "data"
    first = BrokerProcess(str(data)).start()
    try:
        out = twistd(tmp_path, "--data", str(data), "--mqtt", LOOPBACK_0, "--amqp", "none",
                     "--web", "none")
        assert first.proc is not None
        assert_stopped_with(out, f"another mqttamqp is using {data} "
                                 f"(lock held by pid {first.proc.pid} (")
        with socket.create_connection(("127.0.0.1", first.mqtt_port), timeout=10):
            pass
        assert first.proc.poll() is None
    finally:
        first.stop()


def test_a_stale_pid_in_the_lock_file_is_not_named_as_the_holder(tmp_path: Path) -> None:
    """The lock file's pid may be a process long gone (zc.lockfile wrote it once):
    the refusal names the process the kernel says holds the lock, with its command."""
    data = tmp_path / "data"
    first = BrokerProcess(str(data)).start()
    try:
        assert first.proc is not None
        (data / "mqttamqp.fs.lock").write_text(" 4194302\n")   # a pid nobody has
        out = twistd(tmp_path, "--data", str(data), "--mqtt", LOOPBACK_0, "--amqp", "none",
                     "--web", "none")
        text = assert_stopped_with(out, f"(lock held by pid {first.proc.pid} (")
        assert "4194302" not in text and "twistd" in text
        assert first.proc.poll() is None
    finally:
        first.stop()


def _damage_the_last_transaction(storage: Path) -> None:
    """Flip a byte of the last transaction's trailing (redundant) length, as a torn
    write would leave it: FileStorage refuses the file at open."""
    with open(storage, "r+b") as f:
        f.seek(-2, os.SEEK_END)
        byte = f.read(1)
        f.seek(-2, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x5A]))


def test_a_damaged_storage_stops_with_one_line_and_recover_repairs_it(
        tmp_path: Path) -> None:
    """A commit torn by a crash: the start stops with one line naming the command;
    ``mqttamqp-admin recover`` keeps a copy and cuts the file after its last good
    transaction; the broker starts again with what was committed before."""
    from pahoclient import PahoClient

    data = tmp_path / "data"
    broker = BrokerProcess(str(data), "--no-archive").start()
    try:
        client = PahoClient(broker.mqtt_port, "recover-writer")
        client.publish("kept/a", b"before", qos=1, retain=True)   # durable at PUBACK
        client.publish("kept/b", b"later", qos=1, retain=True)    # a later commit
        client.stop()
    finally:
        broker.kill()                       # a crash: the index is not saved
    storage = data / "mqttamqp.fs"
    original = storage.read_bytes()
    _damage_the_last_transaction(storage)
    damaged = storage.read_bytes()
    out = twistd(tmp_path, "--data", str(data), "--mqtt", LOOPBACK_0, "--amqp", "none",
                 "--web", "none", "--no-archive")
    assert_stopped_with(out, f"the storage {storage} is damaged (")
    assert f"Run 'mqttamqp-admin recover --data {data}'" in out.stdout + out.stderr
    assert storage.read_bytes() == damaged        # nothing changed by the failed start

    fixed = subprocess.run([ADMIN, "recover", str(data)], capture_output=True, text=True,
                           timeout=60)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    (copy,) = data.glob("mqttamqp.fs.damaged-*")
    assert copy.read_bytes() == damaged
    kept = storage.read_bytes()
    assert 4 < len(kept) < len(damaged) and original.startswith(kept)
    assert f"kept {len(kept):,} of {len(damaged):,} bytes" in fixed.stdout
    assert str(copy) in fixed.stdout

    again = BrokerProcess(str(data), "--no-archive").start()
    try:
        reader = PahoClient(again.mqtt_port, "recover-reader")
        reader.subscribe(("kept/a", 1))
        got = reader.get()
        assert (got.topic, got.payload, got.retain) == ("kept/a", b"before", True)
        reader.stop()
    finally:
        again.stop()
    again_fixed = subprocess.run([ADMIN, "recover", "--data", str(data)],
                                 capture_output=True, text=True, timeout=60)
    assert again_fixed.returncode == 0 and "nothing changed" in again_fixed.stdout


def test_recover_is_refused_while_the_broker_runs(tmp_path: Path) -> None:
    """``mqttamqp-admin recover`` takes the storage's lock first: with a broker
    running it names that broker and changes nothing."""
    data = tmp_path / "data"
    broker = BrokerProcess(str(data), "--no-archive").start()
    try:
        assert broker.proc is not None
        before = (data / "mqttamqp.fs").read_bytes()
        out = subprocess.run([ADMIN, "recover", "--data", str(data)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 1
        assert f"lock held by pid {broker.proc.pid} (" in out.stderr
        assert "stop the broker first; nothing changed" in out.stderr
        assert (data / "mqttamqp.fs").read_bytes() == before
        assert not list(data.glob("mqttamqp.fs.damaged-*"))
    finally:
        broker.stop()


def _read_only_bind() -> tuple[str, ...] | None:
    """A command prefix that runs the rest with ``$RO_DIR`` read-only (a read-only
    bind mount in a private user and mount namespace), or None where the system does
    not allow that without privileges."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    script = ('mount --bind "$RO_DIR" "$RO_DIR" && '
              'mount -o remount,bind,ro "$RO_DIR" "$RO_DIR" && exec "$@"')
    return (unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh")


def test_a_read_only_data_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only data directory stops the broker with one line saying it cannot write
    there."""
    data = tmp_path / "data"
    data.mkdir()
    prefix = _read_only_bind()
    monkeypatch.setenv("RO_DIR", str(data))
    probe = None if prefix is None else subprocess.run(
        [*prefix, "touch", str(data / "x")], capture_output=True, text=True, timeout=30)
    if probe is None or "Read-only file system" not in probe.stderr:
        pytest.skip("no unprivileged read-only bind mount here: "
                    + ("no unshare" if probe is None else probe.stderr.strip()))
    out = twistd(tmp_path, "--data", str(data), "--mqtt", LOOPBACK_0, "--amqp", "none",
                 "--web", "none", prefix=prefix)
    assert_stopped_with(out, f"cannot write to the data directory {data}: "
                             "Read-only file system")


# ----------------------------------------------------------------------------------
# mqttamqp-admin


def test_admin_users_without_a_data_directory_says_where_it_looked(tmp_path: Path) -> None:
    """mqttamqp-admin users without a data directory says where it looked; an empty one
    lists no users."""
    out = subprocess.run([ADMIN, "users"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.startswith(
        f"mqttamqp-admin: no data directory at {tmp_path / 'mqttamqp-data'} "), out.stderr
    (tmp_path / "empty").mkdir()
    out = subprocess.run([ADMIN, "users", "--data", "empty"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0
    assert out.stderr.startswith(
        f"no users in {tmp_path / 'empty' / 'users.json'} "), out.stderr


def test_a_damaged_storage_outside_the_data_directory_is_recovered_by_its_path(
        tmp_path: Path) -> None:
    """With --storage file://PATH elsewhere, the refusal names 'recover --file PATH'
    (it named the data directory, whose mqttamqp.fs is not the damaged file), and
    that command repairs PATH."""
    from pahoclient import PahoClient

    data, storage = tmp_path / "data", tmp_path / "elsewhere" / "state.fs"
    storage.parent.mkdir()
    uri = f"file://{storage}"
    broker = BrokerProcess(str(data), "--no-archive", "--storage", uri).start()
    try:
        client = PahoClient(broker.mqtt_port, "recover-file-writer")
        client.publish("kept/a", b"before", qos=1, retain=True)
        client.publish("kept/b", b"later", qos=1, retain=True)
        client.stop()
    finally:
        broker.kill()
    _damage_the_last_transaction(storage)
    out = twistd(tmp_path, "--data", str(data), "--storage", uri, "--mqtt", LOOPBACK_0,
                 "--amqp", "none", "--web", "none", "--no-archive")
    assert_stopped_with(out, f"the storage {storage} is damaged (")
    assert f"Run 'mqttamqp-admin recover --file {storage}'" in out.stdout + out.stderr
    fixed = subprocess.run([ADMIN, "recover", "--file", str(storage)], capture_output=True,
                           text=True, timeout=60)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert list(storage.parent.glob("state.fs.damaged-*"))
    BrokerProcess(str(data), "--no-archive", "--storage", uri).start().stop()
