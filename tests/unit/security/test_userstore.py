"""The one user store (issue 10): roles, migration of the console's
admin-users.json, the authenticator's anonymous rule, the admin command, and the
console's roles (in process: the Klein app through treq's stub)."""

from __future__ import annotations

import io
import json
import os
import re
from typing import Any

import console_support
import pytest
from console_support import CHEAP, make_console
from twisted.internet.defer import Deferred, succeed

from mqttamqp.console import credentials as admin_cli
from mqttamqp.core.auth import Credentials
from mqttamqp.security.storeauth import StoreAuthenticator
from mqttamqp.security.users import UserFile, make_line
from mqttamqp.security.userstore import (
    LEGACY_ADMIN_FILE,
    ROLE_ADMIN,
    ROLE_CLIENT,
    ROLE_READ_ONLY,
    UserStore,
)


def now(fn: Any, *args: Any) -> Deferred[Any]:
    """Runs the password check at once (the broker runs it in its thread pool)."""
    return succeed(fn(*args))


def _result(value: Any) -> Any:
    """The result of an authenticator's answer: a bool, or a fired Deferred."""
    if not isinstance(value, Deferred):
        return value
    box: list[Any] = []
    value.addBoth(box.append)
    assert box, "the check did not complete"
    return box[0]


def creds(user: str | None, password: str | None = None,
          peer: str = "127.0.0.1:4000") -> Credentials:
    return Credentials("c1", user, password.encode() if password else None, "mqtt", peer)


def test_the_console_users_of_earlier_versions_move_into_the_store(tmp_path: Any) -> None:
    """The console's admin-users.json of earlier versions moves once into the user store as
    admins (file mode 0600)."""
    legacy = tmp_path / LEGACY_ADMIN_FILE
    legacy.write_text(json.dumps({"version": 1, "users": {"ops": {
        "password": "scrypt$2$1$1$AAAA$AAAA", "changed": 5.0, "tokens": []}}}))
    store = UserStore(str(tmp_path))
    assert store.migrated == 1
    assert not legacy.exists() and (tmp_path / (LEGACY_ADMIN_FILE + ".migrated")).exists()
    ops = store.get("ops")
    assert ops is not None and ops.role == ROLE_ADMIN and ops.changed == 5.0
    assert oct(os.stat(store.path).st_mode & 0o777) == "0o600"
    assert UserStore(str(tmp_path)).migrated == 0     # once


def test_roles_and_the_anonymous_rule(tmp_path: Any) -> None:
    """Local anonymous clients are let in until a client user exists; a known name is a
    credential, an unknown one only a label until then."""
    store = UserStore(str(tmp_path))
    auth = StoreAuthenticator(store, run_in_thread=now)
    store.set_password("root", "admin password", role=ROLE_ADMIN, **CHEAP)
    # Console users alone do not close the broker to anonymous local clients...
    assert auth.authenticate(creds(None)) is True
    assert auth.authenticate(creds(None, peer="10.0.0.1:1")) is False
    # ...and a name the store does not know is a label while there are no client users,
    assert auth.authenticate(creds("someone")) is True
    # but a name it knows is a credential.
    assert _result(auth.authenticate(creds("root", "admin password"))) is True
    assert _result(auth.authenticate(creds("root", "wrong"))) is False
    store.set_password("dev", "device password", **CHEAP)       # role client by default
    assert store.get("dev").role == ROLE_CLIENT                 # type: ignore[union-attr]
    assert auth.authenticate(creds(None)) is False              # client users exist now
    assert _result(auth.authenticate(creds("someone", "x"))) is False
    assert _result(auth.authenticate(creds("dev", "device password"))) is True
    assert StoreAuthenticator(store, anywhere=True).authenticate(
        creds(None, peer="10.0.0.1:1")) is True                 # --allow-anonymous


def test_a_users_file_stays_readable_beside_the_store(tmp_path: Any) -> None:
    """A --users file keeps authenticating beside the store and closes the broker to
    anonymous clients."""
    path = tmp_path / "users"
    path.write_text(make_line("old", "old password") + "\n")
    legacy = UserFile(str(path))
    legacy._defer = now           # (its own thread pool: run the check at once here)
    auth = StoreAuthenticator(UserStore(str(tmp_path / "data")), legacy=legacy,
                              run_in_thread=now)
    assert auth.allows_anonymous is False
    assert _result(auth.authenticate(creds("old", "old password"))) is True
    assert _result(auth.authenticate(creds("old", "nope"))) is False


def _admin(*args: str) -> int:
    return admin_cli.main(list(args))


