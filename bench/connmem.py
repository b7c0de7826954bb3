#!/usr/bin/env python3
"""What one idle MQTT connection costs the broker, allocation by allocation.

    PYTHONPATH=. python bench/connmem.py [--count 2000] [--persistent] [--top 25]
                                         [--frames 1] [--broker-arg ARG] [--json]
                                         [--rss [--warmup N] [--trim] [--malloc-info FILE]]

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

``--rss`` measures that overhead here, without tracemalloc (which adds its own): the
process's RSS per connection, split into pymalloc's arenas (the blocks in use, by
size class, and what its pools leave free), the C heap (``mallinfo2``: in use and
free) and the rest, before and after the connections, and what one connection holds
alone (``one_connection``: ``sys.getsizeof`` of every object reachable through
``gc.get_referents`` from one protocol and not from another).  The RSS figure counts
whatever room the allocators had left free at the first reading as room the
connections found: two builds whose start-up leaves different slack (more modules
imported, say) differ by that slack / ``--count`` with the same per-connection
allocations.  ``--warmup N`` opens N connections (another worker) before the first
reading, which measures the cost of a connection in a broker that already has some,
without that start-up artefact; ``--trim`` (``malloc_trim(0)`` first) is another way.
Compare two trees by running each one's ``python`` on this script, alternating.
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


def rss_kib() -> dict[str, int]:
    """This process's resident set, KiB: ``VmRSS`` and its anonymous and file parts."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def mallinfo() -> dict[str, int]:
    """glibc's heap (``mallinfo2``): arena bytes taken from the system, in use, free."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = MallInfo2
    m = fn()
    return {"heap": m.arena, "heap_in_use": m.uordblks, "heap_free": m.fordblks,
            "mmapped": m.hblkhd}


def pymalloc() -> dict[str, object]:
    """pymalloc's state from ``sys._debugmallocstats`` (written on C's stderr):
    totals, and blocks in use per size class."""
    import re
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    out: dict[str, object] = {}
    classes: dict[int, int] = {}
    free: dict[int, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", line)
        if m and "obmalloc" not in out:
            classes[int(m.group(2))] = int(m.group(4))
            free[int(m.group(2))] = int(m.group(5))
            continue
        m = re.match(r"# (arenas allocated current|bytes in allocated blocks|"
                     r"bytes in available blocks|bytes in \d+ unused pools|"
                     r"bytes lost to pool headers|bytes lost to quantization|"
                     r"bytes lost to arena alignment)\s*=\s*([\d,]+)", line)
        if m:
            key = re.sub(r"\d+ ", "", m.group(1)).replace(" ", "_")
            out[key] = int(m.group(2).replace(",", ""))
        elif line.startswith("Total") and "total" not in out:
            out["total"] = int(line.split("=")[1].strip().replace(",", ""))
            out["obmalloc"] = True
    out.pop("obmalloc", None)
    out["classes"] = classes
    out["free_classes"] = free
    return out


def reach(root: object, stop: set[int]) -> dict[int, object]:
    """Objects reachable from ``root`` through ``gc.get_referents``, not going
    through the ids in ``stop`` nor into types, modules and code."""
    import types
    barrier = (type, types.ModuleType, types.FunctionType, types.CodeType,
               types.BuiltinFunctionType)
    seen: dict[int, object] = {}
    todo = [root]
    while todo and len(seen) < 100_000:
        o = todo.pop()
        if id(o) in seen or id(o) in stop or isinstance(o, barrier):
            continue
        seen[id(o)] = o
        todo.extend(gc.get_referents(o))
    return seen


def one_connection() -> dict[str, object]:
    """What one connection holds alone (``sys.getsizeof`` of each object reachable
    from its protocol and not from another connection's), by type."""
    conns = [o for o in gc.get_objects() if type(o).__name__ == "MQTTProtocol"]
    if len(conns) < 3:
        return {}
    a, b = conns[len(conns) // 2], conns[len(conns) // 2 + 1]
    shared = {id(getattr(a, name, None)) for name in (
        "factory", "broker", "clock", "meter", "limits", "strings")}
    shared |= {id(getattr(a.transport, name, None)) for name in ("reactor", "server")}
    ra, rb = reach(a, shared), reach(b, shared)
    own = [o for k, o in ra.items() if k not in rb]
    by: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for o in own:
        row = by[type(o).__qualname__]
        row[0] += 1
        row[1] += sys.getsizeof(o)
    return {"objects": len(own), "bytes": sum(r[1] for r in by.values()),
            "by_type": {k: v for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])}}


def memory() -> dict[str, object]:
    gc.collect()
    return {"rss_kib": rss_kib(), "malloc": mallinfo(), "pymalloc": pymalloc()}


