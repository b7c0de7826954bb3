"""Durable QoS 1 on PostgreSQL against the file storage, same run (issue 28, figures):
one producer at QoS 1 (a window of 100) to a persistent (clean_session=0) QoS 1
subscriber, and to a durable queue with 4 acking consumers, for ``--seconds`` each,
on a fresh broker per engine: ``file`` (the default FileStorage), ``postgresql``
(RelStorage on a throw-away local cluster, ``tests/support/pgcluster.py``) and
``postgresql-ha`` (the same with ``--ha``: the epoch checked in every commit).
Printed as JSON: messages/s per engine and scenario, and each engine's ratio to the
file storage (goal: >= 0.5).

Loopback only; each run is bounded by ``--seconds``; the brokers and the cluster are
stopped by what started them.

    python bench/pg_throughput.py [--seconds 10] [--engines file,postgresql,postgresql-ha]
"""

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from pgcluster import PostgresCluster  # noqa: E402
from queue_bench import drive, start_broker  # noqa: E402

SCENARIOS = {
    "session": (["jobs"], ["jobs"], False),
    "queue": (["$queue/jobs/task"], ["$queue/jobs"] * 4, True),
}
WINDOW = 100


def log(msg):
    sys.stderr.write("[pg_throughput {}] {}\n".format(time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--engines", default="file,postgresql,postgresql-ha")
    ap.add_argument("--out")
    a = ap.parse_args()
    cluster = PostgresCluster().start()
    results = {}
    try:
        for scenario, (topics, filters, clean) in SCENARIOS.items():
            for engine in a.engines.split(","):
                extra = ["--no-archive"]
                if engine.startswith("postgresql"):
                    extra += ["--storage", cluster.create_database()]
                if engine == "postgresql-ha":
                    extra += ["--ha"]
                log(f"{scenario} on {engine}, {a.seconds:g} s")
                broker = start_broker("mqttamqp", WINDOW, extra)
                try:
                    r = drive(broker.port, topics, filters, clean, count=10_000_000,
                              window=WINDOW, timeout=a.seconds)
                finally:
                    broker.stop()
                    broker.cleanup()
                # (the run is bounded by time, not count: "lost" would mean nothing)
                results[f"{scenario}/{engine}"] = {
                    k: r[k] for k in ("msgs_per_s", "publisher_acked", "delivered_once",
                                      "duplicates", "seconds")}
                log(f"  {r.get('msgs_per_s') or r}")
    finally:
        cluster.stop()
    ratios = {}
    for key, r in results.items():
        scenario, engine = key.split("/")
        base = results.get(f"{scenario}/file", {}).get("msgs_per_s")
        if engine != "file" and base and r.get("msgs_per_s"):
            ratios[key] = round(r["msgs_per_s"] / base, 3)
    doc = {"bench": "pg_throughput", "when": datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%dT%H:%M:%SZ"), "cpus": os.cpu_count(),
           "load_average": os.getloadavg(), "seconds": a.seconds, "results": results,
           "ratio_to_file": ratios}
    text = json.dumps(doc, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
