"""The assembled service: scheduled packing of the storage, option errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from brokerproc import TWISTD, BrokerProcess

pytestmark = pytest.mark.timeout(120)


def test_storage_is_packed_on_schedule(tmp_path: Path) -> None:
    """--pack-interval (hours) packs the FileStorage periodically, logged each time."""
    proc = BrokerProcess(str(tmp_path / "data"), "--pack-interval", "0.0005")  # 1.8 s
    proc.start()
    try:
        proc.wait_for_line(r"storage packed", timeout=30)
        proc.wait_for_line(r"storage packed", timeout=30)  # and again: it is a schedule
    finally:
        proc.stop()
    assert (tmp_path / "data" / "mqttamqp.fs").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["--max-inflight", "0"], "--max-inflight must be at least 1"),
    (["--max-queued-messages", "-1"], "--max-queued-messages must not be negative"),
    (["--connect-timeout", "soon"], "--connect-timeout must be a number"),
    (["--amqp-max-links", "0"], "--amqp-max-links must be at least 1"),
    (["--amqp-max-links-total", "0"], "--amqp-max-links-total must be at least 1"),
])
def test_bad_options_say_what_to_do(tmp_path: Path, args: list[str], message: str) -> None:
    """A bad option value stops twistd with a message naming the option."""
    out = subprocess.run([TWISTD, "-n", "--pidfile=", "mqttamqp", "--data",
                          str(tmp_path / "d"), *args], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": ""}, cwd=tmp_path)
    assert out.returncode != 0
    assert message in out.stdout + out.stderr
    assert not (tmp_path / "d").exists()  # nothing was started


def test_help_lists_every_option() -> None:
    """twistd mqttamqp --help documents each listener and limit option."""
    out = subprocess.run([TWISTD, "mqttamqp", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    for option in ("--mqtt", "--amqp", "--web", "--data", "--users", "--max-connections",
                   "--max-packet-size", "--max-inflight", "--max-queued-messages",
                   "--max-queued-bytes", "--connect-timeout", "--session-expiry",
                   "--will-grace", "--sys-interval", "--pack-interval",
                   "--amqp-idle-timeout", "--stall-timeout", "--amqp-max-sessions",
                   "--amqp-max-links", "--amqp-max-links-total", "--allow-anonymous",
                   "--strict-mqtt31",
                   "--allow-control-chars", "--max-topic-levels", "--max-topic-length"):
        assert option in out, option


def test_listeners_default_to_loopback_only() -> None:
    """With no listener options, MQTT, AMQP and the console bind to 127.0.0.1 only
    (as Mosquitto 2 does without a configuration) (issue 10, item 5)."""
    from mqttamqp.options import Options

    options = Options()
    options.parseOptions([])
    assert (options["mqtt"], options["amqp"], options["web"]) == (
        ["tcp:1883:interface=127.0.0.1"], ["tcp:5672:interface=127.0.0.1"],
        ["tcp:8080:interface=127.0.0.1"])


@pytest.mark.parametrize(("host", "access", "expected"), [
    ("127.0.0.1", "loopback", "loopback only (the default)"),
    ("0.0.0.0", "anyone", "anyone who can reach it may connect"),
    ("0.0.0.0", "loopback", "only clients on this machine are accepted"),
    ("0.0.0.0", "users", None),
    ("::", "anyone", "anyone who can reach it may connect"),
])
def test_listener_says_how_open_it_is(host: str, access: str, expected: str | None) -> None:
    """On the default loopback listener the log says how to open the broker; a
    listener beyond loopback without users logs a warning; with users, nothing."""
    from twisted.internet.address import IPv4Address, IPv6Address
    from twisted.logger import formatEvent, globalLogPublisher

    from mqttamqp.options import DEFAULT_LISTENERS
    from mqttamqp.service import ListenerService

    address = (IPv6Address("TCP", host, 1883) if ":" in host
               else IPv4Address("TCP", host, 1883))

    class Port:
        def getHost(self) -> object:
            return address

    lines: list[str] = []

    def observe(event: dict[str, object]) -> None:
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        description = DEFAULT_LISTENERS["mqtt"] if host == "127.0.0.1" else "tcp:1883"
        ListenerService("MQTT", description, None, None, access)._listening(Port())
    finally:
        globalLogPublisher.removeObserver(observe)
    said = [line for line in lines if "loopback" in line or "machine" in line]
    if expected is None:
        assert said == []
    else:
        assert len(said) == 1 and expected in said[0], said