def test_admin_user_commands(tmp_path: Any, monkeypatch: Any, capsys: Any) -> None:
    """mqttamqp-admin user add, role, passwd, list and import manage the store and refuse
    what cannot be done."""
    data = str(tmp_path)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("a long password\n"))
    assert _admin("user", "add", "-d", data, "--password-stdin", "dev1") == 0
    assert "created user 'dev1' (role client)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="exists"):
        _admin("user", "add", "-d", data, "--password-stdin", "dev1")
    assert _admin("user", "role", "-d", data, "dev1", "read-only") == 0
    assert UserStore(data).get("dev1").role == ROLE_READ_ONLY   # type: ignore[union-attr]
    with pytest.raises(SystemExit, match="no user 'ghost'"):
        _admin("user", "passwd", "-d", data, "--password-stdin", "ghost")
    capsys.readouterr()
    assert _admin("user", "list", "-d", data) == 0
    assert capsys.readouterr().out.startswith("dev1\tread-only\tpassword set ")
    legacy = tmp_path / "users.txt"
    legacy.write_text(make_line("old", "pw") + "\nbad line\n" + make_line("dev1", "x") + "\n")
    assert _admin("user", "import", "-d", data, str(legacy)) == 0
    out = capsys.readouterr()
    assert "imported 1 user(s) (role client)" in out.out
    assert "users.txt:2: skipped" in out.err
    assert "users.txt:3: skipped: user 'dev1' exists" in out.err
    store = UserStore(data)
    old = store.get("old")
    assert old is not None and old.role == ROLE_CLIENT
    assert store.check_password("old", "pw") is not None      # the hash moved as it was
    assert _admin("user", "del", "-d", data, "old") == 0
    assert UserStore(data).get("old") is None


def test_admin_help_shows_one_command_set(tmp_path: Any, monkeypatch: Any,
                                          capsys: Any) -> None:
    """--help lists the 'user' commands only; the earlier passwd/users/deluser are
    hidden aliases that still work (issue 24, item 9)."""
    with pytest.raises(SystemExit) as done:
        _admin("--help")
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert "{user,token,tokens,revoke,gen-cert,recover}" in shown
    listed = re.findall(r"^    (\S+)\s", shown, re.M)     # the commands with a help line
    assert sorted(listed) == sorted(["user", "token", "tokens", "revoke", "gen-cert",
                                     "recover"]), shown
    for hidden in ("passwd", "users", "deluser"):
        assert not re.search(rf"^\s+{hidden}\b", shown, re.M), shown
    data = str(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("a long password\n"))
    assert _admin("passwd", "-d", data, "--password-stdin", "boss") == 0
    assert UserStore(data).get("boss").role == ROLE_ADMIN      # type: ignore[union-attr]
    assert _admin("users", "-d", data) == 0
    assert "boss\tadmin\t" in capsys.readouterr().out
    assert _admin("deluser", "-d", data, "boss") == 0
    assert UserStore(data).get("boss") is None


def test_console_roles(tmp_path: Any) -> None:
    """Client users may not log in to the console, read-only users may look but not act,
    and a role taken away ends the session."""
    console, _, _ = make_console(tmp_path)
    console.users.set_password("viewer", "viewer password", role=ROLE_READ_ONLY, **CHEAP)
    console.users.set_password("device", "device password", **CHEAP)
    device = console_support.Client(console)
    assert device.login("device", "device password").code == 403    # a client user
    viewer = console_support.Client(console)
    assert viewer.login("viewer", "viewer password").code == 303
    assert viewer.get("/clients").code == 200
    refused = viewer.post("/publish", topic="t", payload="x", qos="0")
    assert refused.code == 403 and b"read-only role" in refused.body
    assert viewer.post("/logout").code == 303                        # may still log out
    admin = console_support.Client(console)
    assert admin.login().code == 303
    assert admin.post("/publish", topic="t", payload="x", qos="0").code == 303
    # a role taken away ends the console session at once
    console.users.set_password("viewer2", "viewer password", role=ROLE_READ_ONLY, **CHEAP)
    v2 = console_support.Client(console)
    assert v2.login("viewer2", "viewer password").code == 303
    console.users.set_role("viewer2", ROLE_CLIENT)
    assert v2.get("/clients").code == 303                            # back to the login


