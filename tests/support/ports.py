"""Loopback ports for tests that must know a port before a process listens on it, or
listen on the same one again after a restart.

``free_port`` picks it below the kernel's ephemeral range, so that no outgoing
connection (a client's reconnect attempts, another test's clients) is given it while
nothing listens there: a port the kernel handed out (bind to port 0) is one of the
ephemeral ones, and a broker restarted on it met "Address already in use"."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]

_ATTEMPTS = 200


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports this process has handed out: two calls in a row never give the same one.
_given: set[int] = set()


def free_port() -> int:
    """A loopback port nothing is bound to now, below the ephemeral range if there
    is room below it (bounded attempts; else one the kernel picks)."""
    high = _ephemeral_low() - 1
    low = max(1024, high - 12000)
    for _ in range(_ATTEMPTS if high - low >= 1000 else 0):
        port = random.randint(low, high)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
