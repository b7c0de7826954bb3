#!/usr/bin/env python3
"""What runs late in the broker at 1,000 QoS 1 messages/s (issue 31, section 3).

    PYTHONPATH=. python bench/lateness.py [--seconds 10] [--persistent]
                                          [--broker-arg ARG ...] [--json]

Runs the broker in this process (the same ``makeService`` as ``twistd mqttamqp``,
MQTT on 127.0.0.1 port 0, data in a temporary directory, default options: the
archive on) and ``run.py`` scenario 7's load generators as child processes (a
publisher paced at 1,000 QoS 1 messages/s with a window of 100, each payload
stamped with its send time, and one QoS 1 subscriber, clean or with
``--persistent`` clean session 0).  Besides the subscriber's latency histogram it
records, inside the broker:

* every turn of the reactor: the time from the end of one ``epoll`` poll to the
  start of the next (the events of that poll handled, the timers run, and any wait
  for the GIL inside them), as a histogram;
* every garbage collection (``gc.callbacks``): count and pause by generation;
* the turns that took over 1 ms, and how many of them a collection overlapped;
* per message (the counts load does not move): reactor turns, delayed calls
  scheduled (``callLater``, by function), and, per thread of the broker's process,
  CPU time and context switches (voluntary: it slept and was woken; involuntary:
  preempted), from ``/proc/self/task``;
* with ``--profile N``, cProfile call counts per message (the N most called);
* with ``--callgrind`` (under ``valgrind --tool=callgrind --instr-atstart=no``),
  instructions collected only while the load runs: callgrind's total over the
  messages is the instructions per message at this pace (all threads);
* with ``--residence``, each PUBLISH's time split at the broker's read and send:
  the publisher's send (its payload's stamp) to the read, the end of the poll that
  woke the reactor to the read, the read to the subscriber's PUBLISH sent, and that
  send to the next poll (the rest of the turn), as histograms;
* with ``--perf``, ``perf stat`` of the broker's process over the load: system
  calls, context switches and CPU migrations, per message;
* with ``--jobs``, the periodic work's own durations: each delayed call run (a
  ``LoopingCall``'s step, ``$SYS``, the store's checks; by function), each step of the
  archive's feeding thread (its CPU time, the GIL it may hold, and its wall time), and
  the turns over 300 µs split by what ran in them (a delayed call, a collection, an
  archive step, or nothing but events).

The load generators are the same processes as ``run.py``'s, so the latencies are
comparable with scenario 7's (less the process start-up).  Every loop is bounded
(the load's deadline, ``--seconds`` + 60 s in all).  On a shared machine the
histograms move with other work; compare variants (``--broker-arg``) in one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brokers  # noqa: E402

LOADGEN = os.path.join(HERE, "loadgen.py")
SAMPLES = 100_000   # (per histogram: a bound on what a run keeps)
EDGES_US = (50, 100, 200, 300, 500, 750, 1000, 2000, 5000, 10000, 20000, 50000)


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(EDGES_US) + 1)
        self.n = 0
        self.total = 0.0
        self.max = 0.0
        self.samples: list[float] = []   # (the first SAMPLES, for the median and p90)

    def add(self, seconds: float) -> None:
        us = seconds * 1e6
        i = 0
        while i < len(EDGES_US) and us > EDGES_US[i]:
            i += 1
        self.counts[i] += 1
        self.n += 1
        if self.n <= SAMPLES:
            self.samples.append(us)
        self.total += seconds
        self.max = max(self.max, seconds)

    def report(self) -> dict[str, Any]:
        ordered = sorted(self.samples)
        quantiles = ({"p50_us": round(ordered[len(ordered) // 2], 1),
                      "p90_us": round(ordered[len(ordered) * 9 // 10], 1)} if ordered else {})
        return {"edges_us": list(EDGES_US), "counts": self.counts, "n": self.n,
                "total_s": round(self.total, 4), "max_ms": round(self.max * 1e3, 3),
                **quantiles}


def threads_per_message(before: dict[Any, Any], n: int) -> dict[str, dict[str, float]]:
    """Each thread's user and system CPU (µs) and context switches per message since
    ``before`` (``brokers.proc_threads`` of this process), by thread name (Python's
    names by native id; threads of one name are summed)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    return brokers.threads_per_unit(os.getpid(), before, brokers.proc_threads(os.getpid()),
                                    n, group=lambda key, row: names.get(key[0]) or row["name"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--broker-arg", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile the reactor thread while the load runs and report "
                         "the N functions of most calls, per message (call counts do "
                         "not move with the machine's load; times do)")
    ap.add_argument("--profile-out", metavar="FILE",
                    help="with --profile: also write the profile (pstats) to FILE")
    ap.add_argument("--callgrind", action="store_true",
                    help="run under valgrind --tool=callgrind --instr-atstart=no: "
                         "instructions are collected only while the load runs "
                         "(callgrind_control -i on/off; use a low --rate)")
    ap.add_argument("--residence", action="store_true",
                    help="split each PUBLISH's latency: from the publisher's send (its "
                         "payload's stamp) to the protocol's read (dataReceived), from "
                         "the end of the poll that woke the reactor to that read, and "
                         "from the read to the first send it causes (the subscriber's "
                         "PUBLISH), as histograms (wall time: compare on a quiet "
                         "machine)")
    ap.add_argument("--critical", type=int, default=0, metavar="N",
                    help="count the Python calls and built-in calls (sys.setprofile events) "
                         "of each turn that reads a PUBLISH, split at its first send to the "
                         "subscriber: from the poll's end to that send (the critical path "
                         "of the latency) and from it to the next poll; with the N "
                         "functions most called before the send (counts: the machine's "
                         "load does not move them)")
    ap.add_argument("--jobs", action="store_true",
                    help="time the periodic work: each delayed call run (by function), "
                         "each archive feeding step (CPU and wall), and split the turns "
                         "over 300 us by what ran in them")
    ap.add_argument("--perf", action="store_true",
                    help="perf stat the broker's process (system calls, context switches, "
                         "instructions) while the load runs")
    args = ap.parse_args()

    from twisted.internet import protocol, reactor

    from mqttamqp.options import Options
    from mqttamqp.service import makeService

    data = tempfile.mkdtemp(prefix="lateness-")
    opts = Options()
    opts.parseOptions(["--data", data, "--mqtt", "tcp:0:interface=127.0.0.1", "--amqp", "none",
                       "--web", "none", "--mqtt-ws", "none", "--metrics", "none",
                       "--max-inflight", "100", *args.broker_arg])
    svc = makeService(opts)
    deadline = time.monotonic() + args.seconds + 60
    n = args.seconds * args.rate
    report: dict[str, Any] = {"seconds": args.seconds, "rate": args.rate,
                              "persistent": args.persistent, "broker_args": args.broker_arg}

    turns = Histogram()
    gcs = {0: Histogram(), 1: Histogram(), 2: Histogram()}
    recording = [False]
    gc_start = [0.0]
    gc_during_turn = [False]
    late = {"turns_over_1ms": 0, "with_gc": 0}
    last_poll_end = [0.0]
    timer_in_turn = [False]   # (``--jobs``: a delayed call ran in this turn)
    step_in_turn = [False]   # (``--jobs``: an archive step took CPU during this turn)
    long_turns: dict[str, int] = {}   # (``--jobs``: turns over 300 us, by what ran)
    job_times: dict[str, Histogram] = {}   # (``--jobs``: each delayed call's run)
    # (``--jobs``: archive steps; "pack": the step's CPU before its exchange with the
    # writer, the take, the packing and the previous answer's handling)
    step_cpu, step_pack_cpu, step_wall = Histogram(), Histogram(), Histogram()
    pack_cpu = Histogram()   # (``--jobs``: each ``pack`` of a step's messages)
    sent_at = [0.0]   # (``--residence``: when this turn's PUBLISH went to the subscriber)
    send_to_poll = Histogram()

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        elif recording[0]:
            gcs[info["generation"]].add(time.perf_counter() - gc_start[0])
            gc_during_turn[0] = True

    class Poller:
        """The reactor's epoll object, timing the work between two polls: the
        events of one poll are handled (and the timers run) before the next."""

        def __init__(self, real: Any) -> None:
            self._real = real

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

        def poll(self, *a: Any) -> Any:
            started = time.perf_counter()
            if recording[0] and last_poll_end[0]:
                work = started - last_poll_end[0]
                turns.add(work)
                if work > 0.001:
                    late["turns_over_1ms"] += 1
                    if gc_during_turn[0]:
                        late["with_gc"] += 1
                if args.jobs and work > 0.0003:
                    what = ("gc" if gc_during_turn[0] else "timer" if timer_in_turn[0]
                            else "archive_step" if step_in_turn[0] else "events_only")
                    long_turns[what] = long_turns.get(what, 0) + 1
            gc_during_turn[0] = False
            timer_in_turn[0] = step_in_turn[0] = False
            if critical_on[0]:
                sys.setprofile(None)
                critical_on[0] = False
                if critical_phase[0] == 1:
                    critical_after.append(critical_count[0] - critical_mark[0])
                else:
                    critical_other.append(critical_count[0])
            if sent_at[0]:   # (``--residence``: the turn's rest after its PUBLISH went out)
                send_to_poll.add(started - sent_at[0])
                sent_at[0] = 0.0
            try:
                return self._real.poll(*a)
            finally:
                last_poll_end[0] = time.perf_counter()
                if args.critical and recording[0]:
                    critical_count[0] = critical_mark[0] = 0
                    critical_phase[0] = 0
                    turn_names.clear()
                    critical_on[0] = True
                    sys.setprofile(critical_counter)

    # (``--critical``: sys.setprofile events of each turn, split at its PUBLISH's send)
    critical_on = [False]
    critical_phase = [0]   # 0: before the turn's PUBLISH went out, 1: after
    critical_count = [0]
    critical_mark = [0]
    critical_before: list[int] = []
    critical_after: list[int] = []
    critical_other: list[int] = []
    critical_names: dict[str, int] = {}
    turn_names: dict[str, int] = {}   # (this turn's, until its PUBLISH is sent)
    after_names: dict[str, int] = {}   # (after the PUBLISH's send, every such turn)

    def critical_counter(frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            critical_count[0] += 1
            code = frame.f_code
            name = f"{os.path.basename(code.co_filename)}:{code.co_name}"
            if event == "c_call":   # (a built-in, by its caller)
                name = f"{name}>{getattr(arg, '__qualname__', repr(arg))}"
            if not critical_phase[0]:
                turn_names[name] = turn_names.get(name, 0) + 1
            else:
                after_names[name] = after_names.get(name, 0) + 1

    reactor._poller = Poller(reactor._poller)   # type: ignore[attr-defined]
    wake_to_read, read_to_send, sent_to_read = Histogram(), Histogram(), Histogram()
    if args.critical:
        from mqttamqp.mqtt import protocol as critical_protocol

        real_critical_send = critical_protocol.send

        def critical_sent(transport: Any, data: bytes) -> None:
            if critical_on[0] and not critical_phase[0] and data[0] >> 4 == 3:
                critical_phase[0] = 1
                critical_mark[0] = critical_count[0]
                critical_before.append(critical_count[0])
                for name, count in turn_names.items():
                    critical_names[name] = critical_names.get(name, 0) + count
            real_critical_send(transport, data)

        critical_protocol.send = critical_sent   # type: ignore[assignment]
    if args.residence:
        # (the protocol module's own ``send`` and ``dataReceived``, wrapped: each
        # read's first send is its PUBLISH to the subscriber; a PUBACK's read sends
        # nothing and is not counted)
        from mqttamqp.mqtt import protocol as mqtt_protocol

        real_received = mqtt_protocol.MQTTProtocol.dataReceived
        real_send = mqtt_protocol.send
        read_at = [0.0]
        read_ns = [0]

        def received(self: Any, data: bytes) -> None:
            if recording[0]:
                read_at[0] = time.perf_counter()
                read_ns[0] = time.monotonic_ns()   # (the load generator's stamps' clock)
            real_received(self, data)
            read_at[0] = 0.0

        def publisher_sent_ns(data: bytes) -> int:
            """The publisher's send time in a QoS 1 PUBLISH's payload (3.1.1: no
            properties; ``loadgen``'s stamp: scheduled, then sent, 8 bytes each)."""
            i = 1
            while data[i] & 0x80:   # (the remaining length)
                i += 1
            i += 1
            offset = i + 2 + ((data[i] << 8) | data[i + 1]) + 2   # (topic, packet id)
            return int.from_bytes(data[offset + 8:offset + 16], "big")

        def sent(transport: Any, data: bytes) -> None:
            if read_at[0]:
                now = time.perf_counter()
                wake_to_read.add(read_at[0] - last_poll_end[0])
                read_to_send.add(now - read_at[0])
                read_at[0] = 0.0
                if data[0] >> 4 == 3 and len(data) > 20:
                    sent_to_read.add((read_ns[0] - publisher_sent_ns(data)) / 1e9)
                    sent_at[0] = now
            real_send(transport, data)

        mqtt_protocol.MQTTProtocol.dataReceived = received   # type: ignore[method-assign]
        mqtt_protocol.send = sent   # type: ignore[assignment]
    timers: dict[str, int] = {}
    real_call_later = reactor.callLater

    def call_later(delay: float, f: Any, *a: Any, **kw: Any) -> Any:
        name = getattr(f, "__qualname__", repr(f))
        if recording[0]:
            timers[name] = timers.get(name, 0) + 1
        if args.jobs:
            real_f = f

            def timed(*a: Any, **kw: Any) -> Any:
                began = time.perf_counter()
                try:
                    return real_f(*a, **kw)
                finally:
                    if recording[0]:
                        timer_in_turn[0] = True
                        job_times.setdefault(name, Histogram()).add(
                            time.perf_counter() - began)

            f = timed
        return real_call_later(delay, f, *a, **kw)

    reactor.callLater = call_later   # type: ignore[method-assign]
    threads0: list[dict[Any, Any]] = []
    archive = getattr(svc, "archive", None)   # (None with --no-archive)
    steps0: list[int] = []
    if args.jobs and archive is not None:
        # (the feeding thread's exchange with the writer process, wrapped: a step's
        # CPU is the thread's CPU from one exchange's end to the next's; its wall
        # time, the exchange's start to end, the writer's work included)
        writer = archive._writer
        real_exchange = writer.exchange
        last_end = [0.0]

        def exchange(frame: Any, *a: Any, **kw: Any) -> Any:
            began = time.perf_counter()
            cpu_in = time.thread_time()
            try:
                return real_exchange(frame, *a, **kw)
            finally:
                cpu = time.thread_time()
                if recording[0] and last_end[0]:
                    step_cpu.add(cpu - last_end[0])
                    step_pack_cpu.add(cpu_in - last_end[0])
                    step_wall.add(time.perf_counter() - began)
                    step_in_turn[0] = True
                last_end[0] = cpu

        writer.exchange = exchange
        # (``pack``, looked up in the archive module's globals at each call, compiled
        # or not: a step's packing of the messages it took, one GIL hold)
        from mqttamqp.archive import archive as archive_module
        real_pack = archive_module.pack

        def timed_pack(*a: Any) -> Any:
            began = time.thread_time()
            try:
                return real_pack(*a)
            finally:
                if recording[0]:
                    pack_cpu.add(time.thread_time() - began)

        archive_module.pack = timed_pack

    def writer_cpu() -> float:
        """The archive writer process's CPU seconds (user + system), or 0."""
        child = getattr(getattr(archive, "_writer", None), "_child", None)
        try:
            with open(f"/proc/{child.pid}/stat") as f:   # type: ignore[union-attr]
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (AttributeError, OSError, IndexError, ValueError):
            return 0.0

    writer_cpu0: list[float] = []
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
    perf: list[Any] = []
    gc.callbacks.append(on_gc)
    procs: dict[str, Any] = {}
    cpu0: list[float] = []

    class Worker(protocol.ProcessProtocol):
        def __init__(self, name: str) -> None:
            self.name = name
            self.buf = b""

        def outReceived(self, chunk: bytes) -> None:
            self.buf += chunk
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                tag, _, rest = line.decode().partition(" ")
                if tag == "READY" and self.name == "sub":
                    spawn("pub")
                elif tag == "READY" and self.name == "pub":
                    recording[0] = True
                    cpu0.append(time.process_time())
                    threads0.append(brokers.proc_threads(os.getpid()))
                    if args.callgrind:
                        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())],
                                       stdout=subprocess.DEVNULL, timeout=60, check=False)
                    if archive is not None:
                        steps0.append(archive._steps)
                        writer_cpu0.append(writer_cpu())
                    if profiler is not None:
                        profiler.enable()
                    if args.perf:
                        perf.append(subprocess.Popen(
                            ["perf", "stat", "-x,", "-e",
                             "raw_syscalls:sys_enter,context-switches,cpu-migrations",
                             "-p", str(os.getpid()), "--", "sleep",
                             str(max(1, args.seconds - 1))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
                    self.transport.write(b"GO\n")
                elif tag == "RESULT":
                    report[self.name] = json.loads(rest) if rest else {}
                    if self.name == "sub":
                        recording[0] = False
                        if args.callgrind:
                            subprocess.run(["callgrind_control", "-i", "off",
                                            str(os.getpid())],
                                           stdout=subprocess.DEVNULL, timeout=60, check=False)
                        if profiler is not None:
                            profiler.disable()
                        report["broker_cpu_us_per_msg"] = (
                            (time.process_time() - cpu0[0]) * 1e6 / max(1, n))
                        report["threads_per_msg"] = threads_per_message(threads0[0],
                                                                        max(1, n))
                        if archive is not None:
                            report["archive_steps_per_msg"] = round(
                                (archive._steps - steps0[0]) / max(1, n), 5)
                            report["archive_writer_process_cpu_us_per_msg"] = round(
                                (writer_cpu() - writer_cpu0[0]) * 1e6 / max(1, n), 2)
                        reactor.callLater(0.2, reactor.stop)

        def errReceived(self, chunk: bytes) -> None:
            sys.stderr.write(chunk.decode(errors="replace"))

    def spawn(name: str) -> None:
        port = next(s for s in svc if getattr(s, "kind", "") == "MQTT").port.getHost().port
        if name == "sub":
            role, wargs = "sub", {"host": "127.0.0.1", "port": port, "conns": 1,
                                  "filters": ["bench/lat"], "qos": 1,
                                  "clean": not args.persistent, "client_prefix": "late-sub",
                                  "expected": n, "deadline": deadline, "idle_s": 5.0,
                                  "latency": True}
        else:
            role, wargs = "pubq", {"host": "127.0.0.1", "port": port, "qos": 1,
                                   "topic": "bench/lat", "payload_len": 64, "count": n,
                                   "window": 100, "rate": args.rate, "stamp": True,
                                   "client_prefix": "late-pub", "deadline": deadline}
        worker = Worker(name)
        procs[name] = worker
        reactor.spawnProcess(worker, sys.executable,
                             [sys.executable, LOADGEN, role, json.dumps(wargs)],
                             env=os.environ.copy())

    def start() -> None:
        svc.startService()
        reactor.callLater(0.5, spawn, "sub")
        reactor.callLater(args.seconds + 60, reactor.stop)

    reactor.callWhenRunning(start)
    try:
        reactor.run()
    finally:
        gc.callbacks.remove(on_gc)
        try:
            svc.stopService()
        except Exception:
            pass
        for w in procs.values():
            try:
                w.transport.signalProcess("KILL")   # (only our own children, by PID)
            except Exception:
                pass
        shutil.rmtree(data, ignore_errors=True)
    sub = report.get("sub", {})
    report["latency_from_send"] = sub.get("latency_from_send")
    report["reactor_turns"] = turns.report()
    report["gc"] = {str(g): h.report() for g, h in gcs.items()}
    report["late_turns"] = late
    report["turns_per_msg"] = round(turns.n / max(1, n), 3)
    if args.residence:
        report["residence"] = {"publisher_send_to_read": sent_to_read.report(),
                               "wake_to_read": wake_to_read.report(),
                               "read_to_send": read_to_send.report(),
                               "send_to_next_poll": send_to_poll.report()}
    if args.jobs:
        report["jobs"] = {
            "timer_runs": {k: h.report() for k, h in job_times.items()},
            "archive_step_cpu": step_cpu.report(),
            "archive_step_cpu_before_exchange": step_pack_cpu.report(),
            "archive_pack_cpu": pack_cpu.report(),
            "archive_step_wall": step_wall.report(),
            "turns_over_300us_by_what_ran": long_turns}
    report["timers_per_msg"] = {k: round(v / max(1, n), 4) for k, v in
                                sorted(timers.items(), key=lambda kv: -kv[1])}
    if profiler is not None:
        import pstats
        if args.profile_out:
            profiler.dump_stats(args.profile_out)
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        rows = sorted(stats.items(), key=lambda kv: -kv[1][1])[:args.profile]
        report["profile_per_msg"] = [
            {"function": f"{os.path.basename(fn)}:{line}:{name}",
             "calls": round(cc / max(1, n), 3), "tottime_us": round(tt * 1e6 / max(1, n), 2),
             "cumtime_us": round(ct * 1e6 / max(1, n), 2)}
            for (fn, line, name), (_, cc, tt, ct, _) in rows]
    if args.critical:
        def spread(values: list[int]) -> dict[str, Any]:
            values = sorted(values)
            if not values:
                return {"n": 0}
            return {"n": len(values), "median": values[len(values) // 2],
                    "min": values[0], "max": values[-1],
                    "mean": round(sum(values) / len(values), 1)}
        turns_sent = max(1, len(critical_before))
        report["critical"] = {
            "profile_events_before_send": spread(critical_before),
            "profile_events_after_send": spread(critical_after),
            "profile_events_other_turns": spread(critical_other),
            "before_send_by_function_per_turn": {
                k: round(v / turns_sent, 3) for k, v in sorted(
                    critical_names.items(), key=lambda kv: -kv[1])[:args.critical]},
            "after_send_by_function_per_turn": {
                k: round(v / turns_sent, 3) for k, v in sorted(
                    after_names.items(), key=lambda kv: -kv[1])[:args.critical]}}
    if perf:
        # (perf measured seconds - 1 of the load: per message at the paced rate)
        try:
            _, err = perf[0].communicate(timeout=30)
        except subprocess.TimeoutExpired:
            perf[0].kill()   # (our own child, by its Popen)
            _, err = perf[0].communicate()
        measured = max(1, args.seconds - 1) * args.rate
        counts = {}
        for line in err.splitlines():
            parts = line.split(",")
            if len(parts) > 2 and parts[0].strip().isdigit():
                counts[parts[2]] = round(int(parts[0]) / measured, 2)
        report["perf_per_msg"] = counts
    report["gc_threshold"] = gc.get_threshold()
    report["gc_frozen_objects"] = gc.get_freeze_count()
    report["loadavg"] = os.getloadavg()
    report.pop("sub", None)
    report["publisher"] = report.pop("pub", None)
    print(json.dumps(report, indent=None if not args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
