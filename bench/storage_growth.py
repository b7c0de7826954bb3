"""Storage growth in steady flow (issue 26, section 1): does the data directory stay
within 2 x the live state + 64 MB while durable QoS 1 flows at full speed?

Scenarios, each on a fresh broker with default settings (plus ``--storage`` when an
engine is named):

* ``queue``: one producer -> ``$queue/jobs/task`` at QoS 1, 4 consumers of
  ``$queue/jobs`` acking every delivery: queue depth stays near 0.
* ``session``: one producer -> topic ``jobs`` at QoS 1, one persistent
  (clean_session=0) QoS 1 subscriber acking every delivery.

While the flow runs, a thread samples every 0.2 s the bytes of the storage (the
engine's file or directory) and of the whole data directory less the archive (the
archive's Parquet files grow with traffic by design, bounded by ``--archive-days``).
After the run the broker is stopped and the live state measured offline: the
storage packed (and, for SQLite, vacuumed) in a copy.  Printed as JSON: throughput,
peak and final sizes, live size, and whether the peak stayed within the bound.

Loopback only; each run is bounded by ``--seconds``; brokers are stopped by their
process groups.

    python bench/storage_growth.py [--seconds 30] [--engines file,file-nopack,sqlite]
        [--scenarios queue,session] [--repeat 1] [--out FILE]
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from queue_bench import drive, start_broker  # noqa: E402
from run import machine_facts  # noqa: E402

MB = 1 << 20
SCENARIOS = {
    # name: (producer topics, consumer filters, clean session)
    "queue": (["$queue/jobs/task"], ["$queue/jobs"] * 4, True),
    "session": (["jobs"], ["jobs"], False),
}
WINDOW = 100


def log(msg):
    sys.stderr.write("[storage_growth {}] {}\n".format(time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def tree_bytes(path, skip=()):
    if os.path.isfile(path):
        return os.lstat(path).st_size
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def storage_path(data, engine):
    return os.path.join(data, "sqlite") if engine == "sqlite" else os.path.join(
        data, "mqttamqp.fs")


def live_bytes(data, engine):
    """The state's size once packed (and vacuumed), measured on a copy, offline."""
    tmp = tempfile.mkdtemp(prefix="growth-live-")
    try:
        src = storage_path(data, engine)
        if engine == "sqlite":
            dst = os.path.join(tmp, "sqlite")
            shutil.copytree(src, dst)
            uri = "sqlite:///" + dst.lstrip("/")
        else:
            dst = os.path.join(tmp, "mqttamqp.fs")
            shutil.copy(src, dst)
            uri = "file://" + dst
        code = (
            "import sys, sqlite3, glob, os\n"
            "from ZODB import DB\n"
            "from mqttamqp.store.engines import resolve, path_size\n"
            "e = resolve(sys.argv[1], sys.argv[2])\n"
            "db = DB(e.factory()); db.pack(); db.close()\n"
            "for f in glob.glob(os.path.join(e.size_path, '*.sqlite3')):\n"
            "    c = sqlite3.connect(f); c.execute('VACUUM'); c.close()\n"
            "print(path_size(e.size_path))\n")
        out = subprocess.run([sys.executable, "-c", code, uri, tmp], capture_output=True,
                             text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        return int(out.stdout.split()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_once(scenario, engine, seconds):
    topics, filters, clean = SCENARIOS[scenario]
    # "file-nopack": the file storage packed on the clock only (as before
    # --pack-growth), for the throughput and size it gives in the same run
    extra = {"file": [], "file-nopack": ["--pack-growth", "0"]}.get(
        engine, ["--storage", f"{engine}://"])
    broker = start_broker("mqttamqp", WINDOW, extra)
    data = os.path.join(broker.tmp, "data")
    store = storage_path(data, engine)
    samples = []
    stop = threading.Event()

    def sample():
        t0 = time.monotonic()
        while not stop.wait(0.2):
            samples.append((round(time.monotonic() - t0, 2), tree_bytes(store),
                            tree_bytes(data, skip=(os.path.join(data, "archive"),))))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        r = drive(broker.port, topics, filters, clean, count=10_000_000, window=WINDOW,
                  timeout=seconds)
    finally:
        stop.set()
        sampler.join()
        broker.stop()
    try:
        live = live_bytes(data, engine)
        final_store = tree_bytes(store)
        final_data = tree_bytes(data, skip=(os.path.join(data, "archive"),))
    finally:
        broker.cleanup()
    peak_store = max((s[1] for s in samples), default=0)
    peak_data = max((s[2] for s in samples), default=0)
    bound = 2 * live + 64 * MB
    return {
        "scenario": scenario, "engine": engine, "seconds": seconds,
        "msgs_per_s": r["msgs_per_s"], "delivered": r["delivered_once"],
        "duplicates": r["duplicates"],
        "live_bytes": live, "bound_bytes": bound,
        "peak_storage_bytes": peak_store, "peak_data_dir_bytes": peak_data,
        "final_storage_bytes": final_store, "final_data_dir_bytes": final_data,
        "growth_bytes_per_s": round(
            (samples[-1][2] - samples[0][2]) / max(0.1, samples[-1][0] - samples[0][0]), 1)
        if len(samples) > 1 else None,
        "within_bound": peak_data <= bound,
        "bytes_per_message": round(peak_store / max(1, r["delivered_once"]), 1),
        "samples": samples[:: max(1, len(samples) // 60)],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--engines", default="file,file-nopack,sqlite")
    ap.add_argument("--scenarios", default="queue,session")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args()
    runs = []
    for _ in range(a.repeat):
        for scenario in a.scenarios.split(","):
            for engine in a.engines.split(","):
                log(f"{scenario} on {engine}, {a.seconds:g} s")
                r = run_once(scenario, engine, a.seconds)
                log(f"  {r['msgs_per_s']:.0f} msg/s, peak {r['peak_data_dir_bytes'] / MB:.1f}"
                    f" MB, live {r['live_bytes'] / MB:.2f} MB, within bound: "
                    f"{r['within_bound']}")
                runs.append(r)
    summary = {}
    for r in runs:
        key = f"{r['scenario']}/{r['engine']}"
        summary.setdefault(key, []).append(r)
    result = {
        "bench": "storage_growth",
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "summary": {k: {"msgs_per_s_median": statistics.median(x["msgs_per_s"] for x in v),
                        "peak_data_dir_mb_max": round(max(x["peak_data_dir_bytes"]
                                                          for x in v) / MB, 1),
                        "live_mb_max": round(max(x["live_bytes"] for x in v) / MB, 2),
                        "all_within_bound": all(x["within_bound"] for x in v)}
                    for k, v in summary.items()},
        "runs": runs,
    }
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
