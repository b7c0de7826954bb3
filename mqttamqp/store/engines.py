"""Storage engines: which ZODB storage holds the broker's state, named by a URI.

``--storage URI`` picks one; without it the state lives in a FileStorage under the
data directory, as it always has.  The schemes:

* ``file://PATH`` — ZODB's FileStorage (an append-only file, fsync'd at every commit,
  packed to reclaim old revisions).  A relative path is under the data directory.
* ``sqlite://`` or ``sqlite:///DIR`` (or zodburi's ``sqlite://?data_dir=DIR``) —
  RelStorage on SQLite, history-free, in ``DIR`` (default ``DATA/sqlite``).  SQLite runs
  in WAL mode with ``synchronous=FULL``, so a commit is on disk when it returns, as
  with FileStorage, and with ``auto_vacuum=FULL``, so a pack shrinks the file.
* ``postgresql://USER:PASSWORD@HOST:PORT/DB`` (``postgres://`` too) — RelStorage on
  PostgreSQL through psycopg2, history-free.  RelStorage's own URI options
  (``?connect_timeout=5``, ``cache_local_mb=…``) pass through.
* ``memory://`` — a ``MappingStorage``: nothing survives a restart.  For tests and
  throw-away brokers only.

History-free RelStorage keeps one revision of each object, so the database does not
grow with the traffic that passes through it; packing there only collects objects no
longer reachable (deleted sessions, consumed queue messages).

This module only builds storages and says where their bytes are; the writer thread,
group commit and packing are ``zodbstore``'s.  It never logs a password: ``display``
is the URI with the password replaced.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit, urlunsplit

__all__ = ["DamagedStorage", "Engine", "EngineError", "FILENAME", "SCHEMES", "ServingLock",
           "ServingLockError", "StorageUnavailable", "open_file_storage", "resolve",
           "serving_lock"]

FILENAME = "mqttamqp.fs"
SCHEMES = ("file", "sqlite", "postgresql", "memory")

# RelStorage defaults that differ from its own: no history (nothing to pack away
# but garbage), and no local cache beyond ZODB's (the broker reads its state once;
# PostgreSQL gets 16 MB, where start-up's bulk reads wait: see _postgresql).
_RELSTORAGE_DEFAULTS = {"keep_history": "false", "cache_local_mb": "0"}


class EngineError(ValueError):
    """A ``--storage`` URI that names no engine, or one this install cannot open."""


@dataclass(frozen=True)
class Engine:
    """What ``resolve`` makes of a URI.

    ``factory()`` opens a fresh storage (the caller owns it).  ``size_path`` is the
    file or directory whose bytes are the storage's size on this box ("" when the
    bytes are elsewhere, as with PostgreSQL).  ``locks_itself``: the storage takes a
    lock file of its own (FileStorage), so a second broker on it is refused there.
    ``dsn``: for PostgreSQL, the libpq connection string (for the serving lock).
    """

    kind: str
    display: str
    factory: Callable[[], Any]
    size_path: str = ""
    durable: bool = True
    locks_itself: bool = False
    dsn: str = field(default="", repr=False)

    def size_bytes(self) -> int:
        """Bytes the storage takes on this box now (0 when unknown or elsewhere)."""
        return path_size(self.size_path) if self.size_path else 0


def path_size(path: str) -> int:
    """Size of a file, or of the files in a directory (not recursive); 0 if gone."""
    try:
        if not os.path.isdir(path):
            return os.stat(path).st_size
        total = 0
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
        return total
    except OSError:
        return 0


def resolve(uri: str | None, data_dir: str) -> Engine:
    """The engine ``uri`` names (None or "" for the default FileStorage in
    ``data_dir``).  Raises ``EngineError`` with a message that says what to do."""
    if not uri:
        return _file(os.path.join(data_dir, FILENAME))
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if parts.query:
            raise EngineError(f"--storage {uri}: file:// takes no options")
        if not path:
            raise EngineError("--storage file:// needs a path, e.g. file:///var/lib/"
                              "mqttamqp/mqttamqp.fs")
        return _file(os.path.join(data_dir, path) if not os.path.isabs(path) else path)
    if scheme == "memory":
        return _memory()
    if scheme == "sqlite":
        return _sqlite(uri, parts, data_dir)
    if scheme in ("postgresql", "postgres"):
        return _postgresql(uri, parts)
    raise EngineError(f"--storage {uri}: unknown engine {parts.scheme or uri!r}; use one "
                      "of file://PATH, sqlite://[/DIR], postgresql://USER@HOST:PORT/DB "
                      "or memory://")


def _file(path: str) -> Engine:
    path = os.path.abspath(path)

    def factory() -> Any:
        return open_file_storage(path)

    return Engine("file", f"file://{path}", factory, size_path=path, locks_itself=True)


class DamagedStorage(Exception):
    """The storage file does not open: ``path``, and ``reason`` (ZODB's words).
    ``recoverable``: a damaged transaction (``datadir.recover`` cuts the file
    before it), rather than a file that is not a FileStorage at all."""

    def __init__(self, path: str, reason: str, recoverable: bool) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.recoverable = recoverable


class _Hold(logging.Filter):
    """Holds back what FileStorage logs while it opens ("Ignoring index", then the
    critical line of a damaged transaction): when the open fails, the exception says
    it (one line, with what to do); when it does not, they are logged after all."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.held.append(record)
        return False


def open_file_storage(path: str) -> Any:
    """``FileStorage(path)`` (``pack_keep_old=False``: a pack leaves no ``.old`` copy of
    the whole file), or ``DamagedStorage`` when its file is damaged."""
    from ZODB.FileStorage import FileStorage
    from ZODB.FileStorage.FileStorage import CorruptedFileStorageError, FileStorageFormatError
    from ZODB.FileStorage.format import CorruptedError

    logger = logging.getLogger("ZODB.FileStorage")
    hold = _Hold()
    logger.addFilter(hold)
    try:
        storage = FileStorage(path, pack_keep_old=False)
    except (CorruptedFileStorageError, CorruptedError) as e:
        raise DamagedStorage(path, str(e).removeprefix(f"{path} "), True) from None
    except FileStorageFormatError:
        raise DamagedStorage(path, "not a ZODB FileStorage", False) from None
    finally:
        logger.removeFilter(hold)
    for record in hold.held:
        logger.handle(record)
    return storage


def _memory() -> Engine:
    def factory() -> Any:
        from ZODB.MappingStorage import MappingStorage

        return MappingStorage("mqttamqp")

    return Engine("memory", "memory://", factory, durable=False)


def _relstorage_options(uri: str, query: dict[str, str]) -> Any:
    """RelStorage ``Options`` from the URI's options (RelStorage's own names, as its
    zodburi resolver reads them), with this broker's defaults."""
    _need_relstorage(uri)
    from relstorage.options import Options
    from relstorage.zodburi_resolver import RelStorageURIResolver

    settings = dict(_RELSTORAGE_DEFAULTS)
    settings.update(query)
    try:
        kw, unknown = RelStorageURIResolver(None).interpret_kwargs(settings)
        if unknown:
            raise EngineError(f"--storage {_masked(uri)}: unknown option(s) "
                              f"{', '.join(sorted(unknown))}")
        return Options(**kw)
    except (TypeError, ValueError) as e:
        if isinstance(e, EngineError):
            raise
        raise EngineError(f"--storage {_masked(uri)}: {e}") from None


def _sqlite(uri: str, parts: SplitResult, data_dir: str) -> Engine:
    query = dict(parse_qsl(parts.query))
    directory = query.pop("data_dir", "") or (parts.netloc + parts.path)
    if not directory:
        directory = os.path.join(data_dir, "sqlite")
    elif not os.path.isabs(directory):
        directory = os.path.join(data_dir, directory)
    directory = os.path.abspath(directory)
    options = _relstorage_options(uri, query)

    def factory() -> Any:
        from relstorage.adapters.sqlite.adapter import Sqlite3Adapter
        from relstorage.storage import RelStorage

        # synchronous=FULL (2): a commit is fsync'd before it returns, so what the
        # broker acknowledged survives a power cut, as with FileStorage.
        # auto_vacuum=FULL (1, taken when the database is created): pages a pack
        # frees go back to the file system, so the file's size is the live state's.
        adapter = Sqlite3Adapter(data_dir=directory,
                                 pragmas={"synchronous": 2, "auto_vacuum": 1},
                                 options=options)
        return RelStorage(adapter=adapter, options=options)

    return Engine("sqlite", f"sqlite://{directory}", factory, size_path=directory)


_PG_DSN_ARGS = ("connect_timeout", "sslmode", "application_name")


def _postgresql(uri: str, parts: SplitResult) -> Engine:
    query = dict(parse_qsl(parts.query))
    dsn_query = {k: query.pop(k) for k in list(query) if k in _PG_DSN_ARGS}
    # A local cache of 16 MB: what start-up (and a --ha takeover) prefetches a chunk
    # at a time waits there (``prefetch``): one query per chunk, not per object.
    query.setdefault("cache_local_mb", "16")
    options = _relstorage_options(uri, query)
    if not parts.path.strip("/"):
        raise EngineError(f"--storage {_masked(uri)}: name the database, e.g. "
                          "postgresql://mqttamqp@127.0.0.1:5432/mqttamqp")
    dsn = _libpq_dsn(parts, dsn_query)
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        raise EngineError(f"--storage {_masked(uri)}: PostgreSQL needs the psycopg2 driver "
                          "(pip install 'mqttamqp[postgresql]')") from None

    def factory() -> Any:
        from relstorage.adapters.postgresql import PostgreSQLAdapter
        from relstorage.storage import RelStorage

        adapter = PostgreSQLAdapter(dsn=dsn, options=options)
        return RelStorage(adapter=adapter, options=options)

    return Engine("postgresql", _masked(uri), factory, dsn=dsn)


def _libpq_dsn(parts: SplitResult, extra: dict[str, str]) -> str:
    """A libpq key=value string (values quoted as libpq wants)."""
    args = {"dbname": parts.path.lstrip("/"), "user": parts.username,
            "password": parts.password, "host": parts.hostname,
            "port": str(parts.port) if parts.port else None}
    args.update(extra)

    def quote(value: str) -> str:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{k}={quote(v)}" for k, v in args.items() if v)


def _masked(uri: str) -> str:
    """The URI with its password (if any) replaced by ``***``."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def _need_relstorage(uri: str) -> None:
    try:
        import relstorage  # noqa: F401
    except ImportError:
        raise EngineError(f"--storage {_masked(uri)}: this engine needs RelStorage "
                          "(pip install relstorage)") from None


class ServingLockError(RuntimeError):
    """Another broker holds the serving lock of this database."""


class StorageUnavailable(RuntimeError):
    """The storage cannot be reached or opened (one line that says which and why)."""


# The advisory lock key that marks "a broker serves this database": the first eight
# bytes of "mqttamqp" as a signed 64-bit integer, the same on every box.
SERVING_LOCK_KEY = int.from_bytes(b"mqttamqp", "big", signed=True)


class ServingLock:
    """A PostgreSQL session advisory lock held on a connection of its own.

    While this connection lives, no other broker can take the lock: a second broker
    started on the same database stops at start-up instead of serving beside the
    first.  Closing the connection (or the process dying) releases it."""

    def __init__(self, dsn: str, display: str) -> None:
        try:
            import psycopg2
        except ImportError:  # resolve() said so already; here for the type checker
            raise StorageUnavailable("PostgreSQL needs the psycopg2 driver") from None
        try:
            # (keepalives: a lock connection cut by the network is noticed by the
            # server within a minute, and the lock freed, rather than after hours)
            self._conn: Any = psycopg2.connect(
                dsn, application_name="mqttamqp-lock", keepalives=1, keepalives_idle=20,
                keepalives_interval=10, keepalives_count=3)
        except psycopg2.Error as e:
            raise StorageUnavailable(f"cannot reach the database {display}: "
                                     f"{_first_line(e)}") from None
        try:
            self._conn.autocommit = True
            with self._conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", (SERVING_LOCK_KEY,))
                (got,) = cur.fetchone()
            holder = "" if got else self._holder()
        except psycopg2.Error as e:
            self.close()
            raise StorageUnavailable(f"cannot take the serving lock of {display}: "
                                     f"{_first_line(e)}") from None
        if not got:
            self.close()
            raise ServingLockError(f"another mqttamqp serves the database {display}"
                                   + (f" ({holder})" if holder else ""))

    def _holder(self) -> str:
        """Who holds the lock, as PostgreSQL sees it ("" if it cannot say)."""
        try:
            with self._conn.cursor() as cur:
                cur.execute(
                    "SELECT a.client_addr, a.pid FROM pg_locks l JOIN pg_stat_activity a "
                    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                    "AND l.database = (SELECT oid FROM pg_database WHERE datname = "
                    "current_database()) "
                    "AND (l.classid::bigint << 32 | l.objid::bigint) = %s",
                    (SERVING_LOCK_KEY & 0xFFFFFFFFFFFFFFFF,))
                row = cur.fetchone()
        except Exception:
            return ""
        if row is None:
            return ""
        addr, pid = row
        return f"held from {addr or 'a local socket'}, backend pid {pid}"

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception:
            pass


def serving_lock(engine: Engine) -> ServingLock:
    """Take ``engine``'s serving lock (PostgreSQL) or raise ``ServingLockError``."""
    return ServingLock(engine.dsn, engine.display)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
