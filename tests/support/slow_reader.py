"""A client that stops reading, for the tests of a close while far behind (the
broker's and the gateway's): how many messages overflow the kernel's buffers, a
/metrics value awaited, a socket read until it is closed."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

SIZE = 32_000          # payload bytes of one flood message
WAIT = 20.0            # seconds any one awaited event may take


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as resp:
        text = resp.read().decode()
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    assert m is not None, name
    return float(m.group(1))


def await_metric(port: int, name: str, ok: Callable[[float], bool], what: str) -> float:
    """Ask a process's /metrics (each answer awaited; bounded in time) until
    ``ok(value)``."""
    deadline = time.monotonic() + WAIT
    while True:
        value = metric(port, name)
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"{what}: still {value} after {WAIT:g} s"


def beyond_kernel_buffers() -> int:
    """Messages of SIZE whose bytes exceed what the kernel can hold for an unread
    loopback socket (the sender's largest send buffer, the reader's receive buffer,
    which grows only as it reads)
    plus Twisted's 64 KB: the rest stays in the gateway's transport, paused."""
    wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[1])
    return (wmem + 2 * rmem + (64 << 10)) // SIZE + 20


def read_to_close(sock: socket.socket) -> tuple[int, str | None]:
    """Read ``sock`` until it is closed or WAIT seconds pass without a byte: (bytes
    read, "eof" or "reset" (cut after the gateway's grace), None if still open)."""
    sock.settimeout(WAIT)
    got = 0
    try:
        while True:
            data = sock.recv(1 << 20)
            if not data:
                return got, "eof"
            got += len(data)
    except ConnectionResetError:
        return got, "reset"
    except TimeoutError:
        return got, None
