#!/usr/bin/env python3
"""What one idle MQTT connection costs the broker, allocation by allocation.

    PYTHONPATH=. python bench/connmem.py [--count 2000] [--persistent] [--top 25]
                                         [--frames 1] [--broker-arg ARG] [--json]

Runs the broker in this process (the same ``makeService`` as ``twistd mqttamqp``,
MQTT on 127.0.0.1 port 0, data in a temporary directory) with ``tracemalloc`` on,
and one ``loadgen.py idle`` worker (a child process, spawned through the reactor so
nothing here blocks it) that opens ``--count`` MQTT 3.1.1 connections
(CONNECT/CONNACK, keepalive 600; clean session 1, or 0 with ``--persistent``).

It prints, per connection: the traced bytes, the allocation sites that grew most
(``--frames 1``: by line; more: by call chain) and the objects that appeared,
counted by type with their shallow sizes (``sys.getsizeof``; what the garbage
collector tracks, so not strings, bytes or ints alone).  ``--cpu`` measures
instead the broker process's CPU time from the first connect to the last CONNACK
(per connection; ``--cprofile FILE`` also profiles that phase; ``--callgrind`` turns
callgrind's collection on for exactly that phase, so that under

    PYTHONPATH=. valgrind --tool=callgrind --collect-atstart=no \\
        --callgrind-out-file=/tmp/cg.out python3 bench/connmem.py --cpu --callgrind

(``python3`` the interpreter itself, not a wrapper script such as pyenv's shim) the
instructions collected / connections is a figure that does not move with the
machine's load: compare changes with it).  Figures are exact for
the allocations of this process, and independent of the machine's load; RSS per
connection (scenario 6 of ``run.py``) adds the allocator's overhead.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
LOADGEN = os.path.join(HERE, "loadgen.py")


def census() -> dict[str, list[int]]:
    """Objects the collector tracks, by type: [count, shallow bytes]."""
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for o in gc.get_objects():
        t = type(o)
        row = out[f"{t.__module__}.{t.__qualname__}"]
        row[0] += 1
        try:
            row[1] += sys.getsizeof(o)
        except TypeError:
            pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--persistent", action="store_true", help="clean session 0")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--frames", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--broker-arg", action="append", default=[])
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--cpu", action="store_true",
                    help="no tracemalloc: the broker process's CPU per connect instead")
    ap.add_argument("--cprofile", metavar="FILE",
                    help="with --cpu: cProfile the connect phase into FILE")
    ap.add_argument("--callgrind", action="store_true",
                    help="with --cpu: toggle callgrind's collection around the connect phase")
    args = ap.parse_args()

    from twisted.internet import protocol, reactor

    from mqttamqp.options import Options
    from mqttamqp.service import makeService

    data = tempfile.mkdtemp(prefix="connmem-")
    opts = Options()
    opts.parseOptions(["--data", data, "--mqtt", "tcp:0:interface=127.0.0.1", "--amqp", "none",
                       "--web", "none", "--mqtt-ws", "none", "--metrics", "none",
                       "--max-connections", "1048576", *args.broker_arg])
    svc = makeService(opts)
    toggle = None
    if args.callgrind:
        from amqp_cost import callgrind_toggle
        toggle = callgrind_toggle()
    report: dict[str, object] = {"count": args.count, "persistent": args.persistent}
    deadline = time.monotonic() + args.timeout
    state: dict[str, object] = {}

    class Worker(protocol.ProcessProtocol):
        buf = b""

        def outReceived(self, data: bytes) -> None:
            self.buf += data
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                tag, _, rest = line.decode().partition(" ")
                if tag == "READY":
                    reactor.callLater(0.5, ready, self)
                elif tag == "CONNECTED":
                    if toggle is not None:
                        toggle()   # (collection off: the connect phase is over)
                    report["loadgen"] = json.loads(rest)
                    reactor.callLater(1.0, connected, self)
                elif tag == "RESULT":
                    report["loadgen_result"] = json.loads(rest) if rest else {}

        def errReceived(self, data: bytes) -> None:
            sys.stderr.write(data.decode(errors="replace"))

        def processEnded(self, reason: object) -> None:
            if reactor.running:
                reactor.stop()

    def settle() -> tracemalloc.Snapshot:
        gc.collect()
        return tracemalloc.take_snapshot()

    gc_time = [0.0, 0.0, 0, 0]   # CPU seconds in collections, start, count, gen-2 count

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_time[1] = time.process_time()
        else:
            gc_time[0] += time.process_time() - gc_time[1]
            gc_time[2] += 1
            gc_time[3] += info.get("generation") == 2

    def ready(worker: Worker) -> None:
        if args.cpu:
            gc.collect()
            gc.callbacks.append(on_gc)
            if args.cprofile:
                import cProfile
                state["prof"] = prof = cProfile.Profile()
                prof.enable()
            if toggle is not None:
                toggle()
            state["cpu0"] = time.process_time()
            state["main0"] = time.thread_time()
            state["ru0"] = resource.getrusage(resource.RUSAGE_THREAD)
        else:
            state["census0"] = census()
            state["snap0"] = settle()
        worker.transport.write(b"GO\n")

    def connected(worker: Worker) -> None:
        if args.cpu:
            cpu = time.process_time() - state["cpu0"]  # type: ignore[operator]
            main = time.thread_time() - state["main0"]  # type: ignore[operator]
            ru0, ru1 = state["ru0"], resource.getrusage(resource.RUSAGE_THREAD)
            if "prof" in state:
                state["prof"].disable()  # type: ignore[attr-defined]
                state["prof"].dump_stats(args.cprofile)  # type: ignore[attr-defined]
            n = max(1, int(report["loadgen"].get("connected") or 0))  # type: ignore[union-attr]
            report["connected"] = n
            report["cpu_us_per_conn"] = round(cpu * 1e6 / n, 1)
            report["reactor_thread_cpu_us_per_conn"] = round(main * 1e6 / n, 1)
            report["reactor_thread_user_us_per_conn"] = round(
                (ru1.ru_utime - ru0.ru_utime) * 1e6 / n, 1)  # type: ignore[union-attr]
            report["reactor_thread_system_us_per_conn"] = round(
                (ru1.ru_stime - ru0.ru_stime) * 1e6 / n, 1)  # type: ignore[union-attr]
            gc.callbacks.remove(on_gc)
            report["gc_us_per_conn"] = round(gc_time[0] * 1e6 / n, 1)
            report["gc_collections"] = gc_time[2]
            report["gc_full_collections"] = gc_time[3]
            report["connect_all_s"] = report["loadgen"].get("connect_all_s")  # type: ignore[union-attr]
            worker.transport.write(b"CLOSE\n")
            return
        snap1 = settle()
        census1 = census()
        n = max(1, int(report["loadgen"].get("connected") or 0))  # type: ignore[union-attr]
        key = "lineno" if args.frames <= 1 else "traceback"
        stats = snap1.compare_to(state["snap0"], key)  # type: ignore[arg-type]
        total = sum(s.size_diff for s in stats)
        report["connected"] = n
        report["traced_bytes_per_conn"] = round(total / n, 1)
        report["sites"] = [
            {"bytes_per_conn": round(s.size_diff / n, 1),
             "blocks_per_conn": round(s.count_diff / n, 2),
             "where": [f"{os.path.relpath(f.filename)}:{f.lineno}" for f in s.traceback][::-1]}
            for s in stats[:args.top]]
        c0 = state["census0"]
        types = []
        for name, (count, size) in census1.items():
            c, b = c0.get(name, (0, 0))  # type: ignore[union-attr]
            if count - c >= n // 2:
                types.append({"type": name, "per_conn": round((count - c) / n, 2),
                              "bytes_per_conn": round((size - b) / n, 1)})
        types.sort(key=lambda r: -r["bytes_per_conn"])
        report["objects"] = types[:args.top]
        worker.transport.write(b"CLOSE\n")

    def start() -> None:
        svc.startService()
        port = next(s for s in svc if getattr(s, "kind", "") == "MQTT").port.getHost().port
        wargs = {"host": "127.0.0.1", "port": port, "count": args.count, "window": 32,
                 "keepalive": 600, "clean": not args.persistent, "client_prefix": "mem",
                 "deadline": deadline}
        reactor.spawnProcess(Worker(), sys.executable,
                             [sys.executable, LOADGEN, "idle", json.dumps(wargs)],
                             env=os.environ.copy())
        reactor.callLater(args.timeout, reactor.stop)

    if not args.cpu:
        tracemalloc.start(max(1, args.frames))
    reactor.callWhenRunning(start)
    try:
        reactor.run()
    finally:
        try:
            svc.stopService()
        except Exception:
            pass
        shutil.rmtree(data, ignore_errors=True)
    if args.json or args.cpu:
        print(json.dumps({k: v for k, v in report.items() if k != "loadgen_result"}, indent=1))
        return 0
    print(f"{report.get('connected')} connections ({'persistent' if args.persistent else 'clean'}):"
          f" {report.get('traced_bytes_per_conn')} traced bytes each")
    for s in report.get("sites", []):  # type: ignore[union-attr]
        print(f"{s['bytes_per_conn']:8.1f} B {s['blocks_per_conn']:6.2f} blk  "
              + " <- ".join(reversed(s["where"])))
    print("objects (gc-tracked, shallow):")
    for t in report.get("objects", []):  # type: ignore[union-attr]
        print(f"{t['bytes_per_conn']:8.1f} B {t['per_conn']:6.2f}x  {t['type']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
