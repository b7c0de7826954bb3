#!/usr/bin/env python3
"""mqttamqp vs Mosquitto benchmark harness.

    python bench/run.py [--broker mqttamqp|mosquitto|both] [--scenarios 1,2,...]
                        [--quick] [--out FILE] [--repeat N] [--timeout S]

Prints one JSON document on stdout (and writes it to --out); progress goes to
stderr.  See bench/README.md for the scenarios and the JSON layout.
"""

import argparse
import atexit
import datetime
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brokers  # noqa: E402
import mqttwire as w  # noqa: E402

LOADGEN = os.path.join(HERE, "loadgen.py")
HOST = "127.0.0.1"
PAYLOAD = 64

_WORKERS = set()


def log(msg):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


# ------------------------------------------------------------------ workers


class Worker:
    """A loadgen.py child process; stdout lines are read by a thread into a queue."""

    def __init__(self, role, args, name):
        self.name = name
        self.p = subprocess.Popen([sys.executable, LOADGEN, role, json.dumps(args)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)
        _WORKERS.add(self)
        self.q = queue.Queue()
        self.err = []
        threading.Thread(target=self._read, args=(self.p.stdout, self.q), daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    @staticmethod
    def _read(f, q):
        for line in f:
            q.put(line.rstrip("\n"))
        q.put(None)

    def _read_err(self):
        for line in self.p.stderr:
            self.err.append(line)
            del self.err[:-50]

    def expect(self, tag, timeout):
        """Wait (bounded) for a line starting with tag; returns its JSON (or {})."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("%s: no %s within %.0fs" % (self.name, tag, timeout))
            try:
                line = self.q.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError("%s exited before %s; stderr: %s"
                                   % (self.name, tag, "".join(self.err)[-1500:]))
            t, _, rest = line.partition(" ")
            if t == tag:
                return json.loads(rest) if rest else {}
            if t == "RESULT":  # early failure report
                r = json.loads(rest) if rest else {}
                raise RuntimeError("%s failed before %s: %s" % (self.name, tag, r.get("error", r)))

    def send(self, line):
        try:
            self.p.stdin.write(line + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stop(self):
        p = self.p
        if p.poll() is None:
            p.terminate()  # by PID: only this child
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(3)
        _WORKERS.discard(self)


def _cleanup():
    for wk in list(_WORKERS):
        try:
            wk.stop()
        except Exception:
            pass
    brokers.stop_all()


atexit.register(_cleanup)


def _on_signal(signum, frame):
    raise KeyboardInterrupt("signal %d" % signum)


# ------------------------------------------------------------------ scenarios

SCENARIOS = {
    1: "QoS 0, 1 publisher -> 1 subscriber, 64-byte payload",
    2: "QoS 1, 1 -> 1, persistent subscriber session (clean session 0), window 100",
    3: "QoS 2, 1 -> 1, window 100 (publish and subscribe QoS 2)",
    4: "Fan-out QoS 0, 1 publisher -> 100 subscribers",
    5: "Fan-in QoS 0, 100 publishers -> 1 subscriber on bench/#",
    6: "5,000 idle connections: connect time and broker memory per connection",
    7: "Latency QoS 1 at 1,000 msg/s (paced), p50/p99",
}
THROUGHPUT = (1, 2, 3, 4, 5)


def counts(quick):
    f = 10 if quick else 1
    return {
        1: 200_000 // f,
        2: 50_000 // f,
        3: 50_000 // f,
        4: 10_000 // f,   # publications; deliveries = 100x
        5: 2_000 // f,    # per publisher; 100 publishers
        6: 5_000,         # not shrunk: per-connection memory needs the full count
        7: 10 if not quick else 2,  # seconds at 1,000 msg/s
    }


def fixed_len_qos0(topic):
    pkt = w.publish(topic, b"x" * PAYLOAD, qos=0)
    return len(pkt), pkt[1]


def run_throughput(sc, broker, cfg, tag):
    """One run of a throughput scenario against a started broker."""
    port = broker.port
    n = cfg["counts"][sc]
    deadline = time.monotonic() + cfg["timeout"]
    idle_s = cfg["idle_s"]
    nap = cfg["rx_nap_s"]
    workers = []
    res = {"scenario": sc}
    try:
        if sc in (1, 2, 3):
            qos = {1: 0, 2: 1, 3: 2}[sc]
            topic = "bench/s%d" % sc
            sub_args = {"host": HOST, "port": port, "conns": 1, "filters": [topic], "qos": qos,
                        "clean": sc != 2, "client_prefix": "sub-%s" % tag, "expected": n,
                        "deadline": deadline, "idle_s": idle_s}
            if qos == 0:
                sub_args["fast_len"], sub_args["fast_rl"] = fixed_len_qos0(topic)
            if qos == 0:
                pub = ("pub0", {"host": HOST, "port": port, "conns": 1, "topics": [topic],
                                "payload_len": PAYLOAD, "count_per_conn": n,
                                "client_prefix": "pub-%s" % tag, "deadline": deadline})
            else:
                pub = ("pubq", {"host": HOST, "port": port, "qos": qos, "topic": topic,
                                "payload_len": PAYLOAD, "count": n, "window": cfg["window"],
                                "client_prefix": "pub-%s" % tag, "deadline": deadline})
            expected = n
            published = n
        elif sc == 4:
            topic = "bench/fanout"
            nsub = cfg["fan"]
            sub_args = {"host": HOST, "port": port, "conns": nsub, "filters": [topic], "qos": 0,
                        "client_prefix": "sub-%s" % tag, "expected": n * nsub,
                        "deadline": deadline, "idle_s": idle_s}
            sub_args["fast_len"], sub_args["fast_rl"] = fixed_len_qos0(topic)
            pub = ("pub0", {"host": HOST, "port": port, "conns": 1, "topics": [topic],
                            "payload_len": PAYLOAD, "count_per_conn": n,
                            "client_prefix": "pub-%s" % tag, "deadline": deadline})
            expected = n * nsub
            published = n
        elif sc == 5:
            npub = cfg["fan"]
            topics = ["bench/p%03d" % i for i in range(npub)]
            sub_args = {"host": HOST, "port": port, "conns": 1, "filters": ["bench/#"], "qos": 0,
                        "client_prefix": "sub-%s" % tag, "expected": n * npub,
                        "deadline": deadline, "idle_s": idle_s}
            sub_args["fast_len"], sub_args["fast_rl"] = fixed_len_qos0(topics[0])
            pub = ("pub0", {"host": HOST, "port": port, "conns": npub, "topics": topics,
                            "payload_len": PAYLOAD, "count_per_conn": n,
                            "client_prefix": "pub-%s" % tag, "deadline": deadline})
            expected = n * npub
            published = n * npub
        else:
            raise ValueError(sc)

        # fan-out: 100 sockets share one process, so let more data accumulate per read
        # only QoS 0 scenarios nap: with acknowledgements a nap could throttle the window
        sub_args["rx_nap_s"] = 0.0 if sc in (2, 3) else nap * (4 if sc == 4 else 1)
        sub = Worker("sub", sub_args, "sub")
        workers.append(sub)
        sub.expect("READY", 60)
        pw = Worker(pub[0], pub[1], "pub")
        workers.append(pw)
        pw.expect("READY", 60)
        st0 = broker.status()
        sys0 = system_busy_s()
        cpu0 = broker.cpu_s()
        t0 = time.monotonic()
        pw.send("GO")
        grace = max(0.0, deadline - time.monotonic()) + idle_s + 20
        try:
            pres = pw.expect("RESULT", grace)
        except (TimeoutError, RuntimeError) as e:
            pres = {"error": str(e), "timed_out": True}
        try:
            sres = sub.expect("RESULT", max(5.0, deadline - time.monotonic() + idle_s + 20))
        except (TimeoutError, RuntimeError) as e:
            sres = {"error": str(e), "timed_out": True, "received": 0}
        t1 = time.monotonic()
        alive = broker.alive()
        cpu1 = broker.cpu_s() if alive else None
        sys1 = system_busy_s()
        st1 = broker.status() if alive else {}
        received = sres.get("received", 0) or 0
        cpu = (cpu1 - cpu0) if cpu1 is not None else None
        e2e = None
        if pres.get("start_ns") and sres.get("last_rx_ns") and received:
            e2e = (sres["last_rx_ns"] - pres["start_ns"]) / 1e9
        res.update({
            # headline: delivered / (last receipt - publisher's first send); cannot be
            # inflated by a broker that buffers the whole input before writing
            "value": (received / e2e) if e2e and e2e > 0 else None,
            "end_to_end_s": e2e,
            # as specified in the brief: at the subscriber, first to last receipt
            "rate_first_to_last": sres.get("rate_per_s"),
            "first_rx_after_publish_start_s": ((sres["first_rx_ns"] - pres["start_ns"]) / 1e9
                                               if (pres.get("start_ns") and sres.get("first_rx_ns")) else None),
            "published_target": published,
            "delivered": received,
            "expected_deliveries": expected,
            "loss": expected - received,
            "timed_out": bool(sres.get("timed_out") or pres.get("timed_out")),
            "wall_s": t1 - t0,
            "broker_cpu_s": cpu,
            "broker_cpu_us_per_msg": (cpu * 1e6 / received) if (cpu is not None and received) else None,
            "broker_cpu_util": (cpu / e2e) if (cpu is not None and e2e) else None,
            "broker_rss_kib_before": st0.get("VmRSS"),
            "broker_rss_kib_after": st1.get("VmRSS"),
            "broker_peak_rss_kib": st1.get("VmHWM"),
            "broker_alive_after": alive,
            "machine_busy_cpu_s": sys1 - sys0,
            "other_cpu_s_est": other_cpu(sys1 - sys0, cpu, sres, pres),
            "subscriber": sres,
            "publisher": pres,
        })
        if sres.get("error") or pres.get("error"):
            res["error"] = "; ".join(x for x in (sres.get("error"), pres.get("error")) if x)
    finally:
        for wk in workers:
            wk.stop()
    return res


def run_idle(broker, cfg, tag):
    n = cfg["counts"][6]
    deadline = time.monotonic() + cfg["timeout"]
    wk = Worker("idle", {"host": HOST, "port": broker.port, "count": n, "window": 32,
                         "keepalive": 600, "client_prefix": "idle-%s" % tag,
                         "deadline": deadline}, "idle")
    res = {"scenario": 6}
    try:
        ready = wk.expect("READY", 30)
        broker.settle(max_s=5)
        st0 = broker.status()
        cpu0 = broker.cpu_s()
        sys0 = system_busy_s()
        wk.send("GO")
        info = wk.expect("CONNECTED", cfg["timeout"] + 30)
        sys1 = system_busy_s()
        cpu_conn = broker.cpu_s() - cpu0 if broker.alive() else None
        settled = broker.settle(max_s=10)
        time.sleep(0.5)
        alive = broker.alive()
        st1 = broker.status() if alive else {}
        cpu1 = broker.cpu_s() if alive else None
        wk.send("CLOSE")
        try:
            fin = wk.expect("RESULT", 30)
        except (TimeoutError, RuntimeError) as e:
            fin = {"error": str(e)}
        connected = info.get("connected", 0)
        drss = (st1.get("VmRSS", 0) - st0.get("VmRSS", 0)) if st1 else None
        res.update({
            "connections": connected,
            "target": n,
            "timed_out": bool(info.get("timed_out")),
            "connect_all_s": info.get("connect_all_s"),
            "connects_per_s": info.get("connects_per_s"),
            "broker_rss_kib_before": st0.get("VmRSS"),
            "broker_rss_kib_after": st1.get("VmRSS"),
            "broker_rss_delta_kib": drss,
            "rss_per_conn_bytes": (drss * 1024.0 / connected) if (drss is not None and connected) else None,
            "broker_peak_rss_kib": st1.get("VmHWM"),
            "broker_cpu_s_connecting": (cpu1 - cpu0) if cpu1 is not None else None,
            "broker_cpu_us_per_conn": ((cpu1 - cpu0) * 1e6 / connected) if (cpu1 is not None and connected) else None,
            "broker_settled": settled,
            "broker_nofile": brokers.proc_nofile(broker.pid) if alive else None,
            "loadgen_nofile": ready.get("nofile"),
            "still_open_at_close": fin.get("still_open_at_close"),
            "failed": info.get("failed"),
            "errors": info.get("errors"),
            "loadgen_cpu_s": info.get("loadgen_cpu_s"),
            "machine_busy_cpu_s": sys1 - sys0,
            "other_cpu_s_est": other_cpu(sys1 - sys0, cpu_conn, info, {}),
        })
        if connected < n:
            res["error"] = "only %d of %d connections succeeded" % (connected, n)
    finally:
        wk.stop()
    return res


def run_latency(broker, cfg, tag):
    secs = cfg["counts"][7]
    rate = 1000
    n = secs * rate
    deadline = time.monotonic() + max(cfg["timeout"], secs + 30)
    topic = "bench/lat"
    res = {"scenario": 7}
    workers = []
    try:
        sub = Worker("sub", {"host": HOST, "port": broker.port, "conns": 1, "filters": [topic],
                             "qos": 1, "clean": True, "client_prefix": "sub-%s" % tag,
                             "expected": n, "deadline": deadline, "idle_s": cfg["idle_s"],
                             "latency": True}, "sub")
        workers.append(sub)
        sub.expect("READY", 60)
        pw = Worker("pubq", {"host": HOST, "port": broker.port, "qos": 1, "topic": topic,
                             "payload_len": PAYLOAD, "count": n, "window": cfg["window"],
                             "rate": rate, "stamp": True, "client_prefix": "pub-%s" % tag,
                             "deadline": deadline}, "pub")
        workers.append(pw)
        pw.expect("READY", 60)
        cpu0 = broker.cpu_s()
        sys0 = system_busy_s()
        pw.send("GO")
        grace = max(0.0, deadline - time.monotonic()) + 20
        try:
            pres = pw.expect("RESULT", grace)
        except (TimeoutError, RuntimeError) as e:
            pres = {"error": str(e), "timed_out": True}
        try:
            sres = sub.expect("RESULT", max(5.0, deadline - time.monotonic() + cfg["idle_s"] + 20))
        except (TimeoutError, RuntimeError) as e:
            sres = {"error": str(e), "timed_out": True, "received": 0}
        alive = broker.alive()
        cpu = (broker.cpu_s() - cpu0) if alive else None
        sys1 = system_busy_s()
        lat = sres.get("latency_from_send") or {}
        received = sres.get("received", 0) or 0
        res.update({
            "rate_target_per_s": rate,
            "duration_target_s": secs,
            "sent": pres.get("sent"),
            "delivered": received,
            "loss": n - received,
            "timed_out": bool(sres.get("timed_out") or pres.get("timed_out")),
            "p50_ms": lat.get("p50_ms"),
            "p99_ms": lat.get("p99_ms"),
            "latency_from_send": lat,
            "latency_from_schedule": sres.get("latency_from_schedule"),
            "publisher_late_releases": pres.get("late_releases"),
            "broker_cpu_s": cpu,
            "broker_cpu_us_per_msg": (cpu * 1e6 / received) if (cpu is not None and received) else None,
            "machine_busy_cpu_s": sys1 - sys0,
            "other_cpu_s_est": other_cpu(sys1 - sys0, cpu, sres, pres),
            "subscriber": {k: v for k, v in sres.items() if not k.startswith("latency")},
            "publisher": pres,
        })
        if sres.get("error") or pres.get("error"):
            res["error"] = "; ".join(x for x in (sres.get("error"), pres.get("error")) if x)
    finally:
        for wk in workers:
            wk.stop()
    return res


# metric definitions per scenario: (name, key in run result, unit, better)
METRICS = {
    "throughput": [("msgs_per_s", "value", "messages/s delivered, publisher's first send to subscriber's last receipt", "higher"),
                   ("msgs_per_s_first_to_last", "rate_first_to_last",
                    "messages/s delivered, subscriber's first to last receipt", "higher"),
                   ("broker_cpu_us_per_msg", "broker_cpu_us_per_msg", "broker CPU µs per delivered message", "lower"),
                   ("broker_cpu_s", "broker_cpu_s", "broker CPU seconds (utime+stime) during the run", "lower"),
                   ("broker_peak_rss_kib", "broker_peak_rss_kib", "broker VmHWM after the run, KiB", "lower")],
    6: [("connect_all_s", "connect_all_s", "seconds to connect all idle clients", "lower"),
        ("rss_per_conn_bytes", "rss_per_conn_bytes", "broker RSS bytes per idle connection", "lower"),
        ("broker_cpu_us_per_conn", "broker_cpu_us_per_conn", "broker CPU µs per connection set-up", "lower")],
    7: [("p50_ms", "p50_ms", "ms, publisher send time to subscriber receive time, median", "lower"),
        ("p99_ms", "p99_ms", "ms, publisher send time to subscriber receive time, 99th percentile", "lower"),
        ("broker_cpu_us_per_msg", "broker_cpu_us_per_msg", "broker CPU µs per delivered message", "lower")],
}
for _s in THROUGHPUT:
    METRICS[_s] = METRICS["throughput"]
METRICS[4] = [("deliveries_per_s", "value", "deliveries/s (100 subscribers), publisher's first send to last receipt", "higher"),
              ("deliveries_per_s_first_to_last", "rate_first_to_last",
               "deliveries/s, subscribers' first to last receipt", "higher")] + METRICS["throughput"][2:]


def median_or_none(vals):
    vals = [v for v in vals if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def summarize(sc, runs_by_broker, labels):
    out = {"name": SCENARIOS[sc], "metrics": {}}
    for name, key, unit, better in METRICS[sc]:
        m = {"unit": unit, "better": better}
        for lab in labels:
            runs = runs_by_broker.get(lab, [])
            m[lab] = median_or_none([r.get(key) for r in runs])
        a, b = m.get("mqttamqp"), m.get("mosquitto")
        m["ratio_mqttamqp_over_mosquitto"] = (a / b) if (isinstance(a, (int, float)) and
                                                        isinstance(b, (int, float)) and b) else None
        out["metrics"][name] = m
    nruns = {lab: len(runs_by_broker.get(lab, [])) for lab in labels}
    out["aggregation"] = ("median of %s runs per broker (brokers alternated, fresh broker per run)"
                          % "/".join(str(nruns[l]) for l in labels))
    for lab in labels:
        runs = runs_by_broker.get(lab, [])
        out[lab] = {"timed_out": any(r.get("timed_out") for r in runs),
                    "errors": [r["error"] for r in runs if r.get("error")],
                    "runs": runs}
    return out


# ------------------------------------------------------------------ machine facts


def system_busy_s():
    """Machine-wide non-idle CPU seconds (all CPUs) from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / brokers.CLK_TCK


def other_cpu(busy, broker_cpu, sres, pres):
    """Rough CPU used by processes other than the broker and the load generator
    during the run (other users of this shared machine).  Large values mean the
    figures are noisy."""
    if broker_cpu is None:
        return None
    lg = (sres.get("loadgen_cpu_s") or 0) + (pres.get("loadgen_cpu_s") or 0)
    return max(0.0, busy - broker_cpu - lg)


def machine_facts():
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1])
    except OSError:
        pass
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, timeout=5).stdout.strip()
        nproc = int(nproc)
    except Exception:
        nproc = len(os.sched_getaffinity(0))
    try:
        import twisted
        tv = twisted.__version__
    except Exception:
        tv = None
    return {
        "nproc": nproc,
        "cpu_model": model,
        "mem_total_kib": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "twisted": tv,
        "mosquitto_version": brokers.mosquitto_version(),
        "loadavg_at_start": list(os.getloadavg()),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


# ------------------------------------------------------------------ main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=["mqttamqp", "mosquitto", "both"], default="both")
    ap.add_argument("--scenarios", default="1,2,3,4,5,6,7")
    ap.add_argument("--quick", action="store_true", help="~10x fewer messages")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--repeat", type=int, default=2, help="runs per broker for scenarios 1-5 (median reported)")
    ap.add_argument("--timeout", type=float, default=60.0, help="hard wall-time limit per run, seconds")
    ap.add_argument("--idle", type=float, default=5.0, help="subscriber stops after this many seconds without data")
    ap.add_argument("--rx-nap", type=float, default=0.0005,
                    help="subscriber naps this long after a short read (throughput scenarios)")
    ap.add_argument("--mqttamqp-arg", action="append", default=[],
                    help="extra argument for `twistd mqttamqp` (repeatable)")
    ap.add_argument("--mqtt5", action="store_true",
                    help="the load generators speak MQTT 5 (empty property blocks) "
                         "instead of 3.1.1, to both brokers")
    # hidden: run a second Mosquitto in the "mqttamqp" slot to exercise the comparison path
    ap.add_argument("--fake-mqttamqp", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.mqtt5:
        # Read by mqttwire in every load generator process (and here, below).
        os.environ["BENCH_MQTT_LEVEL"] = "5"
        w.LEVEL, w.PROPS = 5, b"\x00"
    signal.signal(signal.SIGTERM, _on_signal)
    scen = [int(x) for x in args.scenarios.split(",") if x.strip()]
    for s in scen:
        if s not in SCENARIOS:
            ap.error("unknown scenario %d" % s)
    labels = ["mqttamqp", "mosquitto"] if args.broker == "both" else [args.broker]

    cfg = {"counts": counts(args.quick), "timeout": args.timeout, "idle_s": args.idle,
           "window": 100, "fan": 100, "repeat": args.repeat,
           "rx_nap_s": args.rx_nap}
    result = {
        "tool": "mqttamqp bench/run.py",
        "machine": machine_facts(),
        "config": {
            "quick": args.quick, "repeat_throughput": args.repeat, "repeat_6_7": 1,
            "timeout_s_per_run": args.timeout, "subscriber_idle_stop_s": args.idle,
            "payload_bytes": PAYLOAD, "window": 100, "fan": 100,
            "subscriber_rx_nap_s": args.rx_nap,
            "mqtt_protocol_level": 5 if args.mqtt5 else 4,
            "counts": {
                "1_qos0_messages": cfg["counts"][1], "2_qos1_messages": cfg["counts"][2],
                "3_qos2_messages": cfg["counts"][3],
                "4_fanout_publications": cfg["counts"][4],
                "5_fanin_messages_per_publisher": cfg["counts"][5],
                "6_idle_connections": cfg["counts"][6], "7_latency_seconds_at_1000_per_s": cfg["counts"][7],
            },
            "ratio": "mqttamqp / mosquitto for every metric; see each metric's 'better'",
            "fake_mqttamqp": args.fake_mqttamqp,
        },
        "brokers": {},
        "scenarios": {},
    }

    help_text, env_extra = "", {}
    if "mqttamqp" in labels and not args.fake_mqttamqp:
        ok, help_text, env_extra = brokers.mqttamqp_help()
        if not ok:
            log("`twistd mqttamqp --help` does not work; mqttamqp skipped:\n" + help_text[-1500:])
            result["brokers"]["mqttamqp"] = {"available": False, "help_output": help_text[-1500:]}
            labels = [l for l in labels if l != "mqttamqp"]
        else:
            result["brokers"]["mqttamqp"] = {
                "available": True, "options_listed": brokers.help_options(help_text),
                "env_extra": env_extra, "twistd": brokers.twistd_bin()}
    if "mosquitto" in labels or args.fake_mqttamqp:
        if not brokers.mosquitto_bin():
            log("mosquitto not installed (apt-get install -y mosquitto mosquitto-clients)")
            labels = [l for l in labels if l != "mosquitto"]
            result["brokers"]["mosquitto"] = {"available": False}
        else:
            result["brokers"]["mosquitto"] = {"available": True, "binary": brokers.mosquitto_bin(),
                                              "version": brokers.mosquitto_version()}
    if args.fake_mqttamqp and "mqttamqp" in labels:
        result["brokers"]["mqttamqp"] = {"available": True, "FAKE": "second Mosquitto instance"}

    def make_broker(label, sc):
        kind = "mosquitto" if (label == "mosquitto" or args.fake_mqttamqp) else "mqttamqp"
        return brokers.Broker(kind, label=label, mqttamqp_help_text=help_text,
                              mqttamqp_env=env_extra, extra_args=args.mqttamqp_arg,
                              want_inflight=sc in (2, 3, 7))

    runs, sc = {}, None
    try:
        for sc in scen:
            runs = {lab: [] for lab in labels}
            reps = args.repeat if sc in THROUGHPUT else 1
            for rep in range(reps):
                for lab in labels:
                    tag = "%s-s%d-r%d" % (lab, sc, rep)
                    log("scenario %d (%s) run %d/%d on %s" % (sc, SCENARIOS[sc], rep + 1, reps, lab))
                    b = make_broker(lab, sc)
                    r = {"scenario": sc, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
                    try:
                        b.start()
                        r["broker_cmd"] = b.cmd
                        r["broker_options"] = b.options_passed
                        if sc in THROUGHPUT:
                            r.update(run_throughput(sc, b, cfg, tag))
                        elif sc == 6:
                            r.update(run_idle(b, cfg, tag))
                        elif sc == 7:
                            r.update(run_latency(b, cfg, tag))
                    except KeyboardInterrupt:
                        raise
                    except Exception as e:
                        r["error"] = "%s: %s" % (e.__class__.__name__, e)
                        if b.proc is not None:
                            r["broker_log_tail"] = b.log_tail(2000)
                    finally:
                        alive = b.alive()
                        if not alive and b.proc is not None:
                            r["broker_died"] = True
                            r["broker_log_tail"] = b.log_tail(2000)
                        b.stop()
                        b.cleanup()
                    runs[lab].append(r)
                    log("  -> %s" % short(r))
            result["scenarios"][str(sc)] = summarize(sc, runs, labels)
    except KeyboardInterrupt:
        result["interrupted"] = True
        log("interrupted; reporting what was measured")
        if sc is not None and str(sc) not in result["scenarios"] and any(runs.values()):
            result["scenarios"][str(sc)] = summarize(sc, runs, labels)
            result["scenarios"][str(sc)]["partial"] = True
    finally:
        _cleanup()

    text = json.dumps(result, indent=2, sort_keys=False)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


def short(r):
    if r.get("error"):
        return "ERROR " + r["error"][:300]
    sc = r.get("scenario")
    if sc in THROUGHPUT:
        v = r.get("value")
        cu = r.get("broker_cpu_us_per_msg")
        return "%s msg/s, delivered %s/%s, broker cpu %s us/msg%s" % (
            "%.0f" % v if v else v, r.get("delivered"), r.get("expected_deliveries"),
            "%.1f" % cu if cu else cu, " TIMED OUT" if r.get("timed_out") else "")
    if sc == 6:
        return "%s conns in %.2fs, %s B/conn" % (r.get("connections"), r.get("connect_all_s") or -1,
                                                  "%.0f" % r["rss_per_conn_bytes"] if r.get("rss_per_conn_bytes") else None)
    if sc == 7:
        return "p50 %s ms, p99 %s ms, delivered %s" % (r.get("p50_ms"), r.get("p99_ms"), r.get("delivered"))
    return str(r)[:200]


if __name__ == "__main__":
    main()
