"""What sending PUBREC before forwarding costs inbound QoS 2 (issue 16, item 6).

Since item 6, mqttamqp forwards an inbound QoS 2 message only once the publisher's
PUBREC is out, and PUBREC waits for the commit that stores the packet id (and the
persistent subscribers' copies).  Before, clean subscribers got the message at
once, before that commit.  This measures the difference where it is largest: a
*persistent* publisher (every QoS 2 PUBLISH costs a commit) and a *clean* QoS 2
subscriber, in the same run, against

* ``mqttamqp`` from this tree (the new ordering),
* ``mqttamqp-baseline``: mqttamqp from another source tree (the old ordering):
  ``--baseline-src DIR``, or ``--baseline-rev REV`` (a temporary ``git worktree``
  of that revision, removed afterwards), and
* ``mosquitto`` (PUBREC first as well; no persistence, as in ``run.py``).

Two workloads per broker, each ``--repeat`` times on a fresh broker, medians in the
JSON on stdout:

* ``lockstep``: one message at a time: PUBLISH → the subscriber receives it (and
  completes its flow) and the publisher completes PUBREC/PUBREL/PUBCOMP; latency
  from PUBLISH to PUBREC and to the subscriber's receipt, p50 and p99 (ms);
* ``window``: ``--window`` QoS 2 publishes in flight, ``--messages`` in all;
  messages/s delivered to the subscriber.

    python bench/qos2_order_bench.py --baseline-rev <commit before item 6> [--quick]

The client is one process, one thread, with pre-encoded packets (``mqttwire``);
it never imports the broker.  Brokers are started and stopped by ``brokers.Broker``
(their own process group, signalled by its id only).
"""

import argparse
import json
import os
import select
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import brokers  # noqa: E402
import mqttwire as w  # noqa: E402

PAYLOAD = b"x" * 64
PIDS = [struct.pack("!H", i) for i in range(65536)]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Conn:
    """A blocking-ish MQTT 3.1.1 client socket with a packet splitter."""

    def __init__(self, port, client_id, clean):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = w.Parser()
        self.pending = []
        self.sock.sendall(w.connect(client_id, clean))
        first, body = self.next(10.0)
        if first >> 4 != 2 or body[1] != 0:
            raise RuntimeError("CONNACK %r" % body)

    def fileno(self):
        return self.sock.fileno()

    def read_some(self):
        data = self.sock.recv(262144)
        if not data:
            raise RuntimeError("broker closed the connection")
        self.pending.extend(self.parser.feed(data))

    def next(self, timeout):
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no packet")
            self.sock.settimeout(left)
            self.read_some()
        return self.pending.pop(0)

    def close(self):
        try:
            self.sock.sendall(b"\xe0\x00")
        except OSError:
            pass
        self.sock.close()


def _sub_ack(sub, first, body):
    """The subscriber's side of an outbound QoS 2 flow (PUBLISH → PUBREC, PUBREL →
    PUBCOMP); returns True for a PUBLISH."""
    kind = first >> 4
    if kind == 3:
        tlen = body[0] << 8 | body[1]
        pid2 = body[2 + tlen:4 + tlen]
        sub.sock.sendall(w.pubrec(pid2))
        return True
    if kind == 6:
        sub.sock.sendall(w.pubcomp(body[:2]))
    return False


def setup(port, tag):
    topic = "bench/q2/%s" % tag
    sub = Conn(port, "q2sub-" + tag, True)
    sub.sock.sendall(w.subscribe(1, [(topic, 2)]))
    first, body = sub.next(10.0)
    assert first >> 4 == 9 and body[2] == 2, (first, body)
    pub = Conn(port, "q2pub-" + tag, False)  # persistent: every inbound id is committed
    return topic, pub, sub


def lockstep(port, n, tag):
    topic, pub, sub = setup(port, tag)
    to_pubrec, to_receipt = [], []
    pubrec_first = 0
    try:
        for i in range(n):
            pid = i % 65535 + 1
            t0 = time.monotonic()
            pub.sock.sendall(w.publish(topic, PAYLOAD, 2, pid))
            got_pubrec = got_msg = None
            pubcomp = False
            while got_pubrec is None or got_msg is None or not pubcomp:
                ready, _, _ = select.select([pub, sub], [], [], 10.0)
                if not ready:
                    raise TimeoutError("lockstep stalled at message %d" % i)
                now = time.monotonic()
                for c in ready:
                    c.read_some()
                    while c.pending:
                        first, body = c.pending.pop(0)
                        if c is pub:
                            if first >> 4 == 5:
                                got_pubrec = now
                                pub.sock.sendall(w.pubrel(body[:2]))
                            elif first >> 4 == 7:
                                pubcomp = True
                        elif _sub_ack(sub, first, body) and got_msg is None:
                            got_msg = now
            to_pubrec.append((got_pubrec - t0) * 1000)
            to_receipt.append((got_msg - t0) * 1000)
            pubrec_first += got_pubrec <= got_msg
    finally:
        pub.close()
        sub.close()
    return {
        "messages": n,
        "pubrec_ms_p50": round(statistics.median(to_pubrec), 3),
        "pubrec_ms_p99": round(sorted(to_pubrec)[int(0.99 * (n - 1))], 3),
        "delivery_ms_p50": round(statistics.median(to_receipt), 3),
        "delivery_ms_p99": round(sorted(to_receipt)[int(0.99 * (n - 1))], 3),
        "pubrec_seen_first_fraction": round(pubrec_first / n, 3),
    }


