"""What one MQTT PUBLISH costs the connection's own code, in process (issue 25).

A real ``Broker`` (``task.Clock``, a null or manually committed store) and
``MQTTProtocol``s on StringTransports: one publisher's PUBLISHes are fed in
chunks of 100 (one ``dataReceived`` each), for QoS 0/1, MQTT 3.1.1 and 5, alone
or with one subscriber (a QoS 1 one acknowledges what it got; a persistent one
waits for the store's commits).  Prints CPU ns per PUBLISH (best of 3) and, with
``--calls``, the Python calls per PUBLISH under cProfile (deterministic: what a
code change adds or removes shows there whatever the machine's load).  To compare
two trees, run it from each with ``--tree`` and alternate.

    python bench/mqtt_publish_micro.py [--tree DIR] [--calls] [--only TEXT]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import sys
import time
from typing import Any

_CHUNK = 100
_CASES: list[tuple[str, tuple[int, int, bool, bool]]] = [
    ("3.1.1 QoS 0", (4, 0, False, False)),
    ("3.1.1 QoS 1", (4, 1, False, False)),
    ("5 QoS 0", (5, 0, False, False)),
    ("5 QoS 1", (5, 1, False, False)),
    ("3.1.1 QoS 0, a subscriber", (4, 0, True, False)),
    ("3.1.1 QoS 1, a subscriber's PUBACKs", (4, 1, True, False)),
    ("3.1.1 QoS 1, a persistent subscriber", (4, 1, True, True)),
    ("5 QoS 1, a persistent subscriber", (5, 1, True, True)),
]


def _case(count: int, level: int, qos: int, sub: bool, persistent: bool) -> float:
    from fakes import ManualStore
    from mqtt_memory import Client, Client5, Harness

    from mqttamqp.mqtt.codec import encode
    from mqttamqp.mqtt.packets import Connect, Puback, Publish, Subscribe

    store = ManualStore() if persistent else None
    h = Harness(store=store, max_inflight=2 * _CHUNK)
    pub = (Client5 if level == 5 else Client)(h.factory)
    pub.send(Connect("MQTT", level, "p", True, 0))
    pub.transport.clear()
    s = None
    if sub:
        s = Client(h.factory)
        s.connect("s", clean=not persistent)
        s.send(Subscribe(1, (("t", 1),)))
        if store is not None:
            store.commit_all()
        s.transport.clear()
    chunk = b"".join(encode(Publish("t", b"x" * 64, qos, packet_id=pid if qos else None),
                            level) for pid in range(1, _CHUNK + 1))
    gc.collect()
    t0 = time.process_time()
    for _ in range(count // _CHUNK):
        pub.proto.dataReceived(chunk)
        if store is not None:
            store.commit_all()
        pub.transport.clear()
        if s is not None:
            got = [p.packet_id for p in s.received() if isinstance(p, Publish) and p.packet_id]
            if got:
                s.proto.dataReceived(b"".join(encode(Puback(pid)) for pid in got))
    spent = time.process_time() - t0
    assert pub.proto.state.name == "CONNECTED" and (s is None or s.proto.state.name ==
                                                     "CONNECTED")
    assert not qos or pub.proto._acks.empty
    return spent / count * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=os.getcwd(), help="the checkout to measure")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--calls", action="store_true", help="Python calls per PUBLISH")
    parser.add_argument("--only", default="", help="only the cases whose name has this")
    args = parser.parse_args()
    tree = os.path.abspath(args.tree)
    sys.path[:0] = [tree, os.path.join(tree, "tests", "support")]
    import mqttamqp
    assert mqttamqp.__file__ is not None and mqttamqp.__file__.startswith(tree)
    out: dict[str, Any] = {"tree": tree, "ns_per_publish": {}, "calls_per_publish": {}}
    for name, case in _CASES:
        if args.only not in name:
            continue
        out["ns_per_publish"][name] = round(min(_case(args.messages, *case)
                                                for _ in range(3)))
        if args.calls:
            profile = cProfile.Profile()
            profile.enable()
            _case(2_000, *case)
            profile.disable()
            out["calls_per_publish"][name] = pstats.Stats(profile).total_calls / 2_000
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
