"""``net.fdtable``: the descriptor table grown once, in a fresh process each (the test
process's own table has grown already), read back from ``/proc/self/status``."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from typing import Any

import pytest

_HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FDSize is Linux's /proc"),
    pytest.mark.skipif(_HARD != resource.RLIM_INFINITY and _HARD < 5000,
                       reason="the tests set soft limits up to 5,000"),
]

_PRELUDE = """
import json, os, resource
from mqttamqp.net.fdtable import HEADROOM, grow_descriptor_table

def fdsize():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("FDSize:"))

def soft_limit(n):
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

def open_fds():
    return sorted(int(n) for n in os.listdir("/proc/self/fd"))
"""


def _run(body: str) -> dict[str, Any]:
    code = _PRELUDE + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_table_holds_the_connections_and_headroom_and_nothing_stays_open() -> None:
    r = _run("""
        soft_limit(5000)
        before, fds = fdsize(), open_fds()
        wanted = grow_descriptor_table(3000)
        print(json.dumps({"before": before, "after": fdsize(), "wanted": wanted,
                          "headroom": HEADROOM, "same_fds": open_fds() == fds}))
    """)
    assert r["wanted"] == 3000 + r["headroom"]
    assert r["before"] < 3000 <= r["wanted"] <= r["after"]
    assert r["same_fds"] is True


def test_the_soft_limit_caps_the_table() -> None:
    r = _run("""
        soft_limit(700)
        wanted = grow_descriptor_table(10_000)
        print(json.dumps({"wanted": wanted, "after": fdsize()}))
    """)
    assert r["wanted"] == 700
    assert 700 <= r["after"] < 2048


def test_a_limit_within_the_initial_table_does_nothing() -> None:
    r = _run("""
        soft_limit(64)
        print(json.dumps({"wanted": grow_descriptor_table(10_000)}))
    """)
    assert r == {"wanted": 0}


def test_no_room_at_the_top_does_nothing_and_leaves_nothing_open() -> None:
    """The limit's last descriptor taken: ``F_DUPFD`` finds no number at or above
    it (EMFILE); it answers 0, and the descriptor it opened for the call is closed."""
    r = _run("""
        soft_limit(2000)
        os.dup2(os.pipe()[0], 1999)
        fds = open_fds()
        print(json.dumps({"wanted": grow_descriptor_table(5000), "same_fds": open_fds() == fds}))
    """)
    assert r == {"wanted": 0, "same_fds": True}


def test_a_descriptor_open_at_the_top_is_left_alone() -> None:
    """The descriptor opened to grow the table is the lowest free number at or above
    the top: one already open there stays what it was.  (Opening it there grew the
    table already: this is about the descriptor, not the table.)"""
    r = _run("""
        soft_limit(5000)
        read_end, write_end = os.pipe()
        top = 1000 + HEADROOM - 1
        os.dup2(write_end, top)
        wanted = grow_descriptor_table(1000)
        os.write(top, b"x")
        print(json.dumps({"wanted": wanted, "headroom": HEADROOM,
                          "read": os.read(read_end, 1).decode(),
                          "top_open": top in open_fds(), "above": top + 1 in open_fds()}))
    """)
    assert r == {"wanted": 1000 + r["headroom"], "headroom": r["headroom"], "read": "x",
                 "top_open": True, "above": False}
