"""The archive's CONNECT and DISCONNECT events of a client id handed from one MQTT
connection to the next come in time order: the previous connection's end is never
later than its successor's start (the report pairs them by time:
``pipeline/report.py``; the same story through the report:
``tests/integration/pipeline/test_report_hand_overs.py``)."""

from __future__ import annotations

from takeover_events import GAP, Recorded, TickingClock, hand_overs

T0 = 1000.0


def connection_events(client_id: str) -> list[tuple[float, str, str | None]]:
    clock = TickingClock()
    clock.advance(T0)
    recorded = Recorded()
    hand_overs(clock, recorded)
    return [(ts, kind, f.get("reason")) for ts, kind, cid, f in recorded.events
            if cid == client_id and kind in ("connect", "disconnect")]


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
