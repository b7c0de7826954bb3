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
import tempfile
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
        self.result = None  # a RESULT that arrived while waiting for another line
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
        if tag == "RESULT" and self.result is not None:
            return self.result
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
                self.result = r
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


class PySpy:
    """`py-spy record` of one broker process (all threads, running samples only),
    from now until stop(): SIGINT makes py-spy write its file."""

    def __init__(self, pid, out, rate, extra=()):
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        self.out = out
        self.p = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", str(rate),
                                   "--format", "speedscope", "--threads", "-o", out, *extra],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)  # by PID: only the py-spy we started
        try:
            text, _ = self.p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            text, _ = self.p.communicate(timeout=5)
        return {"file": self.out, "exit": self.p.returncode, "output": (text or "")[-500:]}


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
    8: "QoS 1, 1 -> 1, clean subscriber (clean session 1), window 100",
    9: "20,000 idle connections: connect time and broker memory per connection",
    10: "AMQP -> AMQP unsettled vs this broker's MQTT QoS 1 (bench/amqp_bench.py; mqttamqp only)",
}
THROUGHPUT = (1, 2, 3, 4, 5, 8)
IDLE = (6, 9)
DRAIN_S = 2.0  # the fixed drain after the last publish for `undelivered %`
NOFILE_RESERVE = 64  # descriptors the broker keeps for itself (listeners, log, store)

# The $SYS counters of the accounting identity received = sent + dropped + queued, per
# broker kind.  mqttamqp: PUBLISH routed / copies written / dropped / copies queued in
# sessions, none of them counting its own $SYS messages (docs/production.md, "$SYS message
# accounting"), so the monitor subtracts nothing.  Mosquitto 2.0: the publish/ counters (messages/ also
# counts PINGs and acks); it publishes no queue length, its store count is reported
# beside the identity, not in it (it holds retained messages too).
SYS_TOPICS = {
    "mqttamqp": {"received": "$SYS/broker/messages/received",
                 "sent": "$SYS/broker/messages/sent",
                 "dropped": "$SYS/broker/messages/dropped",
                 "queued": "$SYS/broker/messages/queued"},
    "mosquitto": {"received": "$SYS/broker/publish/messages/received",
                  "sent": "$SYS/broker/publish/messages/sent",
                  "dropped": "$SYS/broker/publish/messages/dropped",
                  "store_count": "$SYS/broker/store/messages/count"},
}
# $SYS period during scenario 5: as short as each broker takes (Mosquitto: whole
# seconds), so that a run of a second or two is sampled many times, mid-load.
SYS_INTERVAL_S = {"mqttamqp": 0.1, "mosquitto": 1}


def counts(quick, scale=1):
    """Messages per run of each scenario; ``scale`` multiplies the throughput
    scenarios' counts (the issue's outside generator ran 6 s: ``--scale 6``)."""
    f = 10 if quick else 1
    return {
        1: 200_000 * scale // f,
        2: 50_000 * scale // f,
        3: 50_000 * scale // f,
        4: 10_000 * scale // f,   # publications; deliveries = 100x
        5: 2_000 * scale // f,    # per publisher; 100 publishers
        6: 5_000,         # not shrunk: per-connection memory needs the full count
        7: 10 if not quick else 2,  # seconds at 1,000 msg/s
        8: 50_000 * scale // f,
        9: 20_000,        # capped by RLIMIT_NOFILE's hard limit if it is lower
        10: 30_000 // f,  # messages per amqp_bench run
    }


def fixed_len_qos0(topic):
    pkt = w.publish(topic, b"x" * PAYLOAD, qos=0)
    return len(pkt), pkt[1]


def start_drain(pw, subs, timeout):
    """Wait (bounded) for the publisher's last PUBLISH, then tell the subscribers
    when the fixed drain ends: their count at that moment gives `undelivered %`."""
    try:
        info = pw.expect("SENT", timeout)
    except (TimeoutError, RuntimeError) as e:
        return {"error": str(e)}
    end_ns = info["last_send_ns"] + int(DRAIN_S * 1e9)
    for sub in subs:
        sub.send("DRAIN %d" % end_ns)
    return info


