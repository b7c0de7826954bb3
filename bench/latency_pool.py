#!/usr/bin/env python3
"""Scenario 7's latency histograms pooled over a result's runs, per broker.

    python bench/latency_pool.py RESULT.json [RESULT.json ...]

``run.py`` keeps, for each run of scenario 7 (QoS 1 at 1,000 msg/s), the histogram
of the publisher's send to the subscriber's receipt (``latency_from_send``,
counts per bucket of fixed edges in µs).  One run's p99.9 is one sample among its
10th-to-60th worst, and moves with whatever else the machine did in that second;
the runs' histograms added up show where each broker's tail lies, bucket by bucket.
Prints, per broker, the pooled count and share of each bucket, the share above
1, 2 and 5 ms, and the per-run p50 / p99 / p99.9 (ms) with their median.  Reads
JSON only; never used in a test.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any


def runs_of(doc: dict[str, Any], broker: str) -> list[dict[str, Any]]:
    sc = doc.get("scenarios", {}).get("7") or {}
    return [r for r in (sc.get(broker) or {}).get("runs", [])
            if isinstance(r.get("latency_from_send"), dict)]


def pooled(runs: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    edges: list[int] = []
    total: list[int] = []
    for r in runs:
        h = r["latency_from_send"]["histogram_us"]
        if not edges:
            edges, total = list(h["edges"]), [0] * len(h["counts"])
        if list(h["edges"]) != edges:
            raise SystemExit("runs with different histogram edges: not pooled")
        total = [a + b for a, b in zip(total, h["counts"], strict=True)]
    return edges, total


def above(edges: list[int], counts: list[int], us: int) -> int:
    """Samples in the buckets above the edge ``us`` (an edge of the histogram)."""
    return sum(counts[edges.index(us) + 1:])


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    docs = [json.load(open(p)) for p in paths]
    for broker in ("mqttamqp", "mosquitto"):
        runs = [r for d in docs for r in runs_of(d, broker)]
        if not runs:
            continue
        edges, counts = pooled(runs)
        n = sum(counts)
        print(f"{broker}: {len(runs)} runs, {n} messages")
        low = 0
        for i, c in enumerate(counts):
            high = edges[i] if i < len(edges) else None
            label = f"{low}-{high} µs" if high is not None else f"> {low} µs"
            print(f"  {label:>16} {c:8d} {100.0 * c / n:8.3f} %")
            low = high if high is not None else low
        for ms in (1, 2, 5):
            k = above(edges, counts, ms * 1000)
            print(f"  above {ms} ms: {k} ({100.0 * k / n:.3f} %)")
        for key in ("p50_ms", "p99_ms", "p999_ms"):
            vals = [r["latency_from_send"][key] for r in runs]
            print(f"  {key}: " + " ".join(f"{v:.3f}" for v in vals)
                  + f"  median {statistics.median(vals):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
