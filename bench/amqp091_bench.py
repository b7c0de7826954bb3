#!/usr/bin/env python3
"""AMQP 0.9.1 benchmark: mqttamqp beside RabbitMQ (Debian's rabbitmq-server), same run.

    python bench/amqp091_bench.py [--brokers rabbitmq,mqttamqp] [--scenarios a,b]
                                  [--repeat R] [--quick] [--window W] [--timeout S]
                                  [--base-tree DIR] [--out FILE]

Scenarios (issue 27, "Tests and figures"), each run with one publisher process and one
consumer process, both written against the wire (pamqp encodes the handshake and one
pre-encoded publish that is copied and numbered; the hot paths parse frames by hand,
so the load generator is not the bottleneck):

  confirms_100b   publisher in confirm mode (at most ``--window`` unconfirmed) -> a
                  durable queue, persistent messages of 100 B; consumer with manual
                  acks (multiple) at prefetch 100
  confirms_4k     the same with 4 KiB payloads
  fanout10        the same publisher -> a durable fanout exchange bound to 10 durable
                  queues; one consumer process on all 10 (prefetch 100 each)
  idle1000        1,000 connections opened (handshake, one channel) and left idle:
                  the resident memory per connection of a broker started for the run,
                  after 100 warm-up connections

Every message carries its sequence number, so the consumer counts lost and duplicated
deliveries; the figures are deliveries/s from the first publish to the last delivery,
confirms/s, and the broker's CPU microseconds per delivery (user + system time of
the broker's processes from /proc/<pid>/stat, read before the publisher starts and
after the last delivery: RabbitMQ's whole process group, mqttamqp's one process
with its threads).  CPU per delivery is the figure to compare on a loaded machine:
throughput there depends on what else the two cores run.  Brokers alternate run by
run (``--repeat`` rounds; the medians of both figures are reported with their
ratios, every run is listed).  The machine is shared with other work: figures are
marked so (``machine.shared``, with the load average before and after).

``--base-tree DIR`` adds a third broker, ``base``: mqttamqp from another checkout
(``git worktree add --detach DIR REV``; started with ``PYTHONPATH=DIR`` and this
interpreter), for before/after figures of a change in the same run.

RabbitMQ is started by ``rabbitmq.py`` (loopback only, its own epmd), mqttamqp by
``amqp_bench.Broker`` (``twistd -n mqttamqp``, port 0); a broker that does not answer
the 0.9.1 protocol header with connection.start is reported as unavailable.  Every
loop is bounded by a count and a deadline; only processes started here are stopped,
by their process group.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import queue
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from statistics import median
from typing import Any

import brokers
import rabbitmq
from amqp_bench import Broker as MqttamqpBroker
from pamqp import body as pbody
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.commands import Basic, Channel, Confirm, Connection, Exchange, Queue
from pamqp.exceptions import UnmarshalingException

HOST = "127.0.0.1"
FRAME_END = b"\xce"
DELIVER = struct.pack("!HH", 60, 60)
ACK = struct.pack("!HH", 60, 80)
NACK = struct.pack("!HH", 60, 120)
SCENARIOS = ("confirms_100b", "confirms_4k", "fanout10", "idle1000")


# -- a lean 0.9.1 client ----------------------------------------------------------------

class Wire:
    """One 0.9.1 connection over a plain socket: the handshake and RPCs through pamqp,
    raw bytes for the hot paths."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.sock.sendall(pframe.marshal(pheader.ProtocolHeader(), 0))
        self.expect(Connection.Start)
        self.send(Connection.StartOk(client_properties={"product": "amqp091_bench"},
                                     mechanism="PLAIN", response="\x00guest\x00guest"))
        tune = self.expect(Connection.Tune)
        self.frame_max = min(tune.frame_max or 131072, 131072)
        self.send(Connection.TuneOk(channel_max=16, frame_max=self.frame_max, heartbeat=0))
        self.send(Connection.Open(virtual_host="/"))
        self.expect(Connection.OpenOk)

    def send(self, method: Any, channel: int = 0) -> None:
        self.sock.sendall(pframe.marshal(method, channel))

    def read_frame(self) -> Any:
        while True:
            try:
                used, _channel, value = pframe.unmarshal(bytes(self.buf))
            except UnmarshalingException:
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("closed by the broker") from None
                self.buf += data
                continue
            del self.buf[:used]
            return value

    def expect(self, kind: type) -> Any:
        for _ in range(100):
            value = self.read_frame()
            if isinstance(value, kind):
                return value
            if isinstance(value, (Connection.Close, Channel.Close)):
                raise RuntimeError(f"{value.reply_code} {value.reply_text}")
        raise RuntimeError(f"no {kind.__name__}")

    def rpc(self, method: Any, reply: type, channel: int = 1) -> Any:
        self.send(method, channel)
        return self.expect(reply)

    def open_channel(self, channel: int = 1) -> None:
        self.rpc(Channel.Open(), Channel.OpenOk, channel)

    def close(self) -> None:
        try:
            self.send(Connection.Close(200, "bye", 0, 0))
            self.expect(Connection.CloseOk)
        except (OSError, RuntimeError, ConnectionError):
            pass
        self.sock.close()


