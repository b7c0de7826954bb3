"""``net.sending.send`` (``net.tcp.send`` before session 23) N times: 20 bytes to a
Twisted ``Server`` transport over a socket pair, the peer drained every 500 sends.

Instructions a send: run it under callgrind at two sizes from a tree (a compiled copy:
``bench/mypyc_build.py``) and take the slope, e.g.

    cd TREE && PYTHONPATH=. PYTHONHASHSEED=0 valgrind --tool=callgrind \
        --callgrind-out-file=OUT python -P bench/send_micro.py 20000   (then 60000)

It stops with "buffered" if a send did not go to the socket at once."""

from __future__ import annotations

import socket
import sys

from twisted.internet.protocol import Protocol
from twisted.internet.tcp import Server

import mqttamqp.net.tcp  # noqa: F401  (its transport classes in the tuples)

try:
    from mqttamqp.net.sending import send
except ImportError:   # (a tree before session 23)
    from mqttamqp.net.tcp import send


class _Reactor:
    """What a ``tcp.Server`` calls on its reactor; a write it buffers ends the run."""

    def addReader(self, reader: object) -> None:
        pass

    def removeReader(self, reader: object) -> None:
        pass

    def addWriter(self, writer: object) -> None:
        raise SystemExit("buffered: a send did not go to the socket at once")

    def removeWriter(self, writer: object) -> None:
        pass


def main() -> None:
    count = int(sys.argv[1])
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    transport = Server(ours, Protocol(), ("127.0.0.1", 1), None, 0, _Reactor())
    data = b"x" * 20
    print(send.__module__, type(send).__name__)
    for _ in range(count // 500):
        for _ in range(500):
            send(transport, data)
        try:
            while theirs.recv(1 << 16):
                pass
        except BlockingIOError:
            pass


if __name__ == "__main__":
    main()