def window(port, n, win, tag):
    topic, pub, sub = setup(port, tag)
    pre = w.publish_parts(topic, len(PAYLOAD), 2)
    sent = completed = received = 0
    t0 = time.monotonic()
    t_last = t0
    try:
        while received < n or completed < n:
            while sent < n and sent - completed < win:
                pid2 = PIDS[sent % 65535 + 1]
                pub.sock.sendall(pre + pid2 + PAYLOAD)
                sent += 1
            ready, _, _ = select.select([pub, sub], [], [], 10.0)
            if not ready:
                raise TimeoutError("window stalled: sent %d completed %d received %d"
                                   % (sent, completed, received))
            for c in ready:
                c.read_some()
                out = []
                for first, body in c.pending:
                    kind = first >> 4
                    if c is pub:
                        if kind == 5:
                            out.append(w.pubrel(body[:2]))
                        elif kind == 7:
                            completed += 1
                    elif kind == 3:
                        tlen = body[0] << 8 | body[1]
                        out.append(w.pubrec(body[2 + tlen:4 + tlen]))
                        received += 1
                        t_last = time.monotonic()
                    elif kind == 6:
                        out.append(w.pubcomp(body[:2]))
                c.pending.clear()
                if out:
                    c.sock.sendall(b"".join(out))
    finally:
        pub.close()
        sub.close()
    return {"messages": n, "window": win,
            "msgs_per_s": round(n / (t_last - t0), 1),
            "elapsed_s": round(t_last - t0, 3)}


def run_broker(label, make, args):
    runs = {"lockstep": [], "window": []}
    for r in range(args.repeat):
        b = make()
        try:
            b.start()
            log("%s run %d: port %d" % (label, r + 1, b.port))
            runs["lockstep"].append(lockstep(b.port, args.lockstep, "%s%d" % (label, r)))
            runs["window"].append(window(b.port, args.messages, args.window,
                                         "%s%dw" % (label, r)))
            log("  lockstep %s" % runs["lockstep"][-1])
            log("  window   %s" % runs["window"][-1])
        finally:
            b.stop()
            cmd = b.cmd
            b.cleanup()
    med = {
        "lockstep": {k: statistics.median(x[k] for x in runs["lockstep"])
                     for k in runs["lockstep"][0] if k != "messages"},
        "window_msgs_per_s": statistics.median(x["msgs_per_s"] for x in runs["window"]),
    }
    return {"median": med, "runs": runs, "broker_cmd": cmd}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-src", help="source tree of the baseline mqttamqp")
    ap.add_argument("--baseline-rev", help="git revision of the baseline (temporary worktree)")
    ap.add_argument("--no-mosquitto", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lockstep", type=int, default=500, help="lock-step messages per run")
    ap.add_argument("--messages", type=int, default=10000, help="windowed messages per run")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="5x fewer messages, 2 repeats")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    if args.quick:
        args.lockstep //= 5
        args.messages //= 5
        args.repeat = min(args.repeat, 2)

    ok, help_text, env = brokers.mqttamqp_help()
    if not ok:
        sys.exit("twistd mqttamqp is not runnable: %s" % help_text)
    worktree = None
    baseline = args.baseline_src
    if baseline is None and args.baseline_rev:
        worktree = tempfile.mkdtemp(prefix="qos2bench-baseline-")
        subprocess.run(["git", "-C", brokers.MAIN, "worktree", "add", "--detach", worktree,
                        args.baseline_rev], check=True, capture_output=True)
        baseline = worktree

    def mqttamqp(src):
        def make():
            extra = dict(env)
            if src is not None:
                extra["PYTHONPATH"] = src
            return _TreeBroker(src or brokers.MAIN, "mqttamqp", mqttamqp_help_text=help_text,
                               mqttamqp_env=extra, want_inflight=True)
        return make

    result = {"workload": {"publisher": "persistent (clean session 0), QoS 2",
                           "subscriber": "clean session, QoS 2", "payload_bytes": len(PAYLOAD),
                           "lockstep_messages": args.lockstep, "window": args.window,
                           "window_messages": args.messages, "repeat": args.repeat},
              "brokers": {}}
    try:
        result["brokers"]["mqttamqp"] = run_broker("mqttamqp", mqttamqp(None), args)
        if baseline:
            result["brokers"]["mqttamqp-baseline"] = run_broker("baseline",
                                                                mqttamqp(baseline), args)
            result["baseline"] = {"src": baseline, "rev": args.baseline_rev}
        if not args.no_mosquitto and brokers.mosquitto_bin():
            result["brokers"]["mosquitto"] = run_broker(
                "mosquitto", lambda: brokers.Broker("mosquitto"), args)
            result["mosquitto_version"] = brokers.mosquitto_version()
    finally:
        brokers.stop_all()
        if worktree:
            subprocess.run(["git", "-C", brokers.MAIN, "worktree", "remove", "--force",
                            worktree], capture_output=True)
            shutil.rmtree(worktree, ignore_errors=True)
    new = result["brokers"]["mqttamqp"]["median"]
    base = result["brokers"].get("mqttamqp-baseline", {}).get("median")
    if base:
        result["new_vs_baseline"] = {
            "delivery_ms_p50_ratio": round(new["lockstep"]["delivery_ms_p50"]
                                           / base["lockstep"]["delivery_ms_p50"], 3),
            "window_msgs_per_s_ratio": round(new["window_msgs_per_s"]
                                             / base["window_msgs_per_s"], 3),
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


class _TreeBroker(brokers.Broker):
    """An mqttamqp broker run from source tree ``src`` (its working directory, so
    twistd finds that tree's plugin and package first)."""

    def __init__(self, src, *a, **kw):
        super().__init__(*a, **kw)
        self.src = src

    def start(self, ready_timeout=60.0):
        saved = brokers.MAIN
        brokers.MAIN = self.src
        try:
            return super().start(ready_timeout)
        finally:
            brokers.MAIN = saved


if __name__ == "__main__":
    main()
