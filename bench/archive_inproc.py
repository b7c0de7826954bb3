"""The archive's cost inside the broker's process, without sockets or a machine's noise:
the real MQTT protocol on fake transports, the real broker and the real archive (its
feeding thread and writer process), QoS 0 1→1 with 64-byte payloads.

    python bench/archive_inproc.py [--reps 15] [--messages 20000] [--profile FILE]
                                   [--wiring service|direct|noop]

Each repetition publishes ``--messages`` messages through one publisher connection
to one subscriber, in 64 KB reads as a socket would give them, on a broker with the
archive on (wired as the service wires it: ``fan_out(archive, webhooks)``, no hook)
and on one without; the two alternate. CPU is the broker process's (all threads:
the reactor side and the feeding thread, ``time.process_time``) from the first read
until the archive's buffer is empty again; the writer process's CPU (from
``/proc``) is reported beside it. Prints JSON with the minimum and median per
message of each. ``--profile FILE`` runs cProfile over the archive-on repetitions
too (the feeding thread is not profiled). ``--wiring`` attributes the cost:
``service`` (the default, as the service wires it), ``direct`` (the archive is the
broker's recorder, no fan-out) or ``noop`` (as ``service``, but the archive's
``message`` does nothing: what is left is the router's and the call's share).

The figures are CPU, not throughput; ``archive_bench.py`` measures throughput over
loopback. Never use them in a test.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from twisted.internet.task import Clock  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from mqttamqp.archive import Archive  # noqa: E402
from mqttamqp.core.broker import Broker  # noqa: E402
from mqttamqp.core.limits import Limits  # noqa: E402
from mqttamqp.core.message import Message  # noqa: E402
from mqttamqp.mqtt.codec import encode  # noqa: E402
from mqttamqp.mqtt.packets import Connect, Publish, Subscribe  # noqa: E402
from mqttamqp.mqtt.protocol import MQTTFactory  # noqa: E402
from mqttamqp.ops.recorders import fan_out  # noqa: E402
from mqttamqp.ops.webhooks import WebhookRecorder  # noqa: E402

_TICKS = os.sysconf("SC_CLK_TCK")


class NullStore:
    """Keeps nothing, commits at once (also bench/linkmem.py's)."""

    def load(self) -> Any:
        from mqttamqp.core.persistence import Snapshot
        return Snapshot()

    def submit(self, ops: Any) -> Any:
        from twisted.internet.defer import succeed
        return succeed(None)

    def pack(self) -> Any:
        from twisted.internet.defer import succeed
        return succeed(None)

    def close(self) -> None:
        pass


def _child_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class Setup:
    """One broker (archive on or off), a subscriber and a publisher on it."""

    def __init__(self, archive_dir: str | None, wiring: str = "service") -> None:
        self.clock = Clock()
        self.archive = Archive(archive_dir, self.clock) if archive_dir else None
        if self.archive is not None:
            self.archive.start()
        if wiring == "direct" and self.archive is not None:
            recorder: Any = self.archive
        else:
            recorder = fan_out(self.archive, WebhookRecorder(self.clock, ()))
        if wiring == "noop" and self.archive is not None:
            self.archive.message = lambda *a: None  # type: ignore[method-assign]
        self.broker = Broker(self.clock, NullStore(), Limits(), recorder=recorder)
        self.broker.start()
        factory = MQTTFactory(self.broker, self.clock)
        self.sub_t = StringTransport()
        self.sub = factory.buildProtocol(None)
        self.sub.makeConnection(self.sub_t)
        self.sub.dataReceived(encode(Connect("MQTT", 4, "sub", True, 0, None))
                              + encode(Subscribe(1, (("bench/t", 0),))))
        self.pub_t = StringTransport()
        self.pub = factory.buildProtocol(None)
        self.pub.makeConnection(self.pub_t)
        self.pub.dataReceived(encode(Connect("MQTT", 4, "pub", True, 0, None)))
        self.sub_t.clear()

    def run(self, chunks: list[bytes]) -> tuple[float, float]:
        """Process CPU and writer CPU for feeding ``chunks``."""
        archive = self.archive
        w0 = _child_cpu(archive.writer_pid) if archive else 0.0
        t0 = time.process_time()
        for chunk in chunks:
            self.pub.dataReceived(chunk)
            self.sub_t.clear()
        if archive is not None:
            archive.wait_until(lambda: archive.stats()["buffered"] == 0, 30.0)
        cpu = time.process_time() - t0
        return cpu, (_child_cpu(archive.writer_pid) - w0) if archive else 0.0

    def close(self) -> None:
        if self.archive is not None:
            self.archive.close()


def _chunks(messages: int) -> list[bytes]:
    packet = encode(Publish("bench/t", b"x" * 64, 0, False, False, None))
    per = max(1, 65536 // len(packet))
    chunks = []
    left = messages
    while left:
        n = min(per, left)
        chunks.append(packet * n)
        left -= n
    return chunks


def _only(archive: bool, chunks: list[bytes], reps: int, wiring: str) -> int:
    with tempfile.TemporaryDirectory(prefix="archive-inproc-") as directory:
        setup = Setup(directory if archive else None, wiring)
        try:
            for _ in range(max(1, reps)):
                setup.run(chunks)
        finally:
            setup.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--profile")
    ap.add_argument("--wiring", choices=("service", "direct", "noop"), default="service")
    ap.add_argument("--only", choices=("on", "off"),
                    help="one broker, --reps runs, no warm-up: for instruction counts "
                         "(valgrind --tool=callgrind), which a busy machine does not move")
    args = ap.parse_args()
    chunks = _chunks(args.messages)
    if args.only:
        return _only(args.only == "on", chunks, args.reps, args.wiring)
    _ = Message  # (imported for the type's module load before timing)
    with tempfile.TemporaryDirectory(prefix="archive-inproc-") as directory:
        on, off = Setup(directory, args.wiring), Setup(None)
        cpu: dict[str, list[float]] = {"on": [], "off": []}
        writer: list[float] = []
        profiler = cProfile.Profile() if args.profile else None
        try:
            on.run(chunks)
            off.run(chunks)   # warm both
            for _ in range(max(1, args.reps)):
                if profiler is not None:
                    profiler.enable()
                c, w = on.run(chunks)
                if profiler is not None:
                    profiler.disable()
                cpu["on"].append(c)
                writer.append(w)
                cpu["off"].append(off.run(chunks)[0])
        finally:
            on.close()
            off.close()
        if profiler is not None:
            profiler.dump_stats(args.profile)
    us = 1e6 / args.messages
    result = {
        "messages_per_rep": args.messages, "reps": args.reps,
        "us_per_msg_on_min": min(cpu["on"]) * us, "us_per_msg_off_min": min(cpu["off"]) * us,
        "us_per_msg_on_median": statistics.median(cpu["on"]) * us,
        "us_per_msg_off_median": statistics.median(cpu["off"]) * us,
        "extra_us_per_msg_min": (min(cpu["on"]) - min(cpu["off"])) * us,
        "cpu_ratio_min": min(cpu["off"]) / min(cpu["on"]),
        "writer_us_per_msg_median": statistics.median(writer) * us,
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
