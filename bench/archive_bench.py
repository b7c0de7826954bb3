"""The archive's cost on the hot path: QoS 0 1→1 throughput (bench scenario 1) with
the archive on (the default) and off (--no-archive), measured in the same run,
alternating, with a fresh broker per run.  Prints JSON; the target is on/off ≥ 0.85.

    python bench/archive_bench.py [--rounds 3] [--out FILE]

Each round runs ``bench/run.py --broker mqttamqp --scenarios 1 --repeat 1`` once
with and once without the archive (the order alternates between rounds), so both
see the same machine load; the medians of the rounds are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def one_run(archive: bool, quick: bool) -> float:
    cmd = [sys.executable, os.path.join(HERE, "run.py"), "--broker", "mqttamqp",
           "--scenarios", "1", "--repeat", "1"]
    if quick:
        cmd.append("--quick")
    if not archive:
        cmd.append("--mqttamqp-arg=--no-archive")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    doc = json.loads(out)
    return float(doc["scenarios"]["1"]["metrics"]["msgs_per_s"]["mqttamqp"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer messages per run")
    ap.add_argument("--out")
    args = ap.parse_args()
    on: list[float] = []
    off: list[float] = []
    for i in range(max(1, args.rounds)):
        for archive in ((True, False) if i % 2 == 0 else (False, True)):
            value = one_run(archive, args.quick)
            (on if archive else off).append(value)
            print(f"round {i + 1}: archive {'on ' if archive else 'off'} {value:,.0f} msg/s",
                  file=sys.stderr)
    result = {
        "scenario": "QoS 0, 1->1, 64 B (bench/run.py scenario 1), msg/s",
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "archive_on": on, "archive_off": off,
        "median_on": statistics.median(on), "median_off": statistics.median(off),
        "ratio": statistics.median(on) / statistics.median(off),
        "target": ">= 0.85",
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