def undelivered(pres, sres, per_message, sent_info):
    """Messages sent minus received after the fixed drain, over sent (deliveries
    owed for fan-out: every sent message is owed to each subscriber)."""
    sent = pres.get("sent", sent_info.get("sent"))
    at_drain = sres.get("received_at_drain")
    owed = sent * per_message if isinstance(sent, int) else None
    pct = (100.0 * (owed - at_drain) / owed) if (owed and at_drain is not None) else None
    return {"sent": sent, "received_at_drain": at_drain, "drain_s": DRAIN_S,
            "drain_end_reached": sres.get("drain_end_reached"), "undelivered_pct": pct}


def stop_sysmon(mon):
    """Ask the $SYS monitor for one more sample (the broker at rest), bounded."""
    mon.send("STOP")
    try:
        return mon.expect("RESULT", 10)
    except (TimeoutError, RuntimeError) as e:
        return {"error": str(e)}


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
        if sc in (1, 2, 3, 8):
            qos = {1: 0, 2: 1, 3: 2, 8: 1}[sc]
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
        sub_args["rx_nap_s"] = 0.0 if sc in (2, 3, 8) else nap * (4 if sc == 4 else 1)
        sub = Worker("sub", sub_args, "sub")
        workers.append(sub)
        sub.expect("READY", 60)
        mon = None
        if sc == 5:
            mqttamqp = broker.kind == "mqttamqp"
            mon = Worker("sysmon", {"host": HOST, "port": port, "topics": SYS_TOPICS[broker.kind],
                                    "sent_from": "none" if mqttamqp else "message",
                                    # mqttamqp sends its uptime first in every burst, then
                                    # what changed: a burst ends when the next starts (no
                                    # gap to wait for at 0.1 s)
                                    **({"burst_marker": "$SYS/broker/uptime"} if mqttamqp else {}),
                                    "client_prefix": "sys-%s" % tag, "deadline": deadline + idle_s + 30},
                         "sysmon")
            workers.append(mon)
            mon.expect("READY", 30)
        pw = Worker(pub[0], pub[1], "pub")
        workers.append(pw)
        pw.expect("READY", 60)
        st0 = broker.status()
        sys0 = system_busy_s()
        cpu0 = broker.cpu_s()
        t0 = time.monotonic()
        pw.send("GO")
        grace = max(0.0, deadline - time.monotonic()) + idle_s + 20
        sent_info = start_drain(pw, [sub], grace)
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
        if mon is not None:
            res["sys_accounting"] = stop_sysmon(mon)
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
            **undelivered(pres, sres, expected // published, sent_info),
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


IDLE_PER_WORKER = 10_000  # idle connections per load-generator process
IDLE_WINDOW = 32  # handshakes in progress at once, over all workers
# source addresses of the idle clients (loopback): <= 2,500 connections each at 20,000
IDLE_SOURCES = ["127.0.0.%d" % i for i in range(2, 10)]


def idle_target(broker, want):
    """The connections the broker can hold: its hard RLIMIT_NOFILE (which a
    container may not let us raise) less the descriptors it already has open and
    a reserve.  Returns (count, reason it is lower than want or None)."""
    lim = brokers.proc_nofile(broker.pid) or {}
    try:
        soft = int(lim.get("soft"))
    except (TypeError, ValueError):
        return want, None
    room = soft - brokers.proc_open_fds(broker.pid) - NOFILE_RESERVE
    if room >= want:
        return want, None
    return room, ("broker RLIMIT_NOFILE %d (hard limit, not raisable here) leaves room "
                  "for %d connections" % (soft, room))


def run_idle(sc, broker, cfg, tag):
    want = cfg["counts"][sc]
    n, capped = idle_target(broker, want)
    nworkers = max(1, -(-n // IDLE_PER_WORKER))
    deadline = time.monotonic() + cfg["timeout"]
    shares = [n // nworkers + (1 if i < n % nworkers else 0) for i in range(nworkers)]
    wks = [Worker("idle", {"host": HOST, "port": broker.port, "count": k,
                           "window": max(1, IDLE_WINDOW // nworkers), "keepalive": 600,
                           "source_ips": IDLE_SOURCES,
                           "client_prefix": "idle-%s-%d" % (tag, i), "deadline": deadline},
                  "idle%d" % i) for i, k in enumerate(shares)]
    res = {"scenario": sc}
    try:
        ready = [wk.expect("READY", 30) for wk in wks]
        broker.settle(max_s=5)
        st0 = broker.status()
        cpu0 = broker.cpu_s()
        threads0 = brokers.proc_threads(broker.pid)
        sys0 = system_busy_s()
        for wk in wks:
            wk.send("GO")
        infos = [wk.expect("CONNECTED", cfg["timeout"] + 30) for wk in wks]
        sys1 = system_busy_s()
        cpu_conn = broker.cpu_s() - cpu0 if broker.alive() else None
        threads_conn = brokers.proc_threads(broker.pid) if cpu_conn is not None else None
        settled = broker.settle(max_s=10)
        time.sleep(0.5)  # let the allocator settle before the reading (not an event wait)
        alive = broker.alive()
        st1 = broker.status() if alive else {}
        cpu1 = broker.cpu_s() if alive else None
        for wk in wks:
            wk.send("CLOSE")
        fins = []
        for wk in wks:
            try:
                fins.append(wk.expect("RESULT", 30))
            except (TimeoutError, RuntimeError) as e:
                fins.append({"error": str(e)})
        connected = sum(i.get("connected", 0) for i in infos)
        errors = {}
        for i in infos:
            for k, v in (i.get("errors") or {}).items():
                errors[k] = errors.get(k, 0) + v
        drss = (st1.get("VmRSS", 0) - st0.get("VmRSS", 0)) if st1 else None
        res.update({
            "connections": connected,
            "target_requested": want,
            "target": n,
            "target_capped": capped,
            "loadgen_processes": nworkers,
            "timed_out": any(i.get("timed_out") for i in infos),
            # the workers start on the same GO: the slowest one is the time for all
            "connect_all_s": max((i.get("connect_all_s") or 0) for i in infos),
            "connects_per_s": sum(i.get("connects_per_s") or 0 for i in infos),
            "broker_rss_kib_before": st0.get("VmRSS"),
            "broker_rss_kib_after": st1.get("VmRSS"),
            "broker_rss_delta_kib": drss,
            "rss_per_conn_bytes": (drss * 1024.0 / connected) if (drss is not None and connected) else None,
            "broker_peak_rss_kib": st1.get("VmHWM"),
            "broker_cpu_s_connecting": (cpu1 - cpu0) if cpu1 is not None else None,
            "broker_cpu_us_per_conn": ((cpu1 - cpu0) * 1e6 / connected) if (cpu1 is not None and connected) else None,
            # (from GO to the last CONNACK: the main thread is mqttamqp's reactor)
            "broker_threads_per_conn_connecting": (
                brokers.threads_per_unit(broker.pid, threads0, threads_conn, connected, cpu_conn)
                if (threads_conn is not None and connected) else None),
            "broker_settled": settled,
            "broker_nofile": brokers.proc_nofile(broker.pid) if alive else None,
            "loadgen_nofile": [r.get("nofile") for r in ready],
            "still_open_at_close": sum(f.get("still_open_at_close") or 0 for f in fins),
            "failed": sum(i.get("failed") or 0 for i in infos),
            "errors": errors,
            "loadgen_cpu_s": sum(i.get("loadgen_cpu_s") or 0 for i in infos),
            "machine_busy_cpu_s": sys1 - sys0,
            "other_cpu_s_est": other_cpu(sys1 - sys0, cpu_conn,
                                         {"loadgen_cpu_s": sum(i.get("loadgen_cpu_s") or 0 for i in infos)}, {}),
        })
        if connected < n:
            res["error"] = "only %d of %d connections succeeded" % (connected, n)
    finally:
        for wk in wks:
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
        threads0 = brokers.proc_threads(broker.pid)
        sys0 = system_busy_s()
        pw.send("GO")
        grace = max(0.0, deadline - time.monotonic()) + 20
        sent_info = start_drain(pw, [sub], grace)
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
        threads = brokers.proc_threads(broker.pid) if alive else None
        sys1 = system_busy_s()
        lat = sres.get("latency_from_send") or {}
        received = sres.get("received", 0) or 0
        res.update({
            "rate_target_per_s": rate,
            "duration_target_s": secs,
            "sent": pres.get("sent"),
            "delivered": received,
            "loss": n - received,
            **undelivered(pres, sres, 1, sent_info),
            "timed_out": bool(sres.get("timed_out") or pres.get("timed_out")),
            "p50_ms": lat.get("p50_ms"),
            "p99_ms": lat.get("p99_ms"),
            "p999_ms": lat.get("p999_ms"),
            "latency_from_send": lat,
            "latency_from_schedule": sres.get("latency_from_schedule"),
            "publisher_late_releases": pres.get("late_releases"),
            "broker_cpu_s": cpu,
            "broker_cpu_us_per_msg": (cpu * 1e6 / received) if (cpu is not None and received) else None,
            # (the main thread: mqttamqp's reactor, Mosquitto's only one)
            "broker_threads_per_msg": (
                brokers.threads_per_unit(broker.pid, threads0, threads, received, cpu)
                if (threads is not None and received) else None),
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


AMQP_BENCH = os.path.join(HERE, "amqp_bench.py")


def run_amqp(cfg, repeat):
    """Scenario 10: bench/amqp_bench.py's MQTT QoS 1 and AMQP unsettled runs
    (interleaved, one mqttamqp broker), one result per pair of runs.  Mosquitto
    speaks no AMQP: the comparison is with this broker's own MQTT QoS 1."""
    n = cfg["counts"][10]
    with tempfile.TemporaryDirectory(prefix="bench-amqp-") as tmp:
        out = os.path.join(tmp, "amqp.json")
        cmd = [sys.executable, AMQP_BENCH, "--scenarios", "mqtt_qos1,amqp_unsettled",
               "--repeat", str(repeat), "--count", str(n), "--timeout", str(cfg["timeout"]),
               "--out", out]
        limit = repeat * 2 * (cfg["timeout"] + 30) + 90
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        if p.returncode != 0 or not os.path.exists(out):
            raise RuntimeError("amqp_bench failed (%s): %s" % (p.returncode, p.stderr[-1500:]))
        with open(out) as f:
            doc = json.load(f)
    sc = doc["scenarios"]
    mq, am = sc["mqtt_qos1"], sc["amqp_unsettled"]
    runs = []
    for i, (a, b) in enumerate(zip(am.get("runs", []), mq.get("runs", []), strict=False)):
        runs.append({
            "scenario": 10, "pair": i,
            "amqp_unsettled_msgs_per_s": a["msgs_per_s"], "mqtt_qos1_msgs_per_s": b["msgs_per_s"],
            "ratio_amqp_over_mqtt": (a["msgs_per_s"] / b["msgs_per_s"]) if b["msgs_per_s"] else None,
            "sent": a["messages"], "received_at_drain": a["received"],
            # amqp_bench has no fixed drain: a run stops when all arrived or at its deadline
            "undelivered_pct": 100.0 * (a["messages"] - a["received"]) / a["messages"],
            "mqtt_undelivered_pct": 100.0 * (b["messages"] - b["received"]) / b["messages"],
            "amqp": a, "mqtt": b,
        })
    return runs, {k: v for k, v in doc.items() if k != "scenarios"}


UNDELIVERED = ("%% of the messages sent (deliveries owed, for fan-out) not received %.0f s "
               "after the publisher's last PUBLISH" % DRAIN_S)

# metric definitions per scenario: (name, key in run result, unit, better)
METRICS = {
    "throughput": [("msgs_per_s", "value", "messages/s delivered, publisher's first send to subscriber's last receipt", "higher"),
                   ("msgs_per_s_first_to_last", "rate_first_to_last",
                    "messages/s delivered, subscriber's first to last receipt", "higher"),
                   ("broker_cpu_us_per_msg", "broker_cpu_us_per_msg", "broker CPU µs per delivered message", "lower"),
                   ("broker_cpu_s", "broker_cpu_s", "broker CPU seconds (utime+stime) during the run", "lower"),
                   ("broker_peak_rss_kib", "broker_peak_rss_kib", "broker VmHWM after the run, KiB", "lower"),
                   ("undelivered_pct", "undelivered_pct", UNDELIVERED, "lower")],
    6: [("connect_all_s", "connect_all_s", "seconds to connect all idle clients", "lower"),
        ("rss_per_conn_bytes", "rss_per_conn_bytes", "broker RSS bytes per idle connection", "lower"),
        ("broker_cpu_us_per_conn", "broker_cpu_us_per_conn", "broker CPU µs per connection set-up", "lower")],
    7: [("p50_ms", "p50_ms", "ms, publisher send time to subscriber receive time, median", "lower"),
        ("p99_ms", "p99_ms", "ms, publisher send time to subscriber receive time, 99th percentile", "lower"),
        ("p999_ms", "p999_ms", "ms, publisher send time to subscriber receive time, 99.9th percentile", "lower"),
        ("broker_cpu_us_per_msg", "broker_cpu_us_per_msg", "broker CPU µs per delivered message", "lower"),
        ("undelivered_pct", "undelivered_pct", UNDELIVERED, "lower")],
    10: [("amqp_unsettled_msgs_per_s", "amqp_unsettled_msgs_per_s",
          "AMQP -> AMQP unsettled, messages/s (first send to last receipt)", "higher"),
         ("mqtt_qos1_msgs_per_s", "mqtt_qos1_msgs_per_s",
          "MQTT QoS 1 -> MQTT QoS 1 on the same broker, messages/s", "higher"),
         ("ratio_amqp_over_mqtt", "ratio_amqp_over_mqtt",
          "AMQP unsettled / MQTT QoS 1, per interleaved pair of runs (goal >= 0.7)", "higher"),
         ("undelivered_pct", "undelivered_pct",
          "% of AMQP messages sent not received when the run ended (no fixed drain here)", "lower")],
}
METRICS[9] = METRICS[6]
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
            vals = [r.get(key) for r in runs]
            m[lab] = median_or_none(vals)
            nums = [v for v in vals if isinstance(v, (int, float))]
            m.setdefault("min", {})[lab] = min(nums) if nums else None
            m.setdefault("max", {})[lab] = max(nums) if nums else None
            m.setdefault("n", {})[lab] = len(nums)
        a, b = m.get("mqttamqp"), m.get("mosquitto")
        m["ratio_mqttamqp_over_mosquitto"] = (a / b) if (isinstance(a, (int, float)) and
                                                        isinstance(b, (int, float)) and b) else None
        out["metrics"][name] = m
    nruns = {lab: len(runs_by_broker.get(lab, [])) for lab in labels}
    out["aggregation"] = ("median of %s runs per broker (min/max: the spread); brokers "
                          "alternated, fresh broker per run"
                          % "/".join(str(nruns[l]) for l in labels))
    if sc == 10:
        out["aggregation"] = ("median of %s interleaved pairs of runs on one mqttamqp broker "
                              "(bench/amqp_bench.py); Mosquitto speaks no AMQP"
                              % nruns.get("mqttamqp", 0))
    if sc == 5:
        out["sys_accounting"] = sys_accounting_summary(runs_by_broker, labels)
    for lab in labels:
        runs = runs_by_broker.get(lab, [])
        out[lab] = {"timed_out": any(r.get("timed_out") for r in runs),
                    "errors": [r["error"] for r in runs if r.get("error")],
                    "runs": runs}
    return out


def sys_accounting_summary(runs_by_broker, labels):
    """The worst $SYS mismatch (received - sent - dropped - queued) seen per broker."""
    out = {}
    for lab in labels:
        acc = [r.get("sys_accounting") or {} for r in runs_by_broker.get(lab, [])]
        worst = [a for a in acc if a.get("worst_mismatch") is not None]
        w_ = max(worst, key=lambda a: abs(a["worst_mismatch"]), default=None)
        out[lab] = {
            "worst_mismatch": w_["worst_mismatch"] if w_ else None,
            "worst_mismatch_pct_of_received": w_["worst_mismatch_pct_of_received"] if w_ else None,
            "worst_sample": w_["worst_mismatch_sample"] if w_ else None,
            "final_mismatch": [(a["samples"][-1]["mismatch"] if a.get("samples") else None) for a in acc],
            "samples_per_run": [a.get("n_samples") for a in acc],
            "samples_mid_load_per_run": [a.get("n_mid_load") for a in acc],
            "queued_published": any(a.get("queued_published") for a in acc),
        }
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
        # (what the broker imports: a compiled copy first on PYTHONPATH, or not)
        "pythonpath": os.environ.get("PYTHONPATH"),
        "loadavg_at_start": list(os.getloadavg()),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


# ------------------------------------------------------------------ main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=["mqttamqp", "mosquitto", "both"], default="both")
    ap.add_argument("--scenarios", default="1,2,3,4,5,6,7,8,9,10")
    ap.add_argument("--quick", action="store_true", help="~10x fewer messages")
    ap.add_argument("--scale", type=int, default=1,
                    help="multiply the throughput scenarios' message counts (1-5, 8) by this "
                         "(longer runs: a run of scenario 2 takes ~1 s at scale 1)")
    ap.add_argument("--mosquitto-persistence", action="store_true",
                    help="run Mosquitto with `persistence true` (in-memory store written at "
                         "its autosave interval and at exit, no fsync) instead of false: the "
                         "peer of the issue's outside generator")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per broker of every scenario (median and min/max reported)")
    ap.add_argument("--timeout", type=float, default=60.0, help="hard wall-time limit per run, seconds")
    ap.add_argument("--idle", type=float, default=5.0, help="subscriber stops after this many seconds without data")
    ap.add_argument("--rx-nap", type=float, default=0.0005,
                    help="subscriber naps this long after a short read (throughput scenarios)")
    ap.add_argument("--mqttamqp-arg", action="append", default=[],
                    help="extra argument for `twistd mqttamqp` (repeatable)")
    ap.add_argument("--mqtt5", action="store_true",
                    help="the load generators speak MQTT 5 (empty property blocks) "
                         "instead of 3.1.1, to both brokers")
    ap.add_argument("--py-spy", metavar="DIR",
                    help="record every mqttamqp run with `py-spy record --format speedscope` "
                         "into DIR (profiling perturbs the figures: not for published runs)")
    ap.add_argument("--py-spy-rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--py-spy-arg", action="append", default=[],
                    help="extra argument for py-spy record (repeatable), e.g. --gil: only "
                         "the thread holding the GIL (Python CPU, no waits)")
    ap.add_argument("--fan-in-count", type=int, default=None,
                    help="messages per publisher in scenario 5 (default 2,000; 200 with "
                         "--quick). The broker publishes $SYS between reactor turns, and "
                         "under this load one turn reads ~84k messages (64 KB from each "
                         "of 100 sockets): a longer run gives the accounting more samples")
    ap.add_argument("--latency-seconds", type=int, default=None,
                    help="scenario 7's length at 1,000 msg/s (default 10; 2 with --quick): a "
                         "p99.9 of 10,000 samples is the 10th worst, so the tail moves with "
                         "any neighbour; 60 s gives 60,000")
    # hidden: run a second Mosquitto in the "mqttamqp" slot to exercise the comparison path
    ap.add_argument("--fake-mqttamqp", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.mqtt5:
        # Read by mqttwire in every load generator process (and here, below).
        os.environ["BENCH_MQTT_LEVEL"] = "5"
        w.LEVEL, w.PROPS = 5, b"\x00"
    signal.signal(signal.SIGTERM, _on_signal)
    brokers.raise_nofile()  # the load generators inherit it (20,000 idle connections)
    scen = [int(x) for x in args.scenarios.split(",") if x.strip()]
    for s in scen:
        if s not in SCENARIOS:
            ap.error("unknown scenario %d" % s)
    labels = ["mqttamqp", "mosquitto"] if args.broker == "both" else [args.broker]

    if not 1 <= args.scale <= 100:
        ap.error("--scale must be 1..100")
    cfg = {"counts": counts(args.quick, args.scale), "timeout": args.timeout, "idle_s": args.idle,
           "window": 100, "fan": 100, "repeat": args.repeat,
           "rx_nap_s": args.rx_nap}
    if args.fan_in_count is not None:
        cfg["counts"][5] = args.fan_in_count
    if args.latency_seconds is not None:
        if not 1 <= args.latency_seconds <= 600:
            ap.error("--latency-seconds must be 1..600")
        cfg["counts"][7] = args.latency_seconds
    result = {
        "tool": "mqttamqp bench/run.py",
        "machine": machine_facts(),
        "config": {
            "quick": args.quick, "scale": args.scale,
            "mosquitto_persistence": args.mosquitto_persistence,
            "repeat": args.repeat, "drain_s": DRAIN_S,
            "sys_interval_s_scenario_5": SYS_INTERVAL_S,
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
                "8_qos1_clean_messages": cfg["counts"][8], "9_idle_connections": cfg["counts"][9],
                "10_amqp_messages_per_run": cfg["counts"][10],
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
                "env_extra": env_extra, "twistd": brokers.twistd_bin(),
                "build": brokers.mqttamqp_build(env_extra)}
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
                              want_inflight=sc in (2, 3, 7, 8),
                              sys_interval=SYS_INTERVAL_S[kind] if sc == 5 else None,
                              mosquitto_persistence=args.mosquitto_persistence)

    runs, sc = {}, None
    try:
        for sc in scen:
            runs = {lab: [] for lab in labels}
            if sc == 10:
                if "mqttamqp" in labels and not args.fake_mqttamqp:
                    log("scenario 10 (%s), %d pairs of runs" % (SCENARIOS[10], args.repeat))
                    try:
                        runs["mqttamqp"], result["amqp_bench"] = run_amqp(cfg, args.repeat)
                    except (RuntimeError, subprocess.TimeoutExpired, KeyError, OSError) as e:
                        runs["mqttamqp"] = [{"scenario": 10, "error": "%s: %s" % (e.__class__.__name__, e)}]
                    for r in runs["mqttamqp"]:
                        log("  -> %s" % short(r))
                    result["scenarios"]["10"] = summarize(10, runs, labels)
                continue
            reps = args.repeat
            for rep in range(reps):
                for lab in labels:
                    tag = "%s-s%d-r%d" % (lab, sc, rep)
                    log("scenario %d (%s) run %d/%d on %s" % (sc, SCENARIOS[sc], rep + 1, reps, lab))
                    b = make_broker(lab, sc)
                    r = {"scenario": sc, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
                    spy = None
                    try:
                        b.start()
                        r["broker_cmd"] = b.cmd
                        r["broker_options"] = b.options_passed
                        if args.py_spy and b.kind == "mqttamqp":
                            spy = PySpy(b.pid, os.path.join(args.py_spy, "s%d-r%d.speedscope.json"
                                                            % (sc, rep)), args.py_spy_rate,
                                        args.py_spy_arg)
                        if sc in THROUGHPUT:
                            r.update(run_throughput(sc, b, cfg, tag))
                        elif sc in IDLE:
                            r.update(run_idle(sc, b, cfg, tag))
                        elif sc == 7:
                            r.update(run_latency(b, cfg, tag))
                    except KeyboardInterrupt:
                        raise
                    except Exception as e:
                        r["error"] = "%s: %s" % (e.__class__.__name__, e)
                        if b.proc is not None:
                            r["broker_log_tail"] = b.log_tail(2000)
                    finally:
                        if spy is not None:
                            r["py_spy"] = spy.stop()
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
        un = r.get("undelivered_pct")
        acc = (r.get("sys_accounting") or {}).get("worst_mismatch")
        return "%s msg/s, delivered %s/%s, undelivered after %.0fs %s%%, broker cpu %s us/msg%s%s" % (
            "%.0f" % v if v else v, r.get("delivered"), r.get("expected_deliveries"), DRAIN_S,
            "%.2f" % un if un is not None else un,
            "%.1f" % cu if cu else cu, " TIMED OUT" if r.get("timed_out") else "",
            ", $SYS worst mismatch %s" % acc if "sys_accounting" in r else "")
    if sc in IDLE:
        return "%s conns in %.2fs, %s B/conn" % (r.get("connections"), r.get("connect_all_s") or -1,
                                                  "%.0f" % r["rss_per_conn_bytes"] if r.get("rss_per_conn_bytes") else None)
    if sc == 7:
        return "p50 %s ms, p99 %s ms, p99.9 %s ms, delivered %s, undelivered %s%%" % (
            r.get("p50_ms"), r.get("p99_ms"), r.get("p999_ms"), r.get("delivered"),
            r.get("undelivered_pct"))
    if sc == 10:
        return "AMQP unsettled %s msg/s, MQTT QoS 1 %s msg/s, ratio %.2f" % (
            r.get("amqp_unsettled_msgs_per_s"), r.get("mqtt_qos1_msgs_per_s"),
            r.get("ratio_amqp_over_mqtt") or 0)
    return str(r)[:200]


if __name__ == "__main__":
    main()
