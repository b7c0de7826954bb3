"""The ZODB writer thread's Python per message of the durable QoS 1 load, in one
process: what ``zodbstore._commit`` does with a group before the storage writes
(``applying.superseded_puts`` and the handler loop), on MappingStorage, in a
transaction aborted afterwards (no pickling, no fsync).

    python bench/writer_cost.py TREE [GROUPS]

``TREE``: the checkout whose ``mqttamqp`` is measured (first on ``sys.path``, so two
checkouts compare with one interpreter).  Each group is what the writer gathers under
``bench/durable_probe.py``'s load: a submit of 50 puts (one socket read of the
publisher, each the first put of its entry) and a submit of the 50 deletes of the
subscriber's PUBACKs.  Prints the process CPU per message in microseconds.  Never use
the figure in a test.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def main() -> None:
    tree = sys.argv[1]
    groups_n = int(sys.argv[2]) if sys.argv[2:] else 2000
    sys.path.insert(0, tree)
    import transaction
    import ZODB
    from ZODB.MappingStorage import MappingStorage

    import mqttamqp
    from mqttamqp.core.message import Message
    from mqttamqp.core.persistence import DeleteQueued, PutQueued, PutSession, StoredQueued
    from mqttamqp.store import applying, models
    assert mqttamqp.__file__ is not None and mqttamqp.__file__.startswith(tree)

    db = ZODB.DB(MappingStorage())
    conn = db.open()
    models.init_root(conn.root())
    applying.HANDLERS[PutSession](applying.Trees(conn.root()), PutSession("s", 1.0))
    transaction.commit()
    message = Message("bench/t", b"x" * 64, 1)

    def put(seq: int) -> Any:
        entry = StoredQueued(message, 1, "inflight", seq % 65535 + 1)
        try:
            return PutQueued("s", seq, entry, True)   # type: ignore[call-arg]
        except TypeError:   # (a tree before ``PutQueued.first``)
            return PutQueued("s", seq, entry)

    groups = []
    for g in range(groups_n):
        seqs = range(g * 50, g * 50 + 50)
        groups.append([([put(s) for s in seqs], None),
                       ([DeleteQueued("s", s) for s in seqs], None)])
    handlers = applying.HANDLERS
    start = time.process_time()
    for group in groups:
        skip = applying.superseded_puts(group)
        trees = applying.Trees(conn.root())
        for ops, _ in group:
            trees.deleted.clear()
            for op in ops:
                if skip and id(op) in skip:
                    continue
                handlers[type(op)](trees, op)
    end = time.process_time()
    transaction.abort()
    db.close()
    print(f"{(end - start) / (groups_n * 50) * 1e6:.3f}")


if __name__ == "__main__":
    main()
