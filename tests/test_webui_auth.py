"""Console authentication pieces: the users file, scrypt hashing, the first admin,
the ``mqttamqp-admin`` command, session bounds and expiry, the login throttle."""

from __future__ import annotations

import io
import json
import os
import stat
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher
from webui_support import CHEAP, FakeService

from webui import admin_cli
from webui.auth import (
    INITIAL_PASSWORD_FILE,
    USERS_FILE,
    LoginThrottle,
    SessionStore,
    UserStore,
    ensure_first_admin,
    hash_password,
    verify_password,
)


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_scrypt_hashes_verify_and_carry_their_cost() -> None:
    """A hash verifies its password only, records its cost, and rejects garbage."""
    h = hash_password("s3cret pass", **CHEAP)
    assert h.startswith("scrypt$1024$8$1$")
    assert verify_password("s3cret pass", h)
    assert not verify_password("s3cret pasS", h)
    assert not verify_password("x", "md5$abc")
    assert not verify_password("x", "scrypt$bad")
    assert hash_password("same", **CHEAP) != hash_password("same", **CHEAP)  # salted


def test_users_file_is_private_and_reloaded_when_changed(tmp_path: Any) -> None:
    """The users file is 0600, written atomically, and re-read after outside changes."""
    store = UserStore(str(tmp_path))
    store.set_password("admin", "first password", **CHEAP)
    assert _mode(store.path) == 0o600
    assert store.check_password("admin", "first password") is not None
    other = UserStore(str(tmp_path))           # e.g. the CLI in another process
    other.set_password("admin", "second password", **CHEAP)
    assert store.check_password("admin", "first password") is None
    assert store.check_password("admin", "second password") is not None
    assert store.check_password("ghost", "second password") is None
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    with pytest.raises(ValueError):
        store.set_password("bad name!", "whatever pw", **CHEAP)


def test_first_admin_gets_a_random_password_in_a_0600_file(tmp_path: Any) -> None:
    """With no users, 'admin' is created with a random password written to a 0600 file."""
    store = UserStore(str(tmp_path))
    created = ensure_first_admin(store, **CHEAP)
    assert created is not None
    password, path = created
    assert path == os.path.join(str(tmp_path), INITIAL_PASSWORD_FILE)
    assert _mode(path) == 0o600 and _mode(store.path) == 0o600
    assert open(path).read() == f"user: admin\npassword: {password}\n"
    assert len(password) >= 20
    assert store.check_password("admin", password) is not None
    assert ensure_first_admin(store, **CHEAP) is None


def test_console_service_creates_the_first_admin_and_logs_it_once(tmp_path: Any) -> None:
    """Starting the console logs the generated password once; a restart does not."""
    from twisted.application.service import MultiService

    from webui.site import make_site

    class Service(MultiService, FakeService):
        def __init__(self) -> None:
            MultiService.__init__(self)
            FakeService.__init__(self, str(tmp_path), Clock())

    lines: list[str] = []
    observer = lambda e: lines.append(formatEvent(e))  # noqa: E731
    globalLogPublisher.addObserver(observer)
    try:
        for _ in range(2):
            svc = Service()
            site = make_site(svc)
            assert site.console.broker is svc.broker   # wired to this service's broker
            svc.startService()
            svc.stopService()
    finally:
        globalLogPublisher.removeObserver(observer)
    password = open(tmp_path / INITIAL_PASSWORD_FILE).read().split("password: ")[1].strip()
    hits = [line for line in lines if "created the first admin user" in line]
    assert len(hits) == 1 and password in hits[0]
    assert "mqttamqp-admin passwd" in hits[0]


