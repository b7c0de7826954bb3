"""No subclass makes a property of a compiled base class's attribute (but the one
below, kept by hand): compiled code reads and writes such an attribute in its slot
and never calls the property, so the two builds would disagree (session 24's review:
a durable queue's AMQP link sent past its credit in the compiled build only)."""
from __future__ import annotations

import importlib
import inspect
import os
import re
from typing import Any

import pytest
from compiled import COMPILED

import mqttamqp

# The subclass's property and what keeps it right in both builds.
KEPT = {
    # ``_SessionLink`` writes ``congested`` (socket full or closed) in ``__init__``,
    # ``on_blocked`` and ``end``; the subclass overrides those three to keep
    # ``_blocked``, and the core reads ``congested`` by name, never natively.
    ("mqttamqp.amqp.queuelinks", "QueueSubscription", "congested"),
}


def _compiled_modules() -> list[str]:
    setup = os.path.join(os.path.dirname(os.path.dirname(mqttamqp.__file__)), "setup.py")
    with open(setup, encoding="utf-8") as f:
        listed = re.search(r'COMPILED = """(.*?)"""', f.read(), re.S)
    assert listed is not None
    return ["mqttamqp." + name[:-3].replace("/", ".") for name in listed.group(1).split()]


def _attributes(cls: type) -> set[str]:
    # (slots and a native class's attributes are descriptors in its ``__dict__``)
    names = {name for name, value in vars(cls).items() if not name.startswith("__")
             and (inspect.ismemberdescriptor(value) or inspect.isgetsetdescriptor(value))}
    for name, hint in inspect.get_annotations(cls).items():
        if "ClassVar" not in str(hint) and name not in cls.__dict__:
            names.add(name)
    return names


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found.add(sub)
        found |= _subclasses(sub)
    return found


@pytest.mark.skipif(COMPILED, reason="a rule on the source: compiled, a property and an "
                    "attribute are both getset descriptors")
def test_no_property_overrides_a_compiled_base_attribute() -> None:
    bases: list[tuple[str, type]] = []
    for name in _compiled_modules():
        module = importlib.import_module(name)
        bases += [(name, c) for c in vars(module).values()
                  if isinstance(c, type) and c.__module__ == name]
    # (the modules that subclass them: importing the service imports them all)
    importlib.import_module("mqttamqp.service")
    found: set[tuple[str, str, str]] = set()
    for _, base in bases:
        attributes = _attributes(base)
        for sub in _subclasses(base):
            for attr in attributes:
                own: Any = sub.__dict__.get(attr)
                if isinstance(own, property):
                    found.add((sub.__module__, sub.__qualname__, attr))
    assert found <= KEPT, sorted(found - KEPT)
    assert KEPT <= found, "a KEPT entry no longer exists: remove it"
