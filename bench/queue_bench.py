"""Durable queues (issue 12): a work queue with 4 competing consumers, end to end.

One producer publishes ``--count`` messages at QoS 1 (a window of ``--window``
unacknowledged PUBLISHes) and 4 MQTT 3.1.1 consumers, client ids worker-1..4,
subscribed at QoS 1, PUBACK every delivery (for a queue the PUBACK is the ack).
Throughput is messages delivered once and acknowledged by a consumer, divided by
the time from the producer's first send to the last delivery.  Scenarios, all in
the same run, alternating, each run on a fresh broker:

* ``queue``: mqttamqp, ``$queue/jobs/task`` -> consumers on ``$queue/jobs``
  (one consumer group, "worker", from the client ids); clean sessions: the queue
  is what is durable.
* ``queue_persistent`` (only when named in ``--scenarios``): the same with
  clean_session=0 consumers.
* ``share``: mqttamqp's persistent-session QoS 1 path, the closest equivalent:
  ``jobs`` -> ``$share/worker/jobs`` with 4 clean_session=0 members, so every
  message is delivered once and committed before the PUBACK.
* ``rr4``: durable QoS 1 to 4 persistent (clean_session=0) subscribers of 4
  topics ``jobs/1..4`` fed round-robin: what RabbitMQ 3.10's MQTT plugin can
  express (every clean_session=0 QoS 1 subscriber has its own durable queue; it
  has no shared subscriptions), measured on RabbitMQ and on mqttamqp.

Before the runs a probe checks whether the installed RabbitMQ honours
``$share/worker/jobs`` (2 members, a few messages to ``jobs``); the JSON says what
it saw.  Loopback only; every loop is bounded by a count and a deadline; brokers
are stopped by their process groups.

    python bench/queue_bench.py [--count 50000] [--repeat 3] [--out FILE]
"""

import argparse
import datetime
import json
import os
import selectors
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import brokers
import mqttwire as w
import rabbitmq
from loadgen import close_gracefully, mqtt_open
from run import machine_facts

CONSUMERS = 4
PAYLOAD = 64

SCENARIOS = {
    # name: (broker kind, producer topics (round-robin), consumer filters, clean session)
    "queue": ("mqttamqp", ["$queue/jobs/task"], ["$queue/jobs"] * CONSUMERS, True),
    "share": ("mqttamqp", ["jobs"], ["$share/worker/jobs"] * CONSUMERS, False),
    # (not in the default run) the queue's consumers with persistent sessions
    "queue_persistent": ("mqttamqp", ["$queue/jobs/task"], ["$queue/jobs"] * CONSUMERS,
                         False),
    "rr4": ("mqttamqp", [f"jobs/{i + 1}" for i in range(CONSUMERS)],
            [f"jobs/{i + 1}" for i in range(CONSUMERS)], False),
    "rr4_rabbitmq": ("rabbitmq", [f"jobs/{i + 1}" for i in range(CONSUMERS)],
                     [f"jobs/{i + 1}" for i in range(CONSUMERS)], False),
}
DEFAULT_SCENARIOS = ("queue", "share", "rr4", "rr4_rabbitmq")


