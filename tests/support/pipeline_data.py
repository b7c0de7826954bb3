"""A known archive for the report tests, written by the real ``Archive`` writer.

Three parts, so that full and ``--incremental`` runs can be mixed over growing
input (``write_archive`` adds new files to a directory each time it is called).
The exact numbers the tests assert follow from the comments below.
"""

from __future__ import annotations

import calendar
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock

from mqttamqp.archive import (
    AUTH_FAILURE,
    CAUSE_CLEAN,
    CAUSE_KEEPALIVE,
    CAUSE_LOST,
    CONNECT,
    DISCONNECT,
    SUBSCRIBE,
    WILL_PUBLISHED,
    Archive,
)

T0 = calendar.timegm((2026, 11, 24, 7, 58, 0))  # 07:58:00 UTC
FIXED_NOW = T0 + 7200  # "now" for generated_at

def publish(a: Archive, ts: float, topic: str, publisher: str | None, qos: int = 0,
            size: int = 10, retain: bool = False, user: str | None = None) -> None:
    a.message(ts, topic, qos, retain, b"p" * size, publisher, user, "mqtt3.1.1", 1, 0)


def write_part_one(a: Archive) -> None:
    """07:58-08:01: three topics, three publishers, sessions, a will, auth failures."""
    for i in range(6):                                     # 07:58 and 07:59
        publish(a, T0 + i * 20, "plant/1/temp", "dev1", qos=0, size=5)
    for i in range(4):                                     # 07:58
        publish(a, T0 + 1 + i, "plant/1/temp", "dev2", qos=1, size=7, user="u2")
    for i in range(3):                                     # 08:00
        publish(a, T0 + 120 + i, "plant/2/hum", "dev2", qos=2, size=100, user="u2",
                retain=(i == 0))
    publish(a, T0 + 125, "office/door", None, qos=1, size=1, retain=True)
    a.event(T0, CONNECT, "dev1", protocol="mqtt3.1.1", address="127.0.0.1:40001")
    a.event(T0 + 0.5, SUBSCRIBE, "dev1", topic="plant/#", qos=1)
    a.event(T0 + 1, CONNECT, "dev2", protocol="mqtt3.1.1", address="127.0.0.1:40002",
            user="u2")
    a.event(T0 + 100, DISCONNECT, "dev1", reason=CAUSE_CLEAN)
    a.event(T0 + 130, DISCONNECT, "dev2", reason=CAUSE_LOST)
    a.event(T0 + 130, WILL_PUBLISHED, "dev2", topic="plant/2/status", qos=1,
            reason=CAUSE_LOST)
    a.event(T0 + 140, AUTH_FAILURE, None, address="10.0.0.5:1234", user="bob",
            reason="bad password")
    a.event(T0 + 141, AUTH_FAILURE, None, address="10.0.0.5:1235", user="bob")
    a.event(T0 + 142, AUTH_FAILURE, None, address="[::1]:999", user=None)


def write_part_two(a: Archive) -> None:
    """08:30-08:40: a flapping client (12 connects in the hour) and more traffic."""
    base = T0 + 32 * 60
    for i in range(12):
        a.event(base + i * 30, CONNECT, "flappy", protocol="mqtt3.1", address="10.0.0.9:1")
        a.event(base + i * 30 + 10, DISCONNECT, "flappy", reason=CAUSE_KEEPALIVE)
        publish(a, base + i * 30 + 5, "plant/1/temp", "flappy", qos=1, size=3)
    a.event(base + 400, CONNECT, "dev1", protocol="mqtt3.1.1", address="127.0.0.1:40003")
    publish(a, base + 401, "office/light", "dev1", qos=0, size=2)


def write_part_three(a: Archive) -> None:
    """09:10-09:12: dev1's session from part two ends (a will fires), a new client
    on a new topic, one more authentication failure."""
    base = T0 + 72 * 60
    a.event(base, DISCONNECT, "dev1", reason=CAUSE_LOST)
    a.event(base, WILL_PUBLISHED, "dev1", topic="plant/1/status", qos=0, reason=CAUSE_LOST)
    a.event(base + 5, CONNECT, "dev3", protocol="mqtt5", address="127.0.0.1:40010",
            user="u3")
    for i in range(5):
        publish(a, base + 10 + i, "plant/3/flow", "dev3", qos=1, size=4, user="u3")
    publish(a, base + 20, "plant/1/temp", "dev3", qos=2, size=6, user="u3")
    a.event(base + 120, AUTH_FAILURE, None, address="10.0.0.5:1300", user="bob")


def write_archive(directory: Path, *parts: Any) -> None:
    clock = Clock()
    clock.advance(T0)
    a = Archive(str(directory), clock, row_group_rows=16)
    a.start()
    for part in parts:
        part(a)
    a.close()
    assert a.stats()["dropped"] == 0 and a.stats()["errors"] == 0