def speaks_amqp091(port: int) -> str | None:
    """None when ``port`` completes a 0.9.1 handshake, else why not."""
    try:
        Wire(port, timeout=10.0).close()
        return None
    except (OSError, RuntimeError, ConnectionError, UnmarshalingException) as e:
        return f"{type(e).__name__}: {e}"


def publish_template(exchange: str, key: str, size: int, frame_max: int) -> tuple[bytes, int]:
    """One persistent publish (method, header, body frames) and the body's offset."""
    method = pframe.marshal(Basic.Publish(exchange=exchange, routing_key=key), 1)
    head = pframe.marshal(pheader.ContentHeader(0, size, Basic.Properties(delivery_mode=2)), 1)
    assert size + 8 <= frame_max
    body = pframe.marshal(pbody.ContentBody(b"\x00" * size), 1)
    return method + head + body, len(method) + len(head) + 7


def frames(buf: bytearray) -> Any:
    """(type, channel, payload) of every whole frame in ``buf``, consumed from it."""
    pos, end = 0, len(buf)
    out = []
    while end - pos >= 7:
        kind, channel, size = struct.unpack_from("!BHI", buf, pos)
        if end - pos < size + 8:
            break
        out.append((kind, channel, bytes(buf[pos + 7:pos + 7 + size])))
        pos += size + 8
    del buf[:pos]
    return out


# -- the load generators (child processes) --------------------------------------------

def publisher(port: int, exchange: str, key: str, n: int, size: int, window: int,
              deadline: float, out: Any) -> None:
    w = Wire(port)
    w.open_channel()
    w.rpc(Confirm.Select(), Confirm.SelectOk)
    template, offset = publish_template(exchange, key, size, w.frame_max)
    one = len(template)
    sent = confirmed = nacked = 0
    buf = bytearray()
    t0 = time.monotonic()
    cpu0 = time.process_time()
    w.sock.setblocking(False)
    while confirmed + nacked < n and time.monotonic() < deadline:
        room = min(window - (sent - confirmed - nacked), n - sent)
        if room > 0:
            batch = bytearray(template * room)
            for i in range(room):
                struct.pack_into("!Q", batch, i * one + offset, sent + i)
            view = memoryview(batch)
            while view:
                try:
                    view = view[w.sock.send(view):]
                except BlockingIOError:
                    select.select([], [w.sock], [], 1.0)
            sent += room
        select.select([w.sock], [], [], 1.0)
        try:
            data = w.sock.recv(262144)
        except BlockingIOError:
            continue
        if not data:
            break
        buf += data
        for kind, _ch, payload in frames(buf):
            if kind != 1:
                continue
            tag, = struct.unpack_from("!Q", payload, 4)
            multiple = payload[12] & 1
            done = (tag - (confirmed + nacked)) if multiple else 1
            if payload[:4] == ACK:
                confirmed += done
            elif payload[:4] == NACK:
                nacked += done
    t1 = time.monotonic()
    out.put({"role": "publisher", "sent": sent, "confirmed": confirmed, "nacked": nacked,
             "t0": t0, "t1": t1, "cpu_s": time.process_time() - cpu0})
    w.sock.setblocking(True)
    w.close()


