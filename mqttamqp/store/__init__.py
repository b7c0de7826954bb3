"""Durable storage for mqttamqp: the ZODB implementation of ``StateStore``.

This package owns everything that imports ZODB.  The core talks to it only through
``mqttamqp.core.persistence`` (ops, ``Snapshot``, ``StateStore``); nothing here
holds authoritative broker state or runs ZODB work on the reactor thread after
``load()``.
"""

from mqttamqp.store.zodbstore import (
    FILENAME,
    DamagedStorage,
    StorageFactory,
    StoreClosedError,
    ZODBStore,
)

__all__ = ["FILENAME", "DamagedStorage", "StorageFactory", "StoreClosedError", "ZODBStore"]
