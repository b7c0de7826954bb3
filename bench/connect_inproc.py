"""The broker's cost per MQTT CONNECT inside one process, without sockets: the real
MQTT protocol on ``StringTransport``s (``tests/support/mqtt_memory``), the real broker
on a ``Clock``, the real ``Archive`` recording (its feeding thread not started: the
events wait in its buffer, as in a storm).

    python bench/connect_inproc.py TREE N [--persistent] [--no-archive] [--callgrind]

``TREE``: the checkout whose ``mqttamqp`` is measured (put first on ``sys.path``, so
two checkouts compare with one interpreter).  ``N`` clean-session MQTT 3.1.1 clients
(keepalive 600) connect one after another and stay connected.  Prints the process
CPU per connect in microseconds; under callgrind, with ``--callgrind``, collection is
on for exactly the connects, so that

    PYTHONHASHSEED=0 valgrind --tool=callgrind --collect-atstart=no \\
        --callgrind-out-file=OUT .venv/bin/python bench/connect_inproc.py TREE 2000 --callgrind

gives instructions per connect (Collected / N) that neither the machine's load nor
the kernel's batching of accepts moves (``connmem.py --cpu --callgrind`` counts the
same path with sockets, whose per-turn work varies from run to run by several
thousand instructions a connect).  The accept, the socket and the CONNACK's send
are not in it.  Never use the figures in a test.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
from typing import Any


def main() -> None:
    tree, n = sys.argv[1], int(sys.argv[2])
    flags = set(sys.argv[3:])
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [tree, os.path.join(here, "..", "tests", "support"), here]
    import mqttamqp
    assert mqttamqp.__file__ is not None and mqttamqp.__file__.startswith(tree)
    from fakes import NullStore
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from mqttamqp.archive import Archive
    from mqttamqp.core.broker import Broker
    from mqttamqp.core.limits import Limits
    from mqttamqp.mqtt.codec import encode
    from mqttamqp.mqtt.packets import Connect
    from mqttamqp.mqtt.protocol import MQTTFactory
    from mqttamqp.security.admission import guards

    clock = Clock()
    clock.advance(1_800_000_000.0)
    limits = Limits(sys_interval=0, max_connections=n + 10, max_connect_rate=0)
    recorder: Any = None
    with tempfile.TemporaryDirectory() as tmp:
        if "--no-archive" not in flags:
            recorder = Archive(os.path.join(tmp, "archive"), clock, buffer_limit=1 << 22)
        kwargs = {} if recorder is None else {"recorder": recorder}
        broker = Broker(clock, NullStore(), limits, guards=guards(clock.seconds, limits),
                        **kwargs)
        factory = MQTTFactory(broker, clock)
        clean = "--persistent" not in flags
        packets = [encode(Connect("MQTT", 4, f"client-{i:06d}", clean, 600, None))
                   for i in range(n)]
        protocols = [factory.buildProtocol(None) for _ in range(n)]
        transports = [StringTransport() for _ in range(n)]
        toggle = None
        if "--callgrind" in flags:
            from amqp_cost import callgrind_toggle
            toggle = callgrind_toggle()
        gc.collect()
        began = time.process_time()
        if toggle is not None:
            toggle()
        for proto, transport, packet in zip(protocols, transports, packets, strict=True):
            proto.makeConnection(transport)
            proto.dataReceived(packet)
        if toggle is not None:
            toggle()
        spent = time.process_time() - began
        bad = [t.value()[:8] for t in transports if t.value()[:1] != b"\x20"]
        assert not bad, f"{len(bad)} not accepted: {bad[:3]}"
        print(f"{n} connects: {spent / n * 1e6:.1f} us each (process CPU)")


if __name__ == "__main__":
    main()
