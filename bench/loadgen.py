#!/usr/bin/env python3
"""Load-generator worker process for bench/run.py.

Usage (normally only run.py calls this):
    python bench/loadgen.py ROLE 'JSON-ARGS'

Roles: sub (1..N subscriber sockets), pub0 (QoS 0 publisher, 1..N sockets),
pubq (QoS 1/2 publisher with an in-flight window, optionally paced), idle
(many idle connections), sysmon (samples the broker's $SYS counters).

Protocol with the parent on stdout/stdin, one line each:
    READY [json]          worker connected (and subscribed) and waits
    GO                    (stdin, pub/idle roles) start now
    SENT json             (pub roles) the last PUBLISH was written: last_send_ns
    DRAIN ns              (stdin, sub role) count what has arrived at CLOCK_MONOTONIC ns
                          (the fixed drain after the last publish), keep receiving
    MARK                  (stdin, sub role) answer MARKED json: what has arrived by now
    STOP                  (stdin, sysmon role) take one more $SYS sample, then report
    CONNECTED json        (idle role) all connections made
    CLOSE                 (stdin, idle role) close them
    RESULT json           final figures; always printed, with "error" on failure

Every loop is bounded by a message count and by args["deadline"], an absolute
time.monotonic() value (CLOCK_MONOTONIC is system-wide on Linux, so parent and
workers share it).  Nothing here imports the broker's code.
"""

import errno
import json
import os
import resource
import select
import selectors
import socket
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mqttwire as w  # noqa: E402

PROPS_LEN = len(w.PROPS)  # MQTT 5: the (empty) property block after the packet id

mono = time.monotonic
mono_ns = time.monotonic_ns


def emit(tag, obj=None):
    line = tag if obj is None else tag + " " + json.dumps(obj)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_stdin_buf = b""


