"""A storage file damaged by a torn commit: how the store refuses it, how
``store.recover`` repairs it, and who holds the data directory's lock.

Real FileStorages in ``tmp_path``, written with ZODB directly; no broker process
(``test_startup`` runs the same through ``twistd`` and ``mqttamqp-admin``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
from pathlib import Path
from typing import Any, cast

import pytest
import transaction
from ZODB import DB
from ZODB.FileStorage import FileStorage

from mqttamqp.datadir import StorageBusy, lock_holder, recover
from mqttamqp.store import DamagedStorage, ZODBStore
from mqttamqp.store.recover import good_end, recover_file


def _write(path: Path, values: int) -> list[int]:
    """A FileStorage with one transaction per value (root["k<i>"] = i); returns the
    file's size after each commit."""
    db = DB(FileStorage(str(path)))
    ends = []
    try:
        conn = db.open()
        root = conn.root()
        for i in range(values):
            root[f"k{i}"] = i
            transaction.commit()
            ends.append(os.path.getsize(path))
        conn.close()
    finally:
        db.close()
    os.unlink(f"{path}.index")   # as after a crash: the next open scans the file
    return ends


def _damage_last(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x5A]))


def _values(path: Path) -> dict[str, Any]:
    db = DB(FileStorage(str(path), read_only=True))
    try:
        conn = db.open()
        out = dict(conn.root())
        conn.close()
        return out
    finally:
        db.close()


def test_a_damaged_last_transaction_is_one_error_and_no_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The store refuses the file with ``DamagedStorage`` (recoverable) and lets the
    caller say it once: ZODB's own lines about it are held back."""
    data = tmp_path / "data"
    data.mkdir()
    _write(data / "mqttamqp.fs", 3)
    _damage_last(data / "mqttamqp.fs")
    with caplog.at_level(logging.DEBUG), pytest.raises(DamagedStorage) as caught:
        ZODBStore(str(data), cast(Any, None))
    assert caught.value.recoverable
    assert "transaction length" in caught.value.reason
    assert not [r for r in caplog.records
                if r.name.startswith("ZODB") and r.levelno >= logging.INFO], caplog.records


def test_a_file_that_is_not_a_storage_is_not_called_recoverable(tmp_path: Path) -> None:
    """A file that is not a FileStorage is refused as not recoverable, and recover says so."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "mqttamqp.fs").write_bytes(b"not a FileStorage at all")
    with pytest.raises(DamagedStorage) as caught:
        ZODBStore(str(data), cast(Any, None))
    assert not caught.value.recoverable
    with pytest.raises(ValueError, match="not a ZODB FileStorage"):
        recover_file(str(data / "mqttamqp.fs"))


def test_recover_keeps_a_copy_and_cuts_after_the_last_good_transaction(
        tmp_path: Path) -> None:
    """The copy is the damaged file byte for byte; the file keeps every transaction
    before the damaged one and opens again."""
    path = tmp_path / "mqttamqp.fs"
    ends = _write(path, 4)
    _damage_last(path)
    damaged = path.read_bytes()
    assert good_end(str(path)) == (ends[-2], ends[-1])
    done = recover_file(str(path), now=0.0)
    assert done.backup == f"{path}.damaged-19700101T000000Z"
    assert Path(done.backup).read_bytes() == damaged
    assert (done.size, done.kept, done.removed) == (ends[-1], ends[-2], ends[-1] - ends[-2])
    assert done.last_transaction.endswith(" UTC")
    assert path.read_bytes() == damaged[:ends[-2]]
    assert _values(path) == {"k0": 0, "k1": 1, "k2": 2}


def test_recover_changes_nothing_in_a_sound_file(tmp_path: Path) -> None:
    """Recovering a sound file changes nothing and makes no backup."""
    path = tmp_path / "mqttamqp.fs"
    _write(path, 2)
    before = path.read_bytes()
    done = recover_file(str(path))
    assert done.backup is None and done.removed == 0 and path.read_bytes() == before
    assert not list(tmp_path.glob("*.damaged-*"))


def test_recover_refuses_a_locked_storage_and_names_the_holder(tmp_path: Path) -> None:
    """While a process holds the lock (here, this one through a second descriptor,
    as a broker would) nothing is touched; the holder is named from the kernel's
    lock table, not from the pid written in the file."""
    path = tmp_path / "mqttamqp.fs"
    _write(path, 2)
    _damage_last(path)
    before = path.read_bytes()
    lock = tmp_path / "mqttamqp.fs.lock"
    lock.write_text(" 4194302\n")
    with open(lock, "r+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        child = os.fork()
        if child == 0:   # the holder: a process of its own, as a broker is
            try:
                signal.pause()
            finally:
                os._exit(0)
        try:
            held.close()   # the child's copy of the descriptor keeps the lock
            with pytest.raises(StorageBusy) as busy:
                recover(str(tmp_path), "mqttamqp.fs")
            assert str(busy.value).startswith(f"pid {child}")
            assert "4194302" not in str(busy.value)
            assert lock_holder(str(lock)).startswith(f"pid {child}")
            assert path.read_bytes() == before
        finally:
            os.kill(child, 9)
            os.waitpid(child, 0)
    assert recover(str(tmp_path), "mqttamqp.fs").removed > 0   # free again: repaired
