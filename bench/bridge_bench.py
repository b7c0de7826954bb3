"""Bridge throughput against direct clients, and the backlog drained after an outage, in
one run (issue #29 §2's figures).

Starts Mosquitto and mqttamqp on free loopback ports, mqttamqp with a ``[[bridge]]`` to
Mosquitto (``bench/out/# out 1``, ``bench/in/# in 1``), then runs the same QoS 1
workload (one publisher with a window of 100 unacknowledged PUBLISHes, one subscriber
that PUBACKs each) four ways:

* ``direct_mosquitto``: publisher and subscriber on Mosquitto;
* ``direct_mqttamqp``: publisher and subscriber on mqttamqp;
* ``bridge_out``: publisher on mqttamqp, subscriber on Mosquitto (through the bridge);
* ``bridge_in``: publisher on Mosquitto, subscriber on mqttamqp (through the bridge).

Then the outage: Mosquitto stopped (SIGTERM, by PID), ``--backlog`` messages published
on mqttamqp (each acknowledged here, queued in ``$bridge/bench``), Mosquitto started
again with a subscriber, and the time from its start to the first and to the last
message: ``drained_per_s`` is the backlog over the time from the first to the last.

    python bench/bridge_bench.py [--messages N] [--payload BYTES] [--backlog N]

JSON on stdout, with the CPU seconds per message of each process.  The harness uses
the benchmark's own MQTT wire code (``mqttwire``), not the broker's.  The machine is
shared: figures vary between runs; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
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
from brokers import free_port, mosquitto_bin, mosquitto_version, proc_cpu_s
from gateway_bench import _client, _start, _stop

_OFF = ("--web", "none", "--mqtt-ws", "none", "--metrics", "none", "--amqp", "none")


def _mosquitto(directory: str, port: int) -> subprocess.Popen[str]:
    conf = os.path.join(directory, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\nlog_dest stderr\n"
                "log_type error\nlog_type notice\nlog_type information\nmax_queued_messages 0\n"
                f"persistence true\npersistence_location {directory}/\n"
                # (as root, Mosquitto drops to user mosquitto, which cannot write here)
                f"user {getpass.getuser()}\n")
    binary = mosquitto_bin()
    if binary is None:
        raise SystemExit("bridge_bench: Mosquitto is not installed")
    proc = subprocess.Popen([binary, "-c", conf], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("mosquitto exited before it was ready")
        if " running" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()   # (drain)
            return proc
    raise TimeoutError("mosquitto was not ready within 30 s")


def _subscriber(port: int, client_id: str, topic: str, clean: bool = True
                ) -> tuple[socket.socket, mqttwire.Parser]:
    if clean:
        sub, parser = _client(port, client_id)
    else:   # (a persistent session: the remote keeps what comes while it is away)
        sub = socket.create_connection(("127.0.0.1", port), timeout=30)
        sub.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sub.sendall(mqttwire.connect(client_id, clean=False))
        parser = mqttwire.Parser()
    sub.sendall(mqttwire.subscribe(1, [(topic, 1)]))
    for _ in range(1000):   # (bounded: SUBACK is among the first packets)
        kinds = {first >> 4 for first, _ in parser.feed(sub.recv(65536))}
        if mqttwire.SUBACK in kinds:
            return sub, parser
    raise RuntimeError(f"{client_id}: no SUBACK")


def _receive(sub: socket.socket, parser: mqttwire.Parser, n: int,
             times: list[float]) -> None:
    """Take ``n`` QoS 1 messages, acknowledging each; the time of the first and last."""
    count = 0
    while count < n:
        data = sub.recv(1 << 16)
        if not data:
            break
        acks = []
        for first, body in parser.feed(data):
            if first >> 4 == mqttwire.PUBLISH:
                count += 1
                if count == 1 or count == n:
                    times.append(time.monotonic())
                tlen = int.from_bytes(body[:2], "big")
                acks.append(mqttwire.puback(body[2 + tlen:4 + tlen]))
        if acks:
            sub.sendall(b"".join(acks))


def _publish(port: int, client_id: str, topic: str, n: int, payload: bytes) -> None:
    """``n`` QoS 1 PUBLISHes, at most 100 unacknowledged; returns once all are acked."""
    pub, parser = _client(port, client_id)
    sent = acked = 0
    while acked < n:
        batch = []
        while sent < n and sent - acked < 100:
            sent += 1
            batch.append(mqttwire.publish(topic, payload, 1, sent % 65535 + 1))
        if batch:
            pub.sendall(b"".join(batch))
        for first, _body in parser.feed(pub.recv(65536)):
            if first >> 4 == mqttwire.PUBACK:
                acked += 1
    pub.sendall(mqttwire.DISCONNECT_PKT)
    pub.close()


def _run(pub_port: int, sub_port: int, topic: str, n: int, payload: bytes, tag: str) -> float:
    """Seconds for ``n`` QoS 1 messages from a publisher on ``pub_port`` to a
    subscriber on ``sub_port``, until the last is received and acknowledged."""
    sub, parser = _subscriber(sub_port, f"sub-{tag}", topic)
    times: list[float] = []
    receiver = threading.Thread(target=_receive, args=(sub, parser, n, times), daemon=True)
    receiver.start()
    start = time.monotonic()
    _publish(pub_port, f"pub-{tag}", topic, n, payload)
    receiver.join(300)
    if receiver.is_alive() or len(times) < 2:
        raise RuntimeError(f"{tag}: the subscriber did not get every message")
    sub.sendall(mqttwire.DISCONNECT_PKT)
    sub.close()
    return times[-1] - start


def _drained(port: int, backlog: int, queued_s: float) -> dict[str, float]:
    """A persistent subscriber on the restarted remote (``port``) receives the
    ``backlog`` queued here during the outage (in ``queued_s``): the figures."""
    restarted = time.monotonic()
    sub, parser = _subscriber(port, "sub-outage", "bench/out/#", clean=False)
    times: list[float] = []
    _receive(sub, parser, backlog, times)
    sub.close()
    if len(times) < 2:
        raise RuntimeError("the backlog did not drain")
    return {
        "backlog": backlog,
        "queued_here_per_s": round(backlog / queued_s),
        "first_after_restart_s": round(times[0] - restarted, 3),
        "drain_seconds": round(times[-1] - times[0], 3),
        "drained_per_s": round(backlog / max(times[-1] - times[0], 1e-6)),
    }


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument("--backlog", type=int, default=20000)
    opts = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bridgebench-")
    far_port, near_port = free_port(), free_port()
    far_dir = os.path.join(tmp, "mosquitto")
    os.makedirs(far_dir)
    config = os.path.join(tmp, "mqttamqp.toml")
    with open(config, "w") as f:
        f.write(f'[[bridge]]\nname = "bench"\naddress = "mqtt://127.0.0.1:{far_port}"\n'
                'topics = ["bench/out/# out 1", "bench/in/# in 1"]\n'
                'max-backlog-messages = 30000\nreconnect-min = 0.1\nreconnect-max = 0.2\n')
    far = _mosquitto(far_dir, far_port)
    near = None
    try:
        near = _start(["--data", os.path.join(tmp, "near"), "--no-archive", "--config", config,
                       "--mqtt", f"tcp:{near_port}:interface=127.0.0.1", *_OFF],
                      "bridge bench: subscribed on the remote")
        payload = b"x" * opts.payload
        result: dict[str, object] = {
            "messages": opts.messages, "payload": opts.payload, "qos": 1,
            "mosquitto": mosquitto_version(), "cpus": os.cpu_count(),
            "note": "shared machine: compare the rows of one run, not runs"}
        runs = (("direct_mosquitto", far_port, far_port, "bench/direct"),
                ("direct_mqttamqp", near_port, near_port, "bench/direct"),
                ("bridge_out", near_port, far_port, "bench/out/t"),
                ("bridge_in", far_port, near_port, "bench/in/t"))
        for label, pub_port, sub_port, topic in runs:
            procs = {"mqttamqp": near, "mosquitto": far}
            cpu = {k: proc_cpu_s(p.pid) for k, p in procs.items()}
            seconds = _run(pub_port, sub_port, topic, opts.messages, payload, label)
            used = {k: proc_cpu_s(p.pid) - cpu[k] for k, p in procs.items()}
            result[label] = {"seconds": round(seconds, 3),
                             "messages_per_s": round(opts.messages / seconds),
                             "cpu_us_per_message": {k: round(v / opts.messages * 1e6, 1)
                                                    for k, v in used.items()}}
        # The outage: the remote away, the backlog acknowledged here, then drained.
        # The subscriber's session on Mosquitto is persistent (Mosquitto saves it at
        # SIGTERM), so what the bridge sends before it is back is kept for it.
        keeper, _ = _subscriber(far_port, "sub-outage", "bench/out/#", clean=False)
        keeper.sendall(mqttwire.DISCONNECT_PKT)
        keeper.close()
        _stop(far)
        start = time.monotonic()
        _publish(near_port, "pub-outage", "bench/out/o", opts.backlog, payload)
        queued_s = time.monotonic() - start
        far = _mosquitto(far_dir, far_port)
        result["outage"] = _drained(far_port, opts.backlog, queued_s)
        print(json.dumps(result, indent=2))
    finally:
        if near is not None:
            _stop(near)
        _stop(far)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