def wait_line(word, deadline):
    """Wait (bounded) for a line equal to word on stdin."""
    global _stdin_buf
    while True:
        while b"\n" in _stdin_buf:
            line, _stdin_buf = _stdin_buf.split(b"\n", 1)
            if line.strip().decode() == word:
                return True
        left = deadline - mono()
        if left <= 0:
            return False
        r, _, _ = select.select([0], [], [], min(left, 0.5))
        if r:
            chunk = os.read(0, 4096)
            if not chunk:
                return False
            _stdin_buf += chunk


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def mqtt_open(host, port, client_id, clean=True, keepalive=0, subs=None, timeout=15.0):
    """Blocking CONNECT (+ SUBSCRIBE) handshake; returns (sock, parser, leftover packets)."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    p = w.Parser()
    s.sendall(w.connect(client_id, clean=clean, keepalive=keepalive))
    extra = []
    state = "connack"
    while state != "done":
        data = s.recv(65536)
        if not data:
            raise ConnectionError("broker closed during handshake (%s)" % state)
        for h, body in p.feed(data):
            t = h >> 4
            if state == "connack" and t == w.CONNACK:
                if len(body) < 2 or body[1] != 0:
                    raise ConnectionError("CONNACK refused rc=%r" % (body[1:2],))
                if subs:
                    s.sendall(w.subscribe(1, subs))
                    state = "suback"
                else:
                    state = "done"
            elif state == "suback" and t == w.SUBACK:
                if any(g == 0x80 for g in body[2:]):
                    raise ConnectionError("SUBACK refused %r" % body[2:])
                state = "done"
            else:
                extra.append((h, body))
    s.setblocking(False)
    return s, p, extra


def close_gracefully(socks, timeout=2.0):
    """DISCONNECT, half-close, drain until EOF (bounded), close.  Draining avoids
    an RST that could discard data the broker has not read yet."""
    for s in socks:
        try:
            s.setblocking(True)
            s.settimeout(1.0)
            s.sendall(w.DISCONNECT_PKT)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    end = mono() + timeout
    live = list(socks)
    for s in live:
        s.setblocking(False)
    while live and mono() < end:
        r, _, _ = select.select(live, [], [], max(0.0, min(0.2, end - mono())))
        for s in r:
            try:
                d = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                d = b""
            if not d:
                live.remove(s)
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


HIST_EDGES_US = (50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000,
                 10000, 20000, 50000)


def percentiles(values_ns):
    if not values_ns:
        return {}
    v = sorted(values_ns)
    n = len(v)

    def pct(p):
        return v[min(n - 1, max(0, int(round(p / 100.0 * n + 0.5)) - 1))] / 1e6

    # A histogram, not only percentiles (issue 31 section 3): counts per bucket of
    # fixed edges in microseconds (the last bucket is everything above the last edge).
    hist = [0] * (len(HIST_EDGES_US) + 1)
    i = 0
    for x in v:   # (sorted: one pass)
        while i < len(HIST_EDGES_US) and x > HIST_EDGES_US[i] * 1000:
            i += 1
        hist[i] += 1
    return {
        "count": n,
        "histogram_us": {"edges": list(HIST_EDGES_US), "counts": hist},
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "p999_ms": pct(99.9),
        "max_ms": v[-1] / 1e6,
        "min_ms": v[0] / 1e6,
        "mean_ms": sum(v) / n / 1e6,
    }


# ---------------------------------------------------------------- subscriber


class SubConn:
    __slots__ = ("sock", "parser", "count", "dups", "other", "out", "fast_len", "fast_rl",
                 "rem", "pending2", "closed", "lat_sched", "lat_send", "first", "last")

    def __init__(self, sock, parser, fast_len, fast_rl, latency):
        self.sock = sock
        self.parser = parser
        self.count = 0
        self.dups = 0
        self.other = 0
        self.out = bytearray()
        self.fast_len = fast_len  # QoS 0 fixed-size packet length, or 0 (generic parse)
        self.fast_rl = fast_rl
        self.rem = 0
        self.pending2 = set()
        self.closed = False
        self.lat_sched = [] if latency else None
        self.lat_send = [] if latency else None
        self.first = 0
        self.last = 0

    def feed(self, data, t_ns):
        if self.fast_len:
            n = self.feed_fast(data)
            if n >= 0:
                return n
        return self.feed_generic(data, t_ns)

    def feed_fast(self, data):
        """QoS 0 fixed-length stream: count packet starts with C-speed slicing and
        check every header byte (0x30) and remaining-length byte.  Returns -1 and
        hands the rest to the generic parser if anything else shows up."""
        L = self.fast_len
        rem = self.rem
        n = len(data)
        if rem >= n:
            self.rem = rem - n
            return 0
        hdrs = data[rem::L]
        k = len(hdrs)
        rls = data[rem + 1::L]
        if hdrs.count(0x30) == k and rls.count(self.fast_rl) == len(rls):
            self.count += k
            self.rem = rem + k * L - n
            return k
        # switch permanently to the generic parser, starting at this packet boundary
        self.fast_len = 0
        self.parser = w.Parser()
        return self.feed_generic(data[rem:], 0)

    def feed_generic(self, data, t_ns):
        return self.handle(self.parser.feed(data), t_ns)

    def handle(self, packets, t_ns):
        counted = 0
        out = self.out
        for h, body in packets:
            t = h >> 4
            if t == 3:
                qos = (h >> 1) & 3
                tl = (body[0] << 8) | body[1]
                if qos == 0:
                    counted += 1
                    poff = 2 + tl + PROPS_LEN
                else:
                    pid = body[2 + tl:4 + tl]
                    poff = 4 + tl + PROPS_LEN
                    if qos == 1:
                        out += b"\x40\x02" + pid
                        counted += 1
                    else:
                        if pid in self.pending2:
                            self.dups += 1
                            out += b"\x50\x02" + pid
                            continue
                        self.pending2.add(pid)
                        out += b"\x50\x02" + pid
                        counted += 1
                if self.lat_sched is not None and len(body) >= poff + 16:
                    sched = int.from_bytes(body[poff:poff + 8], "big")
                    sent = int.from_bytes(body[poff + 8:poff + 16], "big")
                    self.lat_sched.append(t_ns - sched)
                    self.lat_send.append(t_ns - sent)
            elif t == 6:  # PUBREL -> PUBCOMP
                pid = body[0:2]
                self.pending2.discard(pid)
                out += b"\x70\x02" + pid
            else:
                self.other += 1
        self.count += counted
        return counted


class DrainClock:
    """The fixed drain after the last publish.  The parent learns when the
    publisher wrote its last PUBLISH and sends ``DRAIN <ns>`` (the drain's end on
    CLOCK_MONOTONIC); the count at that moment is the subscriber's figure for
    ``undelivered %``.  The subscriber keeps receiving afterwards, so the
    throughput figures still see every message."""

    def __init__(self):
        self.end_ns = 0
        self.at = None
        self.buf = b""
        self.marks = 0   # MARK lines read and not answered yet

    def read_stdin(self):
        """Read the parent's lines; False at EOF (stop watching stdin)."""
        try:
            chunk = os.read(0, 4096)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            word, _, arg = line.decode().strip().partition(" ")
            if word == "DRAIN" and arg:
                self.end_ns = int(arg)
            elif word == "MARK":
                self.marks += 1
        return True

    def check(self, now_ns, total):
        if self.end_ns and self.at is None and now_ns >= self.end_ns:
            self.at = total

    def timeout(self, longest):
        """Wake up at the drain's end, so the count is taken on time."""
        if self.end_ns and self.at is None:
            return max(0.0, min(longest, (self.end_ns - mono_ns()) / 1e9))
        return longest


