#!/usr/bin/env python3
"""Summarise py-spy speedscope profiles: where the broker's CPU samples went.

    python bench/pyspy_top.py PROFILE.speedscope.json [...] [--top N] [--json]

py-spy (``record --format speedscope``, without ``--idle``) stores one sampled
profile per thread; every sample is one stack of a thread that was running.
For all the files together this prints, per thread and for all threads:

* self %: samples whose innermost frame is the function (where the CPU is);
* inclusive %: samples with the function anywhere on the stack (what it costs,
  callees included; recursion counted once);
* self % by area: the innermost frame's package (ZODB, BTrees, persistent,
  transaction, pickle, twisted, mqttamqp.<subpackage>.<module>, ...).

py-spy's idle filter does not recognise every wait here (epoll_wait and a timed
Condition.wait show up as running), so samples whose innermost frame is a known
wait (WAITS) are counted as ``waiting`` and the percentages are of the thread's
*busy* samples (socket writes and fsync stay in: they are work).  Reads only the
JSON files; imports nothing of the broker.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

AREAS = (
    # (substring of the file path, area name), first match wins
    ("/ZODB/", "ZODB"), ("/BTrees/", "BTrees"), ("/persistent/", "persistent"),
    ("/transaction/", "transaction"), ("/zc/lockfile", "ZODB"),
    ("/twisted/", "twisted"), ("/proton/", "proton"), ("/autobahn/", "autobahn"),
    ("pickle", "pickle"), ("/threading.py", "threading"), ("/queue.py", "queue"),
    ("/selectors.py", "selectors"),
)


# innermost frames that mean "waiting for work", not work
WAITS = {"Condition.wait", "Event.wait", "EPollReactor.doPoll", "select", "Thread.join",
         "_read_exact"}  # (the archive's pipe: select, or the writer's blocking read)


def area(frame: dict) -> str:
    path = frame.get("file") or ""
    marker = "/mqttamqp/"
    if marker in path:
        rest = path.rsplit(marker, 1)[1]
        return "mqttamqp/" + rest.removesuffix(".py")
    for needle, name in AREAS:
        if needle in path:
            return name
    if not path or path.startswith("<"):
        return frame.get("name") or "?"
    return os.path.basename(path).removesuffix(".py")


def label(frame: dict) -> str:
    path = frame.get("file") or "?"
    if "/site-packages/" in path:
        path = path.split("/site-packages/", 1)[1]
    elif "/mqttamqp/" in path:
        path = "mqttamqp/" + path.rsplit("/mqttamqp/", 1)[1]
    elif "/lib/python" in path:
        path = path.split("/lib/python", 1)[1].split("/", 1)[-1]
    return f"{frame.get('name')} ({path})"


def load(paths: list[str]) -> dict[str, list[tuple[list[int], float]]]:
    """Thread name -> [(stack of frame indexes, weight)], with the frames shared
    by all files remapped to one table (the module global FRAMES)."""
    threads: dict[str, list[tuple[list[int], float]]] = collections.defaultdict(list)
    index: dict[tuple, int] = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        frames = doc["shared"]["frames"]
        remap = []
        for fr in frames:
            key = (fr.get("name"), fr.get("file"), fr.get("line"))
            if key not in index:
                index[key] = len(FRAMES)
                FRAMES.append(fr)
            remap.append(index[key])
        first_pid = None
        for prof in doc["profiles"]:
            # 'Thread 15343 "MainThread"': merge the runs by the thread's name;
            # with --subprocesses ('Process 1 Thread 2 "..."'), a child's threads are
            # named "child:..." (the archive's writer process)
            name = prof.get("name", "?")
            pid = name.split()[1] if name.startswith("Process ") else None
            if first_pid is None:
                first_pid = pid
            if '"' in name:
                name = name.split('"')[1]
            if pid != first_pid:
                name = "child:" + name
            for stack, weight in zip(prof["samples"], prof["weights"], strict=True):
                threads[name].append(([remap[i] for i in stack], weight))
    return threads


FRAMES: list[dict] = []


def summarise(samples: list[tuple[list[int], float]], top: int) -> dict:
    self_t: collections.Counter = collections.Counter()
    incl_t: collections.Counter = collections.Counter()
    area_t: collections.Counter = collections.Counter()
    waiting = 0.0
    busy = 0.0
    for stack, w in samples:
        if not stack:
            continue
        leaf = FRAMES[stack[-1]]
        if leaf.get("name") in WAITS:
            waiting += w
            continue
        busy += w
        self_t[label(leaf)] += w
        area_t[area(leaf)] += w
        for fn in {label(FRAMES[i]) for i in stack}:
            if not fn.startswith("thread ("):  # py-spy's per-thread root frame
                incl_t[fn] += w
    total = busy or 1.0
    pct = lambda c: [(k, round(100.0 * v / total, 1)) for k, v in c.most_common(top)]  # noqa: E731
    return {"samples": len(samples), "busy_s": round(busy, 3), "waiting_s": round(waiting, 3),
            "self_pct": pct(self_t), "inclusive_pct": pct(incl_t),
            "self_pct_by_area": pct(area_t)}


def children(threads: dict, name: str, top: int) -> int:
    """Inclusive time of NAME split by its direct callees (outermost call of NAME)."""
    for thread, samples in threads.items():
        busy = sum(w for st, w in samples if st and FRAMES[st[-1]].get("name") not in WAITS)
        split: collections.Counter = collections.Counter()
        inside = 0.0
        for stack, w in samples:
            if not stack or FRAMES[stack[-1]].get("name") in WAITS:
                continue
            names = [FRAMES[i].get("name") for i in stack]
            if name not in names:
                continue
            at = names.index(name)
            inside += w
            split[label(FRAMES[stack[at + 1]]) if at + 1 < len(stack) else "(self)"] += w
        if not inside:
            continue
        print(f"== {thread}: {name} = {100.0 * inside / busy:.1f} % of busy samples")
        for k, v in split.most_common(top):
            print(f"  {100.0 * v / busy:5.1f}  {k}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument("--children", metavar="NAME",
                    help="instead: what the function NAME (e.g. Router.publish) spends its "
                         "time in, by direct callee, %% of all busy samples")
    args = ap.parse_args()
    threads = load(args.files)
    if args.children:
        return children(threads, args.children, args.top)
    everything = [s for ss in threads.values() for s in ss]
    out = {"files": [os.path.basename(p) for p in args.files],
           "all_threads": summarise(everything, args.top),
           "threads": {name: summarise(ss, args.top) for name, ss in
                       sorted(threads.items(), key=lambda kv: -len(kv[1]))}}
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    for name, s in [("all threads", out["all_threads"]), *out["threads"].items()]:
        print(f"== {name}: {s['samples']} samples, busy {s['busy_s']:.2f} s, "
              f"waiting {s['waiting_s']:.2f} s; % of busy samples")
        for title in ("self_pct_by_area", "self_pct", "inclusive_pct"):
            print(f"  -- {title}")
            for k, v in s[title]:
                print(f"  {v:5.1f}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
