#!/usr/bin/env python3
"""Where a durable QoS 1 message's CPU goes: scenario 2 of ``run.py`` (QoS 1, 1 -> 1,
persistent subscriber, window 100) against one mqttamqp broker per run, with the
broker's CPU split by thread and the commits counted afterwards (issue 31, section 1).

    python bench/durable_probe.py [--runs 3] [--count 50000] [--window 100] [--mosquitto]
                                  [--engine file|sqlite|postgresql] [--baseline DIR]
                                  [--mqttamqp-arg ARG ...] [--out FILE]

Per run: messages/s as ``run.py`` counts them; the broker's CPU per message (utime +
stime from ``/proc``), split into the reactor (the main thread, whose id is the
process id) and every other thread (the ZODB writer, the archive's feeding thread,
the queue reader, the thread pool: the thread ids and their CPU are listed); the
store's transactions and records after the run (the broker is stopped, then its
FileStorage file is iterated read-only; with another storage only the CPU): messages
per commit and records written per message (a put an acknowledgement cancels in the
same commit is never written).  ``--engine`` picks the storage of every mqttamqp run:
``file`` (the default FileStorage), ``sqlite`` (RelStorage on SQLite in the broker's
data directory) or ``postgresql`` (RelStorage on a throw-away local PostgreSQL cluster,
``tests/support/pgcluster.py``, a fresh database a run, stopped at the end).
With ``--mosquitto`` a Mosquitto run alternates with every mqttamqp run (same
load; its CPU per message beside mqttamqp's); with ``--baseline DIR`` so does a broker of
another checkout (``git worktree add DIR REV``; its ``mqttamqp`` is put first on the
broker's ``PYTHONPATH``, the same interpreter and packages): before and after a
change, side by side.  Every loop is bounded; brokers are stopped
by their process group.  The machine is shared: compare CPU per message, and only
within one run of this script.
"""

import argparse
import json
import os
import signal
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brokers  # noqa: E402
import run  # noqa: E402


def commits_in(path):
    """(transactions, data records) of the FileStorage at ``path`` (read-only)."""
    from ZODB.FileStorage import FileIterator
    txns = records = 0
    it = FileIterator(path)
    try:
        for txn in it:
            txns += 1
            for _ in txn:
                records += 1
    finally:
        it.close()
    return txns, records


def storage_args(engine, cluster):
    """The ``--storage`` arguments of one mqttamqp run on ``engine`` (``cluster``: the
    PostgreSQL cluster, for ``postgresql``: a fresh database a run)."""
    if engine == "postgresql":
        return ("--storage", cluster.create_database())
    if engine == "sqlite":
        return ("--storage", "sqlite://")
    return ()


