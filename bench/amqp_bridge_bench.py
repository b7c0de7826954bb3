"""AMQP 1.0 bridge throughput against direct clients, and the backlog drained after an
outage, in one run (issue #29 §2, AMQP 1.0 bridges).

Starts two mqttamqp processes on free loopback ports: ``far`` (MQTT and AMQP 1.0
listeners) and ``near``, with an ``amqp://`` ``[[bridge]]`` to far's AMQP listener
(``bench/out/# out 1``, ``bench/in/# in 1``). Then the same QoS 1 workload as
``bridge_bench.py`` (its functions: one publisher with 100 unacknowledged PUBLISHes,
one subscriber that PUBACKs each), three ways: ``direct_far`` (both on far),
``bridge_out`` (publisher on near, subscriber on far, through the bridge) and
``bridge_in`` (publisher on far, subscriber on near). Then the outage: far stopped,
``--backlog`` messages published on near (each queued in ``$bridge/bench``), far started
again on the same ports, and the backlog's drain timed at a persistent subscriber.

    python bench/amqp_bridge_bench.py [--messages N] [--payload BYTES] [--backlog N]

JSON on stdout, with the CPU seconds per message of each process.  The machine is
shared: compare the rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mqttwire
from bridge_bench import _drained, _publish, _run, _subscriber
from brokers import free_port, proc_cpu_s
from gateway_bench import _start, _stop

_OFF = ("--web", "none", "--mqtt-ws", "none", "--metrics", "none", "--no-archive")


def _far(directory: str, mqtt_port: int, amqp_port: int) -> subprocess.Popen[str]:
    return _start(["--data", directory, "--mqtt", f"tcp:{mqtt_port}:interface=127.0.0.1",
                   "--amqp", f"tcp:{amqp_port}:interface=127.0.0.1", *_OFF],
                  "listening for AMQP")


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument("--backlog", type=int, default=20000)
    opts = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="amqpbridgebench-")
    far_mqtt, far_amqp, near_port = free_port(), free_port(), free_port()
    far_dir = os.path.join(tmp, "far")
    config = os.path.join(tmp, "mqttamqp.toml")
    with open(config, "w") as f:
        f.write(f'[[bridge]]\nname = "bench"\naddress = "amqp://127.0.0.1:{far_amqp}"\n'
                'topics = ["bench/out/# out 1", "bench/in/# in 1"]\n'
                'max-backlog-messages = 30000\nreconnect-min = 0.1\nreconnect-max = 0.2\n')
    far = _far(far_dir, far_mqtt, far_amqp)
    near = None
    try:
        near = _start(["--data", os.path.join(tmp, "near"), "--config", config,
                       "--mqtt", f"tcp:{near_port}:interface=127.0.0.1", "--amqp", "none",
                       *_OFF], "bridge bench: receiving from the remote")
        payload = b"x" * opts.payload
        result: dict[str, object] = {
            "messages": opts.messages, "payload": opts.payload, "qos": 1,
            "cpus": os.cpu_count(),
            "note": "shared machine: compare the rows of one run, not runs"}
        runs = (("direct_far", far_mqtt, far_mqtt, "bench/direct"),
                ("bridge_out", near_port, far_mqtt, "bench/out/t"),
                ("bridge_in", far_mqtt, near_port, "bench/in/t"))
        for label, pub_port, sub_port, topic in runs:
            procs = {"near": near, "far": far}
            cpu = {k: proc_cpu_s(p.pid) for k, p in procs.items()}
            seconds = _run(pub_port, sub_port, topic, opts.messages, payload, label)
            used = {k: proc_cpu_s(p.pid) - cpu[k]
                    for k, p in procs.items()}
            result[label] = {"seconds": round(seconds, 3),
                             "messages_per_s": round(opts.messages / seconds),
                             "cpu_us_per_message": {k: round(v / opts.messages * 1e6, 1)
                                                    for k, v in used.items()}}
        keeper, _ = _subscriber(far_mqtt, "sub-outage", "bench/out/#", clean=False)
        keeper.sendall(mqttwire.DISCONNECT_PKT)
        keeper.close()
        _stop(far)
        start = time.monotonic()
        _publish(near_port, "pub-outage", "bench/out/o", opts.backlog, payload)
        queued_s = time.monotonic() - start
        far = _far(far_dir, far_mqtt, far_amqp)
        result["outage"] = _drained(far_mqtt, opts.backlog, queued_s)
        print(json.dumps(result, indent=2))
    finally:
        if near is not None:
            _stop(near)
        _stop(far)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