def role_sub(a):
    """args: host, port, conns, filters (list per conn or one for all), qos, clean,
    client_prefix, expected (total PUBLISH count to stop at), fast_len, fast_rl,
    deadline, idle_s, latency, keepalive"""
    deadline = a["deadline"]
    raise_nofile(a["conns"] + 64)
    conns = []
    for i in range(a["conns"]):
        flt = a["filters"][i] if len(a["filters"]) > 1 else a["filters"][0]
        s, p, extra = mqtt_open(a["host"], a["port"], "%s-%d" % (a["client_prefix"], i),
                                clean=a.get("clean", True), keepalive=a.get("keepalive", 0),
                                subs=[(flt, a["qos"])])
        c = SubConn(s, p, a.get("fast_len", 0), a.get("fast_rl", 0), a.get("latency", False))
        if extra or p.buf:  # data arrived together with the SUBACK: use the generic path
            c.fast_len = 0
            c.handle(extra, mono_ns())
        conns.append(c)
    emit("READY", {"conns": len(conns)})

    expected = a["expected"]
    idle_s = a.get("idle_s", 5.0)
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    drain = DrainClock()
    sel.register(0, selectors.EVENT_READ, drain)
    total = sum(c.count for c in conns)
    first_ns = 0
    last_ns = 0
    last_rx = mono()
    timed_out = False
    stop_reason = "count"
    cpu0 = self_cpu()
    rbuf = bytearray(262144)  # recv_into a reused buffer: recv(256K) would mmap/munmap per call
    rmv = memoryview(rbuf)
    # After a short read, nap briefly so data accumulates in the socket buffer:
    # far fewer wake-ups/syscalls for the load generator (it must not be the
    # bottleneck on a 2-core box).  Bounded: adds at most one nap to the timing.
    nap = a.get("rx_nap_s", 0.0)
    small = a.get("rx_small_bytes", 8192)  # average bytes per read below which we nap
    open_conns = len(conns)
    n_reads = 0
    n_bytes = 0
    n_naps = 0
    while total < expected:
        now = mono()
        if now >= deadline:
            timed_out = True
            stop_reason = "deadline"
            break
        if first_ns and now - last_rx > idle_s:
            stop_reason = "idle %.1fs" % idle_s
            break
        if open_conns == 0:
            stop_reason = "all connections closed by broker"
            break
        drain.check(mono_ns(), total)
        got = 0
        reads = 0
        for key, mask in sel.select(timeout=drain.timeout(0.2)):
            c = key.data
            if c is drain:
                if not drain.read_stdin():
                    sel.unregister(0)
                while drain.marks:   # (bounded: the lines of one read)
                    drain.marks -= 1
                    emit("MARKED", {"received": total, "ns": mono_ns()})
                continue
            if mask & selectors.EVENT_READ:
                try:
                    nb = c.sock.recv_into(rbuf)
                    data = rmv[:nb].tobytes()
                except BlockingIOError:
                    data = None
                except OSError:
                    data = b""
                if data is not None:
                    if not data:
                        c.closed = True
                        open_conns -= 1
                        sel.unregister(c.sock)
                        continue
                    got += len(data)
                    reads += 1
                    t_ns = mono_ns()
                    drain.check(t_ns, total)  # data read after the drain's end is late
                    k = c.feed(data, t_ns)
                    if k:
                        total += k
                        if not first_ns:
                            first_ns = t_ns
                        if not c.first:
                            c.first = t_ns
                        last_ns = t_ns
                        c.last = t_ns
                        last_rx = mono()
            if c.out and not c.closed:
                try:
                    n = c.sock.send(c.out)
                    del c.out[:n]
                except BlockingIOError:
                    pass
                except OSError:
                    pass
                want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0)
                if key.events != want:
                    sel.modify(c.sock, want, c)
        n_reads += reads
        n_bytes += got
        if nap and reads and got < small * reads and total < expected:
            n_naps += 1
            time.sleep(nap)
    cpu1 = self_cpu()
    drain.check(mono_ns(), total)
    # flush outstanding acks (bounded), then disconnect
    end = mono() + 1.0
    for c in conns:
        while c.out and not c.closed and mono() < end:
            try:
                n = c.sock.send(c.out)
                del c.out[:n]
            except BlockingIOError:
                time.sleep(0.005)
            except OSError:
                break
    sel.close()
    close_gracefully([c.sock for c in conns if not c.closed], timeout=1.0)
    dur = (last_ns - first_ns) / 1e9 if first_ns else 0.0
    res = {
        "received": total,
        "expected": expected,
        "complete": total >= expected,
        "timed_out": timed_out,
        "stop_reason": stop_reason,
        "first_to_last_s": dur,
        "first_rx_ns": first_ns,
        "last_rx_ns": last_ns,
        "rate_per_s": (total - 1) / dur if dur > 0 and total > 1 else None,
        "dups": sum(c.dups for c in conns),
        "other_packets": sum(c.other for c in conns),
        "fast_path_conns": sum(1 for c in conns if c.fast_len),
        "per_conn_min": min(c.count for c in conns),
        "per_conn_max": max(c.count for c in conns),
        "closed_by_broker": sum(1 for c in conns if c.closed),
        "loadgen_cpu_s": cpu1 - cpu0,
        "reads": n_reads,
        "bytes": n_bytes,
        "naps": n_naps,
        # the fixed drain: what had arrived when it ended (or when the subscriber
        # stopped, if that came first: everything, or nothing more was coming)
        "received_at_drain": drain.at if drain.at is not None else total,
        "drain_end_ns": drain.end_ns,
        "drain_end_reached": drain.at is not None,
    }
    if a.get("latency"):
        lat_sched = []
        lat_send = []
        for c in conns:
            lat_sched += c.lat_sched
            lat_send += c.lat_send
        res["latency_from_schedule"] = percentiles(lat_sched)
        res["latency_from_send"] = percentiles(lat_send)
    return res


