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
* ``amqp_links_many``: 100 AMQP connections each attach as many links as the
  broker allows (up to ``--amqp-max-links`` each, until an attach is refused for
  the total, ``--amqp-max-links-total``), hold them, then close; it reports the
  links held, the bytes of RSS per link at the peak, and the RSS after;
* ``fuzz``: the MQTT and AMQP socket fuzzers of ``tests/support/fuzzing.py`` for 60 s;
* ``ws_abuse``: WebSocket handshakes with version 8 and frame headers announcing
  100 MB and 2^63 bytes (200 of each);
* ``fd_exhaustion``: the broker's descriptor limit lowered while it runs, then 150
  connections;
* ``login_guessing``: console password guesses for one user from 100 loopback
  addresses for 30 s;
* ``shared_stuck``: a shared group of three members that never PUBACK and one that
  does, 20,000 QoS 1 messages, then the stuck members leave (issue #26);
* ``retained_replay``: a new QoS 1 and QoS 0 subscriber to 2,000 retained messages of
  8 KB, then to 100,000 of 1 KB (issue #26);
* ``queue_flood``: 8 publishers each pipelining QoS 1 messages of 64 KB into a
  durable queue of its own (``$queue/flood<i>/x``, no consumer) for 60 s, then a
  consumer reads 200 messages back from one of them; measures what was
  acknowledged, how long the publishers were not read (the queue bounds' back-
  pressure) and the data directory's size;
* ``user_properties``: other clients' PING round trips (p50, p99) while one MQTT 5
  client floods, 20 s a phase: packets of 100,000 user properties, packets at the
  user property limit, small QoS 0 PUBLISHes, and SUBSCRIBEs of 1,000 filters
  (the abuser runs in its own process: ``abuse.py --abuser KIND PORT SECONDS``).

``--quick`` divides the durations by 6 and the counts by 10.

For each: whether the broker stayed alive; a well-behaved pair of clients (a
publisher sending QoS 1 every 20 ms, a subscriber) running through the scenario
and how many of its messages arrived (all must); the broker's RSS before, at its
peak (sampled every 100 ms) and after, in MB; the data directory's size; the
number of log lines at the start and the end; the log lines with a traceback or
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


def packets_until(sock, parser, stop):
    """The packets ``sock`` receives (``(first byte, body)``) until ``stop`` is set or
    the socket ends; the socket's timeout paces the checks of ``stop``."""
    while not stop.is_set():
        try:
            data = sock.recv(1 << 16)
        except socket.timeout:
            continue
        except OSError:
            return
        if not data:
            return
        yield from parser.feed(data)


def log_lines(broker):
    """How many lines the broker's log has (a flood of log lines is a finding too)."""
    try:
        with open(broker.log, errors="replace") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def data_dir_mb(broker):
    """The broker's data directory, in MB (storage, archive, everything)."""
    total = 0
    for root, _dirs, files in os.walk(os.path.join(broker.tmp, "data")):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return round(total / (1 << 20), 1)


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
    listener = getattr(fn, "listener", None)   # a scenario's own listener, on a free port
    extra_port = brokers.free_port() if listener else None
    if listener:
        extra_args = (*extra_args, listener, "tcp:%d:interface=127.0.0.1" % extra_port)
    amqp_port = brokers.free_port()
    broker = brokers.Broker("mqttamqp", mqttamqp_help_text=HELP[0], extra_args=[
        "--amqp", "tcp:%d:interface=127.0.0.1" % amqp_port, "--web", "none",
        "--connect-timeout", "5", "--no-archive",
        # the broker's own default queue bounds (brokers.Broker raises them for
        # parity with Mosquitto in the throughput benchmark)
        "--max-queued-messages", "1000", "--max-queued-bytes", str(16 << 20), *extra_args])
    broker.amqp_port = amqp_port
    broker.extra_port = extra_port
    broker.start()
    try:
        time.sleep(0.5)
        before = broker.status()["VmRSS"]
        lines_before = log_lines(broker)
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
            "data_dir_mb": data_dir_mb(broker),
            "log_lines": {"at_start": lines_before, "at_end": log_lines(broker)},
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


class _LinkClient:
    """One AMQP connection (a proton client engine on a socket) attaching links."""

    def __init__(self, port, name):
        from proton import Connection, Transport

        self.conn = Connection()
        self.conn.container = name
        self.transport = Transport()
        self.transport.bind(self.conn)
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setblocking(False)
        self.inbound = b""
        self.links = []
        self.closed = False
        self.refused = False        # an attach was refused: it stops asking

    def attach(self, n, tag):
        for i in range(n):
            link = self.session.receiver("l%d" % len(self.links))
            link.source.address = "many/%s/%d" % (tag, len(self.links))
            link.open()
            self.links.append(link)

    def pump(self):
        """Move what is ready both ways (never blocks); heartbeats on time."""
        if self.closed:
            return
        self.transport.tick(time.monotonic())
        pending = self.transport.pending()
        if pending > 0:
            out = bytes(self.transport.peek(pending))
            try:
                sent = self.sock.send(out)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.closed = True
                return
            self.transport.pop(sent)
        try:
            data = self.sock.recv(1 << 20)
            if not data:
                self.closed = True
            self.inbound += data
        except BlockingIOError:
            pass
        except OSError:
            self.closed = True
        while self.inbound and self.transport.capacity() > 0:
            n = min(len(self.inbound), self.transport.capacity())
            self.transport.push(self.inbound[:n])
            self.inbound = self.inbound[n:]

    def answered(self):
        """Attaches answered so far, and of those refused."""
        from proton import Endpoint

        done = refused = 0
        for link in self.links:
            if link.state & Endpoint.REMOTE_CLOSED:
                done += 1
                refused += 1
            elif link.state & Endpoint.REMOTE_ACTIVE:
                done += 1
        return done, refused

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def amqp_links_many(broker, quick):
    """100 connections attach links up to what the broker allows, in rounds of 100
    per connection; a connection stops at its own bound or at its first refusal
    (which it detaches, as a well-behaved client does); all hold what they got
    until the end, when the RSS is read and they close."""
    connections = 20 if quick else 100
    per_connection = 1000                      # the broker's --amqp-max-links default
    batch = 100
    rss0 = broker.status()["VmRSS"]
    clients = [_LinkClient(broker.amqp_port, "many-%d" % i) for i in range(connections)]
    end = time.monotonic() + (60 if quick else 240)
    while time.monotonic() < end:
        active = [c for c in clients if not (c.closed or c.refused)
                  and len(c.links) < per_connection]
        if not active:
            break
        for c in active:
            c.attach(min(batch, per_connection - len(c.links)), c.conn.container)
        # until every attach of the round is answered (bounded by the deadline)
        while time.monotonic() < end:
            for c in clients:
                c.pump()
            waiting = False
            for c in active:
                done, refused = c.answered()
                if refused and not c.refused:
                    c.refused = True
                    for link in c.links:     # detach what was refused
                        if link.remote_condition is not None:
                            link.close()
                if done < len(c.links) and not c.closed:
                    waiting = True
            if not waiting:
                break
            time.sleep(0.005)
    for _ in range(50):                       # the detaches of refused links out
        for c in clients:
            c.pump()
        time.sleep(0.01)
    attached = sum(c.answered()[0] - c.answered()[1] for c in clients if not c.closed)
    refused = sum(c.answered()[1] for c in clients)
    closed_by_broker = sum(1 for c in clients if c.closed)
    rss = broker.status()["VmRSS"]
    for c in clients:
        c.close()
    return {"connections": connections, "links_attached": attached,
            "attaches_refused": refused, "connections_closed_by_broker": closed_by_broker,
            "rss_mb_holding": round(rss / MB, 1),
            # (what the links held added to the RSS: proton's, the broker's, the
            # allocator's overhead)
            "rss_bytes_per_link": round((rss - rss0) * 1024 / attached) if attached else None}


def fuzz(broker, quick):
    sys.path.insert(0, os.path.join(brokers.MAIN, "tests", "support"))
    import fuzzing as tf  # the fuzzers of the test suite

    seconds = 10 if quick else 60
    counts = {}
    for proto, port, data, keep in (
            ("mqtt", broker.port, tf.mqtt_stream(), 20),
            ("amqp", broker.amqp_port, tf.amqp_stream(), 8)):
        import random

        rng = random.Random(7)
        end = time.monotonic() + seconds / 2
        n = 0
        while time.monotonic() < end:
            tf.poke(port, tf.mutate(rng, data, keep))
            n += 1
        counts[proto] = n
    return {"cases": counts}


# -- issue #26 section 3: no acknowledged message dropped ----------------------------

class _NbClient:
    """A non-blocking MQTT client for the select loops below: ``out`` goes as the
    socket takes it; PUBLISHes are counted (distinct payload prefixes) and, when
    ``acks``, answered with PUBACK; PUBACKs received are counted."""

    def __init__(self, port, client_id, acks=True, rcvbuf=None, key=6):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.parser = w.Parser()
        self.out = bytearray(w.connect(client_id, True))
        self.acks, self.key = acks, key
        self.connacked = self.subacked = False
        self.got = set()
        self.publishes = self.pubacks = 0
        self.closed = False

    def on_readable(self):
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        for first, body in self.parser.feed(data):
            kind = first >> 4
            if kind == w.PUBLISH:
                self.publishes += 1
                qos = (first >> 1) & 3
                tlen = int.from_bytes(body[:2], "big")
                start = 2 + tlen + (2 if qos else 0)
                self.got.add(bytes(body[start:start + self.key]))
                if qos and self.acks:
                    self.out += w.puback(bytes(body[2 + tlen:4 + tlen]))
            elif kind == w.PUBACK:
                self.pubacks += 1
            elif kind == w.CONNACK:
                self.connacked = True
            elif kind == w.SUBACK:
                self.subacked = True

    def on_writable(self):
        try:
            del self.out[:self.sock.send(self.out)]
        except BlockingIOError:
            pass
        except OSError:
            self.closed = True

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def _nb_loop(clients, until, seconds, idle=None):
    """Move bytes until ``until()``, ``seconds`` pass, or (``idle``) nothing arrived for
    that long; True if ``until()`` held."""
    end = time.monotonic() + seconds
    last = time.monotonic()
    import select

    while not until():
        now = time.monotonic()
        if now >= end or (idle is not None and now - last > idle):
            return False
        live = [c for c in clients if not c.closed]
        r, wr, _ = select.select([c.sock for c in live],
                                 [c.sock for c in live if c.out], [], 0.2)
        for c in live:
            if c.sock in wr:
                c.on_writable()
            if c.sock in r:
                c.on_readable()
                last = time.monotonic()
    return True


def _publish_all(port, client_id, messages, seconds):
    """Pipeline ``messages`` (topic, payload, retain) at QoS 1; PUBACKs counted."""
    pub = _NbClient(port, client_id)
    _nb_loop([pub], lambda: pub.connacked, 10)
    for i, (topic, payload, retain) in enumerate(messages):
        pub.out += w.publish(topic, payload, 1, i % 65535 + 1, retain)
    _nb_loop([pub], lambda: pub.pubacks >= len(messages), seconds)
    pub.close()
    return pub.pubacks


def shared_stuck(broker, quick):
    """Three members of a shared group that read but never PUBACK, one that does; a
    publisher pipelines QoS 1 messages (20,000; --quick 2,000) and waits for every
    PUBACK; then the stuck members leave (clean sessions).  Counts what the acking
    member got: every message acknowledged to the publisher must arrive."""
    n = 2000 if quick else 20000
    port = broker.port
    stuck = [_NbClient(port, "stuck-%d" % i, acks=False) for i in range(3)]
    acker = _NbClient(port, "acker")
    members = stuck + [acker]
    _nb_loop(members, lambda: all(m.connacked for m in members), 10)
    for m in members:
        m.out += w.subscribe(1, [("$share/abuse/jobs", 1)])
    _nb_loop(members, lambda: all(m.subacked for m in members), 10)
    pub = _NbClient(port, "shared-producer")
    _nb_loop([pub], lambda: pub.connacked, 10)
    pub.out += b"".join(w.publish("jobs", b"%06d" % i, 1, i % 65535 + 1)
                        for i in range(n))
    everyone = members + [pub]
    t0 = time.monotonic()
    acked_all = _nb_loop(everyone, lambda: pub.pubacks >= n, 60 if quick else 300)
    publish_seconds = time.monotonic() - t0
    held = sum(len(m.got) for m in stuck)
    before_leaving = len(acker.got)
    for m in stuck:
        m.close()
    _nb_loop([acker], lambda: len(acker.got) >= n, 30, idle=10)
    acker.close()
    pub.close()
    return {"messages": n, "acknowledged_to_publisher": pub.pubacks,
            "all_acknowledged": acked_all, "publish_seconds": round(publish_seconds, 1),
            "stuck_members_held": held, "acker_got_before_they_left": before_leaving,
            "acker_got": len(acker.got),
            "acknowledged_but_lost": max(0, pub.pubacks - len(acker.got))}


def retained_replay(broker, quick):
    """Retained messages, then a new subscriber at QoS 1 (acking) and one at QoS 0 (a
    64 KB socket buffer), counting what arrives: 2,000 of 8 KB, then (deleted first)
    100,000 of 1 KB (--quick: 200 and 10,000).  Every one must arrive."""
    port = broker.port
    out = {}
    for label, count, size in (("8KB", 200 if quick else 2000, 8192),
                               ("1KB", 10000 if quick else 100000, 1024)):
        topics = ["replay%s/%d" % (label, i) for i in range(count)]
        t0 = time.monotonic()
        stored = _publish_all(port, "retainer-" + label, [
            (t, b"%06d" % i + b"r" * (size - 6), True) for i, t in enumerate(topics)], 300)
        phase = {"retained": count, "stored_acknowledged": stored,
                 "store_seconds": round(time.monotonic() - t0, 1)}
        for qos in (1, 0):
            sub = _NbClient(port, "late-%s-q%d" % (label, qos), key=6,
                            rcvbuf=None if qos else 64 * 1024)
            _nb_loop([sub], lambda: sub.connacked, 10)
            sub.out += w.subscribe(1, [("replay%s/#" % label, qos)])
            t0 = time.monotonic()
            _nb_loop([sub], lambda: len(sub.got) >= count, 120 if quick else 600, idle=15)
            phase["qos%d" % qos] = {"got": len(sub.got), "all": len(sub.got) == count,
                                    "seconds": round(time.monotonic() - t0, 1)}
            sub.close()
        # (deleted, so the next phase stays within --max-retained-messages)
        _publish_all(port, "eraser-" + label, [(t, b"", True) for t in topics], 300)
        out[label] = phase
    return out


def _ws_handshake(port, version=13):
    import base64

    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
               "Sec-WebSocket-Protocol: mqtt\r\nSec-WebSocket-Version: %d\r\n\r\n"
               % (key, version)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    return s, int(head.split(b" ", 2)[1]) if head else 0


def _closed_within(s, seconds):
    """True if the peer closes ``s`` within ``seconds`` (whatever it sends first)."""
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
        return True
    except (socket.timeout, ConnectionError):
        return False
    finally:
        s.close()


def ws_abuse(broker, quick):
    """Handshakes with WebSocket version 8, and frame headers announcing 100 MB and
    2^63 bytes with nothing after them: each must be refused (426) or closed at the
    header, at once."""
    import struct

    port = broker.extra_port
    n = 20 if quick else 200
    refused = closed_100mb = closed_huge = 0
    for _ in range(n):
        s, status = _ws_handshake(port, version=8)
        s.close()
        refused += status == 426
        for length, kind in ((100 << 20, "100mb"), ((1 << 63) - 1 + 1, "huge")):
            s, status = _ws_handshake(port)
            if status != 101:
                s.close()
                continue
            s.sendall(bytes([0x82, 0x80 | 127]) + struct.pack("!Q", length)
                      + b"\x01\x02\x03\x04")
            if _closed_within(s, 5):
                if kind == "100mb":
                    closed_100mb += 1
                else:
                    closed_huge += 1
    return {"attempts_each": n, "version8_got_426": refused,
            "100mb_header_closed": closed_100mb, "2^63_header_closed": closed_huge}


ws_abuse.listener = "--mqtt-ws"


def fd_exhaustion(broker, quick):
    """The broker's descriptor limit lowered to 64 while it runs (prlimit), then 150
    connections: the ones past the limit are refused, the broker stays up, and the
    log says so once per spell."""
    import resource

    soft, hard = resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/%d/fd" % broker.proc.pid))
    limit = open_now + 40
    resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE, (limit, hard))
    socks, connacked = [], 0
    try:
        for i in range(60 if quick else 150):
            try:
                s, _p = mqtt_session(broker.port, "fd-%d" % i, timeout=2)
                socks.append(s)
                connacked += 1
            except (OSError, RuntimeError):
                pass
    finally:
        for s in socks:
            s.close()
        resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))
    with open(broker.log, errors="replace") as f:
        lines = [line.strip()[:200] for line in f if "file descriptor" in line]
    return {"limit": limit, "connacked": connacked, "fd_log_lines": len(lines),
            "fd_lines": lines[:3]}


