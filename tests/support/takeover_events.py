"""The archive events of two hand-overs of a client id, recorded by a real ``Broker``
and ``MQTTFactory`` on a clock that moves whenever it is read (as real time does
while code runs): shared by the unit test of their order and the report test that
pairs them into sessions.

``x``: a second connection takes the session over from a connected one (the old
one's DISCONNECT, ``taken_over``, is recorded in the turn that reads the new CONNECT).
``y``: a connection registers under the key of a previous one that is closing but
not yet unregistered (the registry ends the previous holder and starts the newcomer
in one call, at one clock reading; MQTT unregisters at once when it closes, so this
is played on the registry with plain connections).  Each connection then ends
cleanly.
"""

from __future__ import annotations

from typing import Any, Protocol

from fakes import NullStore
from mqtt_memory import ACCEPTED, Client
from twisted.internet.task import Clock

from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.connections import ConnectionInfo
from mqttamqp.core.limits import Limits
from mqttamqp.core.recorder import CAUSE_CLEAN
from mqttamqp.mqtt.packets import Disconnect
from mqttamqp.mqtt.protocol import MQTTFactory
from mqttamqp.security.admission import guards

STEP = 1e-5   # seconds a reading of the clock moves it (10 µs: distinct in the archive)
GAP = 10.0    # seconds between the steps of the story


class TickingClock(Clock):
    """A ``Clock`` whose every reading is ``STEP`` after the previous one."""

    def seconds(self) -> float:
        self.rightNow += STEP
        return self.rightNow


class Recorder(Protocol):
    records_messages: bool

    def message(self, *args: Any, **kwargs: Any) -> None: ...

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: Any) -> None: ...

    def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None: ...

    def stats(self) -> dict[str, int]: ...


class Recorded:
    """A recorder that keeps (timestamp, kind, client id, fields) of each event."""

    records_messages = False

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str | None, dict[str, Any]]] = []

    def message(self, *args: Any, **kwargs: Any) -> None:
        pass

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: Any) -> None:
        self.events.append((timestamp, kind, client_id, fields))

    def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None:
        self.event(timestamp, kind, client_id, **dict(zip(names, values, strict=True)))

    def stats(self) -> dict[str, int]:
        return {}


class Plain:
    """A connection as the registry sees it (``InspectableConnection``)."""

    def __init__(self, client_id: str, port: int) -> None:
        self.client_id, self.port = client_id, port

    def info(self) -> ConnectionInfo:
        return ConnectionInfo("mqtt:" + self.client_id, self.client_id, "mqtt3.1.1",
                              f"127.0.0.1:{self.port}", None, 0.0, 0, True, self.client_id)

    def event_fields(self) -> tuple[str, str, str | None, bool | None, int]:
        return (self.client_id, f"127.0.0.1:{self.port}", None, True, 0)

    def close(self, reason: str) -> None:
        pass


def hand_overs(clock: TickingClock, recorder: Recorder) -> None:
    """Play the two hand-overs (``x``, ``y``) through a broker recording into ``recorder``."""
    limits = Limits(sys_interval=0)
    broker = Broker(clock, NullStore(), limits, guards=guards(clock.seconds, limits),
                    recorder=recorder)
    factory = MQTTFactory(broker, clock)
    a = Client(factory)
    assert a.connect("x") == [ACCEPTED]
    clock.advance(GAP)
    b = Client(factory)
    assert b.connect("x") == [ACCEPTED]
    assert not a.open
    a.lost()
    clock.advance(GAP)
    c, d = Plain("y", 1), Plain("y", 2)
    broker.register_connection("mqtt:y", c, "mqtt3.1.1")
    clock.advance(GAP)
    broker.register_connection("mqtt:y", d, "mqtt3.1.1")   # (c still registered)
    broker.unregister_connection("mqtt:y", c, CAUSE_CLEAN)  # (a no-op: d holds the key)
    clock.advance(GAP)
    b.send(Disconnect())
    b.lost()
    broker.unregister_connection("mqtt:y", d, CAUSE_CLEAN)