# ---------------------------------------------------------------- publishers


def role_pub0(a):
    """QoS 0 blast.  args: host, port, conns, topics (one per conn, or one for all),
    payload_len, count_per_conn, client_prefix, deadline, chunk_bytes"""
    deadline = a["deadline"]
    raise_nofile(a["conns"] + 64)
    payload = b"x" * a["payload_len"]
    chunk_bytes = a.get("chunk_bytes", 65536)
    per = a["count_per_conn"]
    conns = []
    for i in range(a["conns"]):
        topic = a["topics"][i] if len(a["topics"]) > 1 else a["topics"][0]
        s, _, _ = mqtt_open(a["host"], a["port"], "%s-%d" % (a["client_prefix"], i))
        pkt = w.publish(topic, payload, qos=0)
        bn = max(1, chunk_bytes // len(pkt))
        conns.append({"sock": s, "pkt": pkt, "bn": bn, "batch": memoryview(pkt * bn),
                      "left": per, "chunk": memoryview(b""), "off": 0, "done": False})
    emit("READY", {"conns": len(conns), "packet_len": len(conns[0]["pkt"])})
    if not wait_line("GO", deadline):
        return {"error": "no GO before deadline", "sent": 0, "timed_out": True}
    cpu0 = self_cpu()
    t0 = mono()
    t0_ns = mono_ns()
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c["sock"], selectors.EVENT_WRITE, c)
    remaining = len(conns)
    timed_out = False
    error = None
    while remaining:
        if mono() >= deadline:
            timed_out = True
            break
        for key, _mask in sel.select(timeout=0.2):
            c = key.data
            if c["off"] >= len(c["chunk"]):
                if c["left"] == 0:
                    c["done"] = True
                    remaining -= 1
                    sel.unregister(c["sock"])
                    continue
                k = min(c["bn"], c["left"])
                c["chunk"] = c["batch"] if k == c["bn"] else memoryview(c["pkt"] * k)
                c["off"] = 0
                c["left"] -= k
            try:
                c["off"] += c["sock"].send(c["chunk"][c["off"]:])
            except BlockingIOError:
                pass
            except OSError as e:
                error = "send failed: %r" % (e,)
                c["done"] = True
                c["left"] = 0
                remaining -= 1
                sel.unregister(c["sock"])
    t1 = mono()
    last_send_ns = mono_ns()
    cpu1 = self_cpu()
    sel.close()
    sent = 0
    for c in conns:
        unsent_pk = (len(c["chunk"]) - c["off"]) // len(c["pkt"])
        sent += per - c["left"] - unsent_pk
    emit("SENT", {"last_send_ns": last_send_ns, "sent": sent})
    close_gracefully([c["sock"] for c in conns], timeout=2.0)
    return {"sent": sent, "target": per * len(conns), "timed_out": timed_out, "error": error,
            "start_ns": t0_ns, "last_send_ns": last_send_ns, "send_s": t1 - t0, "send_rate_per_s": sent / (t1 - t0) if t1 > t0 else None,
            "loadgen_cpu_s": cpu1 - cpu0}