def memory_delta(m0: dict, m1: dict, n: int) -> dict[str, object]:  # type: ignore[type-arg]
    """Per connection: RSS, and the allocators' parts of it."""
    rss = m1["rss_kib"]["VmRSS"] - m0["rss_kib"]["VmRSS"]
    per: dict[str, object] = {"rss_bytes_per_conn": round(rss * 1024 / n, 1)}
    for part in ("rss_kib", "malloc", "pymalloc"):
        for k, v in m1[part].items():
            if isinstance(v, int):
                per[f"{part}_{k}_before"] = m0[part].get(k, 0)
                per[f"{part}_{k}_after"] = v
    for part in ("malloc", "pymalloc"):
        for k, v in m1[part].items():
            if isinstance(v, int):
                per[f"{part}_{k}_per_conn"] = round((v - m0[part].get(k, 0)) / n, 1)
    c0, c1 = m0["pymalloc"]["classes"], m1["pymalloc"]["classes"]
    per["pymalloc_blocks_per_conn_by_size"] = {
        size: round((c1.get(size, 0) - c0.get(size, 0)) / n, 2)
        for size in sorted(set(c0) | set(c1))
        if abs(c1.get(size, 0) - c0.get(size, 0)) >= n // 100}
    f0, f1 = m0["pymalloc"]["free_classes"], m1["pymalloc"]["free_classes"]
    per["pymalloc_free_blocks_per_conn_by_size"] = {
        size: round((f1.get(size, 0) - f0.get(size, 0)) / n, 2)
        for size in sorted(set(f0) | set(f1))
        if abs(f1.get(size, 0) - f0.get(size, 0)) >= n // 100}
    return per


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
    ap.add_argument("--rss", action="store_true",
                    help="no tracemalloc: RSS per connection and the allocators' parts of it")
    ap.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="open N connections first (another loadgen worker), then measure "
                         "--count more: the cost of a connection once the broker has some, "
                         "without what the start-up left free in the allocators")
    ap.add_argument("--trim", action="store_true",
                    help="with --rss: malloc_trim(0) before the first reading, so that what the "
                         "C heap kept free from the start-up is not counted as room the "
                         "connections found")
    ap.add_argument("--malloc-info", metavar="FILE",
                    help="with --rss: glibc's malloc_info (its free chunks by size, XML) at "
                         "the second reading, into FILE")
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

    class WarmUp(protocol.ProcessProtocol):
        """The ``--warmup`` connections: opened before the first reading, closed
        with the measured ones."""
        buf = b""

        def outReceived(self, data: bytes) -> None:
            self.buf += data
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                tag = line.decode().partition(" ")[0]
                if tag == "READY":
                    self.transport.write(b"GO\n")
                elif tag == "CONNECTED":
                    report["warmup_connected"] = args.warmup
                    reactor.callLater(0.5, spawn, Worker(), args.count, "mem")

        def errReceived(self, data: bytes) -> None:
            sys.stderr.write(data.decode(errors="replace"))

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
        elif args.rss:
            if args.trim:
                import ctypes
                gc.collect()
                ctypes.CDLL(None).malloc_trim(0)
            state["mem0"] = memory()
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
            close_all()
            return
        if args.rss:
            if args.malloc_info:
                import ctypes
                libc = ctypes.CDLL(None)
                libc.fopen.restype = ctypes.c_void_p
                fp = libc.fopen(args.malloc_info.encode(), b"w")
                libc.malloc_info(0, ctypes.c_void_p(fp))
                libc.fclose(ctypes.c_void_p(fp))
            n = max(1, int(report["loadgen"].get("connected") or 0))  # type: ignore[union-attr]
            report["connected"] = n
            report.update(memory_delta(state["mem0"], memory(), n))  # type: ignore[arg-type]
            report["one_connection"] = one_connection()
            close_all()
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
        close_all()

    workers: list[protocol.ProcessProtocol] = []

    def close_all() -> None:
        """Every loadgen worker (the ``--warmup`` one too) closes its connections."""
        for w in workers:
            w.transport.write(b"CLOSE\n")

    def spawn(worker: protocol.ProcessProtocol, count: int, prefix: str) -> None:
        port = next(s for s in svc if getattr(s, "kind", "") == "MQTT").port.getHost().port
        wargs = {"host": "127.0.0.1", "port": port, "count": count, "window": 32,
                 "keepalive": 600, "clean": not args.persistent, "client_prefix": prefix,
                 "deadline": deadline}
        workers.append(worker)
        reactor.spawnProcess(worker, sys.executable,
                             [sys.executable, LOADGEN, "idle", json.dumps(wargs)],
                             env=os.environ.copy())

    def start() -> None:
        svc.startService()
        if args.warmup:
            spawn(WarmUp(), args.warmup, "warm")
        else:
            spawn(Worker(), args.count, "mem")
        reactor.callLater(args.timeout, reactor.stop)

    if not (args.cpu or args.rss):
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
    if args.json or args.cpu or args.rss:
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
