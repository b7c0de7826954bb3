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


def free_port() -> int:
    """A loopback port nothing is bound to now, below the ephemeral range if one is
    free there (bounded attempts; else one the kernel picks)."""
    high = _ephemeral_low() - 1
    for _ in range(_ATTEMPTS):
        port = random.randint(max(1024, high - 12000), high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
