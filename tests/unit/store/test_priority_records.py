"""Priorities in stored message records (issue 30 review): records stored before the
twelfth field take the priority from the AMQP 1.0 native header or the 0.9.1 basic
properties; a session's queued record never carries one; an AMQP 1.0 header
priority of 4 (the default) is no priority at all."""

from __future__ import annotations

from typing import Any

from pamqp import commands
from proton import Message as ProtonMessage

from mqttamqp.amqp.codec.native import native_flag
from mqttamqp.amqp.codec.publish import decode_publish
from mqttamqp.amqp091.properties import envelope
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import StoredQueued
from mqttamqp.store.models import (
    message_to_record,
    queued_to_record,
    record_to_message,
    record_to_queued,
)


def _091(priority: int | None, **props: Any) -> bytes:
    raw = commands.Basic.Properties(priority=priority, **props).marshal()
    return envelope("amq.direct", "jobs", raw)


def _old(message: Message) -> tuple[object, ...]:
    """``message``'s record as stored before the twelfth field (priority) existed."""
    record = message_to_record(message)
    return record[:11] if len(record) == 12 else record


def test_an_old_091_record_takes_its_priority_from_the_basic_properties() -> None:
    """An 11-field record of a 0.9.1 message: its priority is read from the property
    section, behind a content type, encoding, headers and delivery mode; none when
    the publisher set none."""
    for props in ({}, {"content_type": "a/b", "content_encoding": "gzip",
                       "headers": {"k": "v", "n": 1}, "delivery_mode": 2}):
        sent = Message("", b"x", 1, amqp091=_091(7, **props), priority=7)
        old = _old(sent)
        assert len(old) == 11
        assert record_to_message(old).priority == 7
    plain = Message("", b"x", 1, amqp091=_091(None, content_type="a/b"))
    assert record_to_message(_old(plain)).priority is None


def test_an_old_amqp_record_takes_its_priority_from_the_native_header() -> None:
    """9- and 10-field records of AMQP 1.0 messages: the native form's first bytes
    say the priority (flag 2 or 3); flag 0 or 1 says none."""
    for durable in (False, True):
        native = native_flag(durable, 9) + b"\x00\x53\x75\xa0\x01x"
        record = message_to_record(Message("t", b"x", 1, native=native, priority=9))
        old = record[:9]
        assert record_to_message(old).priority == 9
    none = message_to_record(Message("t", b"x", 1, native=native_flag(True, None) + b"z"))
    assert len(none) == 9 and record_to_message(none).priority is None


def test_an_unreadable_old_record_still_loads_without_a_priority() -> None:
    """A property section cut short reads as no priority, not an error."""
    broken = envelope("", "q", b"\x08\x00")     # (priority flag, no value)
    message = record_to_message(("t", b"x", 1, False, "p", 1.0, False, None, False, None,
                                 broken))
    assert message.priority is None


def test_a_sessions_queued_record_keeps_no_priority() -> None:
    """Queued for an MQTT session (``native`` False), a message with a priority is
    stored as 7 fields: persistent MQTT sessions pay nothing for priorities."""
    queued = StoredQueued(Message("t", b"x", 1, priority=8), 1, "queued", None, ())
    record = queued_to_record(queued)
    assert len(record[0]) == 7
    assert record_to_queued(record).message.priority is None
    queue_record = message_to_record(Message("t", b"x", 1, priority=8))
    assert len(queue_record) == 12 and record_to_message(queue_record).priority == 8


def test_an_amqp_header_priority_of_4_is_no_priority() -> None:
    """The header's default priority (4) decodes as none, as the native form keeps
    it: a durable queue's record of such a message stays without a twelfth field."""
    for priority, expected in ((4, None), (5, 5), (0, 0)):
        # (a header with priority written out: proton leaves the default 4 out)
        header = b"\x00\x53\x70\xc0\x04\x02\x40\x50" + bytes((priority,))
        data = header + b"\x00\x53\x75\xa0\x01x"
        assert decode_publish(data, False).priority == expected
        sent = bytes(ProtonMessage(body="x", priority=priority, address="t").encode())
        assert decode_publish(sent, False).priority == expected


def test_a_priority_groups_level_watermarks_are_stored_and_only_grow(tmp_path: Any) -> None:
    """A group record keeps its levels' watermarks (a tenth field, only when it has
    some: other groups' records stay 9 fields); an older snapshot committed after a
    newer one lowers none of them."""
    from store_reactor import FakeReactor, commit

    from mqttamqp.core.persistence import PutQueue, PutQueueGroup, QueueGroupRecord
    from mqttamqp.store import ZODBStore
    from mqttamqp.store.models import group_to_record, record_to_group

    plain = QueueGroupRecord("g", "#", "classic", 0, 64)
    assert len(group_to_record(plain)) == 9 and record_to_group(group_to_record(plain)) == plain
    newer = QueueGroupRecord("g", "#", "classic", 0, 8192, levels=((1, 4096), (9, 8192)))
    older = QueueGroupRecord("g", "#", "classic", 0, 4096, levels=((1, 2048), (5, 100)))
    reactor = FakeReactor()
    store = ZODBStore(str(tmp_path / "data"), reactor)  # type: ignore[arg-type]
    commit(reactor, store, [PutQueue("jobs", (None, None, None, 9)),
                            PutQueueGroup("jobs", "g", newer)])
    commit(reactor, store, [PutQueueGroup("jobs", "g", older)])
    store.close()
    again = ZODBStore(str(tmp_path / "data"), FakeReactor())  # type: ignore[arg-type]
    try:
        group = again.load().queues[0].groups["g"]
    finally:
        again.close()
    assert group.watermark == 8192
    assert group.levels == ((1, 4096), (5, 100), (9, 8192))
