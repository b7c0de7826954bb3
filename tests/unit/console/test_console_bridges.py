"""The Bridges page and ``/api/bridges``: each configured bridge with its state,
remote, last error (escaped), connected since, messages out and in and its out
backlog; an empty table without bridges."""

from __future__ import annotations

from typing import Any

from bridge_remote import TABLE, Remote, accept
from console_support import CHEAP, PASSWORD, Client, FakeService, run_now
from twisted.internet.task import Clock

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.bridge.service import figures
from mqttamqp.console.app import Console
from mqttamqp.console.context import ConsoleContext
from mqttamqp.core.message import Message
from mqttamqp.security.userstore import UserStore


class _Bridges:
    def __init__(self, bridges: list[Bridge]) -> None:
        self.bridges = bridges

    def figures(self) -> list[dict[str, Any]]:
        return [figures(b) for b in self.bridges]


def _client(tmp_path: Any, with_bridges: bool) -> tuple[Client, FakeService, list[Bridge]]:
    clock = Clock()
    clock.advance(1_700_000_000)
    service = FakeService(str(tmp_path), clock)
    bridges: list[Bridge] = []
    if with_bridges:
        for name, up in (("hq", True), ("lab", False)):
            remote = Remote()
            remote.up = up
            bridge = Bridge(service.broker, clock, BridgeSettings.from_table(
                {**TABLE, "name": name, "address": "mqtt://127.0.0.1:1884"}), remote)
            bridge.start()
            if up:
                accept(remote)
            bridges.append(bridge)
        service.bridges = _Bridges(bridges)  # type: ignore[attr-defined]
    users = UserStore(str(tmp_path))
    users.set_password("admin", PASSWORD, role="admin", **CHEAP)
    client = Client(Console(ConsoleContext.of(service), clock=clock, run_in_thread=run_now,
                            users=users))
    assert client.login().code == 303
    return client, service, bridges


def test_bridges_page_and_api_show_state_backlog_and_errors(tmp_path: Any) -> None:
    """A connected bridge with its counters and a waiting one with its last error
    (escaped) and backlog, in the page and the API alike."""
    client, service, bridges = _client(tmp_path, True)
    bridges[1].last_error = "<b>refused</b>"
    for i in range(3):
        service.broker.publish(Message("sensors/t", b"%d" % i, 1, False, "p", 0.0))
    api = client.get("/api/bridges").json()
    by_name = {b["name"]: b for b in api["items"]}
    assert by_name["hq"]["state"] == "connected" and by_name["hq"]["sent"] == 3
    assert by_name["hq"]["connected_since"] == 1_700_000_000
    assert by_name["lab"]["state"] == "waiting" and by_name["lab"]["backlog_messages"] == 3
    assert api["totals"] == {"bridges": 2, "connected": 1, "backlog_messages": 6}
    page = client.get("/bridges").text
    for text in ("hq", "lab", "connected", "waiting", "mqtt://127.0.0.1:1884",
                 "&lt;b&gt;refused&lt;/b&gt;", "sensors/# out 1"):
        assert text in page, text
    assert "<b>refused</b>" not in page


def test_no_bridges_is_an_empty_table(tmp_path: Any) -> None:
    """Without [[bridge]] tables the page says so and the API lists none."""
    client, _, _ = _client(tmp_path, False)
    assert client.get("/api/bridges").json()["items"] == []
    assert "No bridges." in client.get("/bridges").text


def test_bridges_page_shows_rates_and_the_backlog_bound(tmp_path: Any) -> None:
    """The rates out and in (messages/s) and the backlog's bound are on the page and
    in the API."""
    client, _, bridges = _client(tmp_path, True)
    bridges[0].sent = 25
    bridges[0].sample(5.0)
    api = {b["name"]: b for b in client.get("/api/bridges").json()["items"]}
    assert api["hq"]["rate_out"] == 5.0 and api["hq"]["rate_in"] == 0.0
    assert api["hq"]["on_full"] == "block"
    page = client.get("/bridges").text
    assert "(5.0/s)" in page and "(0.0/s)" in page and "dropped" in page
