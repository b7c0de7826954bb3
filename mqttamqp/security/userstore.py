"""The one user store: MQTT user names, AMQP SASL PLAIN and the console.

Users live in ``<data>/users.json`` (mode 0600), not in ZODB, so that
``mqttamqp-admin user add|del|passwd|list`` can change it while the broker runs
and holds the storage lock.  Writes are atomic (temporary file + rename) under an
advisory lock; readers re-read the file when its mtime or size changes, so every
change applies without a restart.

A user has a role:

- ``admin``: the console with every action, and the protocols;
- ``read-only``: the console without actions (POSTs get 403), and the protocols;
- ``client``: MQTT and AMQP only, no console.

Migration: the console's ``admin-users.json`` of earlier versions is moved into
``users.json`` on first use, its users becoming admins.  The line format of
``--users FILE`` (``core.users``) stays readable as a second, read-only source of
``client`` users; ``mqttamqp-admin user import FILE`` copies it into the store.

Passwords are hashed with scrypt (memory-hard) and checked off the reactor thread
(``security.storeauth.StoreAuthenticator``, the broker's authenticator over this
store, uses a thread pool).  What this module must not do: log
or keep a password, or block the reactor.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from twisted.logger import Logger

from mqttamqp.security.enhanced_auth import ScramCredentials, scram_credentials
from mqttamqp.security.users import scrypt

__all__ = [
    "USERS_FILE", "LEGACY_ADMIN_FILE", "ROLE_ADMIN", "ROLE_READ_ONLY", "ROLE_CLIENT",
    "ROLES", "CONSOLE_ROLES", "TOKEN_PREFIX", "hash_password", "verify_password",
    "token_digest", "valid_username", "ApiToken", "User", "UserStore",
]

USERS_FILE = "users.json"
LEGACY_ADMIN_FILE = "admin-users.json"
TOKEN_PREFIX = "mqa_"

ROLE_ADMIN = "admin"
ROLE_READ_ONLY = "read-only"
ROLE_CLIENT = "client"
ROLES = (ROLE_ADMIN, ROLE_READ_ONLY, ROLE_CLIENT)
CONSOLE_ROLES = frozenset({ROLE_ADMIN, ROLE_READ_ONLY})

# scrypt cost: n=2**15, r=8 needs 32 MiB and ~0.1 s per check here.
SCRYPT_N = 2 ** 15
SCRYPT_R = 8
SCRYPT_P = 1
_SCRYPT_MAXMEM = 256 * 1024 * 1024


def valid_username(name: str) -> bool:
    return 0 < len(name) <= 64 and all(c.isalnum() or c in "._-@" for c in name)


def hash_password(password: str, n: int = SCRYPT_N, r: int = SCRYPT_R,
                  p: int = SCRYPT_P) -> str:
    """``scrypt$n$r$p$salt$hash`` (base64); the cost travels with the hash."""
    salt = secrets.token_bytes(16)
    digest = scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p,
                    maxmem=_SCRYPT_MAXMEM, dklen=32)
    return "$".join(["scrypt", str(n), str(r), str(p),
                     base64.b64encode(salt).decode(), base64.b64encode(digest).decode()])


def verify_password(password: str | bytes, encoded: str) -> bool:
    """Constant-time check of ``password`` against ``hash_password``'s output
    (slow on purpose: call it off the reactor)."""
    raw = password.encode("utf-8") if isinstance(password, str) else password
    try:
        scheme, n, r, p, salt, digest = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = scrypt(raw, salt=base64.b64decode(salt), n=int(n), r=int(r),
                        p=int(p), maxmem=_SCRYPT_MAXMEM, dklen=len(expected))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


_DUMMY_HASH: str | None = None


def dummy_hash() -> str:
    """A hash to check against when the user does not exist, so that an unknown user
    costs as much time as a wrong password."""
    global _DUMMY_HASH
    if _DUMMY_HASH is None:
        _DUMMY_HASH = hash_password(secrets.token_urlsafe(16))
    return _DUMMY_HASH


def token_digest(token: str) -> str:
    """API tokens are long random strings: a SHA-256 digest is enough to store."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ApiToken:
    id: str
    digest: str
    label: str
    created: float
    read_only: bool


@dataclass(frozen=True)
class User:
    name: str
    password: str           # scrypt hash
    changed: float          # when the password was set; console sessions older than it end
    tokens: tuple[ApiToken, ...] = ()
    role: str = ROLE_CLIENT
    # MQTT 5 SCRAM-SHA-256 (enhanced authentication): derived from the password when
    # it is set (never the password itself); None for users set before this existed.
    scram: ScramCredentials | None = None

    @property
    def console(self) -> bool:
        """May this user log into the console?"""
        return self.role in CONSOLE_ROLES


