"""The leader epoch (``store.fencing``): a store whose epoch another store has
bumped commits nothing more, says so once, and refuses what comes after; the new
leader's state has everything the old one committed before the bump.

Two ``ZODBStore``s share one RelStorage SQLite directory, as two brokers share one
PostgreSQL database under ``--ha``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from twisted.python.failure import Failure

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import PutRetained
from mqttamqp.store import StoreClosedError, ZODBStore, resolve_engine
from mqttamqp.store.fencing import Fenced

pytest.importorskip("relstorage")


class _InlineReactor:
    """Runs what the writer thread hands over at once, on that thread."""

    def callFromThread(self, f: Any, *args: Any) -> None:
        f(*args)


def _store(path: Path) -> ZODBStore:
    engine = resolve_engine(f"sqlite:///{path / 'db'}", str(path))
    return ZODBStore(str(path), _InlineReactor(), engine=engine, gather_seconds=0)


def _result(store: ZODBStore, topic: str) -> Failure | None:
    """Submit one retained message; wait for its outcome (None: committed)."""
    done = threading.Event()
    out: list[Failure | None] = []

    def record(result: Any) -> None:
        out.append(result if isinstance(result, Failure) else None)
        done.set()

    store.submit([PutRetained(Message(topic, b"x", 1, True))]).addBoth(record)
    assert done.wait(10), "the commit did not finish"
    return out[0]


def test_a_bumped_epoch_fences_the_old_leader(tmp_path: Path) -> None:
    """After a second store claims the next epoch, the first one's commit fails with
    Fenced, on_fenced is called once, later submits fail at once, and the new leader
    loads what the old one committed before."""
    old = _store(tmp_path)
    new = None
    try:
        assert old.claim_epoch() == 1
        fenced: list[str] = []
        old.on_fenced = fenced.append
        assert _result(old, "before") is None
        new = _store(tmp_path)
        assert new.claim_epoch() == 2
        failure = _result(old, "after")
        assert failure is not None and failure.check(Fenced)
        assert len(fenced) == 1 and "epoch 2" in fenced[0]
        later = _result(old, "later")
        assert later is not None and later.check(StoreClosedError)
        assert len(fenced) == 1
        assert old.stats()["fenced"] == fenced[0]
        snapshot = new.load()
        assert set(snapshot.retained) == {"before"}
        assert _result(new, "on the new leader") is None
    finally:
        old.close()
        if new is not None:
            new.close()


def test_without_an_epoch_nothing_is_checked(tmp_path: Path) -> None:
    """A store that never claimed an epoch (no --ha) commits whatever the stored
    epoch is."""
    leader = _store(tmp_path)
    plain = None
    try:
        leader.claim_epoch()
        plain = _store(tmp_path)
        assert plain.epoch is None
        assert _result(plain, "t") is None
    finally:
        leader.close()
        if plain is not None:
            plain.close()


def test_a_bump_during_a_commit_makes_that_commit_fail(tmp_path: Path) -> None:
    """A transaction that checked the epoch before another leader bumped it cannot
    commit afterwards: the storage re-checks the epoch record (readCurrent)."""
    import transaction
    from ZODB import DB
    from ZODB.POSException import ConflictError

    from mqttamqp.store.fencing import check, claim

    engine = resolve_engine(f"sqlite:///{tmp_path / 'db'}", str(tmp_path))
    db = DB(engine.factory())
    try:
        mine = claim(db)
        tm = transaction.TransactionManager(explicit=True)
        conn = db.open(transaction_manager=tm)
        tm.begin()
        check(conn, mine)                     # passes: nobody bumped it yet
        conn.root()["written"] = "by the old leader"
        assert claim(db) == mine + 1          # the new leader, meanwhile
        with pytest.raises(ConflictError):
            tm.commit()
        tm.abort()
        tm.begin()
        with pytest.raises(Fenced):
            check(conn, mine)                 # and the next attempt sees the bump
        tm.abort()
        conn.close()
    finally:
        db.close()


def test_a_read_conflict_under_an_epoch_means_another_leader() -> None:
    """lost_to: Fenced always; a read conflict that outlived the retries only under an
    epoch (the epoch record is the only object read with readCurrent); else nothing."""
    from ZODB.POSException import ReadConflictError

    from mqttamqp.store.fencing import lost_to

    assert "epoch 3" in lost_to(Fenced(2, 3), 2)
    assert "another broker took over" in lost_to(ReadConflictError(), 2)
    assert lost_to(ReadConflictError(), None) == ""
    assert lost_to(OSError("disk full"), 2) == ""
