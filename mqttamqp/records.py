"""``@record`` and ``@final_record``: immutable value classes that are cheap to create.

The per-message objects (packets, routed messages, storage operations) are values:
nothing may change them once built.  ``@dataclass(frozen=True)`` enforces that at
run time by routing every field of ``__init__`` through ``object.__setattr__``,
which makes creating one about four times slower (1.1 µs against 0.25 µs for seven
fields), several times per message.  ``@record`` declares the class frozen to the
type checker (PEP 681 ``frozen_default``: ``mypy --strict``, which CI runs, rejects
any assignment to a field) and builds a plain slotted dataclass at run time, with
equality and a hash over its fields like a frozen one.

mypyc does not know ``@record``: in a compiled module its classes stay interpreted
(created by the dataclass's generated ``__init__``, each field read by name).  The
records on every message's path are ``@final_record`` instead: each field is declared
``Final`` with no value in the body and set by the class's own ``__init__`` (PEP 591:
mypy rejects an assignment to it anywhere else, so they are as read-only to mypy as
``@record``'s), and to mypy and mypyc the decorator is ``dataclasses.dataclass``, which
mypyc compiles as a native class (C fields, a compiled ``__init__``).  At run time it
is a dataclass with ``unsafe_hash`` like ``@record``'s (equality, hash, ``repr``,
``dataclasses.replace``), slotted in the pure build (a native class has no instance
dict anyway).  Defaults are the ``__init__``'s.  A field that equality (and the hash)
leave out is named in a ``ClassVar`` tuple ``_uncompared``, one that ``repr`` leaves
out in ``_unshown`` (``field(compare=False)`` would give the field a value in the
body, which ``Final`` forbids).  A native class is not picklable (its ``__new__``
calls ``__init__``): records are never pickled (the store keeps plain values:
``store.models``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, dataclass_transform

__all__ = ["final_record", "record"]

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[T]) -> type[T]:
    return dataclass(slots=True, unsafe_hash=True)(cls)


if TYPE_CHECKING:
    from dataclasses import dataclass as final_record
else:
    def final_record(cls: type[Any]) -> type[Any]:
        uncompared = cls.__dict__.get("_uncompared", ())
        unshown = cls.__dict__.get("_unshown", ())
        if uncompared or unshown:
            # mypyc gives the dataclass the annotations as types, ClassVar lost.
            annotations = inspect.get_annotations(cls)
            annotations.pop("_uncompared", None)
            annotations.pop("_unshown", None)
            cls.__annotations__ = annotations
            for name in {*uncompared, *unshown}:
                setattr(cls, name, field(compare=name not in uncompared,
                                         repr=name not in unshown))
        # A native class (mypyc) is changed in place: mypyc ignores what is returned.
        return dataclass(slots=not hasattr(cls, "__mypyc_attrs__"), unsafe_hash=True)(cls)
