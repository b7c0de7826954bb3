"""The overview under ``--ha``: a High availability card with the role, the epoch,
since when the broker leads, its last takeover and the database's latency; none
without ``--ha``."""

from __future__ import annotations

from typing import Any

from console_support import CHEAP, PASSWORD, Client, FakeService, run_now
from twisted.internet.task import Clock

from mqttamqp.console.app import Console
from mqttamqp.console.context import ConsoleContext
from mqttamqp.security.userstore import UserStore


class _HA:
    def __init__(self, figures: dict[str, Any]) -> None:
        self.values = figures

    def figures(self) -> dict[str, Any]:
        return dict(self.values)


def _client(tmp_path: Any, ha: _HA | None) -> Client:
    clock = Clock()
    clock.advance(1_700_000_000)
    service = FakeService(str(tmp_path), clock)
    if ha is not None:
        service.ha = ha  # type: ignore[attr-defined]
    users = UserStore(str(tmp_path))
    users.set_password("admin", PASSWORD, role="admin", **CHEAP)
    client = Client(Console(ConsoleContext.of(service), clock=clock, run_in_thread=run_now,
                            users=users))
    assert client.login().code == 303
    return client


def test_overview_shows_the_role_under_ha(tmp_path: Any) -> None:
    """A leader's overview names its role, epoch, takeover time and database latency,
    in the page and in /api/overview."""
    ha = _HA({"role": "leader", "epoch": 3, "leader_since": 1_700_000_000.0,
              "standby_since": 1_699_999_000.0, "last_takeover_seconds": 0.8125,
              "database_latency_seconds": 0.0021, "lost_reason": ""})
    client = _client(tmp_path, ha)
    assert client.get("/api/overview").json()["ha"]["role"] == "leader"
    page = client.get("/").text
    for text in ("High availability", "leader", "0.812 s", "2.1 ms", "2023-11-14 22:13:20"):
        assert text in page, text


def test_no_ha_card_without_ha(tmp_path: Any) -> None:
    """Without --ha the overview has no High availability card, and ha is null."""
    client = _client(tmp_path, None)
    assert client.get("/api/overview").json()["ha"] is None
    assert "High availability" not in client.get("/").text


def test_a_standby_console_is_read_only(tmp_path: Any) -> None:
    """On the standby (its state not loaded) logging in works, changes are refused
    with 503 and the reason, and nothing reaches the broker; logging out works."""
    ha = _HA({"role": "standby", "epoch": None, "leader_since": 0.0,
              "standby_since": 1_700_000_000.0, "last_takeover_seconds": None,
              "database_latency_seconds": None, "lost_reason": ""})
    client = _client(tmp_path, ha)
    reply = client.post("/publish", topic="test/a", payload="hi", qos="1", retain="1")
    assert reply.code == 503
    assert "standby" in reply.text and "read-only" in reply.text
    assert client.get("/api/overview").json()["retained"]["count"] == 0
    ha.values["role"] = "leader"
    assert client.post("/publish", topic="test/a", payload="hi", qos="1",
                       retain="1").code == 303
    assert client.post("/logout").code == 303
