#!/usr/bin/env python3
"""The AMQP 0.9.1 adapter's CPU per message, in one process, without sockets or storage.

    NQ=10 python bench/amqp091_inproc.py [COUNT] [PAYLOAD] [-p] [-d]

A publisher connection in confirm mode sends 100 persistent ``basic.publish`` a round
(to the default exchange and queue ``q``, or with ``NQ`` > 1 to a durable fanout
exchange bound to ``NQ`` queues, 100 / NQ a round); a consumer connection at prefetch
100 on every queue acknowledges what it got with one ``basic.ack`` (multiple); the
in-memory store of the unit tests (``tests/support/core_broker.py``), a Twisted
``Clock`` and ``StringTransport``s.  Prints the process CPU per delivery (the harness's own
decoding of the deliveries with pamqp included: an upper bound of the broker's); ``-p`` adds a
cProfile of a second run (wall-clock based: noisy on a loaded machine), ``-d`` prints
a few rounds' frames.  Compare runs made side by side only.
"""

import cProfile
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [
    os.path.join(HERE, "..", "tests", "support"),
    os.path.join(HERE, "..", "tests", "unit", "amqp091"),
]
from pamqp import body, header  # noqa: E402
from pamqp import commands as c  # noqa: E402
from pamqp import frame as pf  # noqa: E402
from test_connection import frames_of, open_connection  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from mqttamqp.amqp091.frames import FrameReader, method_frame  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
PAY = int(sys.argv[2]) if len(sys.argv) > 2 else 100
pub, pt, clock = open_connection()
broker = pub.broker
cons = pub.factory.buildProtocol(None)
ct = StringTransport()
cons.makeConnection(ct)
frames_of(ct)
C = c.Connection
cons.dataReceived(method_frame(0, C.StartOk(mechanism="PLAIN", response="\x00guest\x00guest")))
cons.dataReceived(method_frame(0, C.TuneOk(2047, 131072, 0)) + method_frame(0, C.Open("/")))
frames_of(ct)
NQ = int(os.environ.get("NQ", "1"))
decl = method_frame(1, c.Channel.Open()) + method_frame(1, c.Confirm.Select())
if NQ > 1:
    decl += method_frame(1, c.Exchange.Declare(exchange="fx", exchange_type="fanout", durable=True))
for i in range(NQ):
    decl += method_frame(1, c.Queue.Declare(queue=f"q{i}" if NQ > 1 else "q", durable=True))
    if NQ > 1:
        decl += method_frame(1, c.Queue.Bind(queue=f"q{i}", exchange="fx"))
pub.dataReceived(decl)
clock.advance(0)
frames_of(pt)
cons.dataReceived(
    method_frame(1, c.Channel.Open())
    + method_frame(1, c.Basic.Qos(prefetch_count=100))
    + b"".join(
        method_frame(1, c.Basic.Consume(queue=f"q{i}" if NQ > 1 else "q", consumer_tag=f"c{i}"))
        for i in range(NQ)
    )
)
clock.advance(0)
frames_of(ct)
props = c.Basic.Properties(delivery_mode=2)
one = (
    method_frame(1, c.Basic.Publish(exchange="fx" if NQ > 1 else "", routing_key="q"))
    + pf.marshal(header.ContentHeader(0, PAY, props), 1)
    + pf.marshal(body.ContentBody(b"x" * PAY), 1)
)
reader = FrameReader(1 << 22)


def run(n):
    got = 0
    while got < n:
        pub.dataReceived(one * (100 // NQ))
        clock.advance(0)
        pt.clear()
        data = ct.value()
        ct.clear()
        last = 0
        for _ch, f in reader.feed(data):
            if getattr(f, "name", "") == "Basic.Deliver":
                last = f.delivery_tag
                got += 1
        if last:
            cons.dataReceived(method_frame(1, c.Basic.Ack(last, multiple=True)))
            clock.advance(0)
    return got


run(2000)
t = time.process_time()
got = run(N)
dt = time.process_time() - t
print(f"{dt / got * 1e6:.1f} us per message ({got})")
if "-p" in sys.argv:
    pr = cProfile.Profile()
    pr.enable()
    run(N)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(35)
if "-d" in sys.argv:
    for _ in range(5):
        pub.dataReceived(one * (100 // NQ))
        clock.advance(0)
        data = ct.value()
        ct.clear()
        fs = [f for ch, f in reader.feed(data)]
        names = {}
        for f in fs:
            names[getattr(f, "name", "?")] = names.get(getattr(f, "name", "?"), 0) + 1
        print(names, len(pt.value()))
        pt.clear()
        last = max([f.delivery_tag for f in fs if getattr(f, "name", "") == "Basic.Deliver"] or [0])
        if last:
            cons.dataReceived(method_frame(1, c.Basic.Ack(last, multiple=True)))
            clock.advance(0)
        print("after ack", len(ct.value()))
    q = broker.queues
    print([(k, len(v.log)) for k, v in list(getattr(q, "queues", {}).items())[:3]])
