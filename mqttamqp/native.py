"""mypyc's class marks, for a build that compiles the hot modules to C (issue 31's
mypyc spike, bench/README.md "mypyc on the hot path").

mypyc (``python -m mypyc``) makes a compiled module's classes native (C) classes:
single inheritance (and traits) only, no builtin base but a few (``object``,
``Exception``, ``ValueError``, ``dict`` ...), no interpreted subclass, no attribute
set on an instance or a class at run time.  ``@mypyc_attr(native_class=False)`` keeps
a class an ordinary Python class whose methods are still compiled (the
``RuntimeError`` and builtin-collection subclasses); ``allow_interpreted_subclasses=True`` lets
uncompiled code (the tests, ``mqtt.debuglog``) subclass it; ``@trait`` marks a mixin
of a native class (``sessions.extras.SessionExtras``).  mypyc knows them by their
names in ``mypy_extensions``; in pure Python (no mypyc build, ``mypy_extensions``
perhaps not installed) they do nothing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from typing import TYPE_CHECKING

__all__ = ["NO_SLOTS", "build", "mypyc_attr", "trait"]

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr, trait
else:
    try:
        from mypy_extensions import mypyc_attr, trait
    except ImportError:  # pragma: no cover - the pure-Python install

        def mypyc_attr(*attrs, **kwattrs):
            return lambda cls: cls

        def trait(cls):
            return cls


# ``__slots__ = NO_SLOTS`` in a part of ``mqtt.protocol.MQTTProtocol``: no slots, as
# ``()``, but a name mypy does not read (it would see no slot for what the connection
# has), where ``if not TYPE_CHECKING: __slots__ = ()`` was: mypyc compiles no ``if``
# in a class body.
NO_SLOTS: tuple[str, ...] = ()


def build() -> str:
    """Which build this install runs: ``"compiled"`` when its hot modules are the C
    extensions mypyc built (setup.py's ``MQTTAMQP_COMPILE``; a ``.so`` beside each
    ``.py`` wins the import), else ``"pure Python"``.  The start-up log line names it.
    (``core.commits`` is one of them, and below this module's users in the layers.)"""
    spec = importlib.util.find_spec("mqttamqp.core.commits")
    loader = None if spec is None else spec.loader
    extension = isinstance(loader, importlib.machinery.ExtensionFileLoader)
    return "compiled" if extension else "pure Python"
