"""Console authentication pieces: the users file, scrypt hashing, the first admin,
the ``mqttamqp-admin`` command, session bounds and expiry, the login throttle."""

from __future__ import annotations

import io
import json
import os
import re
import stat
from typing import Any

import pytest
from console_support import BASE, CHEAP, PASSWORD, Client, FakeService, make_console
from treq.testing import StubTreq
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web.resource import Resource

from mqttamqp.console import credentials as admin_cli
from mqttamqp.console.auth import INITIAL_PASSWORD_FILE, SessionStore, ensure_first_admin
from mqttamqp.console.throttle import LoginThrottle
from mqttamqp.security.userstore import USERS_FILE, UserStore, hash_password, verify_password


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
    name, password, path = created
    assert name == "admin"
    assert path == os.path.join(str(tmp_path), INITIAL_PASSWORD_FILE)
    assert _mode(path) == 0o600 and _mode(store.path) == 0o600
    assert open(path).read() == f"user: admin\npassword: {password}\n"
    assert len(password) >= 20
    assert store.check_password("admin", password) is not None
    assert ensure_first_admin(store, **CHEAP) is None


def test_first_admin_file_is_0600_whatever_the_umask(tmp_path: Any) -> None:
    """The password file is exactly 0600 even under a umask that would narrow it."""
    old = os.umask(0o277)
    try:
        created = ensure_first_admin(UserStore(str(tmp_path)), **CHEAP)
    finally:
        os.umask(old)
    assert created is not None
    assert _mode(created[2]) == 0o600


def _console_start_lines(tmp_path: Any, starts: int) -> list[str]:
    """The log lines of ``starts`` console service starts and stops on ``tmp_path``."""
    from twisted.application.service import MultiService

    from mqttamqp.console.site import make_site

    class Service(MultiService, FakeService):
        def __init__(self) -> None:
            MultiService.__init__(self)
            FakeService.__init__(self, str(tmp_path), Clock())

    lines: list[str] = []
    observer = lambda e: lines.append(formatEvent(e))  # noqa: E731
    globalLogPublisher.addObserver(observer)
    try:
        for _ in range(starts):
            svc = Service()
            site = make_site(svc)
            assert site.console.broker is svc.broker   # wired to this service's broker
            svc.startService()
            svc.stopService()
    finally:
        globalLogPublisher.removeObserver(observer)
    return lines


def test_console_service_logs_where_the_first_password_is_never_the_password(
        tmp_path: Any) -> None:
    """Starting the console logs once where the generated password is (and how to
    change it), never the password itself; a restart logs nothing of it."""
    lines = _console_start_lines(tmp_path, 2)
    path = tmp_path / INITIAL_PASSWORD_FILE
    password = open(path).read().split("password: ")[1].strip()
    assert not [line for line in lines if password in line]
    hits = [line for line in lines if "created the first admin user" in line]
    assert len(hits) == 1
    assert str(path) in hits[0] and "'admin'" in hits[0]
    assert "mqttamqp-admin user passwd" in hits[0]


def test_first_admin_log_names_the_user_it_created(tmp_path: Any) -> None:
    """'admin' taken by a client user: the log names the admin actually created."""
    UserStore(str(tmp_path)).set_password("admin", "a device password", role="client",
                                          **CHEAP)
    [hit] = [line for line in _console_start_lines(tmp_path, 1)
             if "created the first admin user" in line]
    name = open(tmp_path / INITIAL_PASSWORD_FILE).readline().split("user: ")[1].strip()
    assert name.startswith("admin-")
    assert f"'{name}'" in hit and hit.endswith(f" {name}")


