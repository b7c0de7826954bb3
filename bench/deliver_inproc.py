"""The broker's cost per delivery inside one process, without sockets: the real MQTT
protocol on ``StringTransport``s (``tests/support/mqtt_memory``), the real broker,
a fixed workload.

    python bench/deliver_inproc.py TREE SCENARIO N

``TREE``: the checkout whose ``mqttamqp`` is measured (put first on ``sys.path``, so
two checkouts compare with one interpreter).  ``SCENARIO``: ``fan311`` (QoS 0, one
publisher to 100 MQTT 3.1.1 subscribers), ``fan5plain`` (the same, MQTT 5
subscribers), ``fan5`` (MQTT 5 subscribers with a subscription identifier each),
``q1`` (QoS 1, 1 -> 1, MQTT 3.1.1, the subscriber acknowledging each), ``q1p`` (the
same to a persistent subscriber, clean session 0, on a store whose commits complete
after each step, as the writer thread's do: the subscriber's PUBACKs come first),
``qq`` (as ``q1`` through a durable queue: published to ``$queue/jobs/task``, one
member of ``$queue/jobs`` acknowledging each delivery with its PUBACK), ``fanin``
(``bench/run.py``'s scenario 5 in process: QoS 0, 100 MQTT 3.1.1 publishers on topics
``bench/pNNN`` to one subscriber on ``bench/#``, each read ``FANIN_READ`` PUBLISHes,
the publishers read round robin; the archive on, as the broker runs by default).
``-p`` after ``N`` prints a cProfile of the measured steps (and writes it to
the file named after ``-p``, if any).  ``N`` scales
the number of messages.  Prints the process CPU per delivery in microseconds (the
test clients' own work included).

CPU on a shared machine moves by several per cent from run to run; for a figure
other work does not move, count instructions at two sizes and take the slope:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=OUT \\
        .venv/bin/python bench/deliver_inproc.py TREE fan311 5     (then 15)

(20,000 and 60,000 deliveries for the fan-outs and ``fanin``, 2,000 and 6,000 for ``q1``
and ``qq``).  Never use the figures in a test.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

FANIN_READ = 5   # PUBLISHes in each publisher's read (``fanin``)


class LaterStore:
    """A store that keeps nothing; its commits complete when the step says so."""

    def __init__(self) -> None:
        from twisted.internet.defer import Deferred
        self._new = Deferred
        self.waiting: list[Any] = []

    def load(self) -> Any:
        from mqttamqp.core.persistence import Snapshot
        return Snapshot()

    def submit(self, ops: Any) -> Any:
        d = self._new()
        self.waiting.append(d)
        return d

    def complete(self) -> None:
        waiting, self.waiting = self.waiting, []
        for d in waiting:
            d.callback(None)

    def pack(self) -> Any:
        from twisted.internet.defer import succeed
        return succeed(None)

    def close(self) -> None:
        pass


def main() -> None:
    tree, scenario, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.path[:0] = [tree, tree + "/tests/support"]
    import mqttamqp
    assert mqttamqp.__file__ is not None and mqttamqp.__file__.startswith(tree)
    from mqtt_memory import Harness, client5

    from mqttamqp.mqtt.codec import encode
    from mqttamqp.mqtt.packets import Properties, Puback, Publish, Subscribe

    store = LaterStore()
    archive = None
    if scenario == "fanin":
        # The archive on, as ``twistd mqttamqp`` runs by default, wired as the service
        # wires it (``fan_out(archive, None)`` is the archive itself); never started:
        # what its feeding thread would take is dropped after each step (nothing is
        # written: its directory is never made).
        from mqttamqp.archive import Archive
        archive = Archive("/nonexistent/fanin-archive", None)
    h = Harness(store, max_inflight=100, recorder=archive)   # (as bench/run.py sets it)
    subs: list[Any] = []
    if scenario in ("fan311", "fan5", "fan5plain"):
        for i in range(100):
            if scenario == "fan311":
                c: Any = h.client()
                c.connect(f"s{i}")
                c.send(Subscribe(1, (("bench/t", 0),)))
            else:
                c = client5(h)
                c.connect5(f"s{i}")
                ids = (Properties(subscription_identifiers=(i + 1,))
                       if scenario == "fan5" else None)
                c.send(Subscribe(1, (("bench/t", 0),), properties=ids))
            c.transport.clear()
            subs.append(c)
        pub = h.client()
        pub.connect("pub")
        batch = [Publish("bench/t", b"x" * 64)] * 50

        def step() -> None:
            pub.send(*batch)
            for s in subs:
                s.transport.clear()
            pub.transport.clear()
        steps = max(1, 40 * n // 50)
        deliveries = steps * 50 * 100
    elif scenario == "fanin":
        sub = h.client()
        sub.connect("s")
        sub.send(Subscribe(1, (("bench/#", 0),)))
        sub.transport.clear()
        # (bench/run.py's scenario 5: a publisher per topic, reads of a few PUBLISHes
        # each, taken round robin as a reactor turn takes its ready sockets)
        reads = []
        for i in range(100):
            c = h.client()
            c.connect(f"p{i}")
            c.transport.clear()
            reads.append((c.proto.dataReceived, c.transport.clear,
                          encode(Publish(f"bench/p{i:03d}", b"x" * 64)) * FANIN_READ))

        records, payloads = archive._filling

        def step() -> None:
            for received, _clear, data in reads:
                received(data)
            sub.transport.clear()
            for _received, clear, _data in reads:
                clear()
            del records[:], payloads[:]
        steps = max(1, 8 * n)
        deliveries = steps * 100 * FANIN_READ
    elif scenario in ("q1", "q1p", "qq"):
        topic, topic_filter = (("$queue/jobs/task", "$queue/jobs") if scenario == "qq"
                               else ("bench/t", "bench/t"))
        sub = h.client()
        sub.connect("s", clean=scenario != "q1p")
        sub.send(Subscribe(1, ((topic_filter, 1),)))
        sub.transport.clear()
        pub = h.client()
        pub.connect("pub")
        pid = [0]

        def step() -> None:
            packets = []
            for _ in range(50):
                pid[0] = pid[0] % 60000 + 1
                packets.append(Publish(topic, b"x" * 64, 1, False, False, pid[0]))
            pub.send(*packets)
            for _ in range(100):   # (a queue hands out its prefetch, more per PUBACK)
                got = [p for p in sub.received() if isinstance(p, Publish)]
                if not got:
                    break
                sub.send(*[Puback(p.packet_id) for p in got])
            store.complete()
            pub.transport.clear()
        steps = max(1, 40 * n // 50) * 10
        deliveries = steps * 50
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    for _ in range(20):   # (warm: caches, specialisation)
        step()
    gc.collect()
    gc.disable()
    profile = None
    if sys.argv[4:5] == ["-p"]:
        import cProfile
        profile = cProfile.Profile()
        profile.enable()
    start = time.process_time()
    for _ in range(steps):
        step()
    end = time.process_time()
    if profile is not None:
        import pstats
        profile.disable()
        if sys.argv[5:6]:
            profile.dump_stats(sys.argv[5])
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
    print(f"{(end - start) / deliveries * 1e6:.4f}")


if __name__ == "__main__":
    main()
