"""How long the PySpark traffic report takes over a large archive (issue 9).

    python bench/report_bench.py [--sizes 1000000,10000000] [--out FILE]

For each size it writes a synthetic archive in the broker's own layout and schema
(``messages/date=…/hour=…/part-*.parquet`` and ``events/…``, written directly
with pyarrow, a few hundred topics, a hundred publishers, 24 hours), then runs
``python -m mqttamqp.pipeline`` in local mode (``local[*]``, this machine's cores)
as a child process and times it, wall clock.  One JSON object per size on stdout;
the machine (cores, memory, Java) in each.  Bounded: each report run has a
timeout, and the temporary archive is removed afterwards.
"""

import argparse
import calendar
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = os.path.dirname(HERE)
sys.path.insert(0, MAIN)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from mqttamqp.archive.schema import EVENT_SCHEMA, MESSAGE_SCHEMA  # noqa: E402

DAY0 = calendar.timegm((2026, 11, 28, 0, 0, 0))
PER_FILE = 500_000


def write_archive(root, n):
    """``n`` messages over 24 hours, one Parquet file per ``PER_FILE`` rows and hour."""
    import numpy as np

    rng = np.random.default_rng(42)
    per_hour = n // 24
    for hour in range(24):
        d = os.path.join(root, "messages", "date=2026-11-28", "hour=%02d" % hour)
        os.makedirs(d, exist_ok=True)
        left, part = per_hour, 0
        while left > 0:
            rows = min(left, PER_FILE)
            ts = (DAY0 + hour * 3600) * 1_000_000 + np.sort(
                rng.integers(0, 3600 * 1_000_000, rows))
            topics = rng.integers(0, 300, rows)
            pubs = rng.integers(0, 100, rows)
            table = pa.table({
                "timestamp": pa.array(ts, pa.timestamp("us", tz="UTC")),
                "topic": pa.array(["plant/%d/line/%d/temp" % (t % 30, t) for t in topics]),
                "qos": pa.array(rng.integers(0, 3, rows), pa.int8()),
                "retain": pa.array(rng.random(rows) < 0.01),
                "payload_size": pa.array(rng.integers(8, 512, rows), pa.int64()),
                "payload": pa.array([None] * rows, pa.binary()),
                "publisher": pa.array(["dev-%d" % p for p in pubs]),
                "user": pa.array([None] * rows, pa.string()),
                "protocol": pa.array(["mqtt3.1.1"] * rows),
                "deliveries": pa.array(rng.integers(0, 5, rows), pa.int32()),
                "dropped": pa.array(np.zeros(rows, dtype=np.int32)),
            }, schema=MESSAGE_SCHEMA)
            pq.write_table(table, os.path.join(d, "part-%05d.parquet" % part))
            left -= rows
            part += 1
    # A few events per hour, so the event sections have something to count.
    d = os.path.join(root, "events", "date=2026-11-28", "hour=00")
    os.makedirs(d, exist_ok=True)
    names = EVENT_SCHEMA.names
    rows = {name: [None] * 200 for name in names}
    rows["timestamp"] = [(DAY0 + i * 60) * 1_000_000 for i in range(200)]
    rows["kind"] = ["connect" if i % 2 == 0 else "disconnect" for i in range(200)]
    rows["client_id"] = ["dev-%d" % (i // 2) for i in range(200)]
    if "reason" in rows:
        rows["reason"] = [None if i % 2 == 0 else "clean" for i in range(200)]
    columns = {}
    for field in EVENT_SCHEMA:
        values = rows[field.name]
        if field.name == "timestamp":
            columns[field.name] = pa.array(values, pa.timestamp("us", tz="UTC"))
        else:
            columns[field.name] = pa.array(values, field.type)
    pq.write_table(pa.table(columns, schema=EVENT_SCHEMA), os.path.join(d, "part-0.parquet"))


def machine():
    java = subprocess.run(["java", "-version"], capture_output=True, text=True)
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"cores": os.cpu_count(), "memory_gb": round(mem_kb / 1024 / 1024, 1),
            "java": (java.stderr or java.stdout).splitlines()[0] if java.returncode == 0
            else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per report run")
    ap.add_argument("--out")
    args = ap.parse_args()
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        tmp = tempfile.mkdtemp(prefix="report-bench-")
        try:
            t0 = time.monotonic()
            write_archive(os.path.join(tmp, "archive"), n)
            written = time.monotonic() - t0
            size = sum(os.path.getsize(os.path.join(dp, f))
                       for dp, _, fs in os.walk(os.path.join(tmp, "archive")) for f in fs)
            t1 = time.monotonic()
            run = subprocess.run(
                [sys.executable, "-m", "mqttamqp.pipeline", "--archive",
                 os.path.join(tmp, "archive"), "--out", os.path.join(tmp, "report"),
                 "--quiet"], capture_output=True, text=True, timeout=args.timeout, cwd=MAIN)
            seconds = time.monotonic() - t1
            summary = {}
            path = os.path.join(tmp, "report", "summary.json")
            if os.path.exists(path):
                with open(path) as f:
                    summary = json.load(f)
            result = {"messages": n, "archive_mb": round(size / 1e6, 1),
                      "write_seconds": round(written, 1), "report_seconds": round(seconds, 1),
                      "exit": run.returncode,
                      "messages_counted": (summary.get("totals") or {}).get("messages"),
                      "machine": machine(), "master": "local[*]"}
            if run.returncode != 0:
                result["stderr_tail"] = run.stderr[-2000:]
            print(json.dumps(result), flush=True)
            results.append(result)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
