"""Repairing a FileStorage whose end is damaged: a copy of the file is kept, then the
file is cut after its last good transaction.

A commit torn by a crash or a full disk can leave a last transaction that
FileStorage will not open (``CorruptedTransactionError``: "redundant transaction
length check failed", say). What FileStorage repairs by itself at open (a
transaction cut short, a checkpoint flag left set) needs nothing from here.

What it owns: finding where the good transactions end with ZODB's own scan (the
``read_index`` FileStorage runs at open, in its ``recover`` mode, which stops at the
first damaged transaction instead of raising), the copy, the truncation, and
checking that FileStorage opens the result.

What it must not do: run while a broker has the storage open (the caller holds the
data directory's lock), parse records itself, or change anything before the copy is
complete and on disk.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass

__all__ = ["Recovery", "good_end", "recover_file"]


@dataclass(frozen=True, slots=True)
class Recovery:
    """What ``recover_file`` did."""

    path: str
    size: int                 # bytes before
    kept: int                 # bytes kept (the end of the last good transaction)
    backup: str | None        # the copy of the whole file (None: nothing was changed)
    last_transaction: str     # when the last kept transaction was committed (UTC), or ""

    @property
    def removed(self) -> int:
        return self.size - self.kept


def good_end(path: str) -> tuple[int, int]:
    """(the end of the last good transaction, the file's size), by FileStorage's own
    scan, read-only."""
    from ZODB.FileStorage.FileStorage import read_index
    from ZODB.fsIndex import fsIndex

    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        pos, _, _ = read_index(f, path, fsIndex(), {}, recover=1, read_only=1)
    return pos, size


def _last_transaction(path: str) -> str:
    """When the last transaction of ``path`` was committed; raises what FileStorage
    raises if it does not open."""
    from ZODB.FileStorage import FileStorage

    storage = FileStorage(path, read_only=True)
    try:
        return _when(storage.lastTransaction())
    finally:
        storage.close()


def _when(tid: bytes) -> str:
    if tid == b"\0" * 8:
        return ""
    from persistent.TimeStamp import TimeStamp

    seconds = TimeStamp(tid).timeTime()
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def recover_file(path: str, now: float | None = None) -> Recovery:
    """Cut ``path`` (a FileStorage ``Data.fs``) after its last good transaction,
    having copied it whole to ``<path>.damaged-<UTC time>`` first; remove its index
    (rebuilt at the next open). Nothing is changed when no transaction is damaged.
    Raises ``OSError`` (the file, the copy) or ``ValueError`` (not a FileStorage,
    or the result still does not open)."""
    from ZODB.FileStorage.FileStorage import FileStorageFormatError

    try:
        kept, size = good_end(path)
    except FileStorageFormatError:
        raise ValueError(f"{path} is not a ZODB FileStorage") from None
    if kept >= size:
        return Recovery(path, size, size, None, _last_transaction(path))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    backup = f"{path}.damaged-{stamp}"
    if os.path.lexists(backup):
        raise ValueError(f"{backup} exists already; move it away first")
    shutil.copyfile(path, backup)
    with open(backup, "rb") as copy:
        os.fsync(copy.fileno())
    with open(path, "r+b") as data:
        data.truncate(kept)
        data.flush()
        os.fsync(data.fileno())
    for stale in (f"{path}.index",):   # positions past the cut
        try:
            os.unlink(stale)
        except FileNotFoundError:
            pass
    try:
        last = _last_transaction(path)
    except Exception as e:
        raise ValueError(f"{path} still does not open after the cut ({e}); the whole "
                         f"file is in {backup}") from None
    return Recovery(path, size, kept, backup, last)
