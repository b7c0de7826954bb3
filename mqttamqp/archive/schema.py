"""What the archive stores: the two Parquet schemas, the event kinds, the causes and
the column names, in one place for the broker (which records), the writer (which
turns records into Arrow batches) and the report job (which reads them).

This module owns names and types only. It must not import Twisted, open files or
know about the broker's objects: callers pass plain values.
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]

from mqttamqp.archive.names import (
    EVENT_FIELD_NAMES,
    EVENTS,
    MESSAGE_FIELDS,
    MESSAGES,
    PROTOCOLS,
)

# The event kinds (the ``kind`` column) and the causes (the ``reason`` column of
# disconnect and will_published) are the broker's own vocabulary: mqttamqp.events.
from mqttamqp.events import (
    AUTH_FAILURE,
    CAUSE_CLEAN,
    CAUSE_CONSOLE,
    CAUSE_KEEPALIVE,
    CAUSE_LOST,
    CAUSE_PROTOCOL_ERROR,
    CAUSE_RESTART,
    CAUSE_SHUTDOWN,
    CAUSE_TAKEN_OVER,
    CONNECT,
    CONSOLE_ACTION,
    DISCONNECT,
    DISCONNECT_CAUSES,
    EVENT_KINDS,
    SESSION_CLEARED,
    SESSION_CREATED,
    SESSION_EXPIRED,
    SESSION_RESUMED,
    SUBSCRIBE,
    UNSUBSCRIBE,
    WILL_CAUSES,
    WILL_PUBLISHED,
)

__all__ = [
    "MESSAGES", "EVENTS", "MESSAGE_SCHEMA", "EVENT_SCHEMA", "EVENT_FIELDS",
    "MESSAGE_COLUMNS", "EVENT_COLUMNS", "PROTOCOLS",
    "CONNECT", "DISCONNECT", "WILL_PUBLISHED", "SESSION_CREATED", "SESSION_RESUMED",
    "SESSION_CLEARED", "SESSION_EXPIRED", "SUBSCRIBE", "UNSUBSCRIBE", "AUTH_FAILURE",
    "CONSOLE_ACTION", "EVENT_KINDS",
    "CAUSE_CLEAN", "CAUSE_LOST", "CAUSE_KEEPALIVE", "CAUSE_PROTOCOL_ERROR",
    "CAUSE_TAKEN_OVER", "CAUSE_CONSOLE", "CAUSE_SHUTDOWN", "CAUSE_RESTART",
    "DISCONNECT_CAUSES", "WILL_CAUSES",
]



_TS = pa.timestamp("us", tz="UTC")  # Spark rejects nanoseconds (PARQUET_TYPE_ILLEGAL)

MESSAGE_SCHEMA = pa.schema([
    pa.field("timestamp", _TS, nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("qos", pa.int8(), nullable=False),
    pa.field("retain", pa.bool_(), nullable=False),
    pa.field("payload_size", pa.int64(), nullable=False),
    pa.field("payload", pa.binary()),           # first --archive-payload-bytes; null if 0
    pa.field("publisher", pa.string()),         # client id (None: console / internal)
    pa.field("user", pa.string()),
    pa.field("protocol", pa.string()),
    pa.field("deliveries", pa.int32(), nullable=False),
    pa.field("dropped", pa.int32(), nullable=False),
])
MESSAGE_COLUMNS = tuple(MESSAGE_SCHEMA.names)
assert len(MESSAGE_COLUMNS) == MESSAGE_FIELDS, "archive: names and schema disagree"

#: The optional columns an event may carry (keyword arguments of ``Archive.event``).
EVENT_FIELDS: dict[str, object] = {
    "protocol": pa.string(),
    "address": pa.string(),        # peer address "host:port"
    "user": pa.string(),           # client's user name, or the admin for console actions
    "reason": pa.string(),         # a cause above, or a short text
    "detail": pa.string(),         # free text (error message, will origin...)
    "clean_session": pa.bool_(),
    "keepalive": pa.int32(),
    "topic": pa.string(),          # will topic, subscription filter
    "qos": pa.int8(),
    "retain": pa.bool_(),
    "queued": pa.int64(),
    "action": pa.string(),         # console action name
    "target": pa.string(),         # console action target
}
# The broker checks names against EVENT_FIELD_NAMES without loading this module.
assert tuple(EVENT_FIELDS) == EVENT_FIELD_NAMES, "archive: names and schema disagree"

EVENT_SCHEMA = pa.schema(
    [pa.field("timestamp", _TS, nullable=False),
     pa.field("kind", pa.string(), nullable=False),
     pa.field("client_id", pa.string())]
    + [pa.field(name, typ) for name, typ in EVENT_FIELDS.items()])
EVENT_COLUMNS = tuple(EVENT_SCHEMA.names)