def login_guessing(broker, quick):
    """Password guesses against one console user from 100 loopback addresses
    (127.0.0.2-101) for 30 s: how many the broker checked (the per-user pace bounds
    it), and whether the real user still gets in."""
    import urllib.parse

    port = broker.extra_port
    seconds = 5 if quick else 30
    checked = [0]
    refused = [0]
    stop = time.monotonic() + seconds

    def guesser(addr):
        import http.client
        import re

        while time.monotonic() < stop:
            try:
                # the login form first: its session cookie and CSRF token
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=35,
                                               source_address=(addr, 0))
                c.request("GET", "/login")
                r = c.getresponse()
                page = r.read().decode("utf-8", "replace")
                cookie = (r.getheader("Set-Cookie") or "").split(";")[0]
                token = re.search(r'name="csrf_token" value="([^"]+)"', page)
                body = urllib.parse.urlencode({
                    "csrf_token": token.group(1) if token else "", "username": "admin",
                    "password": "guess"})
                c.request("POST", "/login", body, {
                    "Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie})
                r = c.getresponse()
                r.read()
                c.close()
            except OSError:
                return
            if r.status == 429:
                refused[0] += 1
                time.sleep(1)   # (a client honouring Retry-After, roughly)
            else:
                checked[0] += 1

    threads = [threading.Thread(target=guesser, args=("127.0.0.%d" % (i + 2),), daemon=True)
               for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 40)
    with open(broker.log, errors="replace") as f:
        said = sum(1 for line in f if "wait their turn" in line or "are paced" in line)
    return {"seconds": seconds, "addresses": 100, "guesses_answered": checked[0],
            "refused_429": refused[0], "pacing_log_lines": said}


login_guessing.listener = "--web"


def _dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def queue_flood(broker, quick):
    seconds = 10 if quick else 60
    queues, size = 8, 64 * 1024
    payload = b"q" * size
    end = time.monotonic() + seconds
    counts = [{"sent": 0, "acked": 0, "not_read_s": 0.0} for _ in range(queues)]
    data_peak = [0]
    import select

    def flood(i):
        pub, parser = mqtt_session(broker.port, "flood-%d" % i)
        c = counts[i]
        stop = threading.Event()

        def acks():   # PUBACKs counted
            pub.settimeout(0.5)
            for first, _ in packets_until(pub, parser, stop):
                if first >> 4 == w.PUBACK:
                    c["acked"] += 1

        reader = threading.Thread(target=acks, daemon=True)
        reader.start()
        pending = b""
        while time.monotonic() < end:
            if not pending:
                pending = w.publish("$queue/flood%d/x" % i, payload, 1,
                                    c["sent"] % 65535 + 1)
                c["sent"] += 1
            t0 = time.monotonic()
            _, writable, _ = select.select([], [pub], [], max(0.0, end - t0))
            waited = time.monotonic() - t0
            if waited > 0.05:
                c["not_read_s"] += waited
            if not writable:
                break
            try:
                pending = pending[pub.send(pending):]
            except OSError:
                break
        time.sleep(1.0)    # the last PUBACKs
        stop.set()
        reader.join(2)
        pub.close()

    def watch_disk():
        while time.monotonic() < end:
            data_peak[0] = max(data_peak[0], _dir_bytes(os.path.join(broker.tmp, "data")))
            time.sleep(1.0)

    threads = [threading.Thread(target=flood, args=(i,), daemon=True)
               for i in range(queues)]
    threads.append(threading.Thread(target=watch_disk, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    # A consumer reads some back (from storage, when the bodies were evicted).
    got = 0
    consume_s = None
    try:
        s, parser = mqtt_session(broker.port, "flood-consumer", timeout=10)
        t0 = time.monotonic()
        s.sendall(w.subscribe(1, [("$queue/flood0/#", 1)]))
        s.settimeout(10)
        want = min(200, counts[0]["acked"])
        while got < want and time.monotonic() - t0 < 60:
            data = s.recv(1 << 16)
            if not data:
                break
            for first, body in parser.feed(data):
                if first >> 4 == w.PUBLISH:
                    got += 1
                    tlen = int.from_bytes(body[:2], "big")
                    s.sendall(w.puback(body[2 + tlen:4 + tlen]))
        consume_s = round(time.monotonic() - t0, 1)
        s.close()
    except (OSError, RuntimeError) as exc:
        consume_s = repr(exc)
    data_bytes = _dir_bytes(os.path.join(broker.tmp, "data"))
    return {"flood_seconds": seconds, "queues": queues, "payload_bytes": size,
            "sent": sum(c["sent"] for c in counts),
            "acknowledged": sum(c["acked"] for c in counts),
            "acknowledged_mb": round(sum(c["acked"] for c in counts) * size / 2 ** 20, 1),
            "publishers_not_read_seconds": round(max(c["not_read_s"] for c in counts), 1),
            "consumer_got": got, "consumer_seconds": consume_s,
            "data_dir_mb_peak": round(max(data_peak[0], data_bytes) / 2 ** 20, 1),
            "data_dir_mb_after": round(data_bytes / 2 ** 20, 1)}


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
            for first, body in packets_until(sock, w.Parser(), stop):
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
             "amqp_links": amqp_links, "amqp_links_many": amqp_links_many, "fuzz": fuzz,
             "ws_abuse": ws_abuse, "fd_exhaustion": fd_exhaustion,
             "login_guessing": login_guessing, "shared_stuck": shared_stuck,
             "retained_replay": retained_replay, "queue_flood": queue_flood,
             "user_properties": user_properties}


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
