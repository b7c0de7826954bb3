"""The archive's session, CONNECT and DISCONNECT events of a client id handed from one MQTT
connection to the next come in time order: the previous connection's end is never
later than its successor's start (the report pairs them by time:
``pipeline/report.py``; the same story through the report:
``tests/integration/pipeline/test_report_hand_overs.py``)."""

from __future__ import annotations

from fakes import NullStore
from mqtt_memory import ACCEPTED, Client
from takeover_events import GAP, Recorded, TickingClock, hand_overs

from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.mqtt.packets import Disconnect
from mqttamqp.mqtt.protocol import MQTTFactory
from mqttamqp.security.admission import guards

T0 = 1000.0


def connection_events(client_id: str) -> list[tuple[float, str, str | None]]:
    """``all_events``' CONNECT and DISCONNECT events."""
    return [e for e in all_events(client_id) if e[1] in ("connect", "disconnect")]


def test_a_takeover_connect_is_recorded_after_the_disconnect_it_caused() -> None:
    """A takeover: the newcomer's CONNECT time is later than the old connection's
    DISCONNECT (taken over), which the same read recorded first."""
    events = connection_events("x")
    assert [(kind, reason) for _, kind, reason in events] == [
        ("connect", None), ("disconnect", "taken_over"), ("connect", None),
        ("disconnect", "clean")]
    times = [ts for ts, _, _ in events]
    assert times[1] > T0 + GAP          # (in the turn of the second CONNECT)
    assert times[1] < times[2], events  # taken over, then connected
    assert times == sorted(times)


def test_a_newcomer_on_a_closing_holders_key_ends_it_first() -> None:
    """A newcomer registered while the previous holder of its key still closes: the
    previous one's DISCONNECT is recorded first, at no later time than the CONNECT."""
    events = connection_events("y")
    assert [(kind, reason) for _, kind, reason in events] == [
        ("connect", None), ("disconnect", "clean"), ("connect", None),
        ("disconnect", "clean")]
    times = [ts for ts, _, _ in events]
    assert times == sorted(times)


def all_events(client_id: str) -> list[tuple[float, str, str | None]]:
    """The archive events of ``client_id`` in ``hand_overs``' run on a ticking
    clock: (time, kind, reason)."""
    clock = TickingClock()
    clock.advance(T0)
    recorded = Recorded()
    hand_overs(clock, recorded)
    return [(ts, kind, f.get("reason")) for ts, kind, cid, f in recorded.events
            if cid == client_id]


def test_a_takeovers_new_session_is_recorded_after_the_disconnect_it_caused() -> None:
    """A takeover: the newcomer's SESSION_CREATED is timed after the old connection's
    DISCONNECT (taken over), as it is recorded after it, not at the read's time."""
    events = all_events("x")
    assert [(kind, reason) for _, kind, reason in events] == [
        ("session_created", None), ("connect", None), ("disconnect", "taken_over"),
        ("session_created", None), ("connect", None), ("disconnect", "clean")]
    times = [ts for ts, _, _ in events]
    assert times[2] < times[3], events
    assert times == sorted(times), events


def test_a_clean_start_over_a_stored_session_is_recorded_after_its_clearing() -> None:
    """A clean-session CONNECT over an offline persistent session: SESSION_CLEARED,
    then SESSION_CREATED at a later time (not the read's, taken before the clearing)."""
    clock = TickingClock()
    clock.advance(T0)
    recorded = Recorded()
    limits = Limits(sys_interval=0)
    broker = Broker(clock, NullStore(), limits, guards=guards(clock.seconds, limits),
                    recorder=recorded)
    factory = MQTTFactory(broker, clock)
    a = Client(factory)
    assert a.connect("p", clean=False) == [ACCEPTED]
    a.send(Disconnect())
    a.lost()
    clock.advance(GAP)
    assert Client(factory).connect("p", clean=True) == [ACCEPTED]
    events = [(ts, kind) for ts, kind, cid, _ in recorded.events if cid == "p"]
    kinds = [kind for _, kind in events]
    assert kinds[-3:] == ["session_cleared", "session_created", "connect"], events
    times = [ts for ts, _ in events]
    assert times == sorted(times), events
