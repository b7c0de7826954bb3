"""``Message``'s copies with other flags: built positionally, they must be what
``dataclasses.replace`` gives, every field kept (a field added to ``Message`` and
forgotten in ``with_flags`` fails here)."""

from __future__ import annotations

import dataclasses

from mqttamqp.core.message import Message, MessageProperties


def _full() -> Message:
    # every field away from its default, so a field dropped by the copy shows
    return Message("a/b", b"body", 2, False, "pub", 12.5, False, b"\x00native", True,
                   MessageProperties(payload_format=1, user_properties=(("k", "v"),)),
                   b"\x01props", 7)


def test_with_flags_is_replace() -> None:
    m = _full()
    # (a new field: set it in ``_full`` and copy it in ``with_flags``)
    assert [f.name for f in dataclasses.fields(Message)] == [
        "topic", "payload", "qos", "retain", "publisher", "timestamp", "dup", "native",
        "amqp_only", "props", "amqp091", "priority"]
    for retain in (False, True):
        for dup in (False, True):
            copy = m.with_flags(retain, dup)
            assert copy == dataclasses.replace(m, retain=retain, dup=dup)
            assert repr(copy) == repr(dataclasses.replace(m, retain=retain, dup=dup))
            assert [getattr(copy, f.name) for f in dataclasses.fields(Message)] == [
                getattr(dataclasses.replace(m, retain=retain, dup=dup), f.name)
                for f in dataclasses.fields(Message)]


def test_with_retain() -> None:
    m = _full()
    assert m.with_retain(False) is m
    kept = m.with_retain(True)
    assert kept.retain and kept == dataclasses.replace(m, retain=True)
    assert kept.with_retain(False) == m
