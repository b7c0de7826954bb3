"""Per-message cost through a gateway against direct, in one run (issue #29 §1's figure).

Starts a core (``twistd mqttamqp`` with AMQP) and a gateway (``--upstream``) on free
loopback ports, then runs the same QoS 1 workload twice: one publisher (a window of
100 unacknowledged PUBLISHes) and one subscriber (PUBACK each), both on the core
("direct"), then both on the gateway ("gateway").  Reports messages/s and the CPU
seconds per message of each process (utime+stime from /proc), as JSON on stdout.

    python bench/gateway_bench.py [--messages N] [--payload BYTES] [--idle-clients N]

``--idle-clients N`` then connects N idle clients (clean session 0, one subscription
each) to the gateway and reports the resident memory each process gained per client.

The harness uses the benchmark's own MQTT wire code (``mqttwire``), not the broker's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mqttwire
from brokers import free_port, proc_cpu_s, twistd_bin

_OFF = ("--web", "none", "--mqtt-ws", "none", "--metrics", "none")


def _start(args: list[str], ready: str, timeout: float = 60.0) -> subprocess.Popen[str]:
    proc = subprocess.Popen([twistd_bin(), "-n", "--pidfile=", "--logfile=-", "mqttamqp",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("process exited before it was ready")
        if re.search(ready, line):
            threading.Thread(target=proc.stdout.read, daemon=True).start()   # (drain)
            return proc
    raise TimeoutError(f"no {ready!r} within {timeout} s")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _client(port: int, client_id: str) -> tuple[socket.socket, mqttwire.Parser]:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(mqttwire.connect(client_id))
    parser = mqttwire.Parser()
    while True:
        data = s.recv(65536)
        if not data:
            raise RuntimeError(f"{client_id}: closed before CONNACK")
        for first, _body in parser.feed(data):
            if first >> 4 == mqttwire.CONNACK:
                return s, parser


def _run(port: int, n: int, payload: bytes, tag: str) -> float:
    """Seconds for ``n`` QoS 1 messages from a publisher to a subscriber on ``port``."""
    topic = f"bench/{tag}"
    sub, sparser = _client(port, f"sub-{tag}")
    sub.sendall(mqttwire.subscribe(1, [(topic, 1)]))
    got = 0
    while not got:
        for first, _body in sparser.feed(sub.recv(65536)):
            if first >> 4 == mqttwire.SUBACK:
                got = 1
    pub, pparser = _client(port, f"pub-{tag}")
    done = threading.Event()

    def receive() -> None:
        count = 0
        while count < n:
            data = sub.recv(1 << 16)
            if not data:
                break
            acks = []
            for first, body in sparser.feed(data):
                if first >> 4 == mqttwire.PUBLISH:
                    count += 1
                    tlen = int.from_bytes(body[:2], "big")
                    acks.append(mqttwire.puback(body[2 + tlen:4 + tlen]))
            if acks:
                sub.sendall(b"".join(acks))
        done.set()

    threading.Thread(target=receive, daemon=True).start()
    start = time.monotonic()
    sent = acked = 0
    window = 100
    while acked < n:
        batch = []
        while sent < n and sent - acked < window:
            sent += 1
            batch.append(mqttwire.publish(topic, payload, 1, sent % 65535 + 1))
        if batch:
            pub.sendall(b"".join(batch))
        for first, _body in pparser.feed(pub.recv(65536)):
            if first >> 4 == mqttwire.PUBACK:
                acked += 1
    assert done.wait(120), "the subscriber did not get every message"
    elapsed = time.monotonic() - start
    for s in (pub, sub):
        s.sendall(mqttwire.DISCONNECT_PKT)
        s.close()
    return elapsed


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _idle(port: int, n: int, procs: dict[str, subprocess.Popen[str]]) -> dict[str, float]:
    """KB of resident memory each process gained per idle client of the gateway."""
    before = {k: _rss_kb(p.pid) for k, p in procs.items()}
    held = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(mqttwire.connect(f"idle-{i}", clean=False)
                  + mqttwire.subscribe(1, [(f"idle/{i}", 1)]))
        parser = mqttwire.Parser()
        kinds: set[int] = set()
        while mqttwire.SUBACK not in kinds:
            data = s.recv(4096)
            if not data:
                raise RuntimeError(f"idle client {i} was closed by the gateway")
            kinds |= {first >> 4 for first, _ in parser.feed(data)}
        held.append(s)
    after = {k: _rss_kb(p.pid) for k, p in procs.items()}
    for s in held:
        s.sendall(mqttwire.DISCONNECT_PKT)
        s.close()
    return {k: round((after[k] - before[k]) / n, 2) for k in procs}


def main() -> None:
    # SIGTERM (a timeout) ends through the finally below: the processes are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument("--idle-clients", type=int, default=0)
    opts = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gwbench-")
    core_mqtt, core_amqp, gw_mqtt = free_port(), free_port(), free_port()
    core = _start(["--data", os.path.join(tmp, "core"), "--no-archive",
                   "--mqtt", f"tcp:{core_mqtt}:interface=127.0.0.1",
                   "--amqp", f"tcp:{core_amqp}:interface=127.0.0.1",
                   # (a gateway's clients: a session and 5-6 links each, one connection)
                   "--amqp-max-sessions", "20000", "--amqp-max-links", "120000",
                   "--amqp-max-links-total", "120000", *_OFF], "listening for AMQP")
    gw = None
    try:
        gw = _start(["--upstream", f"amqp://127.0.0.1:{core_amqp}", "--upstream-connections",
                     "1", "--upstream-max-clients", "20000",
                     "--mqtt", f"tcp:{gw_mqtt}:interface=127.0.0.1", *_OFF],
                    r"upstream connection 0 to \S+ is open")
        payload = b"x" * opts.payload
        result: dict[str, object] = {"messages": opts.messages, "payload": opts.payload,
                                     "qos": 1}
        for label, port in (("direct", core_mqtt), ("gateway", gw_mqtt)):
            cpu = {name: proc_cpu_s(p.pid) for name, p in (("core", core), ("gateway", gw))}
            seconds = _run(port, opts.messages, payload, label)
            used = {name: proc_cpu_s(p.pid) - cpu[name]
                    for name, p in (("core", core), ("gateway", gw))}
            result[label] = {
                "seconds": round(seconds, 3),
                "messages_per_s": round(opts.messages / seconds),
                "cpu_us_per_message": {k: round(v / opts.messages * 1e6, 1)
                                       for k, v in used.items()},
            }
        if opts.idle_clients:
            result["kb_per_idle_client"] = _idle(gw_mqtt, opts.idle_clients,
                                                 {"core": core, "gateway": gw})
        print(json.dumps(result, indent=2))
    finally:
        if gw is not None:
            _stop(gw)
        _stop(core)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
