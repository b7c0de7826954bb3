"""The archive's cost on the hot path: QoS 0 1→1 throughput (bench scenario 1) with
the archive on (the default) and off (--no-archive), measured in the same run,
alternating, with a fresh broker per run.  Prints JSON; the target is on/off ≥ 0.85.
It also counts the messages each archive-on run left in its Parquet files: a run
that kept up archived all of them (the broker drops and counts what its archive
cannot take, so a fast run that had dropped would show here), and gives the ratio
over those complete runs alone too (``ratio_complete``): dropping is cheaper than
archiving, so runs that dropped flatter ``ratio``. The load average before and
after is in the JSON: the figures are only comparable on a quiet machine.

    python bench/archive_bench.py [--rounds 3] [--out FILE] [--baseline PATH]

``--baseline PATH`` runs the code at PATH (another checkout, with its own
``bench/run.py``) the same way in every round, interleaved with this one's runs:
the only fair way to compare two versions on a machine whose speed drifts.

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
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def archived_messages(directory: str) -> int:
    """Rows in the closed message segments of an archive directory."""
    import pyarrow.dataset as ds

    path = os.path.join(directory, "messages")
    if not os.path.isdir(path):
        return 0
    return ds.dataset(path, format="parquet", partitioning="hive").count_rows()


def one_run(archive: bool, quick: bool, archive_dir: str | None = None,
            root: str = ROOT) -> tuple[float, float | None]:
    """msg/s and the broker process's own CPU µs per message (its archive writer
    process not included) of one run of the code at ``root``."""
    cmd = [sys.executable, os.path.join(root, "bench", "run.py"), "--broker", "mqttamqp",
           "--scenarios", "1", "--repeat", "1"]
    if quick:
        cmd.append("--quick")
    if not archive:
        cmd.append("--mqttamqp-arg=--no-archive")
    elif archive_dir is not None:  # kept, to count what was archived
        cmd.append(f"--mqttamqp-arg=--archive-dir={archive_dir}")
    for attempt in range(3):  # a run that fails (a port taken, a timeout) is run again
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root,
                              env=dict(os.environ, PYTHONPATH=root))
        value = cpu = None
        if proc.returncode == 0:
            metrics = json.loads(proc.stdout)["scenarios"]["1"]["metrics"]
            value = metrics["msgs_per_s"]["mqttamqp"]
            cpu = metrics.get("broker_cpu_us_per_msg", {}).get("mqttamqp")
        if value is not None:
            return float(value), (None if cpu is None else float(cpu))
        print(f"run failed (attempt {attempt + 1}): {proc.stderr[-2000:]}", file=sys.stderr)
    raise RuntimeError("bench/run.py failed three times")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer messages per run")
    ap.add_argument("--out")
    ap.add_argument("--baseline", help="also run the code at this path, interleaved")
    args = ap.parse_args()
    base: dict[bool, list[float]] = {True: [], False: []}
    base_cpu: dict[bool, list[float]] = {True: [], False: []}
    base_archived: list[int] = []
    on: list[float] = []
    off: list[float] = []
    cpu_on: list[float] = []
    cpu_off: list[float] = []
    archived: list[int] = []   # per run with the archive on: rows it holds afterwards
    load_before = os.getloadavg()
    for i in range(max(1, args.rounds)):
        for archive in ((True, False) if i % 2 == 0 else (False, True)):
            with tempfile.TemporaryDirectory(prefix="archive-bench-") as directory:
                value, cpu = one_run(archive, args.quick, directory)
                if archive:
                    archived.append(archived_messages(directory))
            (on if archive else off).append(value)
            if cpu is not None:
                (cpu_on if archive else cpu_off).append(cpu)
            print(f"round {i + 1}: archive {'on ' if archive else 'off'} {value:,.0f} msg/s, "
                  f"broker {cpu} µs/msg"
                  + (f", {archived[-1]:,} messages archived" if archive else ""),
                  file=sys.stderr)
            if args.baseline:
                root = os.path.abspath(args.baseline)
                with tempfile.TemporaryDirectory(prefix="archive-bench-") as directory:
                    value, cpu = one_run(archive, args.quick, directory, root)
                    if archive:
                        base_archived.append(archived_messages(directory))
                base[archive].append(value)
                if cpu is not None:
                    base_cpu[archive].append(cpu)
                print(f"round {i + 1}: baseline archive {'on ' if archive else 'off'} "
                      f"{value:,.0f} msg/s, broker {cpu} µs/msg"
                      + (f", {base_archived[-1]:,} messages archived" if archive else ""),
                      file=sys.stderr)
    published = 200_000 // (10 if args.quick else 1)
    complete = [v for v, n in zip(on, archived, strict=True) if n == published]
    result = {
        "scenario": "QoS 0, 1->1, 64 B (bench/run.py scenario 1), msg/s",
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "archive_on": on, "archive_off": off,
        # every message of every run with the archive on is in its Parquet files
        # (a run that dropped records would not count: drops are counted, not hidden)
        "published_per_run": published,
        "archived_per_run": archived,
        "median_on": statistics.median(on), "median_off": statistics.median(off),
        "ratio": statistics.median(on) / statistics.median(off),
        # the same over the archive-on runs that archived every message
        "complete_runs": len(complete),
        "ratio_complete": (statistics.median(complete) / statistics.median(off)
                           if complete else None),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        # the broker process's own CPU per message (not its writer process's)
        "broker_cpu_us_per_msg_on": cpu_on, "broker_cpu_us_per_msg_off": cpu_off,
        "median_cpu_on": statistics.median(cpu_on) if cpu_on else None,
        "median_cpu_off": statistics.median(cpu_off) if cpu_off else None,
        "target": ">= 0.85",
    }
    if args.baseline:
        base_complete = [v for v, n in zip(base[True], base_archived, strict=True)
                         if n == published]
        result["baseline"] = {
            "path": os.path.abspath(args.baseline),
            "archive_on": base[True], "archive_off": base[False],
            "archived_per_run": base_archived,
            "ratio": statistics.median(base[True]) / statistics.median(base[False]),
            "complete_runs": len(base_complete),
            "ratio_complete": (statistics.median(base_complete) / statistics.median(base[False])
                               if base_complete else None),
            "median_cpu_on": statistics.median(base_cpu[True]) if base_cpu[True] else None,
            "median_cpu_off": statistics.median(base_cpu[False]) if base_cpu[False] else None,
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