def one_run(label, args, help_text, env_extra, rep, storage=()):
    """One run of ``label``'s broker; ``storage``: its ``--storage`` arguments (mqttamqp)."""
    kind = "mosquitto" if label == "mosquitto" else "mqttamqp"
    if label == "baseline":
        env_extra = dict(env_extra, PYTHONPATH=os.path.abspath(args.baseline))
    cfg = {"counts": {2: args.count}, "timeout": args.timeout, "idle_s": 5.0,
           "window": args.window, "rx_nap_s": 0.0}
    extra = [*storage, *args.mqttamqp_arg] if kind == "mqttamqp" else args.mqttamqp_arg
    b = brokers.Broker(kind, label=label, mqttamqp_help_text=help_text,
                       mqttamqp_env=env_extra, extra_args=extra,
                       want_inflight=True)
    b.start()
    try:
        pid = b.pid
        before = brokers.proc_threads(pid)
        fs0 = None
        if kind == "mqttamqp":
            fs = os.path.join(b.tmp, "data", "mqttamqp.fs")
            fs0 = commits_in(fs) if os.path.exists(fs) else (0, 0)
        res = run.run_throughput(2, b, cfg, f"{label}-p{rep}")
        after = brokers.proc_threads(pid)
        b.stop()
        by_thread = brokers.threads_per_unit(pid, before, after, 1,
                                             group=lambda key, row: key[0])
        threads = {tid: round((part["user_us"] + part["sys_us"]) / 1e6, 3)   # (seconds)
                   for tid, part in by_thread.items()}
        n = res.get("delivered") or 0
        out = {"broker": label, "msgs_per_s": res.get("value"), "delivered": n,
               "loss": res.get("loss"), "cpu_us_per_msg": res.get("broker_cpu_us_per_msg"),
               "threads_cpu_s": threads, "other_cpu_s_est": res.get("other_cpu_s_est")}
        if n:
            split = brokers.threads_per_unit(pid, before, after, n)
            main = split.get("main", {"user_us": 0.0, "sys_us": 0.0})
            other = split.get("other_threads", {"user_us": 0.0, "sys_us": 0.0})
            out["reactor_us_per_msg"] = main["user_us"] + main["sys_us"]
            out["other_threads_us_per_msg"] = other["user_us"] + other["sys_us"]
            out["reactor_system_us_per_msg"] = main["sys_us"]
            out["other_threads_system_us_per_msg"] = other["sys_us"]
        if kind == "mqttamqp" and os.path.exists(fs):   # (FileStorage only)
            t1, r1 = commits_in(fs)
            t, r = t1 - fs0[0], r1 - fs0[1]
            out.update({"commits": t, "records": r,
                        "msgs_per_commit": n / t if t else None,
                        "records_per_msg": r / n if n else None,
                        "commits_per_s": (t / res["end_to_end_s"]
                                          if res.get("end_to_end_s") else None)})
        return out
    finally:
        b.stop()
        b.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--count", type=int, default=50_000)
    ap.add_argument("--window", type=int, default=100,
                    help="the publisher's QoS 1 messages in flight (run.py's scenario 2: "
                         "100; above the --max-inflight of 100 the bench gives each "
                         "broker, they queue behind the subscriber's window)")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--mosquitto", action="store_true")
    ap.add_argument("--baseline", metavar="DIR")
    ap.add_argument("--engine", choices=("file", "sqlite", "postgresql"), default="file",
                    help="the storage of every mqttamqp run (module docstring)")
    ap.add_argument("--mqttamqp-arg", action="append", default=[])
    ap.add_argument("--out")
    args = ap.parse_args()
    brokers.raise_nofile()
    ok, help_text, env_extra = brokers.mqttamqp_help()
    if not ok:
        sys.exit("twistd mqttamqp --help failed:\n" + help_text[-1500:])
    kinds = (["mqttamqp"] + (["baseline"] if args.baseline else [])
             + (["mosquitto"] if args.mosquitto else []))
    if args.engine != "file" and any(a.startswith("--storage") for a in args.mqttamqp_arg):
        ap.error("--engine and --mqttamqp-arg=--storage both choose the storage: give one")
    signal.signal(signal.SIGTERM, run._on_signal)   # (the cluster and brokers stopped)
    runs = {k: [] for k in kinds}
    cluster = None
    if args.engine == "postgresql":
        sys.path.append(os.path.join(HERE, "..", "tests", "support"))
        from pgcluster import PostgresCluster
        cluster = PostgresCluster()
    try:
        if cluster is not None:
            cluster.start()
        for rep in range(args.runs):
            for kind in kinds:
                storage = () if kind == "mosquitto" else storage_args(args.engine, cluster)
                r = one_run(kind, args, help_text, env_extra, rep, storage)
                runs[kind].append(r)
                brief = {k: (round(v, 2) if isinstance(v, float) else v)
                         for k, v in r.items() if k != "threads_cpu_s"}
                run.log(f"{kind} run {rep}: {json.dumps(brief)}")
    finally:
        if cluster is not None:
            cluster.stop()
    summary = {}
    for kind, rs in runs.items():
        summary[kind] = {}
        for key in ("msgs_per_s", "cpu_us_per_msg", "reactor_us_per_msg",
                    "reactor_system_us_per_msg", "other_threads_us_per_msg",
                    "other_threads_system_us_per_msg", "msgs_per_commit", "records_per_msg",
                    "commits_per_s"):
            vals = [r[key] for r in rs if r.get(key) is not None]
            if vals:
                summary[kind][key] = {"median": statistics.median(vals),
                                      "min": min(vals), "max": max(vals)}
    doc = {"tool": "bench/durable_probe.py", "machine": run.machine_facts(),
           "baseline": args.baseline, "engine": args.engine,
           "build": brokers.mqttamqp_build(env_extra),
           "baseline_build": (brokers.mqttamqp_build(
               dict(env_extra, PYTHONPATH=os.path.abspath(args.baseline)))
               if args.baseline else None),
           "count": args.count, "window": args.window, "mqttamqp_args": args.mqttamqp_arg,
           "summary": summary, "runs": runs}
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
