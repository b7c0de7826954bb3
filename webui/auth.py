"""Console authentication: the admin users file, password hashing, login sessions,
API tokens and the throttle that slows down password guessing.

Users live in ``<data>/admin-users.json`` (mode 0600), not in ZODB: the
``mqttamqp-admin`` command must be able to change a password while the broker runs
and holds the storage lock.  Writes are atomic (temporary file + rename) under an
advisory lock; readers reload the file when its mtime or size changes, so a new
password takes effect (and logs out the user's open sessions) without a restart.

Passwords are hashed with scrypt (memory-hard); the check is CPU-bound and runs
off the reactor thread (the caller passes a ``run_in_thread`` function).  API
tokens are long random strings, stored as SHA-256 digests; a digest is enough for
a secret with 256 bits of entropy.

Login sessions are in memory (a broker restart logs everyone out) and bounded.
This module does no HTTP; ``webui.app`` maps it onto cookies and headers.
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
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "USERS_FILE", "INITIAL_PASSWORD_FILE", "hash_password", "verify_password",
    "UserStore", "User", "ApiToken", "LoginSession", "SessionStore", "LoginThrottle",
    "ensure_first_admin", "valid_username",
]

USERS_FILE = "admin-users.json"
INITIAL_PASSWORD_FILE = "admin-password.txt"
TOKEN_PREFIX = "mqa_"

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
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p,
                            maxmem=_SCRYPT_MAXMEM, dklen=32)
    return "$".join(["scrypt", str(n), str(r), str(p),
                     base64.b64encode(salt).decode(), base64.b64encode(digest).decode()])


def verify_password(password: str, encoded: str) -> bool:
    """Constant-time check of ``password`` against ``hash_password``'s output."""
    try:
        scheme, n, r, p, salt, digest = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(password.encode("utf-8"), salt=base64.b64decode(salt),
                                n=int(n), r=int(r), p=int(p), maxmem=_SCRYPT_MAXMEM,
                                dklen=len(expected))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


# A hash to check against when the user does not exist, so that an unknown user
# costs as much time as a wrong password.
_DUMMY_HASH: str | None = None


def _dummy_hash() -> str:
    global _DUMMY_HASH
    if _DUMMY_HASH is None:
        _DUMMY_HASH = hash_password(secrets.token_urlsafe(16))
    return _DUMMY_HASH


def token_digest(token: str) -> str:
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
    changed: float          # when the password was set; sessions older than it end
    tokens: tuple[ApiToken, ...] = ()


def _user_from_json(name: str, raw: dict[str, Any]) -> User:
    tokens = tuple(ApiToken(str(t["id"]), str(t["digest"]), str(t.get("label", "")),
                            float(t.get("created", 0.0)), bool(t.get("read_only", False)))
                   for t in raw.get("tokens", []))
    return User(name, str(raw["password"]), float(raw.get("changed", 0.0)), tokens)


def _user_to_json(user: User) -> dict[str, Any]:
    return {
        "password": user.password,
        "changed": user.changed,
        "tokens": [{"id": t.id, "digest": t.digest, "label": t.label, "created": t.created,
                    "read_only": t.read_only} for t in user.tokens],
    }


