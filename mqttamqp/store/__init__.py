"""Durable storage for mqttamqp: the ZODB implementation of ``StateStore``.

This package owns everything that imports ZODB.  The core talks to it only through
``mqttamqp.core.persistence`` (ops, ``Snapshot``, ``StateStore``); nothing here
holds authoritative broker state or runs ZODB work on the reactor thread after
``load()``.
"""

from mqttamqp.store.engines import (
    DamagedStorage,
    Engine,
    EngineError,
    ServingLockError,
    StorageUnavailable,
    serving_lock,
)
from mqttamqp.store.engines import resolve as resolve_engine
from mqttamqp.store.zodbstore import (
    FILENAME,
    StorageFactory,
    StoreClosedError,
    ZODBStore,
)

__all__ = ["FILENAME", "DamagedStorage", "Engine", "EngineError", "ServingLockError",
           "StorageFactory", "StorageUnavailable", "StoreClosedError", "ZODBStore",
           "resolve_engine", "serving_lock"]