def consumer(port: int, queues: list[str], expected: int, n: int, prefetch: int,
             deadline: float, ready: Any, out: Any) -> None:
    w = Wire(port)
    w.open_channel()
    w.rpc(Basic.Qos(prefetch_count=prefetch), Basic.QosOk)
    for i, q in enumerate(queues):
        w.rpc(Basic.Consume(queue=q, consumer_tag=f"c{i}"), Basic.ConsumeOk)
    ready.put(True)
    seen = [bytearray(n) for _ in queues]
    tag_to_q = {f"c{i}".encode(): i for i in range(len(queues))}
    current = 0
    received = dups = 0
    last_tag = acked = 0
    t_first = t_last = None
    buf = w.buf
    cpu0 = time.process_time()
    while received < expected and time.monotonic() < deadline:
        r, _, _ = select.select([w.sock], [], [], 1.0)
        if not r:
            continue
        data = w.sock.recv(262144)
        if not data:
            break
        buf += data
        for kind, _ch, payload in frames(buf):
            if kind == 1:
                if payload[:4] == DELIVER:
                    ctag_len = payload[4]
                    current = tag_to_q.get(payload[5:5 + ctag_len], 0)
                    last_tag, = struct.unpack_from("!Q", payload, 5 + ctag_len)
            elif kind == 3:
                seq, = struct.unpack_from("!Q", payload, 0)
                marks = seen[current]
                if seq < n and not marks[seq]:
                    marks[seq] = 1
                else:
                    dups += 1
                received += 1
                t_last = time.monotonic()
                if t_first is None:
                    t_first = t_last
        if last_tag > acked:
            w.sock.sendall(pframe.marshal(Basic.Ack(delivery_tag=last_tag, multiple=True), 1))
            acked = last_tag
    distinct = sum(sum(m) for m in seen)
    out.put({"role": "consumer", "received": received, "distinct": distinct,
             "duplicates": dups, "t_first": t_first, "t_last": t_last,
             "cpu_s": time.process_time() - cpu0})
    w.close()


# -- one run -------------------------------------------------------------------------

def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def broker_cpu(kind: str, b: Any) -> float:
    return b.cpu_s() if kind == "rabbitmq" else b.cpu_seconds()


def settle(kind: str, b: Any, max_s: float = 10.0, window: float = 0.5) -> None:
    """Wait (bounded) until the broker uses under 5 % of a CPU over ``window``."""
    end = time.monotonic() + max_s
    c0 = broker_cpu(kind, b)
    while time.monotonic() < end:
        time.sleep(window)
        c1 = broker_cpu(kind, b)
        if c1 - c0 < 0.05 * window:
            return
        c0 = c1


