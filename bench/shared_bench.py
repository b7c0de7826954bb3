"""Shared subscriptions: 1 publisher -> $share/g/<topic> with 10 members, QoS 1.

Every message must reach exactly one member (none lost, none twice) and the
spread (most / fewest per member) is reported; throughput is end-to-end messages
a second.  Run against mqttamqp and Mosquitto in the same run, alternating,
each on a fresh broker.  Loopback only, bounded in count and time.

    python bench/shared_bench.py [--count 20000] [--members 10] [--repeat 3]

Prints one JSON object per run and a summary (medians) at the end.
"""

import argparse
import json
import os
import selectors
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import brokers  # noqa: E402
import mqttwire as w  # noqa: E402
from loadgen import mqtt_open  # noqa: E402

TOPIC = "bench/shared"
WINDOW = 200          # publisher QoS 1 messages unacknowledged at a time


def run_once(kind, count, members, timeout):
    help_text, env = None, None
    if kind == "mqttamqp":
        ok, help_text, env = brokers.mqttamqp_help()
        if not ok:
            raise RuntimeError("twistd mqttamqp --help failed: " + help_text)
    broker = brokers.Broker(kind, mqttamqp_help_text=help_text, mqttamqp_env=env).start()
    try:
        subs = []
        for i in range(members):
            s, p, extra = mqtt_open("127.0.0.1", broker.port, "member-%d" % i,
                                    subs=[("$share/g/" + TOPIC, 1)])
            subs.append((s, p))
        pub, ppar, _ = mqtt_open("127.0.0.1", broker.port, "publisher")
        sel = selectors.DefaultSelector()
        for i, (s, p) in enumerate(subs):
            sel.register(s, selectors.EVENT_READ, ("sub", i))
        sel.register(pub, selectors.EVENT_READ, ("pub", None))
        got = [0] * members
        seen = bytearray(count)
        dups = 0
        sent = acked = 0
        start = time.monotonic()
        deadline = start + timeout
        pub.setblocking(True)
        while (sent < count or sum(got) < count) and time.monotonic() < deadline:
            burst = []
            while sent < count and sent - acked < WINDOW:
                pid = sent % 65535 + 1
                burst.append(w.publish(TOPIC, struct.pack("!I", sent), 1, pid))
                sent += 1
            if burst:
                pub.sendall(b"".join(burst))
            for key, _ in sel.select(timeout=0.5):
                role, i = key.data
                s = key.fileobj
                try:
                    data = s.recv(262144)
                except BlockingIOError:
                    continue
                if not data:
                    raise RuntimeError("%s closed a connection" % kind)
                if role == "pub":
                    for h, _body in ppar.feed(data):
                        if h >> 4 == w.PUBACK:
                            acked += 1
                    continue
                acks = []
                for h, body in subs[i][1].feed(data):
                    if h >> 4 != w.PUBLISH:
                        continue
                    tlen = struct.unpack("!H", body[:2])[0]
                    pid2 = body[2 + tlen:4 + tlen]
                    seq = struct.unpack("!I", body[4 + tlen:8 + tlen])[0]
                    if seen[seq]:
                        dups += 1
                    else:
                        seen[seq] = 1
                        got[i] += 1
                    acks.append(w.puback(pid2))
                if acks:
                    s.setblocking(True)
                    s.sendall(b"".join(acks))
                    s.setblocking(False)
        elapsed = time.monotonic() - start
        delivered = sum(got)
        for s, _ in subs:
            s.close()
        pub.close()
        return {
            "broker": kind, "count": count, "members": members,
            "delivered_once": delivered, "lost": count - delivered, "duplicates": dups,
            "per_member_min": min(got), "per_member_max": max(got),
            "spread": round(max(got) / max(1, min(got)), 3),
            "msg_per_s": round(delivered / elapsed) if elapsed > 0 else 0,
            "seconds": round(elapsed, 2),
        }
    finally:
        broker.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    results = {"mqttamqp": [], "mosquitto": []}
    try:
        for _ in range(a.repeat):
            for kind in ("mqttamqp", "mosquitto"):
                r = run_once(kind, a.count, a.members, a.timeout)
                results[kind].append(r)
                print(json.dumps(r), flush=True)
    finally:
        brokers.stop_all()
    summary = {}
    for kind, runs in results.items():
        if runs:
            summary[kind] = {
                "msg_per_s_median": statistics.median(r["msg_per_s"] for r in runs),
                "spread_max": max(r["spread"] for r in runs),
                "lost_total": sum(r["lost"] for r in runs),
                "duplicates_total": sum(r["duplicates"] for r in runs),
            }
    if summary.get("mqttamqp") and summary.get("mosquitto"):
        summary["ratio"] = round(summary["mqttamqp"]["msg_per_s_median"]
                                 / max(1, summary["mosquitto"]["msg_per_s_median"]), 2)
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
