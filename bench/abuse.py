"""Hostile conditions against mqttamqp on loopback (issue 10): one JSON object per
scenario on stdout.

    python bench/abuse.py [--quick] [--scenarios slowloris,churn,...] [--out FILE]
                          [--broker-arg ARG ...]

Scenarios (each on a fresh broker, each bounded in count and time):

* ``slowloris``: 2,000 sockets that send one byte of a CONNECT and stall;
* ``churn``: connect/CONNACK/disconnect at up to 1,000 a second for 60 s;
* ``stuck_qos0``: a QoS 0 subscriber that never reads, under a 30 s flood of 1 KB
  QoS 0 messages;
* ``stuck_qos1``: a QoS 1 subscriber that never reads, under a flood of 1 KB QoS 1
  messages (the flooder pipelines them, its PUBACKs read and dropped);
* ``subscriptions``: one client asks for 100,000 subscriptions;
* ``amqp_links``: one AMQP connection tries to attach 150,000 links;
* ``fuzz``: the MQTT and AMQP socket fuzzers of ``tests/test_fuzz.py`` for 60 s;
* ``user_properties``: other clients' PING round trips (p50, p99) while one MQTT 5
  client floods, 20 s a phase: packets of 100,000 user properties, packets at the
  user property limit, small QoS 0 PUBLISHes, and SUBSCRIBEs of 1,000 filters
  (the abuser runs in its own process: ``abuse.py --abuser KIND PORT SECONDS``).

``--quick`` divides the durations by 6 and the counts by 10.

For each: whether the broker stayed alive; a well-behaved pair of clients (a
publisher sending QoS 1 every 20 ms, a subscriber) running through the scenario
and how many of its messages arrived (all must); the broker's RSS before, at its
peak (sampled every 100 ms) and after, in MB; the log lines with a traceback or
at critical level (must be 0); and what the scenario itself measured.
"""

import argparse
import json
import os
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import brokers  # noqa: E402
import mqttwire as w  # noqa: E402

MB = 1024.0


class Sampler(threading.Thread):
    """The broker's RSS every 100 ms (kB); ``peak`` is the highest seen."""

    def __init__(self, broker):
        super().__init__(daemon=True)
        self.broker = broker
        self.peak = 0
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            try:
                self.peak = max(self.peak, self.broker.status()["VmRSS"])
            except (OSError, KeyError, TypeError):
                return
            self.stop_flag.wait(0.1)