def role_pubq(a):
    """QoS 1/2 publisher, one connection, window of un-acknowledged messages.
    args: host, port, qos, topic, payload_len, count, window, client_prefix,
    deadline, rate (msgs/s, optional: paced), stamp (put timestamps in payload)"""
    deadline = a["deadline"]
    qos = a["qos"]
    N = a["count"]
    W = a["window"]
    rate = a.get("rate")
    # rate set => paced, and the payload starts with the scheduled and the send time
    plen = a["payload_len"]
    s, parser, _ = mqtt_open(a["host"], a["port"], "%s-0" % a["client_prefix"])
    prefix = w.publish_parts(a["topic"], plen, qos)
    payload = b"x" * plen
    props_payload = w.PROPS + payload
    pad = b"x" * max(0, plen - 16)
    PIDS = w.PIDS
    emit("READY", {"conns": 1, "packet_len": len(prefix) + 2 + len(w.PROPS) + plen})
    if not wait_line("GO", deadline):
        return {"error": "no GO before deadline", "sent": 0, "timed_out": True}
    cpu0 = self_cpu()
    inflight = {}
    out = bytearray()
    next_pid = 1
    sent = 0
    completed = 0
    late = 0
    window_full_loops = 0
    timed_out = False
    error = None
    t0 = mono()
    start_ns = mono_ns()
    t0_ns = start_ns + 1_000_000
    interval_ns = int(1e9 / rate) if rate else 0
    fd = [s]
    rbuf = bytearray(262144)
    rmv = memoryview(rbuf)
    last_send_ns = 0
    while completed < N:
        now = mono()
        if now >= deadline:
            timed_out = True
            break
        # release messages into the window
        room = W - len(inflight)
        if sent < N and room > 0:
            if rate:
                now_ns = mono_ns()
                while room > 0 and sent < N:
                    sched = t0_ns + sent * interval_ns
                    if sched > now_ns:
                        break
                    if now_ns - sched > 1_000_000:
                        late += 1
                    while PIDS[next_pid] in inflight:
                        next_pid = next_pid % 65535 + 1
                    pid = PIDS[next_pid]
                    next_pid = next_pid % 65535 + 1
                    inflight[pid] = 1
                    out += prefix
                    out += pid
                    out += w.PROPS
                    out += sched.to_bytes(8, "big")
                    out += now_ns.to_bytes(8, "big")
                    out += pad
                    sent += 1
                    room -= 1
            else:
                k = min(room, N - sent)
                for _ in range(k):
                    while PIDS[next_pid] in inflight:
                        next_pid = next_pid % 65535 + 1
                    pid = PIDS[next_pid]
                    next_pid = next_pid % 65535 + 1
                    inflight[pid] = 1
                    out += prefix
                    out += pid
                    out += props_payload
                sent += k
        elif sent < N:
            window_full_loops += 1
        if out:
            try:
                n = s.send(out)
                del out[:n]
            except BlockingIOError:
                pass
            except OSError as e:
                error = "send failed: %r" % (e,)
                break
            if sent == N and not out and not last_send_ns:
                # (a PUBREL may still follow for QoS 2: it is not a publish)
                last_send_ns = mono_ns()
                emit("SENT", {"last_send_ns": last_send_ns, "sent": sent})
        # how long may we wait?
        wait = 0.2
        if rate and sent < N and len(inflight) < W:
            wait = max(0.0, min(wait, (t0_ns + sent * interval_ns - mono_ns()) / 1e9))
        r, wr, _ = select.select(fd, fd if out else [], [], wait)
        if r:
            try:
                nb = s.recv_into(rbuf)
                data = rmv[:nb].tobytes()
            except BlockingIOError:
                continue
            except OSError as e:
                error = "recv failed: %r" % (e,)
                break
            if not data:
                error = "broker closed the connection"
                break
            for h, body in parser.feed(data):
                t = h >> 4
                pid = body[0:2]
                if t == 4 or t == 7:  # PUBACK / PUBCOMP
                    if inflight.pop(pid, None) is not None:
                        completed += 1
                elif t == 5:  # PUBREC -> PUBREL
                    if pid in inflight:
                        inflight[pid] = 2
                    out += b"\x62\x02" + pid
    t1 = mono()
    cpu1 = self_cpu()
    if not last_send_ns:  # stopped early (deadline, error): the drain starts now
        last_send_ns = mono_ns()
        emit("SENT", {"last_send_ns": last_send_ns, "sent": sent})
    close_gracefully([s], timeout=2.0)
    return {"sent": sent, "completed": completed, "target": N, "timed_out": timed_out,
            "error": error, "start_ns": start_ns, "last_send_ns": last_send_ns, "run_s": t1 - t0,
            "completed_rate_per_s": completed / (t1 - t0) if t1 > t0 else None,
            "late_releases": late, "window_full_loops": window_full_loops,
            "loadgen_cpu_s": cpu1 - cpu0}


