#!/usr/bin/env python3
"""MQTT over WebSockets against MQTT over TCP on the same broker build, in the same
run: scenario 1 of run.py (QoS 0, 1 publisher -> 1 subscriber, 64-byte payloads),
once over each transport, alternating, each run on a fresh broker.

    python bench/ws_bench.py [--messages N] [--repeat N] [--out FILE]
                             [--timeout S] [--mqttamqp-arg ARG]...

Prints JSON: every run, the median msg/s per transport and the ratio WebSocket /
TCP (target >= 0.6).  ``python bench/table.py`` does not render it; docs/performance.md
quotes it.

The load generators are this file's ``pub`` and ``sub`` roles, run as separate
processes (``--role``), and they are the same loop for both transports; only the
framing differs.  Both reuse ``loadgen``'s pieces (``SubConn``'s fast QoS 0
counting, the wire encoders).  Over WebSockets the publisher sends each 64 KB
batch of pre-encoded PUBLISH packets as one binary message, masked once in
advance with a random key (clients must mask; the broker unmasks every byte), and
the subscriber strips the broker's frame headers before counting.  The broker
therefore does the whole WebSocket work, the load generators nearly none.

Throughput is counted at the subscriber as in run.py's headline:
received / (last receipt - publisher's first send), CLOCK_MONOTONIC throughout.
Every loop is bounded by a count and a deadline.  Nothing here imports the broker.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import queue
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brokers  # noqa: E402
import loadgen  # noqa: E402
import mqttwire as w  # noqa: E402

mono = time.monotonic
mono_ns = time.monotonic_ns
PAYLOAD = 64
TOPIC = "bench/ws"
TARGET = 0.6


# ------------------------------------------------------------------ the wire


def ws_open(port: int) -> tuple[socket.socket, bytes]:
    """TCP connect and the WebSocket opening handshake (path /mqtt, subprotocol
    mqtt); returns the socket and any bytes that came after the response head."""
    s = socket.create_connection(("127.0.0.1", port), timeout=15.0)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed during the WebSocket handshake")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(f"handshake refused: {head[:200]!r}")
    return s, rest


def ws_frame(payload: bytes) -> bytes:
    """One binary frame, masked (as a client must) with a random key."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes((0x82, 0x80 | n))
    elif n < 65536:
        head = bytes((0x82, 0x80 | 126)) + struct.pack("!H", n)
    else:
        head = bytes((0x82, 0x80 | 127)) + struct.pack("!Q", n)
    key = int.from_bytes(mask * ((n + 3) // 4), "big") >> (8 * ((4 - n % 4) % 4))
    masked = (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big") if n else b""
    return head + mask + masked


class Deframer:
    """The payload bytes of the server's (unmasked) frames, in order; a close
    frame sets ``closed``."""

    def __init__(self) -> None:
        self.buf = b""
        self.closed = False

    def feed(self, data: bytes) -> bytes:
        buf = self.buf + data if self.buf else data
        out = []
        pos, end = 0, len(buf)
        while end - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            n, at = b1 & 0x7F, pos + 2
            if n == 126:
                if end - pos < 4:
                    break
                n, at = struct.unpack_from("!H", buf, pos + 2)[0], pos + 4
            elif n == 127:
                if end - pos < 10:
                    break
                n, at = struct.unpack_from("!Q", buf, pos + 2)[0], pos + 10
            if end < at + n:
                break
            if b0 & 0x0F == 0x8:
                self.closed = True
            elif b0 & 0x0F in (0x0, 0x2):
                out.append(buf[at:at + n])
            pos = at + n
        self.buf = buf[pos:]
        return b"".join(out)


class Link:
    """One MQTT connection over TCP or WebSockets: ``send`` frames as needed,
    ``unwrap`` turns received bytes into MQTT bytes."""

    def __init__(self, port: int, ws: bool) -> None:
        self.ws = ws
        self.deframer = Deframer() if ws else None
        if ws:
            self.sock, rest = ws_open(port)
        else:
            self.sock, rest = socket.create_connection(("127.0.0.1", port), timeout=15.0), b""
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = self.unwrap(rest) if rest else b""

    def wrap(self, data: bytes) -> bytes:
        return ws_frame(data) if self.ws else data

    def unwrap(self, data: bytes) -> bytes:
        return self.deframer.feed(data) if self.deframer is not None else data

    def handshake(self, client_id: str, subs: list | None = None) -> None:
        """CONNECT (and SUBSCRIBE), blocking, bounded by the socket timeout."""
        parser = w.Parser()
        self.sock.sendall(self.wrap(w.connect(client_id)))
        want = {w.CONNACK} | ({w.SUBACK} if subs else set())
        data = self.pending
        while want:
            for h, _body in parser.feed(data):
                t = h >> 4
                want.discard(t)
                if t == w.CONNACK and subs:
                    self.sock.sendall(self.wrap(w.subscribe(1, subs)))
            if want:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("broker closed during the MQTT handshake")
                data = self.unwrap(chunk)
        self.sock.setblocking(False)

    def close(self) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(1.0)
            self.sock.sendall(self.wrap(w.DISCONNECT_PKT))
        except OSError:
            pass
        loadgen.close_gracefully([self.sock], timeout=1.0)


# ------------------------------------------------------------------ roles


def role_sub(a: dict) -> dict:
    link = Link(a["port"], a["ws"])
    link.handshake("wsb-sub", [(TOPIC, 0)])
    fast_len, fast_rl = loadgen_fixed_len()
    counter = loadgen.SubConn(link.sock, w.Parser(), fast_len, fast_rl, False)
    loadgen.emit("READY")
    expected, deadline, idle_s = a["expected"], a["deadline"], a.get("idle_s", 5.0)
    sel = selectors.DefaultSelector()
    sel.register(link.sock, selectors.EVENT_READ)
    rbuf = bytearray(262144)
    rmv = memoryview(rbuf)
    first_ns = last_ns = 0
    last_rx = mono()
    stop = "count"
    cpu0 = loadgen.self_cpu()
    while counter.count < expected:
        now = mono()
        if now >= deadline:
            stop = "deadline"
            break
        if first_ns and now - last_rx > idle_s:
            stop = "idle"
            break
        if not sel.select(timeout=0.2):
            continue
        try:
            nb = link.sock.recv_into(rbuf)
        except BlockingIOError:
            continue
        if nb == 0:
            stop = "closed by broker"
            break
        data = link.unwrap(rmv[:nb].tobytes())
        if data and counter.feed(data, 0):
            last_ns = mono_ns()
            first_ns = first_ns or last_ns
            last_rx = mono()
        if nb < 8192 and counter.count < expected:
            time.sleep(a.get("rx_nap_s", 0.0005))   # as run.py: fewer wake-ups
    cpu1 = loadgen.self_cpu()
    sel.close()
    link.close()
    return {"received": counter.count, "expected": expected, "stop_reason": stop,
            "first_rx_ns": first_ns, "last_rx_ns": last_ns, "loadgen_cpu_s": cpu1 - cpu0}


def loadgen_fixed_len() -> tuple[int, int]:
    pkt = w.publish(TOPIC, b"x" * PAYLOAD, qos=0)
    return len(pkt), pkt[1]


def role_pub(a: dict) -> dict:
    link = Link(a["port"], a["ws"])
    link.handshake("wsb-pub")
    pkt = w.publish(TOPIC, b"x" * PAYLOAD, qos=0)
    per_chunk = max(1, 65536 // len(pkt))
    chunk = link.wrap(pkt * per_chunk)      # one message per batch, masked in advance
    chunks = a["count"] // per_chunk
    tail = a["count"] - chunks * per_chunk
    loadgen.emit("READY")
    if not loadgen.wait_line("GO", a["deadline"]):
        return {"error": "no GO"}
    cpu0 = loadgen.self_cpu()
    start_ns = mono_ns()
    sock = link.sock
    sock.setblocking(True)
    sock.settimeout(max(1.0, a["deadline"] - mono()))
    try:
        for _ in range(chunks):
            sock.sendall(chunk)
        if tail:
            sock.sendall(link.wrap(pkt * tail))
        error = None
    except OSError as e:
        error = repr(e)
    cpu1 = loadgen.self_cpu()
    link.close()
    return {"sent": a["count"] if error is None else None, "start_ns": start_ns,
            "error": error, "loadgen_cpu_s": cpu1 - cpu0}


ROLES = {"sub": role_sub, "pub": role_pub}


# ------------------------------------------------------------------ the driver


class Worker:
    def __init__(self, role: str, args: dict) -> None:
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                                   json.dumps(args)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line.strip())
        self.lines.put("")

    def expect(self, tag: str, timeout: float) -> dict:
        end = mono() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, end - mono()))
            except queue.Empty:
                raise TimeoutError(f"no {tag} within {timeout:.0f}s") from None
            if line == "":
                raise RuntimeError(f"worker exited before {tag}")
            if line.startswith(tag):
                rest = line[len(tag):].strip()
                return json.loads(rest) if rest else {}

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)


