"""A session held for a bridge no longer configured (``hold_orphans``) is on the
console's Sessions page with its backlog, and the page's clear ends it: the way out
the log line names."""

from __future__ import annotations

from typing import Any

from bridge_remote import TABLE, Remote
from console_support import logged_in

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.bridge.service import hold_orphans
from mqttamqp.core.message import Message


def test_a_held_bridge_session_is_listed_and_cleared_from_the_console(tmp_path: Any
                                                                      ) -> None:
    """/api/sessions lists $bridge/hq with its queued message; /sessions/clear ends it."""
    _, broker, clock, client = logged_in(tmp_path)
    Bridge(broker, clock, BridgeSettings.from_table(dict(TABLE)), Remote()).start()
    broker.publish(Message("sensors/t", b"held", 1, False))
    assert hold_orphans(broker, []) == ["$bridge/hq"]
    items = {s["client_id"]: s for s in client.get("/api/sessions").json()["items"]}
    assert items["$bridge/hq"]["queued"] == 1
    reply = client.post("/sessions/clear", client_id="$bridge/hq", back="/sessions")
    assert reply.code == 303
    assert "$bridge/hq" not in broker.sessions
