"""Takeover time of an ``--ha`` pair (issue 28, figures): from ``kill -9`` of the
leader to the standby accepting MQTT CONNECTs and to all persistent sessions resumed,
with a stored state of N persistent sessions (one QoS 1 subscription and one queued
QoS 1 message each) and M retained messages.

A throw-away PostgreSQL cluster (``tests/support/pgcluster.py``) on 127.0.0.1; the
state is written straight through the broker's store (``ZODBStore``, 5,000 ops a
commit) before any broker starts; then a leader and a standby (``twistd mqttamqp
--ha``, as processes) start on it, the leader is killed, and a raw MQTT CONNECT is
tried against the standby's port every 20 ms until a CONNACK comes back.  Then every
session's client reconnects (clean session 0; ``--concurrency`` at a time, a bounded
reconnect storm starting at that first CONNACK): it is resumed when its CONNACK says
session present and its queued message has come (PUBACKed).  Printed as JSON: the
kill-to-first-CONNACK time, the kill-to-last-session-resumed time, the standby's own
takeover line (its load time).

Loopback only; every wait is bounded (``--timeout``); only the processes started here
are signalled, by their PID.

    python bench/ha_takeover.py [--sessions 10000] [--retained 100000] [--rounds 1]
"""

import argparse
import datetime
import json
import os
import re
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from brokerproc import BrokerProcess  # noqa: E402
from pgcluster import PostgresCluster  # noqa: E402