def test_console_users_page_for_admins(tmp_path: Any, log_lines: list[str]) -> None:
    """Admins add users, set passwords and roles on the Users page, within its rules
    (audited)."""
    console, _, _ = make_console(tmp_path)
    admin = console_support.Client(console)
    assert admin.login().code == 303
    page = admin.get("/users")
    assert page.code == 200 and b"admin" in page.body and b"No <code>--acl</code>" in page.body
    assert admin.post("/users/add", name="dev-1", role="client",
                      password="device password").code == 303
    user = console.users.get("dev-1")
    assert user is not None and user.role == ROLE_CLIENT
    assert console.users.check_password("dev-1", "device password") is not None
    assert admin.post("/users/passwd", name="dev-1", password="another one").code == 303
    assert console.users.check_password("dev-1", "another one") is not None
    assert admin.post("/users/role", name="dev-1", role="read-only").code == 303
    assert console.users.get("dev-1").role == ROLE_READ_ONLY     # type: ignore[union-attr]
    # the rules: short passwords, oneself, the last admin, unknown roles
    short = admin.post_json("/api/users/add", {"name": "x1", "password": "short"},
                            {"X-CSRF-Token": admin.csrf})
    assert short.code == 400 and b"at least 8" in short.body
    selfish = admin.post_json("/api/users/role", {"name": "admin", "role": "client"},
                              {"X-CSRF-Token": admin.csrf})
    assert selfish.code == 400 and b"yourself" in selfish.body
    console.users.set_password("boss", "boss password", role=ROLE_ADMIN, **CHEAP)
    boss = console_support.Client(console)
    assert boss.login("boss", "boss password").code == 303
    assert boss.post_json("/api/users/delete", {"name": "admin"},
                          {"X-CSRF-Token": boss.csrf}).code == 200
    last = boss.post_json("/api/users/role", {"name": "boss", "role": "client"},
                          {"X-CSRF-Token": boss.csrf})
    assert last.code == 400
    bad_role = boss.post_json("/api/users/role", {"name": "dev-1", "role": "root"},
                              {"X-CSRF-Token": boss.csrf})
    assert bad_role.code == 400
    listing = boss.get("/api/users")
    names = [u["name"] for u in json.loads(listing.body)["items"]]
    assert names == ["boss", "dev-1"] and b"scrypt" not in listing.body
    assert boss.post("/users/delete", name="dev-1").code == 303
    assert console.users.get("dev-1") is None
    audits = [line for line in log_lines if "audit:" in line]
    assert any("action=user_add" in a and "'dev-1'" in a for a in audits)
    assert any("action=user_delete" in a for a in audits)
    assert not any("device password" in line or "another one" in line for line in log_lines)
    # a read-only user sees neither the page nor the API
    console.users.set_password("viewer", "viewer password", role=ROLE_READ_ONLY, **CHEAP)
    viewer = console_support.Client(console)
    assert viewer.login("viewer", "viewer password").code == 303
    assert viewer.get("/users").code == 403 and viewer.get("/api/users").code == 403


def test_console_shows_the_acl_file_escaped(tmp_path: Any) -> None:
    """The Users page shows the ACL file's rules, escaped."""
    from mqttamqp.security.acl import AclAuthorizer

    acl = tmp_path / "acl"
    acl.write_text("# <script>alert(1)</script>\nuser alice\ntopic read a/#\n")
    console, _, _ = make_console(tmp_path)
    console.broker.authorizer = AclAuthorizer(str(acl))
    admin = console_support.Client(console)
    assert admin.login().code == 303
    page = admin.get("/users")
    assert b"1 rule from" in page.body
    assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in page.body
    assert b"<script>alert(1)" not in page.body


def test_a_hand_edited_store_fails_safe(tmp_path: Any) -> None:
    """Review findings: an entry without a role is a client (not an admin), and a file
    that does not parse keeps the users loaded before for password checks."""
    store = UserStore(str(tmp_path))
    store.set_password("ops", "ops password", role=ROLE_ADMIN, **CHEAP)
    assert store.check_password("ops", "ops password") is not None
    raw = json.loads(open(store.path).read())
    raw["users"]["intruder"] = {"password": raw["users"]["ops"]["password"], "changed": 1}
    with open(store.path, "w") as f:
        json.dump(raw, f)
    assert store.get("intruder").role == ROLE_CLIENT            # type: ignore[union-attr]
    with open(store.path, "w") as f:
        f.write('{"users": {"ops": {"changed": 1}}}')            # no password: broken
    assert store.check_password("ops", "ops password") is not None   # the loaded users


def test_sessions_made_over_amqp_belong_to_their_user(tmp_path: Any) -> None:
    """Review finding: a session provisioned by the subscription service is owned by
    the connection's user, so another verified user cannot take it over."""
    from amqp_memory import Net

    from mqttamqp.core.auth import Identity

    store = UserStore(str(tmp_path))
    store.set_password("alice", "alice password", **CHEAP)       # a client user
    net = Net(authenticator=StoreAuthenticator(store, run_in_thread=now))
    alice = Identity("fe", "alice", "amqp")
    net.broker.gateway.subscribe_client("dev1", alice, [("a/#", 1)])
    assert net.broker.sessions["dev1"].owner == "alice"
    assert not net.broker.gate.may_claim(Identity("dev1", "bob", "mqtt3.1.1"), "dev1")
    assert net.broker.gate.may_claim(Identity("dev1", "alice", "mqtt3.1.1"), "dev1")