def mqtt_session(port, client_id, clean=True, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(w.connect(client_id, clean))
    parser = w.Parser()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for first, body in parser.feed(s.recv(4096) or b"x"):
            if first >> 4 == w.CONNACK:
                if body[1] != 0:
                    raise RuntimeError("CONNACK %d" % body[1])
                return s, parser
    raise RuntimeError("no CONNACK")


class Canary:
    """A well-behaved publisher (QoS 1 every 20 ms, waiting for each PUBACK) and
    subscriber; ``sent`` and ``got`` count what went through."""

    def __init__(self, port, tag):
        self.port, self.topic = port, "canary/" + tag
        self.sent = self.got = 0
        self.errors = []
        self.stop_flag = threading.Event()
        self.sub, self.sub_parser = mqtt_session(port, "canary-sub-" + tag)
        self.sub.sendall(w.subscribe(1, [(self.topic, 1)]))
        self._read_until(self.sub, self.sub_parser, w.SUBACK)
        self.pub, self.pub_parser = mqtt_session(port, "canary-pub-" + tag)
        self.threads = [threading.Thread(target=self._publish, daemon=True),
                        threading.Thread(target=self._receive, daemon=True)]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read_until(s, parser, kind):
        end = time.monotonic() + 10
        while time.monotonic() < end:
            data = s.recv(65536)
            if not data:
                raise RuntimeError("closed")
            for first, _ in parser.feed(data):
                if first >> 4 == kind:
                    return

    def _publish(self):
        pid = 0
        try:
            while not self.stop_flag.is_set():
                pid = pid % 65535 + 1
                self.pub.sendall(w.publish(self.topic, b"canary", 1, pid))
                self._read_until(self.pub, self.pub_parser, w.PUBACK)
                self.sent += 1
                self.stop_flag.wait(0.02)
        except Exception as exc:  # reported, not raised: the scenario goes on
            self.errors.append("publisher: %r" % exc)

    def _receive(self):
        self.sub.settimeout(1.0)
        try:
            while not (self.stop_flag.is_set() and self.got >= self.sent):
                try:
                    data = self.sub.recv(65536)
                except socket.timeout:
                    if self.stop_flag.is_set():
                        return
                    continue
                if not data:
                    self.errors.append("subscriber: closed")
                    return
                for first, body in self.sub_parser.feed(data):
                    if first >> 4 == w.PUBLISH:
                        self.got += 1
                        if (first >> 1) & 3:
                            tlen = int.from_bytes(body[:2], "big")
                            self.sub.sendall(w.puback(body[2 + tlen:4 + tlen]))
        except Exception as exc:
            self.errors.append("subscriber: %r" % exc)

    def finish(self, wait=10.0):
        self.stop_flag.set()
        for t in self.threads:
            t.join(wait)
        for s in (self.pub, self.sub):
            try:
                s.close()
            except OSError:
                pass
        return {"sent": self.sent, "delivered": self.got, "all_delivered":
                self.got >= self.sent and self.sent > 0, "errors": self.errors[:3]}


def bad_lines(broker):
    """Log lines with a traceback or at critical level: (count, the first three)."""
    bad = []
    try:
        with open(broker.log, errors="replace") as f:
            for line in f:
                if "Traceback" in line or "#critical]" in line:
                    bad.append(line.strip()[:300])
    except OSError:
        pass
    return len(bad), bad[:3]


def run(name, fn, quick, extra_args=()):
    amqp_port = brokers.free_port()
    broker = brokers.Broker("mqttamqp", mqttamqp_help_text=HELP[0], extra_args=[
        "--amqp", "tcp:%d:interface=127.0.0.1" % amqp_port, "--web", "none",
        "--connect-timeout", "5", "--no-archive",
        # the broker's own default queue bounds (brokers.Broker raises them for
        # parity with Mosquitto in the throughput benchmark)
        "--max-queued-messages", "1000", "--max-queued-bytes", str(16 << 20), *extra_args])
    broker.amqp_port = amqp_port
    broker.start()
    try:
        time.sleep(0.5)
        before = broker.status()["VmRSS"]
        sampler = Sampler(broker)
        sampler.start()
        canary = Canary(broker.port, name)
        started = time.monotonic()
        measured = fn(broker, quick)
        canary_result = canary.finish()
        sampler.stop_flag.set()
        sampler.join(2)
        alive = broker.alive()
        broker.settle(max_s=10)
        after = broker.status()["VmRSS"] if alive else None
        count, sample = bad_lines(broker)
        return {
            "scenario": name, "seconds": round(time.monotonic() - started, 1),
            "broker_alive": alive, "well_behaved_qos1": canary_result,
            "rss_mb": {"before": round(before / MB, 1), "peak": round(sampler.peak / MB, 1),
                       "after": round(after / MB, 1) if after else None,
                       "peak_above_before": round((sampler.peak - before) / MB, 1)},
            "tracebacks_or_critical": count, "bad_lines": sample, "measured": measured}
    finally:
        broker.stop()
        broker.cleanup()


# -- scenarios ---------------------------------------------------------------------------

def slowloris(broker, quick):
    n = 200 if quick else 2000
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        s.sendall(b"\x10")
        socks.append(s)
    deadline = time.monotonic() + 5 + 10       # --connect-timeout 5, and slack
    closed = 0
    for s in socks:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if s.recv(1) == b"":
                closed += 1
        except OSError:
            pass
        s.close()
    return {"sockets": n, "closed_by_broker_within_15s": closed}


def churn(broker, quick):
    seconds = 10 if quick else 60
    rate = 1000
    done = failed = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        due = start + done / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            s, _ = mqtt_session(broker.port, "churn", True, timeout=5)
            s.sendall(w.DISCONNECT_PKT)
            s.close()
            done += 1
        except (OSError, RuntimeError):
            failed += 1
            done += 1
    elapsed = time.monotonic() - start
    return {"cycles": done, "failed": failed, "per_second": round(done / elapsed)}


def _flood(broker, quick, qos):
    seconds = 5 if quick else 30
    stuck = socket.create_connection(("127.0.0.1", broker.port))
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.sendall(w.connect("stuck", True) + w.subscribe(1, [("flood/#", qos)]))
    pub, _ = mqtt_session(broker.port, "flooder")
    done = threading.Event()

    def drain():   # the flooder's PUBACKs: read and dropped
        pub.settimeout(0.5)
        while not done.is_set():
            try:
                if not pub.recv(1 << 16):
                    return
            except socket.timeout:
                continue
            except OSError:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    import select

    sent = 0
    stalled = 0.0           # seconds the broker did not read the flooder (back-pressure)
    end = time.monotonic() + seconds
    pending = b""
    while time.monotonic() < end:
        if not pending:
            pending = b"".join(w.publish("flood/x", b"x" * 1024, qos, (sent + i) % 65535 + 1)
                               for i in range(64))
            sent += 64
        t0 = time.monotonic()
        _, writable, _ = select.select([], [pub], [], max(0.0, end - t0))
        if not writable:
            stalled += time.monotonic() - t0
            break
        waited = time.monotonic() - t0
        if waited > 0.05:
            stalled += waited
        try:
            pending = pending[pub.send(pending):]
        except OSError:
            break
    done.set()
    reader.join(2)
    pub.close()
    stuck.close()
    return {"flood_seconds": seconds, "messages_sent": sent,
            "flooder_not_read_seconds": round(stalled, 1)}


def stuck_qos0(broker, quick):
    return _flood(broker, quick, 0)


def stuck_qos1(broker, quick):
    return _flood(broker, quick, 1)


def subscriptions(broker, quick):
    total = 10_000 if quick else 100_000
    s, parser = mqtt_session(broker.port, "greedy")
    s.settimeout(30)
    granted = refused = 0
    per_packet = 100
    for pid in range(1, total // per_packet + 1):
        filters = [("greedy/%d/%d" % (pid, i), 1) for i in range(per_packet)]
        s.sendall(w.subscribe(pid, filters))
        got = False
        while not got:
            data = s.recv(65536)
            if not data:
                return {"asked": total, "granted": granted, "refused": refused,
                        "closed_after_packets": pid}
            for first, body in parser.feed(data):
                if first >> 4 == w.SUBACK:
                    codes = body[2:]
                    granted += sum(1 for c in codes if c != 0x80)
                    refused += sum(1 for c in codes if c == 0x80)
                    got = True
    s.close()
    return {"asked": total, "granted": granted, "refused": refused}


def amqp_links(broker, quick):
    from proton import Connection, Transport

    total = 15_000 if quick else 150_000
    conn = Connection()
    conn.container = "linker"
    transport = Transport()
    transport.bind(conn)
    conn.open()
    import select

    sock = socket.create_connection(("127.0.0.1", broker.amqp_port), timeout=10)
    inbound = b""
    sessions = [conn.session() for _ in range(4)]
    for session in sessions:
        session.open()
    made = 0
    closed = False
    end = time.monotonic() + (20 if quick else 60)
    while made < total and time.monotonic() < end and not closed:
        for _ in range(200):
            link = sessions[made % len(sessions)].receiver("l%d" % made)
            link.source.address = "links/%d" % made
            link.open()
            made += 1
        out = transport.peek(transport.pending()) if transport.pending() > 0 else b""
        if out:
            try:
                sock.sendall(out)          # blocking, with the 10 s socket timeout
            except OSError:
                closed = True
                break
            transport.pop(len(out))
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            try:
                data = sock.recv(1 << 20)
            except OSError:
                data = b""
            if data == b"":
                closed = True       # only an end of stream counts as closed
            inbound += data
        while inbound and transport.capacity() > 0:   # the rest waits for the next round
            n = min(len(inbound), transport.capacity())
            transport.push(inbound[:n])
            inbound = inbound[n:]
    condition = conn.remote_condition
    sock.close()
    return {"asked": total, "attached_sent": made, "connection_closed": closed,
            "condition": condition.name if condition is not None else None}


def fuzz(broker, quick):
    sys.path.insert(0, os.path.join(brokers.MAIN, "tests"))
    import test_fuzz as tf  # the fuzzers of the test suite

    seconds = 10 if quick else 60
    counts = {}
    for proto, port, data, keep in (
            ("mqtt", broker.port, tf._mqtt_stream(), 20),
            ("amqp", broker.amqp_port, tf._amqp_stream(), 8)):
        import random

        rng = random.Random(7)
        end = time.monotonic() + seconds / 2
        n = 0
        while time.monotonic() < end:
            tf._poke(port, tf._mutate(rng, data, keep))
            n += 1
        counts[proto] = n
    return {"cases": counts}


# -- user_properties: one MQTT 5 client's input against the others' PING ------------------

def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _v5_packet(first, body):
    return bytes([first]) + _varint(len(body)) + body


def _v5_connect(client_id):
    body = w._str("MQTT") + bytes([5, 0x02]) + b"\x00\x00" + b"\x00" + w._str(client_id)
    return _v5_packet(0x10, body)


def _user_properties(n, size=1):
    """A property block of ``n`` user properties, name and value ``size`` bytes each."""
    one = b"\x26" + w._str(b"k" * size) + w._str(b"v" * size)
    body = one * n
    return _varint(len(body)) + body


def _v5_publish(topic, payload, props=b"\x00"):
    return _v5_packet(0x30, w._str(topic) + props + payload)


def _v5_subscribe(pid, filters):
    body = w.PIDS[pid] + b"\x00" + b"".join(w._str(f) + b"\x00" for f in filters)
    return _v5_packet(0x82, body)


# What each abuser writes, in one ``sendall`` per chunk (as fast as the broker reads).
ABUSERS = {
    # the packet: 100,000 user properties (700 KB, under --max-packet-size)
    "props_100k": lambda: _v5_publish("abuse/p", b"x", _user_properties(100_000)),
    # as many user properties as the broker's default limit lets through, 64 packets
    "props_at_limit": lambda: _v5_publish("abuse/p", b"x", _user_properties(128)) * 64,
    # small QoS 0 PUBLISHes, 1,000 to a chunk
    "small_publish": lambda: _v5_publish("abuse/s", b"x" * 16) * 1000,
    # SUBSCRIBE of 1,000 filters each
    "subscribe": lambda: b"".join(
        _v5_subscribe(i, ["abuse/f/%d/%d" % (i, j) for j in range(1000)])
        for i in range(1, 9)),
}


def _drain_subscriber(port, stop):
    """A subscriber that reads everything the abuser publishes (MQTT 5: properties
    too) and drops it; in the abuser's process, so that its reads do not take the
    pingers' interpreter lock."""
    sub = socket.create_connection(("127.0.0.1", port), timeout=5)
    sub.sendall(_v5_connect("abuse-sub") + _v5_subscribe(1, ["abuse/#"]))
    sub.settimeout(0.5)

    def drain():
        while not stop.is_set():
            try:
                if not sub.recv(1 << 20):
                    return
            except socket.timeout:
                continue
            except OSError:
                return
        sub.close()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return thread


def abuser_main(kind, port, seconds):
    """One MQTT 5 client writing ABUSERS[kind] for ``seconds`` (reconnecting when the
    broker closes it, at most 20 times a second), with a subscriber reading what it
    publishes; prints a JSON summary."""
    chunk = ABUSERS[kind]()
    draining = threading.Event()
    drainer = _drain_subscriber(port, draining)
    end = time.monotonic() + seconds
    sent = connects = closed = 0
    codes = {}
    while time.monotonic() < end:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            time.sleep(0.05)
            continue
        connects += 1
        stop = threading.Event()

        def drain(sock=s):    # everything the broker says; DISCONNECT's reason code
            parser = w.Parser()
            while not stop.is_set():
                try:
                    data = sock.recv(1 << 16)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not data:
                    return
                for first, body in parser.feed(data):
                    if first >> 4 in (w.DISCONNECT, w.CONNACK):
                        code = body[1] if first >> 4 == w.CONNACK else (body[0] if body else 0)
                        codes[hex(code)] = codes.get(hex(code), 0) + 1

        reader = threading.Thread(target=drain, daemon=True)
        s.settimeout(5.0)
        try:
            s.sendall(_v5_connect("abuser"))
            reader.start()
            while time.monotonic() < end:
                s.sendall(chunk)
                sent += 1
        except OSError:
            closed += 1
            time.sleep(0.05)
        finally:
            stop.set()
            s.close()
            reader.join(2)
    draining.set()
    drainer.join(2)
    print(json.dumps({"kind": kind, "chunks_sent": sent, "chunk_bytes": len(chunk),
                      "connects": connects, "closed_by_broker": closed,
                      "reason_codes": codes}), flush=True)


class Pinger(threading.Thread):
    """An MQTT 3.1.1 client that sends PINGREQ every 10 ms and times each PINGRESP;
    ``rtts`` holds (when sent, round trip in ms)."""

    def __init__(self, port, name):
        super().__init__(daemon=True)
        self.sock, self.parser = mqtt_session(port, name)
        self.sock.settimeout(10)
        self.rtts = []
        self.lost = 0
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            t0 = time.monotonic()
            try:
                self.sock.sendall(w.PINGREQ_PKT)
                got = False
                while not got:
                    data = self.sock.recv(4096)
                    if not data:
                        self.lost += 1
                        return
                    got = any(first >> 4 == w.PINGRESP for first, _ in self.parser.feed(data))
            except OSError:
                self.lost += 1
                return
            self.rtts.append((t0, (time.monotonic() - t0) * 1000.0))
            self.stop_flag.wait(0.01)

    def between(self, start, end):
        return sorted(ms for t, ms in self.rtts if start <= t < end)


def _percentile(values, q):
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


def user_properties(broker, quick):
    seconds = 5 if quick else 20
    pingers = [Pinger(broker.port, "pinger-%d" % i) for i in range(2)]
    for p in pingers:
        p.start()
    phases = {}
    import subprocess

    for kind in ("idle", *ABUSERS):
        start = time.monotonic()
        result = None
        if kind == "idle":
            time.sleep(seconds)
        else:
            proc = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--abuser", kind,
                 str(broker.port), str(seconds)],
                capture_output=True, text=True, timeout=seconds + 60)
            try:
                result = json.loads(proc.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                result = {"error": (proc.stderr or proc.stdout)[-500:]}
        end = time.monotonic()
        rtts = sorted(ms for p in pingers for ms in p.between(start, end))
        phases[kind] = {"pings": len(rtts), "ping_p50_ms": _percentile(rtts, 0.5),
                        "ping_p99_ms": _percentile(rtts, 0.99),
                        "ping_max_ms": round(rtts[-1], 1) if rtts else None,
                        "abuser": result}
        print("  %s: %s" % (kind, json.dumps(phases[kind])), file=sys.stderr, flush=True)
    for p in pingers:
        p.stop_flag.set()
        p.join(12)
    return {"phase_seconds": seconds, "phases": phases,
            "pingers_lost": sum(p.lost for p in pingers)}


HELP = [""]   # twistd mqttamqp --help, read once (which options this broker has)

SCENARIOS = {"slowloris": slowloris, "churn": churn, "stuck_qos0": stuck_qos0,
             "stuck_qos1": stuck_qos1, "subscriptions": subscriptions,
             "amqp_links": amqp_links, "fuzz": fuzz, "user_properties": user_properties}


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--abuser":   # (user_properties' child)
        abuser_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter and smaller")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="comma-separated subset of: " + ", ".join(SCENARIOS))
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--broker-arg", action="append", default=[],
                    help="extra argument for `twistd mqttamqp` (repeatable)")
    args = ap.parse_args()
    results = []
    ok, HELP[0], _env = brokers.mqttamqp_help()
    if not ok:
        sys.exit("twistd mqttamqp --help failed:\n" + HELP[0])
    try:
        for name in args.scenarios.split(","):
            print("scenario %s ..." % name, file=sys.stderr, flush=True)
            result = run(name, SCENARIOS[name], args.quick, args.broker_arg)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        brokers.stop_all()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