def _user_from_json(name: str, raw: dict[str, Any], default_role: str) -> User:
    tokens = tuple(ApiToken(str(t["id"]), str(t["digest"]), str(t.get("label", "")),
                            float(t.get("created", 0.0)), bool(t.get("read_only", False)))
                   for t in raw.get("tokens", []))
    role = str(raw.get("role", default_role))
    if role not in ROLES:
        role = ROLE_CLIENT   # an unknown role gets the least
    scram = None
    raw_scram = raw.get("scram")
    if isinstance(raw_scram, dict):
        try:
            scram = ScramCredentials(base64.b64decode(raw_scram["salt"]),
                                     int(raw_scram["iterations"]),
                                     base64.b64decode(raw_scram["stored_key"]),
                                     base64.b64decode(raw_scram["server_key"]))
        except (KeyError, ValueError, TypeError):
            scram = None     # (then this user cannot use SCRAM until a new password)
    return User(name, str(raw["password"]), float(raw.get("changed", 0.0)), tokens, role,
                scram)


def _user_to_json(user: User) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": user.role,
        "password": user.password,
        "changed": user.changed,
        "tokens": [{"id": t.id, "digest": t.digest, "label": t.label, "created": t.created,
                    "read_only": t.read_only} for t in user.tokens],
    }
    if user.scram is not None:
        s = user.scram
        out["scram"] = {"salt": base64.b64encode(s.salt).decode(), "iterations": s.iterations,
                        "stored_key": base64.b64encode(s.stored_key).decode(),
                        "server_key": base64.b64encode(s.server_key).decode()}
    return out


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by the owner only."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # Exactly 0600 whatever the umask; never wider meanwhile (created so).
            os.fchmod(f.fileno(), 0o600)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class UserStore:
    """``users.json``.  Reads are cached by (mtime, size); writes are atomic."""

    log = Logger(namespace="mqttamqp.users")

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, USERS_FILE)
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, User] = {}
        self._clients = False          # any user with the client role (of _users)
        self.writes = 0                # changes made through this object (``_write``)
        self.migrated = self._migrate()

    # -- migration ----------------------------------------------------------------

    def _migrate(self) -> int:
        """Move the console's ``admin-users.json`` (earlier versions) into the store;
        returns the number of users moved."""
        legacy = os.path.join(self.data_dir, LEGACY_ADMIN_FILE)
        if not os.path.exists(legacy):
            return 0
        with self._locked() as users:
            try:
                with open(legacy, encoding="utf-8") as f:
                    raw = json.load(f)
            except FileNotFoundError:
                return 0   # another process migrated it meanwhile
            moved = 0
            for name, entry in raw.get("users", {}).items():
                if name not in users:
                    users[name] = _user_from_json(name, entry, ROLE_ADMIN)
                    moved += 1
            # Written before the old file is renamed (a crash in between migrates
            # again), both under the lock: a process that waited finds no legacy file.
            self._write(users)
            os.replace(legacy, legacy + ".migrated")
        self.log.info("moved {n} console user(s) from {old} into {new} (as admins); the old "
                      "file is kept as {old}.migrated", n=moved, old=legacy, new=self.path)
        return moved

    # -- reading ------------------------------------------------------------------

    def users(self) -> dict[str, User]:
        """Current users (cheap: one ``stat`` when nothing changed)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._users, self._clients = None, {}, False
            return self._users
        except OSError:
            return self._users   # (the data directory's own problems are reported at start)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._users = self._read()
                self._clients = any(u.role == ROLE_CLIENT for u in self._users.values())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                # A hand-edited file that does not parse: keep what was loaded.
                self.log.warn("cannot read {p}: {e}; keeping the users loaded before",
                              p=self.path, e=str(exc))
            self._stamp = stamp
        return self._users

    def _read(self) -> dict[str, User]:
        with open(self.path, encoding="utf-8") as f:
            raw = json.load(f)
        return {name: _user_from_json(name, entry, ROLE_CLIENT)
                for name, entry in raw.get("users", {}).items()}

    def get(self, name: str) -> User | None:
        return self.users().get(name)

    def has_clients(self) -> bool:
        """Are there users meant for MQTT/AMQP (role ``client``)?  Then anonymous
        clients are refused unless ``--allow-anonymous``.  (Asked per connection:
        worked out once per read of the file.)"""
        self.users()
        return self._clients

    def users_and_clients(self) -> tuple[dict[str, User], bool]:
        """``users()`` and ``has_clients()`` with one ``stat``."""
        users = self.users()
        return users, self._clients

    def scram(self, name: str) -> ScramCredentials | None:
        """``name``'s SCRAM-SHA-256 credentials (the MQTT 5 AUTH exchange's lookup;
        cheap: the cached users)."""
        user = self.users().get(name)
        return user.scram if user is not None else None

    def admins(self) -> list[User]:
        return [u for u in self.users().values() if u.role == ROLE_ADMIN]

    def find_token(self, token: str) -> tuple[User, ApiToken] | None:
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest = token_digest(token)
        for user in self.users().values():
            for t in user.tokens:
                if hmac.compare_digest(t.digest, digest):
                    return user, t
        return None

    def token_exists(self, name: str, token_id: str) -> bool:
        user = self.users().get(name)
        return user is not None and any(t.id == token_id for t in user.tokens)

    def check_password(self, name: str, password: str | bytes) -> User | None:
        """Blocking (scrypt): call it from a thread.  Re-reads the file first; if it
        does not parse, the users loaded before answer."""
        try:
            users = self._fresh()
        except ValueError:
            users = self._users
        user = users.get(name)
        if user is None:
            verify_password(password, dummy_hash())
            return None
        return user if verify_password(password, user.password) else None

    def _fresh(self) -> dict[str, User]:
        """The file as it is now ({} if missing).  A file that does not parse (edited
        by hand) raises ``ValueError`` with the reason."""
        try:
            return self._read()
        except FileNotFoundError:
            return {}
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{self.path} does not parse: {exc!r}") from None

    # -- writing ------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, User]]:
        """Read-modify-write under an advisory lock; the yielded dict is written back."""
        os.makedirs(self.data_dir, exist_ok=True)
        lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            users = dict(self._fresh())
            before = dict(users)
            yield users
            if users != before:
                self._write(users)
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)

    def _write(self, users: dict[str, User]) -> None:
        data = {"version": 2, "users": {n: _user_to_json(u) for n, u in sorted(users.items())}}
        write_private(self.path, json.dumps(data, indent=2) + "\n")
        self._stamp = None
        self.writes += 1

    def set_password(self, name: str, password: str, role: str | None = None,
                     **cost: int) -> User:
        """Create ``name`` (role ``role``, default ``client``) or change its password
        (and its role when given); a new password ends its console sessions."""
        if not valid_username(name):
            raise ValueError(f"invalid user name {name!r}: use letters, digits and ._-@")
        if role is not None and role not in ROLES:
            raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
        hashed = hash_password(password, **cost)
        scram = scram_credentials(password)
        with self._locked() as users:
            old = users.get(name)
            user = User(name, hashed, time.time(), old.tokens if old else (),
                        role or (old.role if old else ROLE_CLIENT), scram)
            users[name] = user
        return user

    def set_role(self, name: str, role: str) -> User:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
        with self._locked() as users:
            old = users.get(name)
            if old is None:
                raise KeyError(name)
            users[name] = user = replace(old, role=role)
        return user

    def put_hashed(self, name: str, hashed: str, role: str = ROLE_CLIENT) -> bool:
        """Add ``name`` with an already hashed password (``import``); False if it
        exists (an import never overwrites)."""
        with self._locked() as users:
            if name in users:
                return False
            users[name] = User(name, hashed, time.time(), (), role)
        return True

    def delete_user(self, name: str) -> bool:
        with self._locked() as users:
            return users.pop(name, None) is not None

    def create_token(self, name: str, label: str = "", read_only: bool = False) -> str:
        """A new API token for ``name``; the token itself is returned once, never stored."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._locked() as users:
            user = users.get(name)
            if user is None:
                raise KeyError(name)
            entry = ApiToken(secrets.token_hex(4), token_digest(token), label, time.time(),
                             read_only)
            users[name] = replace(user, tokens=(*user.tokens, entry))
        return token

    def revoke_token(self, name: str, token_id: str) -> bool:
        with self._locked() as users:
            user = users.get(name)
            if user is None:
                return False
            kept = tuple(t for t in user.tokens if t.id != token_id)
            users[name] = replace(user, tokens=kept)
            return len(kept) != len(user.tokens)


def scrypt_line_hash(record: Any) -> str:
    """A ``core.users`` line record's hash in this store's encoding (for ``import``)."""
    return "$".join(["scrypt", str(record.n), str(record.r), str(record.p),
                     base64.b64encode(record.salt).decode(),
                     base64.b64encode(record.digest).decode()])