def test_admin_cli_passwd_users_tokens(tmp_path: Any, monkeypatch: Any, capsys: Any) -> None:
    """mqttamqp-admin: passwd (stdin), users, token, tokens, revoke, deluser."""
    data = str(tmp_path)
    store = UserStore(data)
    _, password, initial = ensure_first_admin(store, **CHEAP)  # type: ignore[misc]
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
    """Back-off starts after three failures of a (user, address) pair, doubles, caps, and a
    success clears the pair; the same user from another address is not held back."""
    clock = Clock()
    throttle = LoginThrottle(clock.seconds, free=3, max_delay=8)
    for _ in range(3):
        assert throttle.retry_after("a", "1.2.3.4") == 0
        throttle.begin("a", "1.2.3.4")
        throttle.finish("a", "1.2.3.4", False)
    assert throttle.retry_after("a", "1.2.3.4") == 1
    assert throttle.retry_after("a", "5.6.7.8") == 0          # not per user name
    assert throttle.retry_after("b", "1.2.3.4") == 0          # the address has 3 of 10
    for _ in range(6):
        throttle.finish("a", "1.2.3.4", False)
    assert throttle.retry_after("a", "1.2.3.4") == 8
    assert throttle.retry_after("b", "1.2.3.4") == 0          # 9 of 10
    throttle.finish("b", "1.2.3.4", False)
    assert throttle.retry_after("b", "1.2.3.4") == 1          # the address itself now
    throttle.begin("c", "9.9.9.9")
    assert throttle.retry_after("d", "9.9.9.9") == 1          # one check at a time per address
    throttle.finish("a", "1.2.3.4", True)
    assert throttle.failures("1.2.3.4", "a") == 0
    assert throttle.failures("1.2.3.4") == 10                 # a success clears the pair only


def test_templates_and_static_are_found() -> None:
    """The console finds its templates and static files in the source tree or package."""
    from mqttamqp.console.rendering import static_dir, templates_dir
    assert (templates_dir() / "base.html").is_file()
    assert (static_dir() / "console.css").is_file()
    assert (static_dir() / "console.js").is_file()


# -- the login throttle over HTTP: per address and per (user, address), never per user ----


