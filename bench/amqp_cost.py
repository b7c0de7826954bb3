#!/usr/bin/env python3
"""The broker's own cost of one AMQP -> AMQP unsettled message, in process.

    PYTHONPATH=. python bench/amqp_cost.py [--count N] [--presettled] [--profile FILE]
                                           [--opcodes TOP]
    PYTHONPATH=. valgrind --tool=callgrind --collect-atstart=no \\
        --callgrind-out-file=/tmp/cg.out python3 bench/amqp_cost.py --callgrind

Unlike ``amqp_bench.py`` (sockets, three processes) this runs one broker and two
proton client engines in one process (``tests/amqp_memory.Net``: a ``task.Clock``
and in-memory transports) with ``amqp_bench``'s load: a sender with a window of
100 unsettled messages of 64 bytes, a receiver that grants 500 credit and accepts
and settles each delivery.  It times only the broker's side: the thread CPU
spent in the broker's ``dataReceived`` and in the clock's zero-delay calls (its
batched flushes), per message.  On a shared machine that figure still moves with
the neighbours' cache traffic; under callgrind (``--callgrind``, which turns
collection on around exactly those calls with ``CALLGRIND_TOGGLE_COLLECT``, built
once with cffi) the instruction count per message is the same on every run:
compare changes with it.  Sockets, epoll and the kernel are not in either figure.

Every loop is bounded by the message count (rounds at most 10 x count).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
sys.path.insert(0, HERE)

_TOGGLE_C = "#include <valgrind/callgrind.h>\nvoid cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }"


def callgrind_toggle() -> Callable[[], None]:
    """CALLGRIND_TOGGLE_COLLECT as a function (a no-op outside valgrind)."""
    from cffi import FFI

    build = os.path.join(tempfile.gettempdir(), "mqttamqp-cgtoggle")
    os.makedirs(build, exist_ok=True)
    sys.path.insert(0, build)
    try:
        from _cgtoggle import lib  # type: ignore[import-not-found]
    except ImportError:
        ffi = FFI()
        ffi.cdef("void cg_toggle(void);")
        ffi.set_source("_cgtoggle", _TOGGLE_C)
        ffi.compile(tmpdir=build)
        from _cgtoggle import lib
    return lib.cg_toggle  # type: ignore[no-any-return]


class OpcodeCounter:
    """Bytecodes run per function while enabled (``sys.settrace`` opcode events)."""

    def __init__(self) -> None:
        from collections import Counter
        self.counts: Counter[tuple[str, int, str]] = Counter()

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            self.counts[(code.co_filename.rsplit("mqttamqp/", 1)[-1], code.co_firstlineno,
                         code.co_name)] += 1
        return self._trace

    def enable(self) -> None:
        sys.settrace(self._trace)

    def disable(self) -> None:
        sys.settrace(None)

    def show(self, top: int, messages: int) -> None:
        total = sum(self.counts.values())
        print(f"bytecodes per message: {total / messages:.1f}", file=sys.stderr)
        for (path, line, name), n in self.counts.most_common(top):
            print(f"{n / messages:8.1f}  {path}:{line} {name}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=30000, help="messages")
    ap.add_argument("--presettled", action="store_true", help="pre-settled both ways")
    ap.add_argument("--callgrind", action="store_true",
                    help="toggle callgrind's collection around the broker's calls")
    ap.add_argument("--opcodes", type=int, metavar="TOP", default=0,
                    help="count the Python bytecodes the broker's calls run, per function "
                         "(sys.settrace, opcode events), and print the TOP functions' "
                         "counts per message: the Python side's share, exact on every run")
    ap.add_argument("--profile", metavar="FILE",
                    help="cProfile only the broker's calls (the timed ones) into FILE "
                         "(pstats); slower, so never quote its times, only its shares")
    args = ap.parse_args()

    from amqp_bench import amqp_publish_bytes
    from amqp_memory import Net, drain
    from cproton import ffi, lib
    from proton import Collector, Delivery, Event, Link

    toggle = callgrind_toggle() if args.callgrind else None
    profiler: Any = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
    elif args.opcodes:
        profiler = OpcodeCounter()
    n = args.count
    net = Net(max_queued_messages=64000)
    spent = [0.0]
    measuring = [False]
    clock_time = time.thread_time

    def timed(call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any) -> Any:
            if not measuring[0]:
                return call(*a)
            if toggle is not None:
                toggle()
            if profiler is not None:
                profiler.enable()
            t = clock_time()
            try:
                return call(*a)
            finally:
                spent[0] += clock_time() - t
                if profiler is not None:
                    profiler.disable()
                if toggle is not None:
                    toggle()
        return wrapper

    topic = "bench/cost"
    settle_mode = Link.SND_SETTLED if args.presettled else Link.SND_UNSETTLED
    rp, sp = net.amqp("cost-recv"), net.amqp("cost-send")
    cols = []
    for peer in (rp, sp):
        col = Collector()
        peer.conn.collect(col)
        cols.append(col)
    rl = rp.session.receiver("r")
    rl.source.address = rl.target.address = topic
    rl.snd_settle_mode = settle_mode
    rl.open()
    rl.flow(500)
    net.pump()
    sl = sp.session.sender("s")
    sl.target.address = topic
    sl.snd_settle_mode = settle_mode
    sl.open()
    net.pump()
    for peer in (rp, sp):
        peer.server.dataReceived = timed(peer.server.dataReceived)
    net.clock.advance = timed(net.clock.advance)  # type: ignore[method-assign]

    ev_delivery = Event.DELIVERY.number
    accepted = Delivery.ACCEPTED

    def deliveries(col: Any) -> list[Any]:
        out, c = [], col._impl
        for _ in range(1_000_000):
            ev = lib.pn_collector_peek(c)
            if not ev:
                break
            if lib.pn_event_type(ev) == ev_delivery:
                out.append(lib.pn_event_delivery(ev))
            lib.pn_collector_pop(c)
        return out

    def wire(peer: Any) -> None:
        """The broker's bytes into the client engine, the client's into the broker."""
        back = peer.wire.value()
        peer.wire.clear()
        while back and peer.transport.capacity() > 0:
            cap = peer.transport.capacity()
            peer.transport.push(back[:cap])
            back = back[cap:]
        out = drain(peer.transport)
        if out:
            peer.server.dataReceived(out)

    data = amqp_publish_bytes(topic, b"x" * 64, 0 if args.presettled else 1)
    simpl, rimpl = sl._impl, rl._impl
    buf = bytearray(1 << 16)
    cbuf = ffi.from_buffer(buf)
    tags = [str(i).encode() for i in range(n)]
    for col in cols:
        deliveries(col)
    # The collector as the broker runs it (``service._start_serving``): what was set
    # up frozen, a young generation of GC_YOUNG_THRESHOLD.
    import gc

    from mqttamqp.net.rawproton import packet_id_tag
    from mqttamqp.service import GC_YOUNG_THRESHOLD
    # A long run's steady state: the delivery tags of every packet id made (a broker
    # makes a block of them as its ids are first used: ``rawproton.packet_id_tag``).
    for pid in range(0, 65536, 1024):
        packet_id_tag(pid)
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    sent = acked = got = rounds = 0
    measuring[0] = True
    wall0 = time.perf_counter()
    while got < n and rounds < 10 * n:
        rounds += 1
        credit = lib.pn_link_credit(simpl)
        while sent < n and credit > 0 and sent - acked < 100:
            tag = tags[sent]
            dlv = lib.pn_delivery(simpl, (len(tag), ffi.from_buffer(tag)))
            lib.pn_link_send(simpl, data, len(data))
            lib.pn_link_advance(simpl)
            if args.presettled:
                lib.pn_delivery_settle(dlv)
                acked += 1
            sent += 1
            credit -= 1
        wire(sp)
        net.clock.advance(0)
        wire(rp)
        deliveries(cols[0])
        for _ in range(100_000):
            dlv = lib.pn_link_current(rimpl)
            if not dlv or lib.pn_delivery_partial(dlv) or not lib.pn_delivery_readable(dlv):
                break
            lib.pn_link_recv(rimpl, cbuf, len(buf))
            lib.pn_link_advance(rimpl)
            if not lib.pn_delivery_settled(dlv):
                lib.pn_delivery_update(dlv, accepted)
            lib.pn_delivery_settle(dlv)
            got += 1
        if lib.pn_link_credit(rimpl) < 250:
            lib.pn_link_flow(rimpl, 500 - lib.pn_link_credit(rimpl))
        wire(rp)
        net.clock.advance(0)
        wire(sp)
        for dlv in deliveries(cols[1]):
            if lib.pn_delivery_updated(dlv) or lib.pn_delivery_settled(dlv):
                lib.pn_delivery_settle(dlv)
                acked += 1
    wall = time.perf_counter() - wall0
    measuring[0] = False
    if args.profile:
        profiler.dump_stats(args.profile)
    elif args.opcodes:
        profiler.show(args.opcodes, max(1, got))
    print(json.dumps({
        "messages": n, "received": got, "rounds": rounds,
        "mode": "presettled" if args.presettled else "unsettled",
        "broker_thread_cpu_us_per_msg": round(spent[0] * 1e6 / max(1, got), 2),
        "loop_wall_us_per_msg": round(wall * 1e6 / max(1, got), 2),
        "note": "under callgrind, the instructions collected / messages is the figure",
    }))
    return 0 if got == n else 1


if __name__ == "__main__":
    raise SystemExit(main())
