#!/usr/bin/env python3
"""The AMQP 0.9.1 adapter's CPU per message, in one process, without sockets or storage.

    NQ=10 python bench/amqp091_inproc.py [COUNT] [PAYLOAD] [--mode both|pub|cons]
                                         [-p] [--areas] [-d] [--callgrind]

A publisher connection in confirm mode sends 100 persistent ``basic.publish`` a round
(to the default exchange and queue ``q``, or with ``NQ`` > 1 to a durable fanout
exchange bound to ``NQ`` queues, 100 / NQ a round); a consumer connection at prefetch
100 on every queue acknowledges what it got with one ``basic.ack`` (multiple); the
in-memory store of the unit tests (``tests/support/core_broker.py``), a Twisted
``Clock`` and ``StringTransport``s.  ``--mode pub``: the publisher alone (confirms,
the queue grows); ``--mode cons``: COUNT messages published first, unmeasured, then
the consumer alone drains them; ``both`` (the default): the two at once.

Prints the process CPU per delivery (per publish for ``pub``).  The harness finds
deliveries and confirms by hand (frame headers and method ids, as the load generator
of ``amqp091_bench.py`` does), so nearly all of the figure is the broker's.  ``-p``
adds a cProfile of a second run (its own overhead inflates small functions: read it
for shares, not absolute times); ``--areas`` sums that profile's own time by area
(frames and pamqp, properties, exchanges, queues, sessions, settlement, Deferreds,
the adapter) in µs per message; ``-d`` prints a few rounds' frames.  Compare runs
made side by side only, or count instructions, which do not move with the load:

    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/tmp/cg.out \
        python bench/amqp091_inproc.py 5000 --callgrind    # "Collected" / 5000

``CG_STAGE=module:Class.method`` with ``--callgrind`` collects inside that callable
only (inclusive): one stage's instructions of the run.  ``GC0=N`` sets the collector's
young-generation threshold (the service's by default).
"""

import argparse
import cProfile
import gc
import os
import pstats
import struct
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

try:
    from mqttamqp import service  # (its collector settings, as the broker runs them)
except ImportError:
    service = None

_ap = argparse.ArgumentParser()
_ap.add_argument("count", nargs="?", type=int, default=20000)
_ap.add_argument("payload", nargs="?", type=int, default=100)
_ap.add_argument("--mode", choices=("both", "pub", "cons"), default="both")
_ap.add_argument("-p", action="store_true")
_ap.add_argument("--areas", action="store_true")
_ap.add_argument("-d", action="store_true")
_ap.add_argument("--callgrind", action="store_true")
OPTS = _ap.parse_args()
N, PAY, MODE = OPTS.count, OPTS.payload, OPTS.mode
NQ = int(os.environ.get("NQ", "1"))
QUEUES = [f"q{i}" for i in range(NQ)] if NQ > 1 else ["q"]

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
decl = method_frame(1, c.Channel.Open()) + method_frame(1, c.Confirm.Select())
if NQ > 1:
    decl += method_frame(1, c.Exchange.Declare(exchange="fx", exchange_type="fanout", durable=True))
for q in QUEUES:
    decl += method_frame(1, c.Queue.Declare(queue=q, durable=True))
    if NQ > 1:
        decl += method_frame(1, c.Queue.Bind(queue=q, exchange="fx"))