def one_run(transport: str, args: argparse.Namespace, help_text: str,
            env_extra: dict) -> dict:
    ws_port = brokers.free_port()
    extra = ["--mqtt-ws", f"tcp:{ws_port}:interface=127.0.0.1", *args.mqttamqp_arg]
    broker = brokers.Broker("mqttamqp", label="mqttamqp-" + transport,
                            mqttamqp_help_text=help_text, mqttamqp_env=env_extra,
                            extra_args=extra)
    deadline = mono() + args.timeout
    workers: list[Worker] = []
    result: dict = {"transport": transport}
    try:
        broker.start()
        port = ws_port if transport == "ws" else broker.port
        common = {"port": port, "ws": transport == "ws", "deadline": deadline}
        sub = Worker("sub", {**common, "expected": args.messages})
        workers.append(sub)
        sub.expect("READY", 30)
        pub = Worker("pub", {**common, "count": args.messages})
        workers.append(pub)
        pub.expect("READY", 30)
        cpu0 = broker.cpu_s()
        pub.send("GO")
        pres = pub.expect("RESULT", args.timeout + 10)
        sres = sub.expect("RESULT", args.timeout + 10)
        result.update({
            "received": sres["received"], "sent": pres.get("sent"),
            "complete": sres["received"] >= args.messages,
            "msgs_per_s": (sres["received"] / ((sres["last_rx_ns"] - pres["start_ns"]) / 1e9)
                           if sres["last_rx_ns"] > pres["start_ns"] else None),
            "broker_cpu_us_per_msg": ((broker.cpu_s() - cpu0) * 1e6 / sres["received"]
                                      if sres["received"] else None),
            "publisher_cpu_s": pres.get("loadgen_cpu_s"),
            "subscriber_cpu_s": sres.get("loadgen_cpu_s"),
            "stop_reason": sres.get("stop_reason"), "error": pres.get("error")})
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        result["broker_log_tail"] = broker.log_tail(2000) if broker.proc else None
    finally:
        for worker in workers:
            worker.stop()
        broker.stop()
        broker.cleanup()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out")
    ap.add_argument("--mqttamqp-arg", action="append", default=[])
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("role_args", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        try:
            res = ROLES[args.role](json.loads(args.role_args))
        except Exception as e:
            res = {"error": f"{type(e).__name__}: {e}"}
        loadgen.emit("RESULT", res)
        return
    ok, help_text, env_extra = brokers.mqttamqp_help()
    if not ok or "--mqtt-ws" not in help_text:
        sys.exit("twistd mqttamqp with --mqtt-ws is not runnable: " + help_text[-500:])
    runs: dict[str, list[dict]] = {"tcp": [], "ws": []}
    for rep in range(args.repeat):
        order = ("tcp", "ws") if rep % 2 == 0 else ("ws", "tcp")
        for transport in order:
            print(f"run {rep + 1}/{args.repeat} over {transport}", file=sys.stderr)
            runs[transport].append(one_run(transport, args, help_text, env_extra))
    medians = {}
    for transport, rs in runs.items():
        rates = [r["msgs_per_s"] for r in rs if r.get("complete") and r.get("msgs_per_s")]
        medians[transport] = statistics.median(rates) if rates else None
    ratio = (medians["ws"] / medians["tcp"]) if medians["ws"] and medians["tcp"] else None
    doc = {"scenario": f"QoS 0, 1 -> 1, {PAYLOAD}-byte payloads, {args.messages} messages",
           "measured": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "loadavg": os.getloadavg()},
           "broker_args": args.mqttamqp_arg,
           "median_msgs_per_s": medians, "ratio_ws_over_tcp": ratio, "target": TARGET,
           "runs": runs}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
