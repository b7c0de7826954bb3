"""A dead-lettered message's death history, carried with the message.

What it owns: the ``deaths`` user property a dead-letter route
(``Acknowledgements._route_dead``: AMQP 0.9.1's x-dead-letter-exchange) writes
on every dead letter, one entry per (queue, reason) as RabbitMQ's x-death keeps
them: how many times, the first and last time (seconds), and the exchange and
routing key the message had when it first died there; the most recent death
first.  An entry's exchange and key are None for a 0.9.1 publisher's message
that had not been dead-lettered before (the adapter reads them from the
message's envelope).  JSON in one user property, so it is stored, restored and
replicated with the message like the other dead-letter properties, for every
protocol (MQTT 5 and AMQP 1.0 consumers see it as a user / application
property); the 0.9.1 adapter builds x-death from it (``amqp091.properties``).
Bounded: at most ``DEATHS_MAX`` entries (the oldest dropped; a message goes
through as many (queue, reason) pairs only in a loop over that many queues).

What it must not do: decide where a dead letter goes, or know any protocol's
header format.
"""

from __future__ import annotations

import json

__all__ = ["DEATHS", "DEATHS_MAX", "Death", "add_death", "read_deaths"]

DEATHS = "deaths"
DEATHS_MAX = 32
# Longer than DEATHS_MAX entries of 255-character names can be: not a history the
# broker wrote (a publisher's own user property of that name), read as none.
DEATHS_MAX_CHARS = 32 * 1024

# (queue, reason, count, first time, last time, exchange or None, key or None)
Death = tuple[str, str, int, int, int, str | None, str | None]


def read_deaths(value: str | None) -> list[Death]:
    """The entries a ``deaths`` property holds, most recent first; [] for none or
    for a value that is not one (a publisher's own user property of that name)."""
    if not value or len(value) > DEATHS_MAX_CHARS:
        return []
    try:
        raw = json.loads(value)
        out: list[Death] = []
        for q, r, n, first, last, ex, key in raw[:DEATHS_MAX]:
            if not (isinstance(q, str) and isinstance(r, str) and type(n) is int
                    and type(first) is int and type(last) is int
                    and (ex is None or isinstance(ex, str))
                    and (key is None or isinstance(key, str))):
                return []
            out.append((q, r, n, first, last, ex, key))
        return out
    except (ValueError, TypeError, RecursionError):   # (a publisher's "[[[[...")
        return []


def add_death(value: str | None, queue: str, reason: str, now: float,
              exchange: str | None, key: str | None) -> str:
    """``value`` (a ``deaths`` property, or None) with one more death in ``queue``
    for ``reason``: that entry's count up by one and its last time now, moved to
    the front; a new entry (with ``exchange`` and ``key``) when it is the first."""
    deaths = read_deaths(value)
    at = int(now)
    for i, (q, r, n, first, _, ex, k) in enumerate(deaths):
        if q == queue and r == reason:
            del deaths[i]
            deaths.insert(0, (q, r, n + 1, first, at, ex, k))
            break
    else:
        deaths.insert(0, (queue, reason, 1, at, at, exchange, key))
        del deaths[DEATHS_MAX:]
    return json.dumps(deaths, separators=(",", ":"))
