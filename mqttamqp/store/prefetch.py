"""Reading a BTree's items in bulk at start-up, for storages that fetch one object per
round trip (RelStorage on PostgreSQL: a ``--ha`` takeover loads the whole state).

``items(conn, tree)`` yields a BTree's items as ``tree.items()`` does (in key order),
but walks the tree from the top: it reads each level's children with one
``conn.prefetch`` per ``CHUNK`` objects (RelStorage loads them with one query into its
local cache) before touching them.  ``sessions(conn, tree)`` does the same for the
sessions tree and also prefetches each chunk's session queues.  On a storage without
``prefetch`` (FileStorage, MappingStorage) or without a local cache, ZODB makes the
prefetch a no-op and this is the plain iteration, a few hundred internal nodes aside.

What it must not do: change what is read (the same objects, the same order), or hold
more than one chunk of prefetched objects beyond what the caller keeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["CHUNK", "items", "sessions"]

CHUNK = 1000   # objects prefetched at once (RelStorage's cache must hold a chunk)


def _children(node: Any) -> list[Any] | None:
    """A BTree node's children (BTree nodes or buckets), or None when its items are
    inline (a tree of one bucket keeps it in its own state) or it is empty."""
    state = node.__getstate__()
    if not state:
        return None
    first = state[0]
    if first and isinstance(first[0], tuple):
        return None
    return list(first[0::2])


def _buckets(conn: Any, tree: Any) -> Iterator[Any]:
    """The tree's buckets in key order, each level prefetched a chunk at a time; or
    the tree itself when its items are inline."""
    children = _children(tree)
    if children is None:
        yield tree
        return
    for start in range(0, len(children), CHUNK):
        chunk = children[start:start + CHUNK]
        conn.prefetch(chunk)
        for child in chunk:
            # (by its class, which a ghost knows without being loaded)
            if not type(child).__name__.endswith("Bucket"):   # an inner node
                yield from _buckets(conn, child)
            else:
                yield child


def items(conn: Any, tree: Any) -> Iterator[tuple[Any, Any]]:
    """``tree.items()``, read in bulk."""
    for bucket in _buckets(conn, tree):
        yield from bucket.items()


def sessions(conn: Any, tree: Any) -> Iterator[tuple[Any, Any]]:
    """The sessions tree's items, each chunk of sessions and their queues prefetched."""
    batch: list[tuple[Any, Any]] = []
    for pair in items(conn, tree):
        batch.append(pair)
        if len(batch) >= CHUNK:
            yield from _prefetched(conn, batch)
            batch = []
    yield from _prefetched(conn, batch)


def _prefetched(conn: Any, batch: list[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
    if not batch:
        return
    conn.prefetch([s for _, s in batch])
    conn.prefetch([q for _, s in batch if (q := getattr(s, "queue", None)) is not None])
    yield from batch
