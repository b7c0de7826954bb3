"""One recorder for the core made of several: the archive and the webhooks.

The core takes a single ``Recorder`` (``core.recorder``); ``fan_out`` gives it one
that passes every call to each of the given recorders, in order, and merges their
``stats()``.  With one recorder it returns that recorder itself, so a broker with
only the archive pays nothing for this module.

What it must not do: add work per message beyond the calls themselves.
"""

from __future__ import annotations

from typing import Any

from mqttamqp.core.recorder import NoRecorder, Recorder

__all__ = ["FanOutRecorder", "fan_out"]


class FanOutRecorder:
    def __init__(self, first: Recorder, second: Recorder) -> None:
        self.first = first
        self.second = second

    @property
    def records_messages(self) -> bool:
        return self.first.records_messages or self.second.records_messages

    def message(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                publisher: str | None, user: str | None, protocol: str | None,
                deliveries: int, dropped: int) -> None:
        self.first.message(timestamp, topic, qos, retain, payload, publisher, user,
                           protocol, deliveries, dropped)
        self.second.message(timestamp, topic, qos, retain, payload, publisher, user,
                            protocol, deliveries, dropped)

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        self.first.event(timestamp, kind, client_id, **fields)
        self.second.event(timestamp, kind, client_id, **fields)

    def stats(self) -> dict[str, int]:
        merged = dict(self.first.stats())
        merged.update(self.second.stats())
        return merged


def fan_out(*recorders: Any) -> Recorder:
    """A recorder passing each call to every one of ``recorders`` (None skipped)."""
    present: list[Recorder] = [r for r in recorders if r is not None]
    if not present:
        return NoRecorder()
    combined = present[0]
    for recorder in present[1:]:
        combined = FanOutRecorder(combined, recorder)
    return combined
