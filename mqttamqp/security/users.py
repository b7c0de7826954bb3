"""A users file as the broker's authenticator (``--users FILE``).

One user per line, ``username:scrypt$<n>$<r>$<p>$<salt hex>$<hash hex>``; blank
lines and lines starting with ``#`` are ignored.  With a users file, anonymous
clients are refused (MQTT CONNACK 5, AMQP: ANONYMOUS is not offered) and MQTT
CONNECT and AMQP SASL PLAIN both check the password here.

What it owns: the line format, hashing (``hashlib.scrypt``) and verification —
off the reactor thread, because scrypt is deliberately slow — and reloading the
file when it changes on disk.  ``python -m mqttamqp.security.users add FILE USER``
adds or replaces a user (the password is prompted for, or read from standard
input when that is not a terminal).

What it must not do: log or keep passwords, or block the reactor.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import os
import secrets
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from mqttamqp.core.auth import Credentials

__all__ = ["UserFile", "UserRecord", "hash_password", "logged_verdict", "main", "make_line",
           "parse_line"]

SCHEME = "scrypt"
DEFAULT_N = 1 << 14
DEFAULT_R = 8
DEFAULT_P = 1
HASH_BYTES = 32
_MAX_N = 1 << 20


@dataclass(frozen=True, slots=True)
class UserRecord:
    username: str
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def verify(self, password: bytes) -> bool:
        """Constant-time check of ``password`` (slow on purpose: call it off the reactor)."""
        candidate = _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(candidate, self.digest)


# At most this many scrypt computations run at once, whichever thread asks: each
# holds 128 * n * r bytes (32 MiB for the user store's n=2**15, r=8) and the
# reactor's pool has 10 threads, so a burst of logins from many addresses took
# 300 MB more RSS (bench/abuse.py login_guessing).  A check beyond the slots waits
# for one in its pool thread; the answer comes a few tens of milliseconds later.
HASH_SLOTS = 2
_hash_slots = threading.BoundedSemaphore(HASH_SLOTS)


def scrypt(password: bytes, *, salt: bytes, n: int, r: int, p: int, dklen: int,
           maxmem: int) -> bytes:
    """``hashlib.scrypt`` within the process-wide bound of ``HASH_SLOTS`` at once."""
    with _hash_slots:
        return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=dklen,
                              maxmem=maxmem)


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, size: int) -> bytes:
    return scrypt(password, salt=salt, n=n, r=r, p=p, dklen=size,
                  maxmem=256 * n * r + (1 << 20))


def hash_password(password: bytes, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P,
                  salt: bytes | None = None) -> str:
    """The part of a line after ``username:``."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = _scrypt(password, salt, n, r, p, HASH_BYTES)
    return f"{SCHEME}${n}${r}${p}${salt.hex()}${digest.hex()}"


def make_line(username: str, password: str | bytes) -> str:
    """A users-file line for ``username`` (no newline)."""
    if not username or ":" in username or "\n" in username or username.startswith("#"):
        raise ValueError("a username must be non-empty, without ':' or newlines, "
                         "and not start with '#'")
    raw = password.encode("utf-8") if isinstance(password, str) else password
    return f"{username}:{hash_password(raw)}"


def parse_line(line: str) -> UserRecord:
    """One line → ``UserRecord``; ``ValueError`` with the reason if malformed."""
    username, sep, rest = line.partition(":")
    if not sep or not username:
        raise ValueError("expected username:scrypt$n$r$p$salt$hash")
    parts = rest.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        raise ValueError("expected scrypt$n$r$p$salt$hash after the username")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, digest = bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
    except ValueError:
        raise ValueError("n, r, p must be integers and salt, hash hexadecimal") from None
    if n < 2 or n & (n - 1) or n > _MAX_N or not 1 <= r <= 64 or not 1 <= p <= 16:
        raise ValueError("scrypt parameters out of range")
    if not salt or not digest:
        raise ValueError("empty salt or hash")
    return UserRecord(username, n, r, p, salt, digest)


