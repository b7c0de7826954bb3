"""What the console's per-topic counts cost on the route path (issue 13).

In-process: a real ``Broker`` (in-memory store, ``task.Clock``) routes QoS 0
messages from one publisher identity to one subscriber, over 100 topics; the same
run with ``Broker.topic_stats`` replaced by a stub whose ``note`` does nothing is
the peer.  Rounds alternate; medians and every round go to stdout as JSON.

    PYTHONPATH=. python bench/console_hotpath_bench.py [--messages N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, "tests/support")

from fakes import FakeLink, NullStore
from twisted.internet.task import Clock

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message


class _NoCounts:
    def note(self, topic: str) -> None:
        pass


def _run(count_topics: bool, messages: int) -> float:
    clock = Clock()
    broker = Broker(clock, NullStore(), Limits(sys_interval=0))
    broker.start()
    if not count_topics:
        broker.publishing.topic_stats = _NoCounts()  # type: ignore[assignment]
    link = FakeLink("sub")
    opened = broker.open_session(link, "sub", True, None)
    broker.activate(opened.session, link, "mqtt3.1.1")
    broker.subscribe(opened.session, Identity("sub"), [("bench/#", 0)])
    who = Identity("pub")
    batch = [Message(f"bench/{i % 100}", b"x" * 64, 0, False, "pub", 0.0)
             for i in range(1000)]
    started = time.perf_counter()
    for _ in range(messages // 1000):
        for m in batch:
            broker.publish(m, who, wait=False)
        link.calls.clear()
    elapsed = time.perf_counter() - started
    broker.stop()
    return messages / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    on: list[float] = []
    off: list[float] = []
    for _ in range(args.rounds):
        off.append(_run(False, args.messages))
        on.append(_run(True, args.messages))
    out: dict[str, Any] = {
        "bench": "console_hotpath", "messages_per_round": args.messages,
        "rounds": args.rounds, "python": sys.version.split()[0],
        "topic_counts_on_msgs_per_s": round(statistics.median(on)),
        "topic_counts_off_msgs_per_s": round(statistics.median(off)),
        "ratio_on_off": round(statistics.median(on) / statistics.median(off), 3),
        "rounds_on": [round(x) for x in on], "rounds_off": [round(x) for x in off],
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
