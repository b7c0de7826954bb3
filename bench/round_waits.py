"""The queues' early-answer entries of commit rounds (``QueueLog.round_waits``), in one
process: what a 0.9.1 publisher's confirmed batches leave behind, and their cost.

    python bench/round_waits.py [--count N] [SCENARIO ...]

Each round (``CommitBatcher`` batch) holds one confirmed publish to a durable queue
with a 0.9.1 consumer (a classic group), committed at once on the unit tests'
``ManualStore``.  Scenarios:

* ``dropped``: x-max-length 0, every append dropped at once (the review's
  ``quad.py``): entries left and CPU per round, N rounds;
* ``front``: N rounds while the consumer takes nothing (N entries), then it takes
  and acknowledges them one a batch: CPU per release;
* ``drops``: x-max-length N, N rounds while the consumer takes nothing, then N more,
  each pushing the oldest out: CPU per round of the second N.

Prints one JSON object: per scenario the entries before and after the measured
phase and the process CPU per round in µs, with the load average.  CPU figures move
with the machine's load: compare trees run side by side only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests", "support"), os.path.join(HERE, "..")]

from exchange_facade import consume  # noqa: E402
from fakes import ManualStore  # noqa: E402
from queue_facade import make  # noqa: E402

from mqttamqp.core.message import Message  # noqa: E402


def run(scenario: str, n: int) -> dict[str, Any]:
    store = ManualStore()
    broker, _, _ = make(store)
    ex = broker.exchanges
    args = ({"x-max-length": 0} if scenario == "dropped"
            else {"x-max-length": n} if scenario == "drops" else None)
    ex.declare_queue("q", "c1", durable=True, arguments=args)
    session, link = consume(broker, "q")
    store.commit_all()
    link.congested = scenario != "dropped"      # (takes nothing for now)
    commits = broker.queues.commits
    queue = broker.queues.queues["q"]

    def rounds(count: int) -> None:
        for _ in range(count):
            commits.begin()
            ex.publish(Message("", b"x", 1, False, "pub", 0.0), "", "q", in_round=True)
            commits.end()
            store.commit_all()

    if scenario != "dropped":
        rounds(n)
    before = len(queue.round_waits)
    t = time.process_time()
    if scenario == "front":
        link.congested = False
        broker.link_drained(session)
        done = 0
        while done < len(link.calls):       # (each acknowledgement lets one more out)
            packet_id = link.calls[done][3]
            done += 1
            commits.begin()
            broker.acknowledged(session, packet_id)
            commits.end()
            store.commit_all()
        assert done == n, done
    else:
        rounds(n)
    us = (time.process_time() - t) / n * 1e6
    return {"entries_before": before, "entries_after": len(queue.round_waits),
            "us_per_round": round(us, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("scenarios", nargs="*", default=["dropped", "front", "drops"])
    opts = ap.parse_args()
    load = os.getloadavg()
    out: dict[str, Any] = {"count": opts.count, "load_before": load}
    for scenario in opts.scenarios:
        out[scenario] = run(scenario, opts.count)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