def broker_rss_kb(kind: str, b: Any) -> int:
    """Resident set of the broker's process group (RabbitMQ: beam and helpers)."""
    pgid = b.proc.pid
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def run_flow(kind: str, b: Any, port: int, scenario: str, n: int, window: int,
             timeout: float) -> dict[str, Any]:
    size = 4096 if scenario == "confirms_4k" else 100
    tag = uuid.uuid4().hex[:8]
    setup = Wire(port)
    setup.open_channel()
    if scenario == "fanout10":
        exchange, key = f"bench-fan-{tag}", ""
        queues = [f"bench-fan-{tag}-{i}" for i in range(10)]
        setup.rpc(Exchange.Declare(exchange=exchange, exchange_type="fanout", durable=True),
                  Exchange.DeclareOk)
    else:
        exchange, key = "", f"bench-{tag}"
        queues = [key]
    for q in queues:
        setup.rpc(Queue.Declare(queue=q, durable=True), Queue.DeclareOk)
        if exchange:
            setup.rpc(Queue.Bind(queue=q, exchange=exchange, routing_key=""), Queue.BindOk)
    expected = n * len(queues)
    ctx = mp.get_context("fork")
    out, ready = ctx.Queue(), ctx.Queue()
    deadline = time.monotonic() + timeout
    cons = ctx.Process(target=consumer, args=(port, queues, expected, n, 100, deadline,
                                               ready, out))
    pub = ctx.Process(target=publisher, args=(port, exchange, key, n, size, window, deadline,
                                              out))
    results = {}
    try:
        cons.start()
        ready.get(timeout=30)
        cpu0 = broker_cpu(kind, b)
        pub.start()
        for _ in range(2):
            r = out.get(timeout=timeout + 30)
            results[r["role"]] = r
        cpu1 = broker_cpu(kind, b)
    finally:
        for proc in (pub, cons):
            if proc.pid is not None:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
    for q in queues:
        setup.rpc(Queue.Delete(queue=q), Queue.DeleteOk)
    if exchange:
        setup.rpc(Exchange.Delete(exchange=exchange), Exchange.DeleteOk)
    setup.close()
    p, c = results["publisher"], results["consumer"]
    span = (c["t_last"] or p["t1"]) - p["t0"]
    return {
        "messages": n, "payload_bytes": size, "queues": len(queues), "window": window,
        "deliveries": c["received"], "lost": expected - c["distinct"],
        "duplicates": c["duplicates"], "confirmed": p["confirmed"], "nacked": p["nacked"],
        "timed_out": c["received"] < expected,
        "deliveries_per_s": round(c["received"] / span, 1) if span > 0 else None,
        "confirms_per_s": round(p["confirmed"] / (p["t1"] - p["t0"]), 1),
        "broker_cpu_us_per_delivery": round((cpu1 - cpu0) * 1e6 / max(1, c["received"]), 1),
        "publisher_cpu_us_per_msg": round(p["cpu_s"] * 1e6 / max(1, p["sent"]), 1),
        "consumer_cpu_us_per_delivery": round(c["cpu_s"] * 1e6 / max(1, c["received"]), 1),
    }


def run_idle(kind: str, b: Any, port: int, count: int, warm: int = 100) -> dict[str, Any]:
    """``count`` idle connections on top of ``warm`` ones opened first, once the
    broker's resident set is steady: a fresh broker grows for seconds after it listens
    (mqttamqp by ~55 MB in its first 5 s with no client at all), which is not a
    connection's cost."""
    conns = []
    for _ in range(warm):
        w = Wire(port)
        w.open_channel()
        conns.append(w)
    settle(kind, b)
    rss0 = broker_rss_kb(kind, b)
    for _ in range(30):                     # at most 30 s: steady for 1 s
        time.sleep(1.0)
        now = broker_rss_kb(kind, b)
        if now == rss0:
            break
        rss0 = now
    t0 = time.monotonic()
    try:
        for _ in range(count):
            w = Wire(port)
            w.open_channel()
            conns.append(w)
        t1 = time.monotonic()
        settle(kind, b)
        rss1 = broker_rss_kb(kind, b)
    finally:
        for w in conns:
            w.sock.close()
    return {"connections": len(conns) - warm, "warm_up_connections": warm,
            "connect_s": round(t1 - t0, 2),
            "rss_before_kb": rss0, "rss_after_kb": rss1,
            "rss_per_connection_kb": round((rss1 - rss0) / max(1, len(conns) - warm), 1)}