# ---------------------------------------------------------------- idle connections


# Linux: choose the source port at connect(), per 4-tuple (not at bind, per address)
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def role_idle(a):
    """Open args['count'] MQTT connections (CONNECT/CONNACK, keepalive), at most
    args['window'] handshakes in progress at once; keep them until CLOSE.
    args['clean'] (default true): false asks for persistent sessions.

    args['source_ips'] (loopback addresses, optional) spreads the clients over
    several source addresses: with 20,000 connections from one address the
    kernel's search for a free ephemeral port (28k in all) grows with every
    connection and the load generator, not the broker, sets the pace."""
    deadline = a["deadline"]
    N = a["count"]
    W = a.get("window", 64)
    lim = raise_nofile(N + 256)
    emit("READY", {"nofile": list(lim)})
    if not wait_line("GO", deadline):
        return {"error": "no GO before deadline", "connected": 0, "timed_out": True}
    host, port = a["host"], a["port"]
    ka = a.get("keepalive", 600)
    clean = a.get("clean", True)   # False: persistent sessions (clean session 0)
    prefix = a["client_prefix"]
    sources = a.get("source_ips") or []
    sel = selectors.DefaultSelector()
    done = []
    opened = 0
    pending = 0
    failed = 0
    errors = {}
    timed_out = False
    cpu0 = self_cpu()
    t0 = mono()

    def fail(s, why):
        nonlocal failed, pending
        failed += 1
        pending -= 1
        errors[why] = errors.get(why, 0) + 1
        try:
            sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()

    while len(done) + failed < N:
        if mono() >= deadline:
            timed_out = True
            break
        while opened < N and pending < W:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            if sources:
                s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                s.bind((sources[opened % len(sources)], 0))
            rc = s.connect_ex((host, port))
            opened += 1
            pending += 1
            st = {"phase": "connect", "buf": b"", "id": opened}
            if rc not in (0, errno.EINPROGRESS):
                fail(s, "connect errno %d" % rc)
                continue
            sel.register(s, selectors.EVENT_WRITE, st)
        for key, _mask in sel.select(timeout=0.2):
            s = key.fileobj
            st = key.data
            if st["phase"] == "connect":
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    fail(s, "connect errno %d" % err)
                    continue
                try:
                    s.send(w.connect("%s-%d" % (prefix, st["id"]), clean=clean, keepalive=ka))
                except OSError as e:
                    fail(s, "send %s" % e.__class__.__name__)
                    continue
                st["phase"] = "connack"
                sel.modify(s, selectors.EVENT_READ, st)
            else:
                try:
                    d = s.recv(16)
                except BlockingIOError:
                    continue
                except OSError as e:
                    fail(s, "recv %s" % e.__class__.__name__)
                    continue
                if not d:
                    fail(s, "closed by broker")
                    continue
                st["buf"] += d
                if len(st["buf"]) >= 4:
                    if st["buf"][0] == 0x20 and st["buf"][3] == 0:
                        sel.unregister(s)
                        pending -= 1
                        done.append(s)
                    else:
                        fail(s, "bad CONNACK %r" % st["buf"][:4])
    t1 = mono()
    cpu1 = self_cpu()
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()
    info = {"connected": len(done), "target": N, "failed": failed, "errors": errors,
            "timed_out": timed_out, "connect_all_s": t1 - t0,
            "connects_per_s": len(done) / (t1 - t0) if t1 > t0 else None,
            "loadgen_cpu_s": cpu1 - cpu0}
    emit("CONNECTED", info)
    wait_line("CLOSE", deadline + 30)
    # check how many are still open (broker did not drop them)
    still = 0
    for s in done:
        try:
            d = s.recv(1, socket.MSG_PEEK)
            if d == b"":
                continue
            still += 1
        except BlockingIOError:
            still += 1
        except OSError:
            pass
    info["still_open_at_close"] = still
    for s in done:
        try:
            s.send(w.DISCONNECT_PKT)
        except OSError:
            pass
        s.close()
    return info


