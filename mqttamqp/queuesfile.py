"""``--queues FILE``: retention and priority levels per queue name pattern, as TOML.

::

    [[queue]]
    pattern = "orders*"        # fnmatch on the queue name (dead-letter queues match
                               # by their origin's name, or by "$dlq/...")
    max-age = "3d"             # or seconds; "0" / 0 = no bound
    max-bytes = 104857600
    max-messages = 100000
    max-priority = 9           # priority levels 0..9 (1-255; 0 or left out: none,
                               # first in first out)

The first table whose pattern matches wins; a queue no table matches has the
``--queue-max-*`` defaults.  A key left out of a table takes that default too.
"""

from __future__ import annotations

import tomllib
from typing import Any

from mqttamqp.reportjob import parse_duration

__all__ = ["QueueRule", "load_queue_rules", "seconds"]

# (pattern, max age seconds, max bytes, max messages, max priority); None: the default
QueueRule = tuple[str, float | None, int | None, int | None, int | None]

_KEYS = {"pattern", "max-age", "max-bytes", "max-messages", "max-priority"}
_MAX_PRIORITY = 255     # (as RabbitMQ's x-max-priority: core.queues.priority)


def seconds(value: Any, what: str) -> float:
    """A duration: a number of seconds, or ``30m``/``1h``/``7d`` (0: no bound)."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{what} must not be negative")
        return float(value)
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        try:
            return parse_duration(text)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
    if number < 0:
        raise ValueError(f"{what} must not be negative")
    return number


def _count(table: dict[str, Any], key: str, where: str) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {key} must be a whole number >= 0, got {value!r}")
    return value


def load_queue_rules(path: str) -> tuple[QueueRule, ...]:
    """Read ``path``; ``ValueError`` says what is wrong and where."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path} is not valid TOML: {e}") from None
    unknown = set(data) - {"queue"}
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (only "
                         "[[queue]] tables)")
    rules: list[QueueRule] = []
    for index, table in enumerate(data.get("queue", []), 1):
        where = f"{path}, [[queue]] #{index}"
        if not isinstance(table, dict):
            raise ValueError(f"{where}: not a table")
        extra = set(table) - _KEYS
        if extra:
            raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(extra))} "
                             f"(known: {', '.join(sorted(_KEYS))})")
        pattern = table.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{where}: pattern (a queue name or fnmatch pattern) is "
                             "required")
        age = table.get("max-age")
        top = _count(table, "max-priority", where)
        if top is not None and top > _MAX_PRIORITY:
            raise ValueError(f"{where}: max-priority must be 0 to {_MAX_PRIORITY}, got {top}")
        rules.append((pattern, None if age is None else seconds(age, f"{where}: max-age"),
                      _count(table, "max-bytes", where), _count(table, "max-messages", where),
                      top or None))
    return tuple(rules)
