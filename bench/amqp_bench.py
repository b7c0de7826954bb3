#!/usr/bin/env python3
"""AMQP benchmark of mqttamqp, side by side with its own MQTT QoS 1 figure.

    python bench/amqp_bench.py [--count N] [--repeat R] [--payload BYTES] [--timeout S]
                               [--scenarios a,b] [--broker-arg ARG] [--out FILE]
                               [--py-spy FILE] [--perf-stat]

Starts one broker (``twistd -n mqttamqp`` on 127.0.0.1 port 0, data in a temporary
directory) and runs, one after the other, each with one publisher process and one
subscriber process:

  mqtt_qos1            MQTT QoS 1 publisher -> MQTT QoS 1 subscriber (the reference)
  amqp_presettled      AMQP sender (pre-settled) -> AMQP receiver (pre-settled)
  amqp_unsettled       AMQP sender (unsettled, QoS 1) -> AMQP receiver (unsettled)
  mqtt_to_amqp         MQTT QoS 1 publisher -> AMQP receiver (unsettled)
  amqp_to_mqtt         AMQP sender (unsettled, QoS 1) -> MQTT QoS 1 subscriber

each scenario ``--repeat`` times, interleaved (the median run is reported, all runs are
listed: the machines are shared and noisy), and prints one JSON document:
messages/s (first send to last receive), broker
CPU microseconds per message (utime + stime of the broker process from
/proc/PID/stat over the same interval), the publisher's and subscriber's own CPU
microseconds per message (so a load generator that limits a figure shows), with
``--perf-stat`` the broker's socket reads and writes, epoll waits, futex calls and
context switches per message (``perf stat -p``: on a busy machine a woken peer
takes the CPU from the broker inside a write, so these count as much as CPU), and
the ratio the issue sets as target:
AMQP -> AMQP unsettled >= 70 % of the MQTT QoS 1 figure (``TARGET``).

Every loop is bounded by a message count and a deadline; the broker is the only
process started, and it is stopped (by its PID) at the end.  The load generators
are written against the wire (a proton engine over a plain socket, a minimal
MQTT 3.1.1 encoder) and import nothing from mqttamqp.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HOST = "127.0.0.1"
TARGET = 0.7   # issue 15: AMQP -> AMQP unsettled >= 0.7 x MQTT QoS 1 (was 0.5)
_LISTEN = re.compile(r"listening for (\w+) on ([\d.]+):(\d+)")


# -- the broker ------------------------------------------------------------------------

class Broker:
    def __init__(self, data_dir: str, extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra = extra or []
        self.env = env   # (None: this process's environment)
        self.proc: subprocess.Popen[str] | None = None
        self.ports: dict[str, int] = {}
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []

    def start(self, timeout: float = 60.0) -> Broker:
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        args = [twistd, "-n", "--pidfile=", "--logfile=-", "mqttamqp", "--data", self.data_dir,
                "--mqtt", "tcp:0:interface=127.0.0.1", "--amqp", "tcp:0:interface=127.0.0.1",
                "--web", "none", "--mqtt-ws", "none", "--metrics", "none", "--sys-interval", "0",
                "--max-queued-messages", "64000",
                *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, env=self.env)
        threading.Thread(target=self._pump, daemon=True).start()
        end = time.monotonic() + timeout
        while not {"MQTT", "AMQP"} <= set(self.ports):
            try:
                line = self.lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("broker did not start:\n" + "".join(self.log)) from None
            if line == "":
                raise RuntimeError("broker exited:\n" + "".join(self.log))
            m = _LISTEN.search(line)
            if m:
                self.ports[m.group(1)] = int(m.group(3))
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            del self.log[:-200]
            self.lines.put(line)
        self.lines.put("")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


# -- minimal MQTT 3.1.1 ------------------------------------------------------------------

def _rl(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!H", len(raw)) + raw


def mqtt_packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _rl(len(body)) + body


def mqtt_connect(client_id: str) -> bytes:
    return mqtt_packet(0x10, _s("MQTT") + bytes((4, 0x02)) + struct.pack("!H", 60) + _s(client_id))


class MqttStream:
    def __init__(self, port: int, client_id: str) -> None:
        self.sock = socket.create_connection((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(mqtt_connect(client_id))
        first, _ = self.read_packet(10.0)
        assert first >> 4 == 2, "no CONNACK"

    def packets(self) -> list[tuple[int, bytes]]:
        out = []
        buf = self.buf
        pos = 0
        while len(buf) - pos >= 2:
            mult, length, i = 1, 0, pos + 1
            while True:
                if i >= len(buf):
                    self.buf = buf[pos:]
                    return out
                b = buf[i]
                length += (b & 0x7F) * mult
                mult *= 128
                i += 1
                if not b & 0x80:
                    break
            if len(buf) - i < length:
                break
            out.append((buf[pos], buf[i:i + length]))
            pos = i + length
        self.buf = buf[pos:]
        return out

    def fill(self, timeout: float) -> bool:
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return False
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("broker closed the MQTT connection")
        self.buf += data
        return True

    def read_packet(self, timeout: float) -> tuple[int, bytes]:
        end = time.monotonic() + timeout
        while True:
            got = self.packets()
            if got:
                assert len(got) == 1
                return got[0]
            if not self.fill(max(0.0, end - time.monotonic())):
                raise TimeoutError("no MQTT packet")


# -- minimal AMQP client on a proton engine ----------------------------------------------

class AmqpPeer:
    def __init__(self, port: int, container: str) -> None:
        from proton import Collector, Connection, Transport

        self.sock = socket.create_connection((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = Connection()
        self.conn.container = container
        self.trans = Transport()
        self.trans.bind(self.conn)
        self.col = Collector()
        self.conn.collect(self.col)
        self.conn.open()
        self.ssn = self.conn.session()
        self.ssn.open()

    def io(self, timeout: float) -> None:
        trans = self.trans
        n = trans.pending()
        if n > 0:
            self.sock.sendall(bytes(trans.peek(n)))
            trans.pop(n)
        r, _, _ = select.select([self.sock], [], [], timeout)
        if r:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("broker closed the AMQP connection")
            while data:
                cap = trans.capacity()
                trans.push(data[:cap])
                data = data[cap:]

    def deliveries(self) -> list[Any]:
        """Raw pointers of the deliveries with news (proton-c calls, no wrappers:
        the load generator must not be the bottleneck)."""
        from cproton import lib

        out = []
        col = self.col._impl
        delivery = _EV_DELIVERY
        while True:
            ev = lib.pn_collector_peek(col)
            if not ev:
                return out
            if lib.pn_event_type(ev) == delivery:
                out.append(lib.pn_event_delivery(ev))
            lib.pn_collector_pop(col)


def _ev_delivery() -> int:
    from proton import Event

    return int(Event.DELIVERY.number)


_EV_DELIVERY = _ev_delivery()


# -- worker roles (run as child processes) ------------------------------------------------

def emit(tag: str, obj: Any = None) -> None:
    sys.stdout.write(tag + ("" if obj is None else " " + json.dumps(obj)) + "\n")
    sys.stdout.flush()


def wait_go(deadline: float) -> None:
    while time.monotonic() < deadline:
        r, _, _ = select.select([sys.stdin], [], [], 0.5)
        if r and sys.stdin.readline().strip() == "GO":
            return
    raise TimeoutError("no GO")


def role_mqtt_sub(a: dict[str, Any]) -> None:
    s = MqttStream(a["port"], a["client"])
    s.sock.sendall(mqtt_packet(0x82, struct.pack("!H", 1) + _s(a["topic"]) + b"\x01"))
    first, _ = s.read_packet(10.0)
    assert first >> 4 == 9, "no SUBACK"
    emit("READY")
    cpu0 = time.process_time()
    count, n, deadline = 0, a["count"], a["deadline"]
    first_at = last_at = 0.0
    out = bytearray()
    while count < n and time.monotonic() < deadline:
        s.fill(0.5)
        for first, body in s.packets():
            if first >> 4 != 3:
                continue
            count += 1
            if count == 1:
                first_at = time.monotonic()
            qos = (first >> 1) & 3
            if qos:
                tlen = struct.unpack_from("!H", body, 0)[0]
                out += b"\x40\x02" + body[2 + tlen:4 + tlen]
        last_at = time.monotonic()
        if out:
            s.sock.sendall(bytes(out))
            out.clear()
    emit("RESULT", {"received": count, "first": first_at, "last": last_at,
                    "cpu": time.process_time() - cpu0})


def role_mqtt_pub(a: dict[str, Any]) -> None:
    s = MqttStream(a["port"], a["client"])
    emit("READY")
    wait_go(a["deadline"])
    n, window, deadline = a["count"], a["window"], a["deadline"]
    topic = _s(a["topic"])
    payload = b"x" * a["payload"]
    sent = acked = 0
    start = time.monotonic()
    cpu0 = time.process_time()
    while acked < n and time.monotonic() < deadline:
        batch = bytearray()
        while sent < n and sent - acked < window:
            pid = sent % 65535 + 1
            batch += mqtt_packet(0x32, topic + struct.pack("!H", pid) + payload)
            sent += 1
        if batch:
            s.sock.sendall(bytes(batch))
        s.fill(0.5)
        acked += sum(1 for first, _ in s.packets() if first >> 4 == 4)
    emit("RESULT", {"sent": sent, "acked": acked, "start": start, "end": time.monotonic(),
                    "cpu": time.process_time() - cpu0})


def role_amqp_recv(a: dict[str, Any]) -> None:
    from cproton import ffi, lib
    from proton import Delivery, Link

    peer = AmqpPeer(a["port"], a["client"])
    link = peer.ssn.receiver("bench-recv")
    link.source.address = a["topic"]
    link.target.address = a["topic"]
    if a["presettled"]:
        link.snd_settle_mode = Link.SND_SETTLED
    link.open()
    window = 500
    link.flow(window)
    end = time.monotonic() + 10
    while not (link.state & link.REMOTE_ACTIVE) and time.monotonic() < end:
        peer.io(0.1)
    emit("READY")
    cpu0 = time.process_time()
    count, n, deadline = 0, a["count"], a["deadline"]
    first_at = last_at = 0.0
    impl = link._impl
    buf = bytearray(1 << 16)
    cbuf = ffi.from_buffer(buf)
    accepted = Delivery.ACCEPTED
    while count < n and time.monotonic() < deadline:
        peer.io(0.5)
        for dlv in peer.deliveries():
            if lib.pn_delivery_partial(dlv) or not lib.pn_delivery_readable(dlv):
                continue
            lib.pn_link_recv(impl, cbuf, len(buf))
            lib.pn_link_advance(impl)
            if not lib.pn_delivery_settled(dlv):
                lib.pn_delivery_update(dlv, accepted)
            lib.pn_delivery_settle(dlv)
            count += 1
            if count == 1:
                first_at = time.monotonic()
        last_at = time.monotonic()
        credit = lib.pn_link_credit(impl)
        if credit < window // 2:
            lib.pn_link_flow(impl, window - credit)
    emit("RESULT", {"received": count, "first": first_at, "last": last_at,
                    "cpu": time.process_time() - cpu0})


def amqp_publish_bytes(topic: str, payload: bytes, qos: int) -> bytes:
    from proton import Message, int32, symbol

    msg = Message(address=topic, durable=qos > 0, body=payload,
                  annotations={symbol("x-opt-mqtt-qos"): int32(qos)})
    msg.inferred = True
    return bytes(msg.encode())


def role_amqp_send(a: dict[str, Any]) -> None:
    from cproton import ffi, lib
    from proton import Link

    peer = AmqpPeer(a["port"], a["client"])
    link = peer.ssn.sender("bench-send")
    link.target.address = a["topic"]
    presettled = a["presettled"]
    link.snd_settle_mode = Link.SND_SETTLED if presettled else Link.SND_UNSETTLED
    link.open()
    end = time.monotonic() + 10
    while not (link.state & link.REMOTE_ACTIVE) and time.monotonic() < end:
        peer.io(0.1)
    emit("READY")
    wait_go(a["deadline"])
    data = amqp_publish_bytes(a["topic"], b"x" * a["payload"], 0 if presettled else 1)
    n, window, deadline = a["count"], a["window"], a["deadline"]
    sent = acked = 0
    start = time.monotonic()
    cpu0 = time.process_time()
    impl = link._impl
    cdata = ffi.from_buffer(data)
    tags = [str(i).encode() for i in range(n)]
    while acked < n and time.monotonic() < deadline:
        credit = lib.pn_link_credit(impl)
        while sent < n and credit > 0 and sent - acked < window:
            tag = tags[sent]
            dlv = lib.pn_delivery(impl, (len(tag), ffi.from_buffer(tag)))
            lib.pn_link_send(impl, cdata, len(data))
            lib.pn_link_advance(impl)
            sent += 1
            credit -= 1
            if presettled:
                lib.pn_delivery_settle(dlv)
                acked += 1
        peer.io(0.0 if presettled and sent < n and credit > 0 else 0.5)
        for dlv in peer.deliveries():
            if lib.pn_delivery_updated(dlv) or lib.pn_delivery_settled(dlv):
                lib.pn_delivery_settle(dlv)
                acked += 1
    # let the last pre-settled transfers leave the socket buffer
    peer.io(0.05)
    emit("RESULT", {"sent": sent, "acked": acked, "start": start, "end": time.monotonic(),
                    "cpu": time.process_time() - cpu0})


ROLES = {"mqtt_sub": role_mqtt_sub, "mqtt_pub": role_mqtt_pub, "amqp_recv": role_amqp_recv,
         "amqp_send": role_amqp_send}


# -- the driver ------------------------------------------------------------------------------

class Worker:
    def __init__(self, role: str, args: dict[str, Any]) -> None:
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                                   json.dumps(args)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.q.put(line.strip())
        self.q.put(None)

    def expect(self, tag: str, timeout: float) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.q.get(timeout=max(0.05, end - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"worker: no {tag}") from None
            if line is None:
                err = self.p.stderr.read() if self.p.stderr else ""
                raise RuntimeError(f"worker exited before {tag}: {err[-2000:]}")
            if line.startswith(tag):
                rest = line[len(tag):].strip()
                result: dict[str, Any] = json.loads(rest) if rest else {}
                return result

    def go(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("GO\n")
        self.p.stdin.flush()

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)


SCENARIOS = {
    # name: (publisher role, publisher presettled, subscriber role, subscriber presettled)
    "mqtt_qos1": ("mqtt_pub", False, "mqtt_sub", False),
    "amqp_presettled": ("amqp_send", True, "amqp_recv", True),
    "amqp_unsettled": ("amqp_send", False, "amqp_recv", False),
    "mqtt_to_amqp": ("mqtt_pub", False, "amqp_recv", False),
    "amqp_to_mqtt": ("amqp_send", False, "mqtt_sub", False),
}


# What --perf-stat counts in the broker process during a run (per message received).
PERF_EVENTS = ("syscalls:sys_enter_recvfrom", "syscalls:sys_enter_sendto",
               "syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_epoll_ctl",
               "syscalls:sys_enter_futex", "context-switches")


class PerfStat:
    """``perf stat`` of the broker process (every thread) from now until ``stop``:
    how many reads, writes, epoll waits and context switches a message costs.
    Only the perf process started here is signalled, by its PID."""

    def __init__(self, pid: int) -> None:
        fd, self.path = tempfile.mkstemp(prefix="amqp-bench-perf-", suffix=".csv")
        os.close(fd)
        self.p = subprocess.Popen(["perf", "stat", "-x", ",", "-e", ",".join(PERF_EVENTS),
                                   "-o", self.path, "-p", str(pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)   # (perf attaches to every thread; a run is seconds long)
        if self.p.poll() is not None:
            err = self.p.stderr.read() if self.p.stderr else ""
            raise RuntimeError(f"perf stat did not start: {err[-500:]}")

    def stop(self, messages: int) -> dict[str, float]:
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=5)
        counts: dict[str, float] = {}
        try:
            with open(self.path) as f:
                for line in f:
                    fields = line.strip().split(",")
                    if len(fields) > 2 and fields[0].isdigit():
                        event = fields[2].rsplit(":", 1)[-1].replace("sys_enter_", "")
                        counts[event] = round(int(fields[0]) / max(1, messages), 4)
        finally:
            os.unlink(self.path)
        return counts


def run_scenario(broker: Broker, name: str, count: int, payload: int,
                 timeout: float, perf_stat: bool = False) -> dict[str, Any]:
    pub_role, pub_pre, sub_role, sub_pre = SCENARIOS[name]
    topic = f"bench/{name}"
    deadline = time.monotonic() + timeout
    port_of = {"mqtt": broker.ports["MQTT"], "amqp": broker.ports["AMQP"]}
    sub = Worker(sub_role, {"port": port_of[sub_role[:4]], "client": f"{name}-sub",
                            "topic": topic,
                            "count": count, "deadline": deadline, "presettled": sub_pre})
    pub = Worker(pub_role, {"port": port_of[pub_role[:4]], "client": f"{name}-pub",
                            "topic": topic, "count": count, "deadline": deadline,
                            "presettled": pub_pre, "window": 100, "payload": payload})
    try:
        sub.expect("READY", 30)
        pub.expect("READY", 30)
        assert broker.proc is not None
        perf = PerfStat(broker.proc.pid) if perf_stat else None
        cpu0 = broker.cpu_seconds()
        pub.go()
        pres = pub.expect("RESULT", timeout + 10)
        sres = sub.expect("RESULT", timeout + 10)
        cpu1 = broker.cpu_seconds()
        per_message = perf.stop(sres["received"]) if perf is not None else None
    finally:
        pub.close()
        sub.close()
    received = sres["received"]
    elapsed = max(1e-9, sres["last"] - pres["start"]) if received else 0.0
    return {
        "messages": count,
        "received": received,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(received / elapsed) if received and elapsed else 0,
        "broker_cpu_us_per_msg": round((cpu1 - cpu0) * 1e6 / received, 1) if received else None,
        "publisher_cpu_us_per_msg": round(pres["cpu"] * 1e6 / received, 1) if received else None,
        "subscriber_cpu_us_per_msg": round(sres["cpu"] * 1e6 / received, 1) if received else None,
        "complete": received == count,
        **({"broker_per_msg": per_message} if per_message is not None else {}),
    }


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--role":
        ROLES[sys.argv[2]](json.loads(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=30000, help="messages per scenario run")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per scenario (interleaved); the median run is reported")
    ap.add_argument("--payload", type=int, default=64, help="payload bytes")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per scenario")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="comma-separated subset of: " + ", ".join(SCENARIOS))
    ap.add_argument("--broker-arg", action="append", default=[],
                    help="extra argument for twistd mqttamqp (repeatable)")
    ap.add_argument("--py-spy", metavar="FILE",
                    help="record the broker with `py-spy record --threads` (speedscope, "
                         "from its start to the end of the last run: profile one scenario "
                         "at a time; summarise with pyspy_top.py; never publish its rates)")
    ap.add_argument("--py-spy-rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--perf-stat", action="store_true",
                    help="count the broker's recvfrom/sendto/epoll/futex calls and context "
                         "switches per message with `perf stat -p` (per run: broker_per_msg)")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="amqp-bench-") as data_dir:
        broker = Broker(data_dir, args.broker_arg).start()
        spy = spy_info = None
        if args.py_spy:
            from run import PySpy  # (run.py's; imported only when profiling)

            assert broker.proc is not None
            spy = PySpy(broker.proc.pid, args.py_spy, args.py_spy_rate)
        try:
            runs: dict[str, list[dict[str, Any]]] = {}
            for attempt in range(max(1, args.repeat)):
                for name in args.scenarios.split(","):
                    one = run_scenario(broker, name, args.count, args.payload, args.timeout,
                                       args.perf_stat)
                    runs.setdefault(name, []).append(one)
                    sys.stderr.write(f"[amqp_bench] {name} run {attempt + 1}: {one}\n")
            for name, tries in runs.items():
                # The median run (by rate); incomplete runs rank lowest.
                ranked = sorted(tries, key=lambda r: (r["complete"], r["msgs_per_s"]))
                median = ranked[len(ranked) // 2]
                results[name] = dict(median, runs_msgs_per_s=[r["msgs_per_s"] for r in tries],
                                     runs=tries)
        finally:
            if spy is not None:
                spy_info = spy.stop()
            broker.stop()
    mqtt = results.get("mqtt_qos1", {}).get("msgs_per_s", 0)
    amqp = results.get("amqp_unsettled", {}).get("msgs_per_s", 0)
    ratio = round(amqp / mqtt, 3) if mqtt else None
    doc = {
        "broker": "mqttamqp",
        "count": args.count,
        "repeat": args.repeat,
        "note": "median of the interleaved runs per scenario; one broker, one publisher "
                "and one subscriber process, 127.0.0.1",
        "payload_bytes": args.payload,
        "scenarios": results,
        "target": {
            "amqp_unsettled_over_mqtt_qos1": ratio,
            "required": TARGET,
            "met": ratio is not None and ratio >= TARGET,
        },
    }
    if spy_info is not None:
        doc["py_spy"] = spy_info
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