def test_admin_cli_passwd_users_tokens(tmp_path: Any, monkeypatch: Any, capsys: Any) -> None:
    """mqttamqp-admin: passwd (stdin), users, token, tokens, revoke, deluser."""
    data = str(tmp_path)
    store = UserStore(data)
    password, initial = ensure_first_admin(store, **CHEAP)  # type: ignore[misc]
    monkeypatch.setattr("sys.stdin", io.StringIO("a much better password\n"))
    assert admin_cli.main(["passwd", "--data", data, "--password-stdin", "admin"]) == 0
    assert not os.path.exists(initial)          # the stale first password is removed
    assert store.check_password("admin", "a much better password") is not None
    assert store.check_password("admin", password) is None
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    with pytest.raises(SystemExit):
        admin_cli.main(["passwd", "--data", data, "--password-stdin", "admin"])
    monkeypatch.setattr("sys.stdin", io.StringIO("operator password\n"))
    admin_cli.main(["passwd", "-d", data, "--password-stdin", "ops"])
    capsys.readouterr()
    admin_cli.main(["users", "--data", data])
    listing = capsys.readouterr().out
    assert "admin\t" in listing and "ops\t" in listing
    admin_cli.main(["token", "--data", data, "ops", "--label", "grafana", "--read-only"])
    token = capsys.readouterr().out.strip()
    found = store.find_token(token)
    assert found is not None and found[0].name == "ops" and found[1].read_only
    admin_cli.main(["tokens", "--data", data, "ops"])
    token_id = capsys.readouterr().out.split("\t")[0]
    assert admin_cli.main(["revoke", "--data", data, "ops", token_id]) == 0
    assert store.find_token(token) is None
    assert admin_cli.main(["deluser", "--data", data, "ops"]) == 0
    assert store.get("ops") is None
    with pytest.raises(SystemExit):
        admin_cli.main(["token", "--data", data, "ops"])
    raw = json.load(open(os.path.join(data, USERS_FILE)))
    assert "a much better password" not in json.dumps(raw)


def test_session_store_expiry_and_bounds() -> None:
    """Idle and absolute expiry; a flood of login-page sessions never evicts a login."""
    clock = Clock()
    sessions = SessionStore(clock.seconds, idle_timeout=100, max_age=1000,
                            anonymous_timeout=50, max_sessions=10, max_anonymous=5)
    anon = sessions.anonymous()
    user = sessions.login(anon.id, "admin", 0.0)
    assert sessions.get(anon.id) is None and user.id != anon.id
    for _ in range(100):
        sessions.anonymous()
    assert sessions.get(user.id) is user
    assert len(sessions) == 6
    for _ in range(9):
        clock.advance(90)
        assert sessions.get(user.id) is user          # activity keeps it alive...
    clock.advance(90)
    assert sessions.get(user.id, touch=False) is user
    clock.advance(200)
    assert sessions.get(user.id) is None              # ...until the absolute limit / idle
    other = sessions.login(None, "admin", 0.0)
    clock.advance(101)
    assert sessions.get(other.id) is None


def test_login_throttle_doubles_and_resets() -> None:
    """Back-off starts after three failures, doubles, caps, and a success clears it."""
    clock = Clock()
    throttle = LoginThrottle(clock.seconds, free=3, max_delay=8)
    keys = ["user:a", "address:1.2.3.4"]
    for _ in range(3):
        assert throttle.retry_after(keys) == 0
        throttle.begin(keys)
        throttle.finish(keys, False)
    assert throttle.retry_after(keys) == 1
    assert throttle.retry_after(["user:b"]) == 0
    for _ in range(6):
        throttle.finish(keys, False)
    assert throttle.retry_after(keys) == 8
    throttle.begin(["user:c"])
    assert throttle.retry_after(["user:c"]) == 1        # one check at a time per key
    throttle.finish(keys, True)
    assert throttle.retry_after(keys) == 0 and throttle.failures("user:a") == 0


def test_templates_and_static_are_found() -> None:
    """The console finds its templates and static files in the source tree or package."""
    from webui.rendering import static_dir, templates_dir
    assert (templates_dir() / "base.html").is_file()
    assert (static_dir() / "console.css").is_file()
    assert (static_dir() / "console.js").is_file()
