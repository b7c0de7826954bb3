"""``store.prefetch``: reading a stored BTree a chunk at a time gives exactly
``tree.items()`` (same items, same order) for trees of several levels, of one inline
bucket, and empty ones; and asks the connection to prefetch each level's children
and each chunk of sessions with their queues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import transaction
from ZODB import DB
from ZODB.FileStorage import FileStorage

from mqttamqp.store import prefetch
from mqttamqp.store.models import PersistentSession, QueueTree, RetainedTree


class _Recording:
    """A connection that records what it is asked to prefetch."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.asked: list[int] = []

    def prefetch(self, objects: Any) -> None:
        objects = list(objects)
        self.asked.append(len(objects))
        self.conn.prefetch(objects)


def _db(tmp_path: Path, retained: int, sessions: int) -> Any:
    db = DB(FileStorage(str(tmp_path / "t.fs")))
    conn = db.open()
    root = conn.root()
    root["big"] = tree = RetainedTree()
    for i in range(retained):
        tree[f"t/{i:06d}"] = ("m", i)
    root["one"] = one = RetainedTree()
    one["only"] = 1
    root["empty"] = RetainedTree()
    root["sessions"] = s = RetainedTree()
    for i in range(sessions):
        session = PersistentSession.__new__(PersistentSession)
        session.queue = QueueTree()
        s[f"c{i:05d}"] = session
    transaction.commit()
    conn.close()
    return db


def test_items_are_the_trees_items_in_order(tmp_path: Path) -> None:
    """Several levels (5,000 items in buckets of 8), one inline bucket, empty."""
    db = _db(tmp_path, 5000, 0)
    try:
        conn = db.open()
        root = conn.root()
        rec = _Recording(conn)
        for name in ("big", "one", "empty"):
            assert list(prefetch.items(rec, root[name])) == list(root[name].items())
        assert rec.asked and max(rec.asked) <= prefetch.CHUNK
        conn.close()
    finally:
        db.close()


def test_sessions_prefetch_sessions_and_queues_by_chunk(tmp_path: Path) -> None:
    """Sessions come in order; each chunk of them and then their queues is
    prefetched."""
    db = _db(tmp_path, 0, 2500)
    try:
        conn = db.open()
        root = conn.root()
        rec = _Recording(conn)
        got = [cid for cid, _ in prefetch.sessions(rec, root["sessions"])]
        assert got == [f"c{i:05d}" for i in range(2500)]
        assert rec.asked.count(1000) == 4 and rec.asked[-2:] == [500, 500]
        conn.close()
    finally:
        db.close()
