"""The reconnect storm of ``bench/ha_takeover.py`` against one broker on the file
storage (no ``--ha``, no PostgreSQL): N stored persistent sessions (a subscription and
one queued QoS 1 message each) resumed by a client each, ``--concurrency`` at a time,
every connection kept open; for comparing with the storm after a takeover on
PostgreSQL (docs/ha.md, what is not done yet).  Prints JSON: the storm's time, the
broker's CPU seconds in it, its commit counters.

Loopback only; every wait is bounded (``--timeout``); the broker started here is
stopped by its PID.

    python bench/resume_storm_file.py [--sessions 10000] [--retained 1000]
"""

import argparse
import datetime
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from brokerproc import BrokerProcess  # noqa: E402
from ha_takeover import (  # noqa: E402
    commit_figures,
    cpu_seconds,
    free_port,
    listen_overflows,
    populate,
    resume_all,
    storm_summary,
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--retained", type=int, default=1_000)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="storm-file-") as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        populate(None, data, args.sessions, args.retained)
        port = free_port()
        broker = BrokerProcess(data, "--no-archive", "--max-connections",
                               str(args.sessions + 100), listeners=("--mqtt", "--metrics"),
                               descriptions={"--mqtt": "tcp:%d:interface=127.0.0.1" % port})
        try:
            broker.start(timeout=args.timeout)
            before = commit_figures(broker.ports["METRICS"])
            cpu = cpu_seconds(broker.proc.pid)
            overflows = listen_overflows()
            seconds, ok = resume_all(port, args.sessions, args.concurrency, args.timeout)
            overflows = listen_overflows() - overflows
            cpu = cpu_seconds(broker.proc.pid) - cpu
            after = commit_figures(broker.ports["METRICS"])
        finally:
            broker.stop()
    commits = {k: round(after.get(k, 0.0) - v, 3) for k, v in before.items()}
    doc = {"bench": "resume_storm_file", "when": datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%dT%H:%M:%SZ"), "cpus": os.cpu_count(),
           "load_average": os.getloadavg(), "sessions": args.sessions,
           "retained": args.retained, "concurrency": args.concurrency,
           "storm_seconds": round(seconds, 3), "sessions_resumed": ok,
           "storm_broker_cpu_seconds": round(cpu, 2), "storm_listen_overflows": overflows,
           "storm_broker_commits": commits, "storm_commits_summary": storm_summary(commits)}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