def test_a_password_also_sets_scram_credentials(tmp_path: Any) -> None:
    """MQTT 5 SCRAM-SHA-256 needs its own derived keys: set with every password,
    stored (never the password), read back from the file."""
    from mqttamqp.security.enhanced_auth import scram_credentials

    store = UserStore(str(tmp_path))
    store.set_password("dev", "device password", **CHEAP)
    creds = UserStore(str(tmp_path)).scram("dev")
    assert creds is not None
    assert creds == scram_credentials("device password", creds.salt, creds.iterations)
    assert "device password" not in open(store.path).read()
    assert store.scram("nobody") is None


def test_the_authenticator_looks_at_the_file_once_per_reactor_turn(tmp_path: Any) -> None:
    """A connect storm read users.json for every CONNECT; the authenticator now looks
    once per reactor turn (the CONNECTs of a turn had all arrived before its first
    look).  Changes made through the store in this process apply at once."""
    from twisted.internet.task import Clock

    clock = Clock()
    store = UserStore(str(tmp_path))
    auth = StoreAuthenticator(store, reactor=clock, run_in_thread=now)
    assert auth.authenticate(creds(None)) is True
    # Another process (mqttamqp-admin) adds a client user during this turn...
    UserStore(str(tmp_path)).set_password("dev", "device password", **CHEAP)
    assert auth.authenticate(creds(None)) is True       # ...seen from the next turn on
    clock.advance(0)
    assert auth.authenticate(creds(None)) is False
    # A change through this store (the console) applies within the turn.
    assert store.delete_user("dev")
    assert auth.authenticate(creds(None)) is True
    clock.advance(0)
    assert not clock.getDelayedCalls()                  # (one reset per turn, no more)


def test_password_hashing_runs_at_most_two_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight password checks at once (a burst of logins from many addresses): only
    HASH_SLOTS (2) compute scrypt at a time, so the memory they hold (32 MiB each) is
    bounded; the others wait for a slot and all eight are answered."""
    import hashlib
    import threading

    from mqttamqp.security import users as users_module
    from mqttamqp.security.userstore import hash_password, verify_password

    encoded = hash_password("pw", n=2 ** 4, r=1, p=1)
    real = hashlib.scrypt
    cond = threading.Condition()
    state = {"inside": 0, "most": 0}
    release = threading.Event()

    def slow_scrypt(*args: Any, **kw: Any) -> bytes:
        with cond:
            state["inside"] += 1
            state["most"] = max(state["most"], state["inside"])
            cond.notify_all()
        release.wait(10)
        with cond:
            state["inside"] -= 1
        return real(*args, **kw)

    monkeypatch.setattr(users_module.hashlib, "scrypt", slow_scrypt)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(verify_password("pw", encoded)))
               for _ in range(8)]
    for t in threads:
        t.start()
    with cond:
        assert cond.wait_for(lambda: state["inside"] >= 2, timeout=10)
        # (a bounded look for a third: on the unbounded code all eight are in at once)
        assert not cond.wait_for(lambda: state["inside"] > 2, timeout=0.5)
    release.set()
    for t in threads:
        t.join(10)
    assert results == [True] * 8 and state["most"] == users_module.HASH_SLOTS == 2


def test_changing_the_first_password_in_the_console_removes_its_file(tmp_path: Any) -> None:
    """The generated first password in DATA/admin-password.txt goes once that user's
    password is changed on the console's Users page, as with mqttamqp-admin (it stayed
    behind, no longer valid, when changed in the console)."""
    import os

    from mqttamqp.console.auth import INITIAL_PASSWORD_FILE

    console, _, _ = make_console(tmp_path)
    data_dir = console.users.data_dir
    initial = os.path.join(data_dir, INITIAL_PASSWORD_FILE)
    with open(initial, "w", encoding="utf-8") as f:
        f.write("user: admin\npassword: generated\n")
    admin = console_support.Client(console)
    assert admin.login().code == 303
    assert admin.post("/users/add", name="dev-2", role="client",
                      password="device password").code == 303
    assert admin.post("/users/passwd", name="dev-2", password="another one").code == 303
    assert os.path.exists(initial)                      # another user's change: kept
    assert admin.post("/users/passwd", name="admin", password="a new admin one").code == 303
    assert not os.path.exists(initial)
