"""SIGHUP reloads the configuration (issue 14): what can change live is applied and
logged, what needs a restart is named, a broken file changes nothing.  Webhooks
from the configuration reach a real HTTP server, and their drops show in ``$SYS``.

The rules run in-process (a synchronous stand-in for the thread, twisted.logger's
lines); SIGHUP is sent, by its PID, to a real ``twistd`` child that this test started
(``brokerproc``), waiting on its log lines.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
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
    """A reload applies what can change live (webhooks), logs it, and names the options
    that need a restart."""
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
    """A reload of a broken file changes nothing and logs why."""
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
    """A part that fails to reload is logged, keeps its settings, and is tried again at the
    next reload."""
    path = tmp_path / "c.toml"
    reloaders, _applied = make(path, "")
    reloaders.register("users", ("users",), lambda new: fail(OSError("cannot read it")))
    path.write_text("users = 'u'\n")
    assert fired(reloaders.reload()) == ["users"]
    assert "reloading users failed, it keeps its settings: cannot read it" in log_lines
    assert fired(reloaders.reload()) == ["users"]   # still differs: tried again


# -- a real broker ----------------------------------------------------------------------


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
