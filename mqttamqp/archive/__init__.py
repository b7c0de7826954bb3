"""The message and event archive: Parquet segments written by a process of their own,
Hive-partitioned by UTC date and hour, read by ``mqttamqp.pipeline``.

This package owns the archive's files and schemas. It must not import the core,
the protocols or the store; the broker service creates an ``Archive`` and calls
``message``/``event`` from the reactor thread.
"""

from mqttamqp.archive.archive import DEFAULT_BUFFER_LIMIT, DEFAULT_EXCLUDE, Archive
from mqttamqp.archive.schema import *  # noqa: F403 - the names are the contract
from mqttamqp.archive.schema import __all__ as _schema_all
from mqttamqp.archive.topics import TopicSelector, filter_matches

__all__ = ["Archive", "DEFAULT_BUFFER_LIMIT", "DEFAULT_EXCLUDE", "TopicSelector",
           "filter_matches", *_schema_all]
