#!/usr/bin/env python3
"""The cost of an AMQP 1.0 transaction: batches of 1, 10 and 100 messages published
to a durable queue in one transaction each, against the same batches without one.

    python bench/tx_bench.py [--messages N] [--sizes 1,10,100] [--repeat R] [--out FILE]

One broker process (``twistd mqttamqp``, FileStorage in a temp dir, AMQP on a free
loopback port) and one python-qpid-proton client in this process.  A batch is
timed from its first transfer to the moment all of it is known durable:

* plain: the batch's messages sent unsettled at once (no waiting between them),
  then every Accepted awaited (each is sent once its append is durable);
* tx: declare, the batch's messages sent with transactional-state (answered at
  once), discharge, its Accepted awaited (sent once the one commit holding the
  whole transaction is durable).

Both move the same messages to the same queue; the difference is the declare and
discharge round trips and the broker's holding and replaying of the work.  The
figure is the median of ``--repeat`` runs of ``--messages`` messages per size
(min and max beside it).  Loops are bounded by the message count; every wait has
a timeout.  The JSON document goes to stdout (and ``--out``), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

TIMEOUT = 60.0
PAYLOAD = "x" * 64


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def plain_batches(conn: Any, sender: Any, size: int, batches: int) -> float:
    """Seconds to make ``batches`` batches of ``size`` durable without transactions."""
    from proton import Message
    start = time.perf_counter()
    for _ in range(batches):
        sent = [sender.link.send(Message(body=PAYLOAD)) for _ in range(size)]
        conn.wait(lambda sent=sent: all(d.settled for d in sent), timeout=TIMEOUT,
                  msg="a plain batch's Accepted")
        for dlv in sent:
            assert dlv.remote_state == 0x24, dlv.remote_state
            dlv.settle()
    return time.perf_counter() - start


def tx_batches(conn: Any, sender: Any, ctrl: Any, size: int, batches: int) -> float:
    """Seconds to commit ``batches`` transactions of ``size`` messages each."""
    from amqp_tx import TRANSACTIONAL
    from proton import Message
    start = time.perf_counter()
    for _ in range(batches):
        txn = ctrl.declare()
        sent = []
        for _ in range(size):
            dlv = sender.link.send(Message(body=PAYLOAD))
            dlv.local.data = [txn]
            dlv.update(TRANSACTIONAL)
            sent.append(dlv)
        done = ctrl.discharge(txn)
        assert done.remote_state == 0x24, done.remote_state
        for dlv in sent:
            dlv.settle()
    return time.perf_counter() - start


def measure(port: int, size: int, messages: int) -> dict[str, float]:
    from amqp_tx import Coordinator
    from proton.utils import BlockingConnection
    batches = max(1, messages // size)
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=TIMEOUT)
    try:
        sender = conn.create_sender(f"$queue/bench-{size}")
        ctrl = Coordinator(conn)
        plain_batches(conn, sender, size, 2)            # warm-up: the queue exists
        tx_batches(conn, sender, ctrl, size, 2)
        plain = plain_batches(conn, sender, size, batches)
        tx = tx_batches(conn, sender, ctrl, size, batches)
    finally:
        conn.close()
    n = batches * size
    return {"messages": n, "plain_us_per_message": plain / n * 1e6,
            "tx_us_per_message": tx / n * 1e6, "plain_ms_per_batch": plain / batches * 1e3,
            "tx_ms_per_batch": tx / batches * 1e3}


def summarise(runs: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": runs[0]["messages"]}
    for key in ("plain_us_per_message", "tx_us_per_message", "plain_ms_per_batch",
                "tx_ms_per_batch"):
        values = [r[key] for r in runs]
        out[key] = round(statistics.median(values), 1)
        out[key + "_min_max"] = [round(min(values), 1), round(max(values), 1)]
    out["tx_over_plain"] = round(out["tx_us_per_message"] / out["plain_us_per_message"], 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2000, help="messages per size and run")
    ap.add_argument("--sizes", default="1,10,100", help="messages per transaction")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size (median kept)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    from brokerproc import BrokerProcess
    with tempfile.TemporaryDirectory(prefix="txbench-") as tmp:
        broker = BrokerProcess(os.path.join(tmp, "data"), listeners=("--amqp",))
        broker.start(timeout=60)
        try:
            port = broker.ports["AMQP"]
            results = []
            for size in sizes:
                runs = []
                for run in range(args.repeat):
                    r = measure(port, size, args.messages)
                    log(f"size {size} run {run + 1}: plain {r['plain_us_per_message']:.0f} "
                        f"us/msg, tx {r['tx_us_per_message']:.0f} us/msg")
                    runs.append(r)
                results.append({"transaction_size": size, **summarise(runs)})
        finally:
            broker.stop()
    doc = {"bench": "tx_bench", "broker": "mqttamqp", "storage": "FileStorage (fsync per "
           "commit)", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "python": platform.python_version(), "cpus": os.cpu_count(),
           "repeat": args.repeat, "results": results}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