class _FromAddress(Resource):
    """Makes every request come from ``host`` (StubTreq always says 127.0.0.1)."""

    isLeaf = True

    def __init__(self, inner: Any, host: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.inner = inner
        self.host = host

    def render(self, request: Any) -> Any:
        request.client = IPv4Address("TCP", self.host, 40000)
        return self.inner.render(request)


def _client_at(console: Any, host: str) -> Client:
    """A browser at ``host``: its own cookies, its own source address."""
    client = Client(console)
    client.treq = StubTreq(_FromAddress(console.resource(), host))
    return client


@pytest.fixture
def console_clock(tmp_path: Any) -> Any:
    console, _, clock = make_console(tmp_path)
    return console, clock


@pytest.fixture
def console_log() -> Any:
    events: list[dict[str, Any]] = []

    def observer(event: dict[str, Any]) -> None:
        if str(event.get("log_format", "")).startswith("console:"):
            events.append(event)
    globalLogPublisher.addObserver(observer)
    yield events
    globalLogPublisher.removeObserver(observer)


def test_wrong_passwords_elsewhere_never_block_the_right_one(console_clock: Any) -> None:
    """Issue 10, item 6: wrong passwords for admin from A do not keep admin out from B,
    not even one guess a minute from A."""
    console, clock = console_clock
    a, b = _client_at(console, "10.0.0.1"), _client_at(console, "10.0.0.2")
    for _ in range(3):
        assert a.login(password="wrong").code == 401
    refused = a.login(password="wrong")
    assert refused.code == 429 and refused.header("retry-after") == "1"  # A is slowed down
    assert b.login().code == 303                                          # B at once
    for _ in range(5):                                  # one guess a minute from A
        clock.advance(61)
        assert a.login(password="wrong").code == 401
        assert _client_at(console, "10.0.0.3").login().code == 303


def test_an_address_that_keeps_failing_is_slowed_down_with_a_capped_delay(
        console_clock: Any) -> None:
    """A failing (user, address) pair and a failing address (any user names) get 429 with
    Retry-After; the delay grows and stops at the cap; other addresses are not affected."""
    console, clock = console_clock
    a = _client_at(console, "10.0.0.1")
    waits: list[int] = []
    for _ in range(15):
        reply = a.login(password="wrong")
        if reply.code == 429:
            waits.append(int(reply.header("retry-after") or 0))
            clock.advance(waits[-1])
            assert a.login(password="wrong").code == 401
        else:
            assert reply.code == 401
    assert waits == sorted(waits) and waits[0] == 1 and max(waits) == 60
    assert waits.count(60) >= 2                          # capped, not growing further
    right_too_soon = a.login()
    assert right_too_soon.code == 429 and right_too_soon.header("retry-after") == "60"
    assert _client_at(console, "10.0.0.2").login().code == 303

    sprayer = _client_at(console, "10.0.0.9")         # a new user name every time
    codes = [sprayer.login(user=f"user{i}", password="wrong").code for i in range(12)]
    assert codes[0] == 401 and codes[-1] == 429
    reply = sprayer.login()                          # admin's right password, from there
    assert reply.code == 429 and int(reply.header("retry-after") or 0) >= 1
    assert _client_at(console, "10.0.0.10").login().code == 303


def test_a_success_resets_the_pair(console_clock: Any) -> None:
    """After the right password, the (user, address) pair starts counting from zero."""
    console, clock = console_clock
    a = _client_at(console, "10.0.0.1")
    for _ in range(3):
        assert a.login(password="wrong").code == 401
    assert a.login().code == 429
    clock.advance(1)
    assert a.login().code == 303
    assert console.login.throttle.failures("10.0.0.1", "admin") == 0
    a = _client_at(console, "10.0.0.1")              # logged out: a fresh browser
    for _ in range(3):                               # three free failures again
        assert a.login(password="wrong").code == 401
    reply = a.login(password="wrong")
    assert reply.code == 429 and reply.header("retry-after") == "1"


def test_each_failure_is_logged_once_with_address_and_user(
        console_clock: Any, console_log: list[dict[str, Any]]) -> None:
    """One line per failure with the address and user name (never the password); a run of
    refused attempts in one back-off window is logged once; no tracebacks."""
    console, _ = console_clock
    a = _client_at(console, "10.0.0.1")
    for _ in range(3):
        a.login(password="hunter2-wrong")
    for _ in range(20):
        assert a.login(password="hunter2-wrong").code == 429
    lines = [formatEvent(e) for e in console_log]
    failed = [line for line in lines if "failed login" in line]
    assert len(failed) == 3
    assert all("10.0.0.1" in line and "'admin'" in line for line in failed)
    refused = [line for line in lines if "refused" in line]
    assert len(refused) == 1 and "10.0.0.1" in refused[0]
    assert not any("hunter2" in line for line in lines)
    assert not any(e.get("log_failure") for e in console_log)


def test_throttle_tables_stay_bounded() -> None:
    """A flood of distinct addresses (and user names) cannot grow the tables past the
    bound; the oldest entries go first, and quiet entries expire."""
    clock = Clock()
    throttle = LoginThrottle(clock.seconds, max_entries=100, forget_after=600)
    for i in range(5000):
        address = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
        for user in ("admin", f"u{i}"):
            assert throttle.retry_after(user, address) == 0
            throttle.begin(user, address)
            throttle.finish(user, address, False)
        clock.advance(0.01)
    addresses, pairs = throttle.sizes()
    assert addresses <= 100 and pairs <= 100
    assert throttle.failures("10.0.0.0") == 0                 # the oldest went first
    assert throttle.failures("10.0.19.135", "admin") == 1     # the newest is kept
    assert throttle.retry_after("admin", "192.0.2.1") == 0    # a clean address is free
    clock.advance(601)
    throttle.finish("admin", "192.0.2.1", False)
    assert throttle.sizes() == (1, 1)                          # quiet entries expired


# -- guessing one user's password from many addresses: paced per user name --------------


class _Browser:
    """A browser at one address whose login POSTs may stay pending (a paced check
    waits on the console's clock): ``start`` sends one, ``code`` reads its answer
    once there is one."""

    def __init__(self, console: Any, host: str) -> None:
        self.client = _client_at(console, host)
        page = self.client.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]*)"', page.text)
        assert token is not None
        self.token = token.group(1)
        self.pending: list[Any] | None = None   # the answer, once it came

    def start(self, password: str, user: str = "admin") -> None:
        box: list[Any] = []
        self.pending = box
        self.client.treq.request(
            "POST", BASE + "/login", allow_redirects=False,
            data={"csrf_token": self.token, "username": user, "password": password,
                  "next": "/"}).addBoth(box.append)

    def code(self) -> int | None:
        """The answer's status once it came (the browser is then free), else None."""
        self.client.treq.flush()
        if not self.pending:
            return None
        got, self.pending = self.pending[0], None
        assert not isinstance(got, Failure), got
        return int(got.code)