# ---------------------------------------------------------------- $SYS accounting


class SysSampler:
    """The latest value of each watched ``$SYS`` counter, and one sample per burst.

    Both brokers publish their counters in a burst every ``sys_interval``, only the
    values that changed (mqttamqp since session 25), so a sample combines the burst
    with the last value seen of every other counter.  The brokers count the $SYS messages they send
    to this monitor in ``sent``; the monitor subtracts the ones it had received
    when the value was taken: ``sent_from="message"`` (Mosquitto counts as it
    sends, so all those before the message that carries ``sent``), ``"burst"``
    (a broker that takes every value of a burst before publishing it) or
    ``"none"`` (mqttamqp since issue 15: its own $SYS messages are not in ``sent``).
    Retained values delivered on subscribe were taken before the monitor existed.
    ``burst_marker``: a topic the broker sends first in every burst (mqttamqp's
    uptime), so a burst ends when the next one starts; otherwise, and also, it ends
    after a gap (``burst_gap_s``)."""

    def __init__(self, topics, t0_ns, sent_from="message", max_samples=2000,
                 burst_marker=None):
        self.role_of = {t.encode(): r for r, t in topics.items()}
        self.values = {}
        self.sys_rx = 0
        self.burst_start_rx = 0
        self.sent_from = sent_from
        self.sent_correction = 0
        self.in_burst = False
        self.samples = []
        self.t0_ns = t0_ns
        self.max_samples = max_samples
        self.marker = burst_marker.encode() if burst_marker else None

    def message(self, topic, payload, retained, now_ns):
        """One $SYS message; True when it closed the burst before it (a live
        ``burst_marker``)."""
        closed = False
        if topic == self.marker and not retained and self.in_burst:
            closed = self.close_burst(now_ns)
        if not self.in_burst:
            self.burst_start_rx = self.sys_rx
        role = self.role_of.get(topic)
        if role is not None:
            try:
                self.values[role] = int(payload.split()[0])
            except (ValueError, IndexError):
                pass
            if role == "sent":
                self.sent_correction = (0 if retained or self.sent_from == "none"
                                        else self.burst_start_rx
                                        if self.sent_from == "burst" else self.sys_rx)
        self.sys_rx += 1
        self.in_burst = True
        return closed

    def close_burst(self, now_ns):
        """Evaluate received - (sent + dropped + queued) with the latest values."""
        if not self.in_burst:
            return False
        self.in_burst = False
        v = self.values
        if not all(k in v for k in ("received", "sent", "dropped")):
            return False
        sent = v["sent"] - self.sent_correction
        queued = v.get("queued")
        sample = {"t_s": round((now_ns - self.t0_ns) / 1e9, 3), "received": v["received"],
                  "sent": sent, "dropped": v["dropped"], "queued": queued,
                  "mismatch": v["received"] - sent - v["dropped"] - (queued or 0)}
        if "store_count" in v:
            sample["store_count"] = v["store_count"]
        if len(self.samples) < self.max_samples:
            self.samples.append(sample)
        return True

    def report(self):
        worst = max(self.samples, key=lambda x: abs(x["mismatch"]), default=None)
        final = self.samples[-1]["received"] if self.samples else 0
        return {
            "samples": self.samples,
            "n_samples": len(self.samples),
            # taken while traffic was under way (not before the first publish or at rest)
            "n_mid_load": sum(1 for x in self.samples if 0 < x["received"] < final),
            "queued_published": "queued" in self.values,
            "topics_seen": sorted(self.values),
            "worst_mismatch": worst["mismatch"] if worst else None,
            "worst_mismatch_sample": worst,
            "worst_mismatch_pct_of_received": (100.0 * abs(worst["mismatch"]) / worst["received"]
                                               if worst and worst["received"] else None),
            "sys_messages_received": self.sys_rx,
        }


