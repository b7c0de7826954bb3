"""SIGHUP reloads the configuration (issue 14): what can change live is applied and
logged, what needs a restart is named, a broken file changes nothing.  Webhooks
from the configuration reach a real HTTP server, and their drops show in ``$SYS``.

The rules run in-process (a synchronous stand-in for the thread, twisted.logger's
lines); SIGHUP is sent, by its PID, to a real ``twistd`` child that this test started
(``brokerproc``), waiting on its log lines.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from brokerproc import BrokerProcess
from hookserver import HookServer
from pahoclient import PahoClient
from twisted.internet import task
from twisted.internet.defer import Deferred, fail, maybeDeferred

from mqttamqp.ops.reload import Reloaders
from mqttamqp.options import Options

pytestmark = pytest.mark.timeout(90)


def options_from(path: Path, text: str) -> Options:
    path.write_text(text, encoding="utf-8")
    options = Options()
    options.parseOptions(["--config", str(path)])
    return options


def make(path: Path, text: str) -> tuple[Reloaders, list[Any]]:
    running = options_from(path, text)

    def parse() -> Options:
        fresh = Options()
        fresh.parseOptions(running.argv)
        return fresh

    reloaders = Reloaders(task.Clock(), running, parse,
                          in_thread=lambda f: maybeDeferred(f))
    applied: list[Any] = []
    reloaders.register("webhooks", ("webhook",), lambda new: applied.append(new["webhook"]))
    return reloaders, applied


def fired(d: Deferred[Any]) -> Any:
    result: list[Any] = []
    d.addBoth(result.append)
    assert result, "the reload did not finish"
    return result[0]


def test_a_live_option_is_applied_and_the_rest_named_for_a_restart(
        tmp_path: Path, log_lines: list[str]) -> None:
    path = tmp_path / "c.toml"
    reloaders, applied = make(path, "max-inflight = 10\n")
    path.write_text("max-inflight = 20\nsys-interval = 5\n"
                    "[[webhook]]\nurl = 'http://127.0.0.1:9/'\n")
    assert fired(reloaders.reload()) == ["max-inflight", "sys-interval", "webhook"]
    assert [[h.url for h in hooks] for hooks in applied] == [["http://127.0.0.1:9/"]]
    assert "reloaded webhooks: webhook changed" in log_lines
    assert ("configuration changed, applied only at a restart: max-inflight, "
            "sys-interval") in log_lines
    # Not applied, so still named at the next reload; the webhooks are not re-applied.
    assert fired(reloaders.reload()) == ["max-inflight", "sys-interval"]
    assert len(applied) == 1


def test_a_broken_file_changes_nothing(tmp_path: Path, log_lines: list[str]) -> None:
    path = tmp_path / "c.toml"
    reloaders, applied = make(path, "[[webhook]]\nurl = 'http://127.0.0.1:9/'\n")
    path.write_text("[[webhook]]\nurl = 'ftp://x'\n")
    assert fired(reloaders.reload()) == []
    assert applied == []
    assert any(line.startswith("configuration not reloaded, the running one stays: "
                               f"--config {path}, line 2: webhook.url: ")
               for line in log_lines), log_lines


def test_a_failing_reloader_is_logged_and_keeps_its_settings(
        tmp_path: Path, log_lines: list[str]) -> None:
    path = tmp_path / "c.toml"
    reloaders, _applied = make(path, "")
    reloaders.register("users", ("users",), lambda new: fail(OSError("cannot read it")))
    path.write_text("users = 'u'\n")
    assert fired(reloaders.reload()) == ["users"]
    assert "reloading users failed, it keeps its settings: cannot read it" in log_lines
    assert fired(reloaders.reload()) == ["users"]   # still differs: tried again


# -- a real broker ----------------------------------------------------------------------


@pytest.fixture
def endpoint() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.close()


def test_sighup_swaps_the_webhooks_of_a_running_broker(
        tmp_path: Path, endpoint: HookServer) -> None:
    conf = tmp_path / "mqttamqp.toml"
    conf.write_text(f"""
[[webhook]]
url = "{endpoint.url}/first"
events = ["connect"]
max-delay = 0
""")
    with BrokerProcess(str(tmp_path / "data"), "--config", str(conf), "--no-archive") as broker:
        PahoClient(broker.mqtt_port, "before").stop()
        got = endpoint.next_request()
        assert got.path == "/hook/first"
        assert [(e["kind"], e["client"]) for e in got.events()] == [("connect", "before")]

        conf.write_text(f"""
max-inflight = 7
[[webhook]]
url = "{endpoint.url}/second"
events = ["connect", "disconnect"]
max-delay = 0
""")
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGHUP)
        broker.wait_for_line(r"reloaded webhooks: webhook changed")
        broker.wait_for_line(r"applied only at a restart: max-inflight")
        PahoClient(broker.mqtt_port, "after").stop()
        kinds = []
        while len(kinds) < 2:
            got = endpoint.next_request()
            assert got.path == "/hook/second"
            kinds += [(e["kind"], e["client"]) for e in got.events()]
        assert kinds == [("connect", "after"), ("disconnect", "after")]

        conf.write_text("max-inflight = 'seven'\n")
        os.kill(broker.proc.pid, signal.SIGHUP)
        broker.wait_for_line(r"configuration not reloaded, the running one stays: .*"
                             r"line 1: max-inflight: must be an integer")
        assert broker.proc.poll() is None


def test_drops_of_a_hook_that_is_down_show_in_sys(tmp_path: Path) -> None:
    conf = tmp_path / "mqttamqp.toml"
    # Port 9 (discard) on loopback: nothing listens, every attempt is refused.
    conf.write_text("""
[[webhook]]
url = "http://127.0.0.1:9/down"
events = ["connect"]
queue = 1
max-batch = 1
retries = 100
backoff = 60
""")
    with BrokerProcess(str(tmp_path / "data"), "--config", str(conf), "--no-archive",
                       "--sys-interval", "1") as broker:
        for i in range(4):
            PahoClient(broker.mqtt_port, f"c{i}").stop()
        watcher = PahoClient(broker.mqtt_port, "watcher")
        try:
            watcher.subscribe(("$SYS/broker/webhooks/dropped", 0))
            # One batch is backing off, one event is queued: the rest were dropped.
            # $SYS is retained and refreshed every second: read until it counts them.
            for _ in range(30):
                value = int(watcher.get().payload)
                if value >= 3:
                    break
            assert value == 3
        finally:
            watcher.stop()


def test_sighup_reloads_the_acl_file_at_once(tmp_path: Path) -> None:
    """SIGHUP re-reads the --acl file even though no option changed (the file is also
    polled; the signal applies it at once), and a broken file keeps the old rules."""
    from mqttamqp.security.acl import AclAuthorizer

    acl = tmp_path / "acl"
    acl.write_text("topic read a/#\n")
    reloaders, _ = make(tmp_path / "mqttamqp.toml", "")
    authorizer = AclAuthorizer(str(acl))
    reloaders.register_always("ACL file", authorizer.reload)
    acl.write_text("topic read b/#\n")
    os.utime(acl, ns=(1, 5_000_000_000))
    fired(reloaders.reload())
    assert [r.filter for r in authorizer.rules.anonymous] == ["b/#"]