def git_commit() -> str | None:
    """The checkout's commit (the mqttamqp measured), if this is a git work tree."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, cwd=os.path.dirname(__file__))
        return done.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


BASE_TREE: str | None = None   # --base-tree: the checkout the "base" broker runs


def start(kind: str) -> tuple[Any, int]:
    """A broker of ``kind`` and its AMQP port."""
    if kind == "rabbitmq":
        rb = rabbitmq.RabbitMQ().start()
        return rb, rb.amqp_port
    env = None
    if kind == "base":
        assert BASE_TREE is not None
        env = dict(os.environ, PYTHONPATH=BASE_TREE)
    mb = MqttamqpBroker(tempfile.mkdtemp(prefix="amqp091-bench-"), env=env).start()
    return mb, mb.ports["AMQP"]


def stop(kind: str, b: Any) -> None:
    b.stop()
    if kind == "rabbitmq":
        b.cleanup()
    else:
        shutil.rmtree(b.data_dir, ignore_errors=True)


def medians(per: dict[str, list[dict[str, Any]]], key: str) -> dict[str, Any]:
    """The median of ``key`` per broker, and each mqttamqp's over RabbitMQ's."""
    m: dict[str, Any] = {
        kind: median(r[key] for r in runs if r.get(key) is not None)
        for kind, runs in per.items() if any(r.get(key) is not None for r in runs)}
    for kind in ("mqttamqp", "base"):
        if "rabbitmq" in m and kind in m and m["rabbitmq"]:
            m[f"{kind}_over_rabbitmq"] = round(m[kind] / m["rabbitmq"], 2)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", default="rabbitmq,mqttamqp")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--base-tree", help="also run mqttamqp from this checkout ('base')")
    ap.add_argument("--out")
    args = ap.parse_args()
    global BASE_TREE
    names = args.brokers.split(",")
    if args.base_tree:
        BASE_TREE = os.path.abspath(args.base_tree)
        names.append("base")
    brokers.raise_nofile()
    counts = {"confirms_100b": 50_000, "confirms_4k": 20_000, "fanout10": 10_000}
    if args.quick:
        counts = {k: v // 10 for k, v in counts.items()}
    started: dict[str, tuple[Any, int]] = {}
    doc: dict[str, Any] = {
        "bench": "amqp091_bench", "when": datetime.datetime.now(datetime.UTC).isoformat(),
        "argv": sys.argv[1:], "commit": git_commit(),
        "machine": {"shared": True, "note": "taken on a machine shared with other helpers' "
                    "test runs (2 cores): compare the brokers within this run only",
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "rabbitmq_version": rabbitmq.version(), "loadavg_start": loadavg(),
                    "base_tree": BASE_TREE},
        "brokers": {}, "runs": {}, "median": {}, "median_cpu_us_per_delivery": {},
    }
    try:
        for kind in names:
            started[kind] = start(kind)
            why = speaks_amqp091(started[kind][1])
            doc["brokers"][kind] = {"available": why is None, "reason": why}
            print(f"{kind}: port {started[kind][1]}, 0.9.1 {'ok' if why is None else why}",
                  file=sys.stderr)
        live = [k for k in started if doc["brokers"][k]["available"]]
        for scenario in args.scenarios.split(","):
            for rnd in range(args.repeat):
                for kind in (live if rnd % 2 == 0 else list(reversed(live))):
                    b, port = started[kind]
                    try:
                        if scenario == "idle1000":
                            # a broker of its own: memory freed by the flows before
                            # stays in either process and would hide the growth
                            fresh, fresh_port = start(kind)
                            try:
                                r = run_idle(kind, fresh, fresh_port,
                                             100 if args.quick else 1000)
                            finally:
                                stop(kind, fresh)
                        else:
                            r = run_flow(kind, b, port, scenario, counts[scenario],
                                         args.window, args.timeout)
                    except (OSError, RuntimeError, ConnectionError, queue.Empty) as e:
                        r = {"error": f"{type(e).__name__}: {e}"}
                    doc["runs"].setdefault(scenario, {}).setdefault(kind, []).append(r)
                    print(scenario, kind, rnd, json.dumps(r), file=sys.stderr)
        for scenario, per in doc["runs"].items():
            key = ("rss_per_connection_kb" if scenario == "idle1000" else "deliveries_per_s")
            doc["median"][scenario] = medians(per, key)
            if scenario != "idle1000":
                doc["median_cpu_us_per_delivery"][scenario] = medians(
                    per, "broker_cpu_us_per_delivery")
        doc["machine"]["loadavg_end"] = loadavg()
    finally:
        for kind, (b, _port) in started.items():
            stop(kind, b)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
