"""The message and event archive: Parquet segments written by a process of their own,
Hive-partitioned by UTC date and hour, read by ``mqttamqp.pipeline``.

This package owns the archive's files and schemas. It must not import the core,
the protocols or the store; the broker service creates an ``Archive`` and calls
``message``/``event`` from the reactor thread.
"""

from typing import Any

from mqttamqp.archive.archive import DEFAULT_BUFFER_LIMIT, DEFAULT_EXCLUDE, Archive
from mqttamqp.archive.topics import TopicSelector, filter_matches

# The schema's names (``schema.__all__``) are loaded on first use: they import
# pyarrow, which only the writer process and the report job need, not the broker.
_SCHEMA_NAMES = frozenset((
    "MESSAGES", "EVENTS", "MESSAGE_SCHEMA", "EVENT_SCHEMA", "EVENT_FIELDS",
    "MESSAGE_COLUMNS", "EVENT_COLUMNS", "PROTOCOLS",
    "CONNECT", "DISCONNECT", "WILL_PUBLISHED", "SESSION_CREATED", "SESSION_RESUMED",
    "SESSION_CLEARED", "SESSION_EXPIRED", "SUBSCRIBE", "UNSUBSCRIBE", "AUTH_FAILURE",
    "CONSOLE_ACTION", "EVENT_KINDS",
    "CAUSE_CLEAN", "CAUSE_LOST", "CAUSE_KEEPALIVE", "CAUSE_PROTOCOL_ERROR",
    "CAUSE_TAKEN_OVER", "CAUSE_CONSOLE", "CAUSE_SHUTDOWN", "CAUSE_RESTART",
    "DISCONNECT_CAUSES", "WILL_CAUSES"))

__all__ = ["Archive", "DEFAULT_BUFFER_LIMIT", "DEFAULT_EXCLUDE", "TopicSelector",
           "filter_matches", *sorted(_SCHEMA_NAMES)]


def __getattr__(name: str) -> Any:
    if name in _SCHEMA_NAMES:
        from mqttamqp.archive import schema
        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