class UserStore:
    """The users file.  Reads are cached by (mtime, size); writes are atomic."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, USERS_FILE)
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, User] = {}

    # -- reading ----------------------------------------------------------------

    def users(self) -> dict[str, User]:
        """Current users (cheap: one ``stat`` when nothing changed)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._users = None, {}
            return self._users
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._users = self._read()
            self._stamp = stamp
        return self._users

    def _read(self) -> dict[str, User]:
        with open(self.path, encoding="utf-8") as f:
            raw = json.load(f)
        return {name: _user_from_json(name, entry)
                for name, entry in raw.get("users", {}).items()}

    def get(self, name: str) -> User | None:
        return self.users().get(name)

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

    def check_password(self, name: str, password: str) -> User | None:
        """Blocking (scrypt): call it from a thread.  Re-reads the file first."""
        user = self._fresh().get(name)
        if user is None:
            verify_password(password, _dummy_hash())
            return None
        return user if verify_password(password, user.password) else None

    def _fresh(self) -> dict[str, User]:
        try:
            return self._read()
        except FileNotFoundError:
            return {}

    # -- writing ----------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, User]]:
        """Read-modify-write under an advisory lock; the yielded dict is written back."""
        os.makedirs(self.data_dir, exist_ok=True)
        lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            users = dict(self._fresh())
            yield users
            self._write(users)
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)

    def _write(self, users: dict[str, User]) -> None:
        data = {"version": 1, "users": {n: _user_to_json(u) for n, u in sorted(users.items())}}
        _write_private(self.path, json.dumps(data, indent=2) + "\n")
        self._stamp = None

    def set_password(self, name: str, password: str, **cost: int) -> User:
        """Create ``name`` or change its password (ends its console sessions)."""
        if not valid_username(name):
            raise ValueError(f"invalid user name {name!r}: use letters, digits and ._-@")
        hashed = hash_password(password, **cost)
        with self._locked() as users:
            old = users.get(name)
            user = User(name, hashed, time.time(), old.tokens if old else ())
            users[name] = user
        return user

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
            users[name] = User(user.name, user.password, user.changed, (*user.tokens, entry))
        return token

    def revoke_token(self, name: str, token_id: str) -> bool:
        with self._locked() as users:
            user = users.get(name)
            if user is None:
                return False
            kept = tuple(t for t in user.tokens if t.id != token_id)
            users[name] = User(user.name, user.password, user.changed, kept)
            return len(kept) != len(user.tokens)


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by the owner only."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def ensure_first_admin(store: UserStore, name: str = "admin",
                       **cost: int) -> tuple[str, str] | None:
    """With no user at all, create ``name`` with a random password.

    Returns (password, path of the 0600 file holding it), or None if users exist.
    """
    if store.users():
        return None
    password = secrets.token_urlsafe(15)
    store.set_password(name, password, **cost)
    path = os.path.join(store.data_dir, INITIAL_PASSWORD_FILE)
    _write_private(path, f"user: {name}\npassword: {password}\n")
    return password, path


# -- login sessions -------------------------------------------------------------


@dataclass
class LoginSession:
    """A browser's session: anonymous (only a CSRF token for the login form) or logged in."""

    id: str
    csrf: str
    created: float
    last_active: float
    user: str | None = None
    password_changed: float = 0.0   # the user's ``changed`` at login
    flash: list[tuple[str, str]] = field(default_factory=list)  # (kind, text) to show once
    drafts: dict[str, dict[str, str]] = field(default_factory=dict)  # form -> what was typed


class SessionStore:
    """Bounded in-memory sessions with idle and absolute expiry.

    Anonymous (pre-login) sessions are kept apart with their own bound, so a flood
    of login-page visits can never push out a logged-in operator.
    """

    def __init__(self, clock: Callable[[], float], idle_timeout: float = 30 * 60,
                 max_age: float = 12 * 3600, anonymous_timeout: float = 15 * 60,
                 max_sessions: int = 1000, max_anonymous: int = 1000) -> None:
        self.clock = clock
        self.idle_timeout = idle_timeout
        self.max_age = max_age
        self.anonymous_timeout = anonymous_timeout
        self.max_sessions = max_sessions
        self.max_anonymous = max_anonymous
        self._users: OrderedDict[str, LoginSession] = OrderedDict()
        self._anonymous: OrderedDict[str, LoginSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._users) + len(self._anonymous)

    def _new(self, table: OrderedDict[str, LoginSession], bound: int, user: str | None,
             password_changed: float) -> LoginSession:
        now = self.clock()
        self.prune()
        while len(table) >= bound:
            table.popitem(last=False)
        session = LoginSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now, now,
                               user, password_changed)
        table[session.id] = session
        return session

    def anonymous(self) -> LoginSession:
        return self._new(self._anonymous, self.max_anonymous, None, 0.0)

    def login(self, old_id: str | None, user: str, password_changed: float) -> LoginSession:
        """A fresh session id for ``user``; the pre-login id is discarded (no fixation)."""
        if old_id is not None:
            self.end(old_id)
        return self._new(self._users, self.max_sessions, user, password_changed)

    def get(self, session_id: str | None, touch: bool = True) -> LoginSession | None:
        """The live session with this id, or None (an expired one is removed).

        ``touch`` counts the request as activity (background refreshes do not)."""
        if not session_id:
            return None
        table = self._users if session_id in self._users else self._anonymous
        session = table.get(session_id)
        if session is None:
            return None
        now = self.clock()
        if self._expired(session, now):
            del table[session_id]
            return None
        if touch:
            session.last_active = now
            table.move_to_end(session_id)
        return session

    def _expired(self, session: LoginSession, now: float) -> bool:
        if session.user is None:
            return now - session.created > self.anonymous_timeout
        return (now - session.last_active > self.idle_timeout
                or now - session.created > self.max_age)

    def end(self, session_id: str) -> None:
        self._users.pop(session_id, None)
        self._anonymous.pop(session_id, None)

    def end_user(self, user: str) -> None:
        for sid in [sid for sid, s in self._users.items() if s.user == user]:
            del self._users[sid]

    def prune(self) -> None:
        now = self.clock()
        for table in (self._users, self._anonymous):
            for sid in [sid for sid, s in table.items() if self._expired(s, now)]:
                del table[sid]