def log(msg):
    sys.stderr.write("[ha_takeover {}] {}\n".format(time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def populate(uri, data_dir, sessions, retained, queued=True):
    """Write the state through the store, as a broker would have."""
    from mqttamqp.core.message import Message
    from mqttamqp.core.persistence import (
        PutQueued,
        PutRetained,
        PutSession,
        PutSubscription,
        StoredQueued,
    )
    from mqttamqp.store import ZODBStore, resolve_engine

    class Inline:
        def callFromThread(self, f, *args):
            f(*args)

    store = ZODBStore(data_dir, Inline(), engine=resolve_engine(uri, data_dir))
    store.load()
    pending = []
    batch = []

    def flush():
        if batch:
            pending.append(store.submit(list(batch)))
            batch.clear()

    for i in range(sessions):
        batch.append(PutSession("s%06d" % i, 0.0))
        batch.append(PutSubscription("s%06d" % i, "bench/s/%d/#" % i, 1))
        if queued:
            batch.append(PutQueued("s%06d" % i, 1, StoredQueued(
                Message("bench/s/%d/q" % i, b"queued", 1, False), 1)))
        if len(batch) >= 5000:
            flush()
    for i in range(retained):
        batch.append(PutRetained(Message("bench/r/%d" % i, b"x" * 32, 1, True)))
        if len(batch) >= 5000:
            flush()
    flush()
    store.close()   # commits what is queued and fires its Deferreds
    failed = [d for d in pending if not d.called]
    if failed:
        raise RuntimeError("%d commits did not finish" % len(failed))


def connect_packet(client_id, clean, will=False):
    """MQTT 3.1.1 CONNECT; ``will``: with a QoS 0 will on ``bench/will/<id>``, as
    devices that report going offline send it every time."""
    cid = client_id.encode()
    flags = (0x02 if clean else 0x00) | (0x04 if will else 0x00)
    var = b"\x00\x04MQTT\x04" + bytes([flags]) + b"\x00\x3c"
    payload = len(cid).to_bytes(2, "big") + cid
    if will:
        topic = b"bench/will/" + cid
        payload += len(topic).to_bytes(2, "big") + topic + b"\x00\x07offline"
    body = var + payload
    return bytes([0x10, len(body)]) + body


def try_connack(port, client_id, clean, timeout):
    """CONNACK's (session present, return code), or None when refused."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except ConnectionRefusedError:
        return None
    with s:
        s.sendall(connect_packet(client_id, clean))
        data = b""
        while len(data) < 4:
            chunk = s.recv(4 - len(data))
            if not chunk:
                return None
            data += chunk
        s.sendall(b"\xe0\x00")   # DISCONNECT
        return bool(data[2] & 1), data[3]


class _Resumer:
    """One client resuming its stored session, as a step of ``resume_all``'s loop:
    connect, CONNECT (clean session 0), CONNACK (session present), then (``queued``)
    the session's queued QoS 1 message, PUBACKed.  Non-blocking, on raw sockets with
    a pre-encoded CONNECT: the bench's own CPU per session is a fraction of asyncio
    streams' (it shares the two cores with the broker and PostgreSQL)."""

    __slots__ = ("sock", "packet", "buf", "connack", "deadline")

    def __init__(self, packet, deadline):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.packet = packet
        self.buf = b""
        self.connack = False
        self.deadline = deadline

    def received(self, data, queued):
        """True: resumed; False: failed; None: more to read."""
        self.buf += data
        buf = self.buf
        if not self.connack:
            if len(buf) < 4:
                return None
            if buf[0] != 0x20 or buf[3] != 0 or not buf[2] & 1:
                return False
            self.connack = True
            if not queued:
                return True
            buf = self.buf = buf[4:]
        # the queued message: a PUBLISH (QoS 1), whole
        length, shift, pos = 0, 0, 1
        while True:
            if pos >= len(buf):
                return None
            b = buf[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if len(buf) < pos + length:
            return None
        if buf[0] & 0xF0 != 0x30:
            return False
        topic_len = int.from_bytes(buf[pos:pos + 2], "big")
        pid = buf[pos + 2 + topic_len:pos + 4 + topic_len]
        self.sock.send(b"\x40\x02" + pid)   # PUBACK (4 bytes: the buffer has room)
        return True


def resume_all(port, sessions, concurrency, timeout, queued=True, will=False):
    """Every stored session resumed by a client of its own, ``concurrency`` resuming
    at a time (a reconnect storm, bounded), every connection kept open until all are
    resumed (a DISCONNECT would cost the broker a commit of its own, and devices
    stay connected): (seconds to the last one, how many succeeded).  One thread, one
    ``selectors`` loop; each client has ``timeout`` seconds, the whole storm too."""
    import errno
    import selectors

    sel = selectors.DefaultSelector()
    addr = ("127.0.0.1", port)
    started = time.monotonic()
    deadline = started + timeout
    keep = []
    active = {}
    ok = 0
    ended = 0
    next_i = 0

    def finish(r, resumed):
        nonlocal ok, ended
        sel.unregister(r.sock)
        del active[r.sock]
        ended += 1
        if resumed:
            ok += 1
            keep.append(r.sock)
        else:
            r.sock.close()

    try:
        while ended < sessions and time.monotonic() < deadline:
            now = time.monotonic()
            while next_i < sessions and len(active) < concurrency:
                r = _Resumer(connect_packet("s%06d" % next_i, False, will), now + timeout)
                next_i += 1
                err = r.sock.connect_ex(addr)
                if err not in (0, errno.EINPROGRESS):
                    r.sock.close()
                    ended += 1
                    continue
                active[r.sock] = r
                sel.register(r.sock, selectors.EVENT_WRITE, r)
            for key, events in sel.select(timeout=0.2):
                r = key.data
                if events & selectors.EVENT_WRITE:
                    if r.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        finish(r, False)
                        continue
                    r.sock.send(r.packet)   # (a few dozen bytes: sent whole)
                    sel.modify(r.sock, selectors.EVENT_READ, r)
                    continue
                try:
                    data = r.sock.recv(4096)
                except OSError:
                    data = b""
                resumed = r.received(data, queued) if data else False
                if resumed is not None:
                    finish(r, resumed)
            if now > min((r.deadline for r in active.values()), default=now):
                for r in [r for r in active.values() if r.deadline < now]:
                    finish(r, False)
        return time.monotonic() - started, ok
    finally:
        for sock in list(active) + keep:
            sock.close()
        sel.close()


def cpu_seconds(pid):
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commit_figures(metrics_port):
    """The broker's commit counters from /metrics (count, latency sum, batch sum)."""
    import urllib.request

    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port,
                                timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        name = line.split(" ", 1)[0]
        if (name.startswith(("mqttamqp_commit", "mqttamqp_store_")) and "{" not in name
                and not name.endswith("_created")):
            out[name] = float(line.split()[-1])
    return out


def run_queue_wait_seconds(pid):
    """Seconds the threads of process ``pid`` (those alive now) have waited on a run
    queue for a CPU so far (/proc/PID/task/*/schedstat): what a busy machine costs
    it beyond its own CPU time."""
    total = 0
    for task in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, task)) as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue   # (ended meanwhile)
    return total / 1e9


def cluster_cpu_seconds(cluster):
    """CPU seconds of the PostgreSQL server's processes so far, by PID: its
    postmaster and every backend (its children), from /proc.  (Subtract two of
    these with ``cpu_delta``: a backend that ended between them is not counted.)"""
    with open(os.path.join(cluster.data, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    total = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue   # (ended meanwhile)
        if int(entry) == postmaster or int(fields[1]) == postmaster:
            total[entry] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def cpu_delta(before, after):
    """CPU seconds the processes alive at ``after`` used since ``before``."""
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


def listen_overflows():
    """The kernel's count of connections dropped because a listen queue was full
    (TcpExt ListenOverflows; for the whole network namespace)."""
    with open("/proc/net/netstat") as f:
        rows = [line.split() for line in f if line.startswith("TcpExt:")]
    return int(rows[1][rows[0].index("ListenOverflows")])


def storm_summary(commits):
    """What the storm's commit counters say: submits per group commit, and the mean
    time of a group commit and of a submit's wait (hand-off to durable)."""
    out = {}
    groups = commits.get("mqttamqp_store_group_commits_total")
    submits = commits.get("mqttamqp_store_committed_submits_total")
    spent = commits.get("mqttamqp_store_commit_seconds_total")
    if groups:
        out["group_commits"] = groups
        out["submits_per_group_commit"] = round(submits / groups, 2)
        out["mean_group_commit_seconds"] = round(spent / groups, 4)
        out["writer_busy_seconds"] = round(spent, 3)
    waits = commits.get("mqttamqp_commit_latency_seconds_count")
    if waits:
        out["mean_submit_wait_seconds"] = round(
            commits["mqttamqp_commit_latency_seconds_sum"] / waits, 4)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(cluster, sessions, retained, timeout, tmp, concurrency, queued=True,
              will=False):
    os.makedirs(tmp, exist_ok=True)
    uri = cluster.create_database()
    t = time.monotonic()
    populate(uri, os.path.join(tmp, "populate"), sessions, retained, queued)
    populate_s = time.monotonic() - t
    log("populated %d sessions, %d retained in %.1fs" % (sessions, retained, populate_s))
    procs = []
    ports = [free_port(), free_port()]
    try:
        for n, port in enumerate(ports):
            proc = BrokerProcess(
                os.path.join(tmp, "data%d" % n), "--storage", uri, "--ha", "--ha-poll",
                "0.2", "--ha-watch", "1", "--no-archive", "--will-grace", "0",
                "--max-connections", str(sessions + 100),
                listeners=("--mqtt", "--metrics"),
                descriptions={"--mqtt": "tcp:%d:interface=127.0.0.1" % port})
            procs.append(proc)
            proc.start(timeout=timeout, expect=("--metrics",))
            proc.wait_for_line(r"took over as leader" if n == 0 else r"standby: waiting",
                               timeout)
        leader, standby = procs
        log("leader and standby up; kill -9 the leader")
        takeover_cpu = cpu_seconds(standby.proc.pid)
        takeover_wait = run_queue_wait_seconds(standby.proc.pid)
        takeover_pg_cpu = cluster_cpu_seconds(cluster)
        killed = time.monotonic()
        leader.kill()
        deadline = killed + timeout
        answer = None
        while answer is None and time.monotonic() < deadline:
            answer = try_connack(ports[1], "probe", True, timeout)
            if answer is None:
                time.sleep(0.02)   # (a benchmark's poll, not a test)
        connack_s = time.monotonic() - killed
        if answer is None:
            raise RuntimeError("the standby did not accept a CONNECT within %ss" % timeout)
        # every persistent session's client reconnects as soon as the listener
        # answers (the probe's CONNACK): CONNACK with the session, then its queued
        # message.  The storm starts at once; the commit counters before it are
        # read beside it (nothing commits in its first moments), from a thread.
        import threading

        commits = {}
        scrape = threading.Thread(
            target=lambda: commits.update(commit_figures(standby.ports["METRICS"])))
        broker_cpu = cpu_seconds(standby.proc.pid)
        broker_wait = run_queue_wait_seconds(standby.proc.pid)
        pg_cpu = cluster_cpu_seconds(cluster)
        takeover_cpu = broker_cpu - takeover_cpu
        takeover_wait = broker_wait - takeover_wait
        takeover_pg_cpu = cpu_delta(takeover_pg_cpu, pg_cpu)
        own_cpu = time.process_time()
        overflows = listen_overflows()
        scrape.start()
        storm_started = time.monotonic()
        storm_s, storm_ok = resume_all(ports[1], sessions, concurrency, timeout, queued,
                                       will)
        scrape.join(timeout)
        overflows = listen_overflows() - overflows
        broker_cpu = cpu_seconds(standby.proc.pid) - broker_cpu
        broker_wait = run_queue_wait_seconds(standby.proc.pid) - broker_wait
        pg_cpu = cpu_delta(pg_cpu, cluster_cpu_seconds(cluster))
        own_cpu = time.process_time() - own_cpu
        after = commit_figures(standby.ports["METRICS"])
        commits = {k: round(after.get(k, 0.0) - v, 3) for k, v in commits.items()}
        all_resumed_s = storm_started + storm_s - killed
        # (the bench's own reads between the first CONNACK and the storm)
        bench_gap_s = storm_started - killed - connack_s
        line = standby.wait_for_line(r"took over as leader", timeout)
        m = re.search(r"listeners open in ([\d.]+)s", line)
        return {"sessions": sessions, "retained": retained,
                "populate_seconds": round(populate_s, 3),
                "kill_to_connack_seconds": round(connack_s, 3),
                "standby_load_and_listen_seconds": float(m.group(1)) if m else None,
                "kill_to_all_sessions_resumed_seconds": round(all_resumed_s, 3),
                "takeover_broker_cpu_seconds": round(takeover_cpu, 2),
                "takeover_broker_run_queue_wait_seconds": round(takeover_wait, 2),
                "takeover_postgresql_cpu_seconds": round(takeover_pg_cpu, 2),
                "bench_own_pauses_seconds": round(bench_gap_s, 3),
                "sessions_resumed": storm_ok, "resume_concurrency": concurrency,
                "queued_message_per_session": queued, "will_in_connect": will,
                "resume_storm_seconds": round(storm_s, 3),
                "storm_broker_cpu_seconds": round(broker_cpu, 2),
                "storm_broker_run_queue_wait_seconds": round(broker_wait, 2),
                "storm_bench_clients_cpu_seconds": round(own_cpu, 2),
                "storm_postgresql_cpu_seconds": round(pg_cpu, 2),
                "storm_listen_overflows": overflows,
                "storm_broker_commits": commits,
                "storm_commits_summary": storm_summary(commits)}
    finally:
        for proc in procs:
            proc.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--retained", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--concurrency", type=int, default=200,
                    help="sessions resuming at once after the takeover")
    ap.add_argument("--will", action="store_true",
                    help="every CONNECT of the storm carries a will (stored before CONNACK)")
    ap.add_argument("--no-queued", action="store_true",
                    help="sessions without a queued message: resumed at CONNACK")
    ap.add_argument("--out")
    args = ap.parse_args()
    cluster = PostgresCluster().start()
    try:
        with tempfile.TemporaryDirectory(prefix="ha-bench-") as tmp:
            rounds = [one_round(cluster, args.sessions, args.retained, args.timeout,
                                os.path.join(tmp, str(i)), args.concurrency,
                                not args.no_queued, args.will)
                      for i in range(args.rounds)]
    finally:
        cluster.stop()
    doc = {"bench": "ha_takeover", "when": datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%dT%H:%M:%SZ"), "cpus": os.cpu_count(),
           "load_average": os.getloadavg(), "rounds": rounds}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
