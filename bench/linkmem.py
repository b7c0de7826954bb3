#!/usr/bin/env python3
"""What one attached AMQP link costs the broker, allocation by allocation.

    PYTHONPATH=. python bench/linkmem.py [--count 5000] [--kind receiver] [--top 20]
                                         [--json]

Runs the broker's AMQP side in this process (``Broker`` on a ``task.Clock``, a store
that keeps nothing, one ``AMQPConnection`` on an in-memory transport) and feeds it
the bytes a proton client sends to attach ``--count`` links of one kind over 4
sessions, built beforehand (so the client's own objects are not counted):

* ``receiver``: the peer receives from a topic filter of its own (``links/<n>``):
  a ``TopicSubscription``, a core session in the trie (the costliest kind);
* ``sender``: the peer sends to a topic (``links/<n>``): a ``TopicPublisher``;
* ``refused``: an attach the broker refuses (a source filter that is not a topic
  filter): proton keeps the link until the peer detaches it.

It prints, per link: the process heap (glibc ``mallinfo2``: proton's C objects,
and Python's allocations above 512 bytes), the bytes ``tracemalloc`` traced
(Python objects: ours, the core's and proton's wrappers), the sites that grew
most, the objects that appeared by type, and for comparison the heap of proton's
engine alone attaching the same links (a bare ``Connection``/``Transport`` pair
answering each attach).  Figures are exact for this process and do not depend on
the machine's load; RSS per link (``abuse.py``'s ``amqp_links_many``) adds the
allocator's overhead.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import tracemalloc
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))   # (PYTHONPATH first: a tree to compare)
sys.path.insert(0, HERE)

from archive_inproc import NullStore  # noqa: E402  (the bench's store that keeps nothing)
from connmem import census  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _heap_reader() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return lambda: 0

    def heap() -> int:
        info = libc.mallinfo2()
        return int(info.uordblks + info.hblkhd)
    return heap


heap = _heap_reader()


def client_stream(count: int, kind: str) -> bytes:
    """What a proton client sends to open, begin 4 sessions and attach ``count``
    links of ``kind`` (all of it, without waiting for answers)."""
    from proton import Connection, Transport

    conn = Connection()
    conn.container = "linkmem"
    transport = Transport()
    transport.bind(conn)
    conn.open()
    sessions = [conn.session() for _ in range(4)]
    for session in sessions:
        session.open()
    for i in range(count):
        session = sessions[i % len(sessions)]
        address = f"links/{i}" if kind != "refused" else f"links/#/{i}"
        link = session.sender(f"l{i}") if kind == "sender" else session.receiver(f"l{i}")
        link.source.address = address
        link.target.address = address
        link.open()
        if kind == "receiver":
            link.flow(10)
    out = bytearray()
    while transport.pending() > 0:
        n = transport.pending()
        out += transport.peek(n)
        transport.pop(n)
    return bytes(out)


def proton_alone(stream: bytes) -> int:
    """Heap bytes a bare proton server engine holds after answering ``stream``."""
    from proton import Collector, Connection, Event, Transport

    gc.collect()
    h0 = heap()
    conn = Connection()
    transport = Transport(Transport.SERVER)
    collector = Collector()
    conn.collect(collector)
    transport.bind(conn)
    transport.max_frame_size = 1 << 20
    data = stream
    while data:
        n = transport.capacity()
        transport.push(data[:n])
        data = data[n:]
        while collector.peek() is not None:
            _answer(conn, collector.peek(), Event)
            collector.pop()
        while transport.pending() > 0:
            transport.pop(transport.pending())
    gc.collect()
    used = heap() - h0
    transport.unbind()
    return used


def _answer(conn: Any, event: Any, kinds: Any) -> None:
    if event.type == kinds.CONNECTION_REMOTE_OPEN:
        conn.open()
    elif event.type == kinds.SESSION_REMOTE_OPEN:
        event.session.open()
    elif event.type == kinds.LINK_REMOTE_OPEN:
        link = event.link
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.open()


def measure(count: int, kind: str, top: int) -> dict[str, Any]:
    from twisted.internet.address import IPv4Address
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport
    from twisted.logger import globalLogBeginner

    from mqttamqp.amqp.listener import AMQPFactory
    from mqttamqp.core.broker import Broker
    from mqttamqp.core.limits import Limits

    # (log events are dropped, not buffered: a buffered event keeps what it names)
    globalLogBeginner.beginLoggingTo([], redirectStandardIO=False)
    stream = client_stream(count, kind)
    head = client_stream(0, kind)             # open and the 4 begins
    alone = proton_alone(stream) - proton_alone(head)
    clock = Clock()
    clock.advance(1_000_000)
    broker = Broker(clock, NullStore(), Limits(sys_interval=0, amqp_max_links=count + 10,
                                            amqp_max_links_total=count + 10)
                    if "amqp_max_links_total" in Limits.__dataclass_fields__
                    else Limits(sys_interval=0, amqp_max_links=count + 10))
    broker.start()
    factory = AMQPFactory(broker, clock)
    conn = factory.buildProtocol(None)
    wire = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
    conn.makeConnection(wire)
    conn.dataReceived(head)
    clock.advance(0)
    wire.clear()
    tracemalloc.start(1)
    gc.collect()
    census0 = census()
    h0 = heap()
    snap0 = tracemalloc.take_snapshot()
    rest = stream[len(head):]
    for i in range(0, len(rest), 1 << 16):
        conn.dataReceived(rest[i:i + (1 << 16)])
        clock.advance(0)
        wire.clear()
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    h1 = heap()
    census1 = census()
    tracemalloc.stop()
    attached = len(conn.links)
    stats = snap1.compare_to(snap0, "lineno")
    traced = sum(s.size_diff for s in stats)
    types = []
    for name, (n, size) in census1.items():
        c, b = census0.get(name, (0, 0))
        if n - c >= count // 2:
            types.append({"type": name, "per_link": round((n - c) / count, 2),
                          "bytes_per_link": round((size - b) / count, 1)})
    types.sort(key=lambda r: -r["bytes_per_link"])
    report = {
        "kind": kind, "count": count, "served": attached,
        "heap_bytes_per_link": round((h1 - h0) / count, 1),
        "traced_python_bytes_per_link": round(traced / count, 1),
        "proton_alone_heap_bytes_per_link": round(alone / count, 1),
        "sites": [{"bytes_per_link": round(s.size_diff / count, 1),
                   "blocks_per_link": round(s.count_diff / count, 2),
                   "where": f"{os.path.relpath(s.traceback[0].filename)}:"
                            f"{s.traceback[0].lineno}"} for s in stats[:top]],
        "objects": types[:top],
    }
    conn.connectionLost(None)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--kind", choices=("receiver", "sender", "refused"), default="receiver")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    report = measure(args.count, args.kind, args.top)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['kind']}: {report['served']}/{report['count']} links served")
    for key in ("heap_bytes_per_link", "traced_python_bytes_per_link",
                "proton_alone_heap_bytes_per_link"):
        print(f"  {key}: {report[key]}")
    print("  sites (bytes/link, blocks/link):")
    for site in report["sites"]:
        print(f"    {site['bytes_per_link']:8.1f} {site['blocks_per_link']:6.2f}  "
              f"{site['where']}")
    print("  objects (per link, shallow bytes/link):")
    for row in report["objects"]:
        print(f"    {row['per_link']:6.2f} {row['bytes_per_link']:8.1f}  {row['type']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