@dataclass
class _Failures:
    """Consecutive failures of one address or one (user, address) pair."""

    count: int
    last: float                   # when the last one happened
    refusal_logged: bool = False  # a refusal in the current back-off was logged


class LoginThrottle:
    """Slows password guessing per client address and per (user name, address) pair.

    Never per user name alone: wrong passwords from one address must not keep the
    right password out from another, so an address that has not been failing is
    never throttled, whatever other addresses do.

    A pair gets ``free`` failures, an address ``address_free`` (over any user names;
    an address can be shared, e.g. behind NAT); after that the next attempt must wait
    ``2**(failures-free)`` seconds (capped at ``max_delay``) after the last failure,
    and attempts in that window are refused without checking the password.  One
    check at a time per address.  A success clears its pair, not the address (else
    one known account would reset the count between guesses at other names).

    Both tables are bounded: entries quiet for ``forget_after`` seconds expire, and
    past ``max_entries`` the entry with the oldest failure goes first.
    """

    USER_KEY_MAX = 65   # longer names are never valid; they share one key per address

    def __init__(self, clock: Callable[[], float], free: int = 3, address_free: int = 10,
                 max_delay: float = 60.0, max_entries: int = 10000,
                 forget_after: float = 15 * 60.0) -> None:
        self.clock = clock
        self.free = free
        self.address_free = address_free
        self.max_delay = max_delay
        self.max_entries = max_entries
        self.forget_after = max(forget_after, max_delay)
        self._addresses: OrderedDict[str, _Failures] = OrderedDict()
        self._pairs: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        self._checking: set[str] = set()   # addresses with a password check under way

    def _pair(self, user: str, address: str) -> tuple[str, str]:
        return user[:self.USER_KEY_MAX], address

    def _delay(self, count: int, free: int) -> float:
        if count < free:
            return 0.0
        return float(min(2.0 ** min(count - free, 64), self.max_delay))

    def _live(self, table: OrderedDict[Any, _Failures], key: Any, now: float
              ) -> _Failures | None:
        entry = table.get(key)
        if entry is not None and now - entry.last > self.forget_after:
            del table[key]
            return None
        return entry

    def _limits(self, user: str, address: str, now: float) -> list[tuple[_Failures, float]]:
        """The entries that hold this attempt back, with the wait each one imposes."""
        found = []
        for table, key, free in ((self._pairs, self._pair(user, address), self.free),
                                 (self._addresses, address, self.address_free)):
            entry = self._live(table, key, now)
            if entry is not None:
                wait = entry.last + self._delay(entry.count, free) - now
                if wait > 0:
                    found.append((entry, wait))
        return found

    def retry_after(self, user: str, address: str) -> float:
        """Seconds until a login as ``user`` from ``address`` may be checked (0: now)."""
        now = self.clock()
        wait = 1.0 if address in self._checking else 0.0
        return max([wait] + [w for _, w in self._limits(user, address, now)])

    def note_refusal(self, user: str, address: str) -> bool:
        """Record a refused attempt; True for the first one in its back-off window
        (log that one; the rest of the window adds nothing)."""
        first = False
        for entry, _ in self._limits(user, address, self.clock()):
            if not entry.refusal_logged:
                entry.refusal_logged = first = True
        return first

    def begin(self, user: str, address: str) -> None:
        self._checking.add(address)

    def finish(self, user: str, address: str, ok: bool) -> None:
        self._checking.discard(address)
        now = self.clock()
        pair = self._pair(user, address)
        if ok:
            self._pairs.pop(pair, None)
        else:
            self._count(self._pairs, pair, now)
            self._count(self._addresses, address, now)
        for table in (self._pairs, self._addresses):
            while table and now - next(iter(table.values())).last > self.forget_after:
                table.popitem(last=False)

    def _count(self, table: OrderedDict[Any, _Failures], key: Any, now: float) -> None:
        entry = self._live(table, key, now)
        table.pop(key, None)
        table[key] = _Failures((entry.count if entry else 0) + 1, now)
        while len(table) > self.max_entries:
            table.popitem(last=False)

    def failures(self, address: str, user: str | None = None) -> int:
        """Current failures of ``address``, or of the pair when ``user`` is given."""
        now = self.clock()
        entry = (self._live(self._addresses, address, now) if user is None
                 else self._live(self._pairs, self._pair(user, address), now))
        return entry.count if entry else 0

    def sizes(self) -> tuple[int, int]:
        """(addresses, pairs) held."""
        return len(self._addresses), len(self._pairs)
