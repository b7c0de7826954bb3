"""The ZODB writer thread's CPU per message under a steady durable QoS 1 flow, in
one process: the real ``ZODBStore`` (its writer thread, gather window, held puts,
commits and hand-offs) on a FileStorage in a temporary directory, fed as
``bench/durable_probe.py``'s load feeds it, without sockets or a broker.

    python bench/writer_steady.py TREE [--messages N] [--batch B] [--lag L]

``TREE``: the checkout whose ``mqttamqp`` is measured (first on ``sys.path``, so two
checkouts compare with one interpreter).  The feeding thread submits, every 0.5 ms,
one publisher read's puts (``B`` first puts of entries sent at once to an online
subscriber) and, as a submit of its own (the subscriber's read), the deletes of its
PUBACKs for the puts submitted ``L`` reads before, as the reactor does; the
hand-offs (``callFromThread``) run on the feeding thread.  Prints
the writer thread's CPU per message (µs, from ``pthread_getcpuclockid``), the
commits and records the FileStorage got, and the store's counters.  The machine is
shared: compare two trees run one after the other, never use the figure in a test.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import time
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--lag", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, args.tree)
    import mqttamqp
    from mqttamqp.core.message import Message
    from mqttamqp.core.persistence import DeleteQueued, PutQueued, PutSession, StoredQueued
    from mqttamqp.store.zodbstore import ZODBStore
    assert mqttamqp.__file__ is not None and mqttamqp.__file__.startswith(
        os.path.abspath(args.tree))

    calls: queue.SimpleQueue[Any] = queue.SimpleQueue()

    class Reactor:
        def callFromThread(self, f: Any, *a: Any) -> None:
            calls.put((f, a))

    def run_calls() -> None:
        while True:
            try:
                f, a = calls.get_nowait()
            except queue.Empty:
                return
            f(*a)

    message = Message("bench/t", b"x" * 64, 1)

    def put(seq: int) -> Any:
        entry = StoredQueued(message, 1, "inflight", seq % 65535 + 1)
        try:
            return PutQueued("s", seq, entry, True, True)   # type: ignore[call-arg]
        except TypeError:   # (a tree before ``PutQueued.online``)
            return PutQueued("s", seq, entry, True)

    with tempfile.TemporaryDirectory() as tmp:
        store = ZODBStore(tmp, Reactor())   # type: ignore[arg-type]
        store.submit([PutSession("s", 1.0)])
        writer = store._writer
        clock = time.pthread_getcpuclockid(writer.ident)   # type: ignore[arg-type]
        cpu0 = time.clock_gettime(clock)
        sent: list[range] = []
        seq = 0
        next_at = time.monotonic()
        while seq < args.messages:
            seqs = range(seq, seq + args.batch)
            seq += args.batch
            store.submit([put(s) for s in seqs])
            sent.append(seqs)
            if len(sent) > args.lag:
                store.submit([DeleteQueued("s", s) for s in sent.pop(0)])
            run_calls()
            next_at += 0.0005
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        for seqs in sent:
            store.submit([DeleteQueued("s", s) for s in seqs])
        done = store.submit([])
        while not done.called:
            f, a = calls.get(timeout=30)
            f(*a)
        cpu = time.clock_gettime(clock) - cpu0
        stats = store.stats()
        store.close()
        run_calls()
        from ZODB.FileStorage import FileIterator
        txns = records = 0
        it = FileIterator(os.path.join(tmp, "mqttamqp.fs"))
        for txn in it:
            txns += 1
            records += sum(1 for _ in txn)
        it.close()
    print(f"writer_us_per_msg {cpu / args.messages * 1e6:.3f} storage_txns {txns} "
          f"records {records} commits {stats['commits']} coalesced {stats['coalesced_puts']} "
          f"held {stats.get('held_puts')}")


if __name__ == "__main__":
    main()
