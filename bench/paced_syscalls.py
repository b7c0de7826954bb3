#!/usr/bin/env python3
"""System calls and context switches per message at scenario 7's pace, for both brokers.

    python bench/paced_syscalls.py [--broker both|mqttamqp|mosquitto] [--seconds 6]
                                   [--rate 1000] [--repeat 1] [--mqttamqp-arg ARG ...]

Starts each broker as ``run.py`` does (a fresh process, the same options: the
archive on for mqttamqp, persistence off for Mosquitto), connects ``run.py``
scenario 7's load generators (one QoS 1 subscriber, clean; one publisher paced at
``--rate`` QoS 1 messages/s with a window of 100, 64-byte stamped payloads), and
while the load runs counts, in the broker's process only:

* ``perf stat --per-thread`` of the system calls the two brokers make on this path
  (``syscalls:sys_enter_<name>`` for each name in ``SYSCALLS``, and
  ``raw_syscalls:sys_enter`` for all of them), per thread (named by its ``comm``);
* the voluntary and non-voluntary context switches of each thread
  (``/proc/PID/task/TID/status``), from the load's start to its end.

Each figure is divided by the messages the subscriber received during perf's
window (its count when the window opened and when it closed, asked with
``loadgen.py``'s ``MARK``), printed as ``received_in_window`` beside the nominal
count (seconds × rate, ``nominal_in_window``); ``load_ended_in_window`` says the
load ended before the window did (then the window's end counts all it received).  These counts are
what the machine's load does not move (a loaded machine changes how often two
events share one turn, so give the turns with them: ``epoll_wait`` per message).
The latencies printed beside them are indicative only.  Every loop is bounded
(the load's deadline); only the processes this script started are stopped, by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brokers  # noqa: E402
import run  # noqa: E402

SYSCALLS = ("epoll_wait", "epoll_pwait", "epoll_ctl", "read", "recvfrom", "recvmsg",
            "write", "sendto", "sendmsg", "writev", "futex", "clock_gettime", "getpid",
            "poll", "ppoll", "select", "pselect6", "newfstatat", "lseek",
            "openat", "close", "fsync", "fdatasync", "getrusage", "madvise", "mmap",
            "munmap", "brk", "nanosleep", "clock_nanosleep", "sched_yield",
            "timerfd_settime", "getsockopt", "setsockopt", "ioctl", "rt_sigprocmask")


def parse_perf(text: str) -> dict[str, dict[str, int]]:
    """``perf stat -x, --per-thread`` lines → {thread: {event: count}}."""
    table: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 4:
            continue
        thread = parts[0].strip()
        value = parts[1].strip()
        event = parts[3].strip()
        if not value.isdigit():
            continue
        count = int(value)
        if count:
            table.setdefault(thread, {})[event] = count
    return table


def mark(sub: run.Worker, edge: int, timeout: float) -> int | None:
    """Wait (bounded) for the next line on the pipe ``edge``, then ask the subscriber
    what it has received: its count, or None if it had already finished."""
    ready, _, _ = select.select([edge], [], [], timeout)
    if not ready or not os.read(edge, 64):
        raise TimeoutError("the measurement window's edge did not come")
    sub.send("MARK")
    try:
        marked: dict = sub.expect("MARKED", 10)
    except RuntimeError:
        if sub.result is None:
            raise
        return None   # (it received everything before the window closed)
    return int(marked["received"])


def one_run(kind: str, args: argparse.Namespace, help_text: str,
            env_extra: dict[str, str]) -> dict:
    broker = brokers.Broker(kind, label=kind, mqttamqp_help_text=help_text,
                            mqttamqp_env=env_extra, extra_args=args.mqttamqp_arg,
                            want_inflight=True)
    broker.start()
    n = args.seconds * args.rate
    deadline = time.monotonic() + args.seconds + 30
    workers = []
    res: dict = {"broker": kind, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    try:
        broker.settle(max_s=5)
        topic = "bench/lat"
        sub = run.Worker("sub", {"host": run.HOST, "port": broker.port, "conns": 1,
                                 "filters": [topic], "qos": 1, "clean": True,
                                 "client_prefix": "sys-sub", "expected": n,
                                 "deadline": deadline, "idle_s": 5.0, "latency": True}, "sub")
        workers.append(sub)
        sub.expect("READY", 60)
        pub = run.Worker("pubq", {"host": run.HOST, "port": broker.port, "qos": 1,
                                  "topic": topic, "payload_len": run.PAYLOAD, "count": n,
                                  "window": 100, "rate": args.rate, "stamp": True,
                                  "client_prefix": "sys-pub", "deadline": deadline}, "pub")
        workers.append(pub)
        pub.expect("READY", 60)
        measured = max(1, args.seconds - 2)   # (a second of margin at each end)
        events = ",".join(["raw_syscalls:sys_enter"] + [
            "syscalls:sys_enter_" + s for s in SYSCALLS
            if os.path.isdir("/sys/kernel/tracing/events/syscalls/sys_enter_" + s)])
        pub.send("GO")
        time.sleep(1.0)   # (pacing the measurement window, not waiting for an event)
        # The window is the life of the command perf runs (perf's own start-up, a
        # second or so with this many events, comes before it): that command says
        # when it starts and ends on a pipe, and the subscriber is asked then what it
        # has received (``MARK``: its answer comes within a millisecond or so).
        edge_r, edge_w = os.pipe()
        before = brokers.proc_threads(broker.pid)
        perf = subprocess.Popen(
            ["perf", "stat", "-x,", "--per-thread", "-e", events, "-p", str(broker.pid),
             "--", "sh", "-c", f"echo >&{edge_w}; sleep {measured}; echo >&{edge_w}"],
            pass_fds=(edge_w,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        os.close(edge_w)
        try:
            try:
                marks = [mark(sub, edge_r, measured + 30) for _ in range(2)]
            except TimeoutError:
                # (perf ended without running the command, or it never came back:
                # what perf said is the error to record)
                perf.kill()
                _, perf_err = perf.communicate(timeout=30)
                raise RuntimeError("perf stat failed: " + (perf_err or "")[-500:]) from None
            _, perf_err = perf.communicate(timeout=30)
        finally:
            os.close(edge_r)
            if perf.poll() is None:
                perf.kill()
                perf.wait(10)
        after = brokers.proc_threads(broker.pid)
        sres = sub.expect("RESULT", args.seconds + 40)
        pub.expect("RESULT", 30)
        if marks[0] is None:
            raise RuntimeError("the subscriber had received everything before the "
                               "measurement window opened: nothing to divide by")
        received = [m if m is not None else sres.get("received", 0) for m in marks]
        counted = max(1, received[1] - received[0])
        res.update({"received_in_window": received[1] - received[0],
                    "nominal_in_window": measured * args.rate,
                    "load_ended_in_window": marks[1] is None})
        per_thread = parse_perf(perf_err)
        res["syscalls_per_msg"] = {
            thread: {ev.replace("syscalls:sys_enter_", ""): round(c / counted, 3)
                     for ev, c in sorted(evs.items(), key=lambda kv: -kv[1])}
            for thread, evs in per_thread.items()}
        res["switches_per_msg"] = {
            f"{row['name']}-{key[0]}": {
                "voluntary": round((row["voluntary"] - before[key]["voluntary"]) / counted, 3),
                "nonvoluntary": round(
                    (row["involuntary"] - before[key]["involuntary"]) / counted, 3)}
            for key, row in after.items() if key in before
            and (row["voluntary"] != before[key]["voluntary"]
                 or row["involuntary"] != before[key]["involuntary"])}
        lat = sres.get("latency_from_send") or {}
        res.update({"delivered": sres.get("received"), "p50_ms": lat.get("p50_ms"),
                    "p99_ms": lat.get("p99_ms"), "measured_s": measured,
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]})
        if perf.returncode != 0:
            res["perf_error"] = perf_err[-500:]
    finally:
        for wk in workers:
            wk.stop()
        broker.stop()
        broker.cleanup()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--broker", default="both", choices=("both", "mqttamqp", "mosquitto"))
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--mqttamqp-arg", action="append", default=[])
    args = ap.parse_args()
    ok, help_text, env_extra = brokers.mqttamqp_help()
    kinds = ["mqttamqp", "mosquitto"] if args.broker == "both" else [args.broker]
    runs = []
    for _ in range(max(1, args.repeat)):
        for kind in kinds:
            if kind == "mqttamqp" and not ok:
                runs.append({"broker": kind, "error": help_text[-500:]})
                continue
            runs.append(one_run(kind, args, help_text, env_extra))
    print(json.dumps({"rate": args.rate, "seconds": args.seconds, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
