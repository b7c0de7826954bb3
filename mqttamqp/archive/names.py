"""The archive's names that the broker's process needs: datasets, protocols and the
optional event columns, without their Arrow types.

``schema`` pairs each name with its type and imports pyarrow; the broker's process
checks ``Archive.event`` calls against these names and never loads Arrow (only the
writer process does). This module must not import pyarrow, Twisted or the broker.
"""

from __future__ import annotations

__all__ = ["MESSAGES", "EVENTS", "PROTOCOLS", "EVENT_FIELD_NAMES", "MESSAGE_FIELDS",
           "MESSAGE_VALUES", "SIZE_VALUE"]

#: The two datasets, each a directory under the archive directory.
MESSAGES = "messages"
EVENTS = "events"

#: Values of the messages' ``protocol`` column (and the events' one).
PROTOCOLS = ("mqtt3.1", "mqtt3.1.1", "mqtt5", "amqp", "amqp0-9-1")

#: The optional columns an event may carry (keyword arguments of ``Archive.event``),
#: in the order of ``schema.EVENT_FIELDS``.
EVENT_FIELD_NAMES = ("protocol", "address", "user", "reason", "detail", "clean_session",
                     "keepalive", "topic", "qos", "retain", "queued", "action", "target")

#: Columns per message record (``Archive.message``: the columns of ``MESSAGE_SCHEMA``
#: in order, with ``payload_size`` computed).
MESSAGE_FIELDS = 11
#: Values per message in the flat lists that carry them to the writer: every column
#: but ``payload``, whose (capped) bytes travel joined in one buffer per list.
MESSAGE_VALUES = MESSAGE_FIELDS - 1
#: Where ``payload_size`` is among a message's values (the writer cuts the buffer
#: of payloads at ``min(payload_size, payload_bytes)``).
SIZE_VALUE = 4