def role_sysmon(a):
    """Subscribe to the broker's $SYS counters and sample the accounting identity
    received = sent + dropped + queued at every $SYS burst, until STOP (then one
    more burst, bounded) or the deadline.  args: host, port, topics {role: topic}
    with roles received, sent, dropped and optionally queued and store_count,
    sent_from and burst_marker (see SysSampler), burst_gap_s, client_prefix,
    deadline, after_stop_s."""
    deadline = a["deadline"]
    topics = a["topics"]
    gap_ns = int(a.get("burst_gap_s", 0.1) * 1e9)
    marker = a.get("burst_marker")
    subs = [(t, 0) for t in topics.values()] + ([(marker, 0)] if marker else [])
    s, parser, extra = mqtt_open(a["host"], a["port"], "%s-0" % a["client_prefix"], subs=subs)
    sampler = SysSampler(topics, mono_ns(), a.get("sent_from", "message"),
                         burst_marker=marker)
    last_ns = mono_ns()

    def feed(packets):
        nonlocal last_ns
        for h, body in packets:
            if h >> 4 != w.PUBLISH:
                continue
            tl = (body[0] << 8) | body[1]
            off = 2 + tl + (2 if (h >> 1) & 3 else 0)
            if w.LEVEL == 5:  # skip the property block (its length is a varint)
                plen, mul = 0, 1
                while True:
                    b = body[off]
                    off += 1
                    plen += (b & 0x7F) * mul
                    mul <<= 7
                    if not b & 0x80:
                        break
                off += plen
            last_ns = mono_ns()
            if sampler.message(bytes(body[2:2 + tl]), bytes(body[off:]), bool(h & 1), last_ns):
                closed.append(True)

    closed = []   # bursts closed by the next one's marker (burst_marker)
    feed(extra)
    emit("READY", {"topics": topics})
    stop_by = None  # after STOP: report after the next burst, or at this time
    # Closes to wait for after STOP: with a marker the first one may close a burst that
    # began before STOP, so the sample at rest is the second (one that began after it).
    closes_after_stop = 0
    stdin_open = True
    stdin_buf = b""
    reason = "deadline"
    while mono() < deadline:
        if stop_by is not None and mono() >= stop_by:
            reason = "stop (no burst after STOP)"
            break
        fds = [s, 0] if stdin_open else [s]
        r, _, _ = select.select(fds, [], [], 0.05)
        if s in r:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data == b"":
                reason = "closed by broker"
                break
            if data:
                feed(parser.feed(data))
        if 0 in r:
            chunk = os.read(0, 4096)
            if not chunk:
                stdin_open = False
            stdin_buf += chunk
            if b"STOP" in stdin_buf and stop_by is None:
                stop_by = mono() + a.get("after_stop_s", 2.5)
                closed.clear()   # (the sample at rest is the next burst)
        now_ns = mono_ns()
        if sampler.in_burst and now_ns - last_ns > gap_ns:
            closed.append(sampler.close_burst(now_ns))
        if stop_by is not None:
            closes_after_stop += sum(1 for c in closed if c)
            if closes_after_stop >= (2 if marker else 1):
                reason = "stop"
                break
        closed.clear()
    if not (marker and reason == "stop"):
        # (with a marker, the burst it just started may be only partly read: not one)
        sampler.close_burst(mono_ns())
    close_gracefully([s], timeout=1.0)
    res = sampler.report()
    res["stop_reason"] = reason
    return res


ROLES = {"sub": role_sub, "pub0": role_pub0, "pubq": role_pubq, "idle": role_idle,
         "sysmon": role_sysmon}


def main():
    role = sys.argv[1]
    args = json.loads(sys.argv[2])
    try:
        res = ROLES[role](args)
    except Exception as e:  # report, never hang
        res = {"error": "%s: %s" % (e.__class__.__name__, e),
               "traceback": traceback.format_exc()[-2000:]}
    emit("RESULT", res)


if __name__ == "__main__":
    main()