pub.dataReceived(decl)
clock.advance(0)
frames_of(pt)
props = c.Basic.Properties(delivery_mode=2)
one = (
    method_frame(1, c.Basic.Publish(exchange="fx" if NQ > 1 else "", routing_key="q"))
    + pf.marshal(header.ContentHeader(0, PAY, props), 1)
    + pf.marshal(body.ContentBody(b"x" * PAY), 1)
)
ROUND = one * (100 // NQ)
PER_ROUND = 100 // NQ
_head = struct.Struct(">BHI")
DELIVER = b"\x00\x3c\x00\x3c"
ACK = b"\x00\x3c\x00\x50"


def scan(data, wanted):
    """(count of method frames ``wanted``, the last one's delivery tag)."""
    pos, end, got, last = 0, len(data), 0, 0
    while pos + 7 <= end:
        kind, _ch, size = _head.unpack_from(data, pos)
        if kind == 1 and data[pos + 7:pos + 11] == wanted:
            got += 1
            if wanted == DELIVER:
                n = data[pos + 11]
                last = int.from_bytes(data[pos + 12 + n:pos + 20 + n], "big")
            else:
                last = int.from_bytes(data[pos + 11:pos + 19], "big")
        pos += size + 8
    return got, last


def consume():
    cons.dataReceived(
        method_frame(1, c.Channel.Open())
        + method_frame(1, c.Basic.Qos(prefetch_count=100))
        + b"".join(method_frame(1, c.Basic.Consume(queue=q, consumer_tag=f"c{i}"))
                   for i, q in enumerate(QUEUES)))
    clock.advance(0)


def run_both(n):
    got = 0
    while got < n:
        pub.dataReceived(ROUND)
        clock.advance(0)
        pt.clear()
        data = ct.value()
        ct.clear()
        k, last = scan(data, DELIVER)
        got += k
        if last:
            cons.dataReceived(method_frame(1, c.Basic.Ack(last, multiple=True)))
            clock.advance(0)
    return got


def run_pub(n):
    done = 0
    while done < n:
        pub.dataReceived(ROUND)
        clock.advance(0)
        done += PER_ROUND
        pt.clear()
    return done


def run_cons(n):
    got = 0
    data = ct.value()
    ct.clear()
    for _ in range(10 * n):
        k, last = scan(data, DELIVER)
        got += k
        if not last:
            break
        cons.dataReceived(method_frame(1, c.Basic.Ack(last, multiple=True)))
        clock.advance(0)
        if got >= n:
            break
        data = ct.value()
        ct.clear()
    return got


AREAS = (
    ("pamqp (decode, encode)", ("/pamqp/",)),
    ("adapter frames", ("amqp091/frames.py",)),
    ("adapter properties", ("amqp091/properties.py",)),
    ("adapter connection, channel, consumers", ("/amqp091/",)),
    ("exchanges (routing)", ("core/exchanges/",)),
    ("queues (append, commit, dispatch)", ("core/queues/",)),
    ("sessions (window, deliver)", ("core/sessions/",)),
    ("settlement, publishing", ("core/routing/",)),
    ("core other (broker, commits, stats)", ("/core/", "/adapter/")),
    ("twisted (Deferreds, Clock, transport)", ("/twisted/",)),
)


def areas(stats, count):
    total = {name: 0.0 for name, _ in AREAS}
    total["builtins and the rest"] = 0.0
    for (filename, _line, _fn), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        for name, parts in AREAS:
            if any(p in filename for p in parts):
                total[name] += tt
                break
        else:
            total["builtins and the rest"] += tt
    whole = sum(total.values())
    print(f"own time by area, µs per message under cProfile ({whole / count * 1e6:.1f} in all):")
    for name, tt in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"  {tt / count * 1e6:7.2f}  {100 * tt / whole:5.1f} %  {name}")


STAGE_CALLS = [0]


def wrap_stage(spec, toggle):
    """``CG_STAGE=module:Class.method`` (or ``module:function``): collect only inside
    that callable (inclusive, outermost call; the toggles cost a few hundred
    instructions a call), so callgrind's total is that stage's share of the run."""
    import functools
    import importlib

    modname, _, path = spec.partition(":")
    owner = importlib.import_module(modname)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    fn = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    depth = [0]

    @functools.wraps(fn)
    def staged(*args, **kwargs):
        if depth[0]:
            return fn(*args, **kwargs)
        STAGE_CALLS[0] += 1
        depth[0] = 1
        toggle()
        try:
            return fn(*args, **kwargs)
        finally:
            toggle()
            depth[0] = 0

    setattr(owner, name, staged)


def measure(run, n):
    t = time.process_time()
    got = run(n)
    return (time.process_time() - t) / max(1, got) * 1e6, got


# As the service does once it has started (``service.py``): what start-up made lives
# for the whole run and stays out of the collector's generations; the young
# generation's threshold is the service's.
gc.collect()
gc.freeze()
if service is not None:
    gc.set_threshold(int(os.environ.get("GC0") or getattr(service, "GC_YOUNG_THRESHOLD", 700)),
                     *gc.get_threshold()[1:])
if MODE == "both":
    consume()
    run_both(2000)
    run = run_both
elif MODE == "pub":
    run_pub(2000)
    run = run_pub
else:
    run_pub(N + 2000 + (N if OPTS.p else 0))
    consume()
    run_cons(2000)
    run = run_cons
toggle = None
stage = None
if OPTS.callgrind:
    # Instructions per message, the same every run (no neighbours' noise): under
    # valgrind --tool=callgrind --collect-atstart=no, collected around this run only.
    sys.path.insert(0, HERE)
    from amqp_cost import callgrind_toggle

    toggle = callgrind_toggle()
    stage = os.environ.get("CG_STAGE")
    if stage:
        wrap_stage(stage, toggle)
    else:
        toggle()
us, got = measure(run, N)
if toggle is not None and not stage:
    toggle()
if stage:
    print(f"stage {stage}: {STAGE_CALLS[0]} calls")
print(f"{MODE}: {us:.1f} us per message ({got})")
if OPTS.p:
    pr = cProfile.Profile()
    pr.enable()
    got = run(N)
    pr.disable()
    st = pstats.Stats(pr)
    if OPTS.areas:
        areas(st, got)
    st.sort_stats("tottime").print_stats(40)
if OPTS.d:
    reader = FrameReader(1 << 22)
    if MODE != "both":
        sys.exit(0)
    for _ in range(5):
        pub.dataReceived(ROUND)
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