def read_lines(path: str) -> Iterator[tuple[int, UserRecord | ValueError]]:
    """The users of the file at ``path`` by line number: a record, or why the line is
    not one (blank and ``#`` lines skipped).  ``OSError`` if it cannot be read."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                yield number, parse_line(line)
            except ValueError as exc:
                yield number, exc


def defer_to_thread(reactor: Any) -> Callable[..., Deferred[Any]]:
    """Run a blocking call (a password hash) in ``reactor``'s thread pool (the
    global one when None); returns the call's Deferred."""
    if reactor is None:
        from twisted.internet.threads import deferToThread

        return deferToThread
    from twisted.internet.threads import deferToThreadPool

    def run(fn: Callable[..., Any], *args: Any) -> Deferred[Any]:
        result: Deferred[Any] = deferToThreadPool(reactor, reactor.getThreadPool(), fn, *args)
        return result
    return run


class UserFile:
    """The ``Authenticator`` backed by a users file (reloaded when it changes)."""

    log = Logger()
    allows_anonymous = False

    def __init__(self, path: str, reactor: Any = None) -> None:
        self.path = os.path.abspath(path)
        self._defer = defer_to_thread(reactor)
        self.users: dict[str, UserRecord] = {}
        self._stamp: tuple[float, int] | None = None
        # A well-formed record for unknown users, so that their check costs the
        # same time as a real one.
        self._decoy = parse_line("x:" + hash_password(secrets.token_bytes(16)))
        self.reload(strict=True)

    def reload(self, strict: bool = False) -> None:
        """Read the file if it changed since the last read."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if strict:
                raise ValueError(f"cannot read users file {self.path}: {exc.strerror}") from None
            self.log.warn("cannot read users file {p}: {e}; keeping the users loaded before",
                          p=self.path, e=exc.strerror)
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return
        users: dict[str, UserRecord] = {}
        for number, record in read_lines(self.path):
            if isinstance(record, ValueError):
                self.log.warn("users file {p} line {n} ignored: {e}", p=self.path,
                              n=number, e=str(record))
                continue
            users[record.username] = record
        self.users = users
        self._stamp = stamp
        self.log.info("loaded {n} user(s) from {p}", n=len(users), p=self.path)

    def authenticate(self, credentials: Credentials) -> bool | Deferred[bool]:
        if credentials.username is None or credentials.password is None:
            return succeed(False)
        self.reload()
        record = self.users.get(credentials.username)
        if record is None:
            d = self._defer(self._decoy.verify, credentials.password)
            d.addCallback(lambda _: False)
        else:
            d = self._defer(record.verify, credentials.password)
        d.addCallback(logged_verdict, self.log, credentials)
        result: Deferred[bool] = d
        return result


def logged_verdict(ok: bool, log: Logger, credentials: Credentials) -> bool:
    """A password check's verdict, a refusal logged (both authenticators' callback)."""
    if not ok:
        log.warn("bad user name or password for {u!r} ({proto} from {peer})",
                 u=credentials.username, proto=credentials.protocol, peer=credentials.peer)
    return bool(ok)


# -- command line -------------------------------------------------------------------------

def _read_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("password: ")
        if getpass.getpass("again: ") != first:
            raise SystemExit("passwords differ; nothing changed")
        return first
    line = sys.stdin.readline()
    return line.rstrip("\r\n")


def add_user(path: str, username: str, password: str) -> None:
    """Add or replace ``username`` in the users file at ``path`` (atomically)."""
    line = make_line(username, password)
    lines: list[str] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            lines = [ln.rstrip("\n") for ln in f
                     if ln.partition(":")[0].strip() != username]
    lines.append(line)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".users-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] != "add":
        sys.stderr.write("usage: python -m mqttamqp.security.users add FILE USER\n"
                         "  (the password is prompted for, or read from standard input)\n")
        return 2
    _, path, username = args
    password = _read_password()
    if not password:
        sys.stderr.write("empty password; nothing changed\n")
        return 1
    try:
        add_user(path, username, password)
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    sys.stdout.write(f"user {username} written to {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