def log(msg):
    sys.stderr.write("[queue_bench {}] {}\n".format(time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def start_broker(kind, window, extra_args):
    if kind == "rabbitmq":
        return rabbitmq.RabbitMQ(prefetch=window).start()
    ok, help_text, env = brokers.mqttamqp_help()
    if not ok:
        raise RuntimeError("twistd mqttamqp --help failed: " + help_text)
    args = ["--queue-prefetch", str(window), *list(extra_args)]
    return brokers.Broker("mqttamqp", max_inflight=window, want_inflight=True,
                          mqttamqp_help_text=help_text, mqttamqp_env=env,
                          extra_args=args).start()


def _packets(topics):
    """Pre-encoded PUBLISH prefixes per topic; the packet id and payload follow."""
    return [w.publish_parts(t, PAYLOAD, 1) for t in topics]


def _send(sock, data, deadline):
    """sendall, bounded by the run's deadline (socket.timeout past it)."""
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        sock.sendall(data)
    finally:
        sock.setblocking(False)


def drive(port, topics, filters, clean, count, window, timeout):
    """One producer and the consumers on an open broker; returns the figures."""
    subs = []
    for i, flt in enumerate(filters):
        s, p, _extra = mqtt_open("127.0.0.1", port, f"worker-{i + 1}", clean=clean,
                                subs=[(flt, 1)])
        subs.append((s, p))
    pub, ppar, _ = mqtt_open("127.0.0.1", port, "producer")
    prefixes = _packets(topics)
    pad = bytes(PAYLOAD - 4)
    sel = selectors.DefaultSelector()
    for i, (s, _p) in enumerate(subs):
        sel.register(s, selectors.EVENT_READ, i)
    sel.register(pub, selectors.EVENT_READ, -1)
    got = [0] * len(subs)
    seen = bytearray(count)
    dups = 0
    sent = acked = delivered = 0
    t_last = None
    start = time.monotonic()
    deadline = start + timeout
    ntop = len(prefixes)
    try:
        while (acked < count or delivered < count) and time.monotonic() < deadline:
            if sent < count and sent - acked < window:
                burst = []
                while sent < count and sent - acked < window:
                    burst.append(prefixes[sent % ntop] + w.PIDS[sent % 65535 + 1]
                                 + struct.pack("!I", sent) + pad)
                    sent += 1
                _send(pub, b"".join(burst), deadline)
            for key, _ in sel.select(timeout=0.5):
                i = key.data
                s = key.fileobj
                try:
                    data = s.recv(262144)
                except BlockingIOError:
                    continue
                if not data:
                    raise RuntimeError("broker closed a connection (%s)"
                                       % ("producer" if i < 0 else f"worker-{i + 1}"))
                if i < 0:
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
                    if seq < count and not seen[seq]:
                        seen[seq] = 1
                        got[i] += 1
                        delivered += 1
                    else:
                        dups += 1
                    acks.append(w.puback(pid2))
                if acks:
                    _send(s, b"".join(acks), deadline)
                    t_last = time.monotonic()
    finally:
        close_gracefully([s for s, _ in subs] + [pub])
    elapsed = (t_last or time.monotonic()) - start
    return {
        "count": count, "sent": sent, "publisher_acked": acked,
        "delivered_once": delivered, "lost": count - delivered, "duplicates": dups,
        "per_consumer": got, "timed_out": delivered < count or acked < count,
        "msgs_per_s": round(delivered / elapsed, 1) if elapsed > 0 else 0.0,
        "seconds": round(elapsed, 3),
    }


def run_once(name, count, window, timeout, extra_args):
    kind, topics, filters, clean = SCENARIOS[name]
    load = [round(x, 2) for x in os.getloadavg()]
    broker = start_broker(kind, window, extra_args)
    try:
        cpu0, own0 = broker.cpu_s(), time.process_time()
        r = drive(broker.port, topics, filters, clean, count, window, timeout)
        cpu, own = broker.cpu_s() - cpu0, time.process_time() - own0
        r.update({
            "scenario": name, "broker": kind, "clean_session": clean,
            "loadavg_before": load, "broker_cpu_s": round(cpu, 2),
            "broker_cpu_us_per_msg": round(cpu / max(1, r["delivered_once"]) * 1e6, 1),
            # the one load-generator process (producer and consumers): not the limit
            # while this stays well under one core
            "loadgen_cpu_s": round(own, 2),
            "loadgen_cpu_share": round(own / max(1e-9, r["seconds"]), 2),
            "broker_cmd": broker.cmd, "broker_options": broker.options_passed,
        })
        return r
    finally:
        broker.stop()
        broker.cleanup()


def probe_rabbitmq_share(window, n=20, timeout=10.0):
    """Does this RabbitMQ deliver ``jobs`` to ``$share/worker/jobs`` members once each?"""
    broker = rabbitmq.RabbitMQ(prefetch=window).start()
    try:
        subs = [mqtt_open("127.0.0.1", broker.port, f"probe-{i}", clean=False,
                          subs=[("$share/worker/jobs", 1)]) for i in range(2)]
        pub, _, _ = mqtt_open("127.0.0.1", broker.port, "probe-pub")
        _send(pub, b"".join(w.publish("jobs", b"x", 0) for _ in range(n)),
              time.monotonic() + timeout)
        got = [0, 0]
        end = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        for i, (s, _p, _x) in enumerate(subs):
            sel.register(s, selectors.EVENT_READ, i)
        while sum(got) < n and time.monotonic() < end:
            for key, _ in sel.select(timeout=min(0.5, max(0.0, end - time.monotonic()))):
                data = key.fileobj.recv(65536)
                if not data:
                    got.append("closed")
                    end = 0
                    break
                got[key.data] += sum(1 for h, _b in subs[key.data][1].feed(data)
                                     if h >> 4 == w.PUBLISH)
        close_gracefully([s for s, _p, _x in subs] + [pub])
        return {"published_to_jobs": n, "received_per_member": got,
                "supported": got[:2] != [0, 0] and sum(got[:2]) == n,
                "waited_s": timeout if sum(got[:2]) < n else None}
    finally:
        broker.stop()
        broker.cleanup()


def summarise(runs):
    out = {}
    for name in SCENARIOS:
        mine = [r for r in runs if r["scenario"] == name and not r.get("error")]
        if not mine:
            continue
        rates = [r["msgs_per_s"] for r in mine]
        out[name] = {
            "runs": len(mine),
            "msgs_per_s_median": statistics.median(rates),
            "msgs_per_s_min": min(rates), "msgs_per_s_max": max(rates),
            "broker_cpu_us_per_msg_median": statistics.median(
                r["broker_cpu_us_per_msg"] for r in mine),
            "lost_total": sum(r["lost"] for r in mine),
            "duplicates_total": sum(r["duplicates"] for r in mine),
            "any_timed_out": any(r["timed_out"] for r in mine),
            "loadavg_1min_range": [min(r["loadavg_before"][0] for r in mine),
                                   max(r["loadavg_before"][0] for r in mine)],
        }

    def ratio(a, b):
        if a in out and b in out and out[b]["msgs_per_s_median"]:
            return round(out[a]["msgs_per_s_median"] / out[b]["msgs_per_s_median"], 3)
        return None

    return out, {
        "queue_over_share": {"value": ratio("queue", "share"), "target": ">= 0.8"},
        "queue_over_rabbitmq_rr4": {"value": ratio("queue", "rr4_rabbitmq"), "target": ">= 2"},
        "rr4_mqttamqp_over_rabbitmq": {"value": ratio("rr4", "rr4_rabbitmq"),
                                       "target": "(same workload on both brokers)"},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=50000, help="messages a run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per scenario (1-9)")
    ap.add_argument("--window", type=int, default=100,
                    help="producer window; also the consumers' prefetch on every broker")
    ap.add_argument("--timeout", type=float, default=120.0, help="hard limit of one run, s")
    ap.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS))
    ap.add_argument("--mqttamqp-arg", action="append", default=[],
                    help="extra argument for twistd mqttamqp (repeatable)")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()
    if not 1 <= a.repeat <= 9:
        ap.error("--repeat must be 1-9")
    names = [n for n in a.scenarios.split(",") if n]
    for n in names:
        if n not in SCENARIOS:
            ap.error("unknown scenario {!r} (have {})".format(n, ", ".join(SCENARIOS)))
    doc = {"machine": machine_facts(), "config": {
        "count": a.count, "repeat": a.repeat, "window": a.window, "timeout_s": a.timeout,
        "consumers": CONSUMERS, "payload_bytes": PAYLOAD, "scenarios": names,
        "mqttamqp_args": a.mqttamqp_arg,
        "throughput": "messages delivered once and PUBACKed by a consumer / (last delivery"
                      " - producer's first send); medians of the runs, min and max"}}
    doc["machine"]["rabbitmq_version"] = rabbitmq.version()
    runs = []
    try:
        if "rr4_rabbitmq" in names:
            if not rabbitmq.available():
                names.remove("rr4_rabbitmq")
                doc["rabbitmq"] = {"available": False, "why": f"{rabbitmq.SERVER} or epmd missing"}
            else:
                log("probing RabbitMQ for $share support")
                try:
                    doc["rabbitmq_share_probe"] = probe_rabbitmq_share(a.window)
                except Exception as e:
                    doc["rabbitmq_share_probe"] = {"error": repr(e)}
        for rep in range(a.repeat):
            for name in names:
                log(f"run {rep + 1}/{a.repeat} {name}")
                try:
                    r = run_once(name, a.count, a.window, a.timeout, a.mqttamqp_arg)
                except Exception as e:
                    r = {"scenario": name, "error": repr(e)}
                runs.append(r)
                log(json.dumps({k: r.get(k) for k in (
                    "scenario", "msgs_per_s", "lost", "duplicates", "broker_cpu_us_per_msg",
                    "loadgen_cpu_share", "loadavg_before", "error")}))
    except KeyboardInterrupt:
        doc["interrupted"] = True
    finally:
        brokers.stop_all()
    doc["summary"], doc["ratios"] = summarise(runs)
    doc["loadavg_at_end"] = list(os.getloadavg())
    doc["date_utc_end"] = datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds")
    doc["runs"] = runs
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