def test_guessing_one_user_from_100_addresses_is_paced_not_locked_out(
        console_clock: Any, console_log: list[dict[str, Any]]) -> None:
    """100 addresses guessing admin's password as fast as each is let (one check at a
    time each, their own back-offs) get a few dozen checks in 30 s, not hundreds: past
    10 failures from 3 addresses, checks for admin from addresses it has not logged
    in from take turns. One log line says so. Meanwhile admin still gets in at once
    from where it logged in before, and from a new address after a bounded wait."""
    console, clock = console_clock
    home = _client_at(console, "192.0.2.1")
    assert home.login().code == 303                  # admin's usual address
    attackers = [_Browser(console, f"10.1.{i // 256}.{i % 256}") for i in range(100)]
    checked = refused = 0
    for _ in range(60):                              # 30 s in steps of 0.5 s (bounded)
        for browser in attackers:
            if browser.pending is None:
                browser.start("wrong")
        for browser in attackers:
            code = browser.code()
            checked += code == 401
            refused += code == 429
        clock.advance(0.5)
    assert checked <= 60, checked                    # (without the pace: over 500)
    assert refused > 0
    assert console.login.throttle.paced > 0
    # From home: at once, whatever the pace.
    assert _client_at(console, "192.0.2.1").login().code == 303
    # From a new address, with the attack going on: its turn comes within 30 s.
    laptop = _Browser(console, "198.51.100.7")
    laptop.start(PASSWORD)
    waited = 0.0
    code = laptop.code()
    while code is None and waited <= console.login.throttle.user_max_wait:
        for browser in attackers:                    # the attack goes on meanwhile
            if browser.pending is None:
                browser.start("wrong")
            browser.code()
        clock.advance(0.5)
        waited += 0.5
        code = laptop.code()
    assert code == 303 and 0 < waited <= console.login.throttle.user_max_wait
    lines = [formatEvent(e) for e in console_log]
    paced = [line for line in lines if "failed logins for 'admin' from" in line]
    assert len(paced) == 1 and "wait their turn" in paced[0], paced
    assert len([line for line in lines if "refused: its password checks" in line]) <= 1


def test_the_user_pace_is_bounded_and_forgotten() -> None:
    """The per-user tables have the throttle's bounds, and a quiet user name is
    forgotten: the pace ends on its own."""
    clock = Clock()
    throttle = LoginThrottle(clock.seconds, max_entries=50, forget_after=600)
    for i in range(12):                               # admin, from 12 addresses
        throttle.finish("admin", f"10.0.0.{i}", False)
    assert throttle.user_pace_now("admin") == 1.0
    assert throttle.user_hold("admin", "10.9.9.9") == 0.0    # the first turn is now
    assert throttle.user_hold("admin", "10.9.9.8") == 1.0    # the next, a pace later
    for i in range(500):                              # a spray of user names
        throttle.finish(f"u{i}", "10.0.1.1", False)
        throttle.finish(f"u{i}", f"10.0.2.{i % 250}", True)
    assert throttle.user_sizes() == (50, 50)
    clock.advance(601)
    throttle.finish("someone", "10.0.3.1", False)     # (prunes what is quiet)
    assert throttle.user_pace_now("admin") == 0.0
    assert throttle.user_hold("admin", "10.9.9.7") == 0.0
