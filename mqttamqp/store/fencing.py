"""The leader epoch that fences a broker which lost its leadership (``--ha``).

What it owns: one record in the ZODB root, ``root["ha_epoch"]`` (a
``PersistentMapping``: the epoch number, when it was claimed and by whom), the claim
a new leader makes of the next epoch (``claim``: one committed transaction, made
*before* the new leader loads the state), and the check the writer thread makes in
the same transaction as every commit (``check``): the record is read and marked
with ``readCurrent``, so the storage refuses the commit if another leader bumped the
epoch after this transaction began, and a commit that sees a newer epoch raises
``Fenced`` before it writes anything.  Hence a broker that lost the lock cannot
commit, so cannot acknowledge, once the new leader's claim is committed; and what it
committed before that claim is in the state the new leader loads after it.

What it must not do: pickle any ``mqttamqp`` class (the record is a plain
``PersistentMapping``), or decide what a fenced broker does next (the service does).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from persistent.mapping import PersistentMapping

__all__ = ["EPOCH_KEY", "Fenced", "check", "claim", "current", "lost_to"]

EPOCH_KEY = "ha_epoch"


class Fenced(RuntimeError):
    """A commit under a stale epoch: another broker has become the leader."""

    def __init__(self, mine: int, current: int) -> None:
        super().__init__(f"another broker took over the storage (epoch {current}, "
                         f"this broker's is {mine})")
        self.mine = mine
        self.current = current


def current(root: Any) -> int:
    """The epoch recorded in ``root`` (0 when no leader ever claimed one)."""
    record = root.get(EPOCH_KEY)
    return int(record["epoch"]) if record is not None else 0


def claim(db: Any, attempts: int = 3) -> int:
    """Commit the next epoch (one past the stored one) and return it.

    Called by the broker that has just taken the serving lock, before it loads the
    state: from this commit on, the previous leader's commits fail (``check``)."""
    import transaction

    tm = transaction.TransactionManager(explicit=True)
    conn = db.open(transaction_manager=tm)
    epoch = 0
    try:
        for attempt in tm.attempts(attempts):
            with attempt:
                root = conn.root()
                record = root.get(EPOCH_KEY)
                if record is None:
                    record = root[EPOCH_KEY] = PersistentMapping()
                epoch = int(record.get("epoch", 0)) + 1
                record["epoch"] = epoch
                record["since"] = time.time()
                record["by"] = socket.gethostname()
    finally:
        conn.close()
    return epoch


def check(conn: Any, epoch: int) -> None:
    """In the writer's transaction: raise ``Fenced`` unless ``epoch`` is still the
    stored one, and have the storage re-check it at commit (``readCurrent``)."""
    record = conn.root().get(EPOCH_KEY)
    stored = int(record["epoch"]) if record is not None else 0
    if stored != epoch:
        raise Fenced(epoch, stored)
    if record is not None:
        conn.readCurrent(record)


def lost_to(error: BaseException, epoch: int | None) -> str:
    """Why a failed commit means another leader has the storage ("" if it does not):
    ``Fenced``, or (under an epoch) a read conflict that outlived the retries.  The
    epoch record is the only object the writer marks ``readCurrent`` and only a
    claim writes it, so a conflict on it means a new leader is committing its claim
    (RelStorage then cannot lock the row: ``lock_not_available``)."""
    from ZODB.POSException import ReadConflictError

    if isinstance(error, Fenced):
        return str(error)
    if epoch is not None and isinstance(error, ReadConflictError):
        return (f"another broker took over the storage (it is claiming the epoch after "
                f"{epoch}: {type(error).__name__})")
    return ""
