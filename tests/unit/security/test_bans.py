"""The ban list in-process: the rule (``core.bans``), the façade's commands and
their durability (``MemoryStore``), and the console's page, API and audit."""

from __future__ import annotations

from typing import Any

import pytest
from console_support import Client, connect, make_console
from fakes import MemoryStore
from twisted.internet.task import Clock

from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.security.admission import guards
from mqttamqp.security.bans import BanError, BanList


def test_ban_rule_matches_each_kind_and_expires() -> None:
    """A ban matches by client id, user or address (in canonical form), and a timed ban
    runs out."""
    clock = Clock()
    bans = BanList(clock.seconds)
    assert bans.check("dev", "alice", "10.0.0.1") is None
    bans.add("client_id", "dev", None, "", "admin")
    bans.add("user", "alice", 60.0, "", "admin")
    bans.add("address", "::ffff:10.0.0.9", None, "", "admin")
    assert bans.check("dev", None, "127.0.0.1") is not None
    assert bans.check("other", "alice", None) is not None
    hit = bans.check("other", None, "10.0.0.9")       # the canonical form matches
    assert hit is not None and hit.value == "10.0.0.9"
    assert bans.check("devx", "alice2", "10.0.0.10") is None
    clock.advance(61)                                  # the user's ban ran out
    assert bans.check("other", "alice", None) is None
    assert [(b.kind, b.value) for b in bans.active()] == [("address", "10.0.0.9"),
                                                          ("client_id", "dev")]
    assert [(op.kind, op.value) for op in bans.purge()] == [("user", "alice")]


@pytest.mark.parametrize("kind, value, until, problem", [
    ("host", "x", None, "kind must be"), ("address", "not-an-ip", None, "not an IP"),
    ("client_id", "", None, "must not be empty"), ("user", "u", -1.0, "in the future")])
def test_bans_that_cannot_be_set(kind: str, value: str, until: float | None,
                                 problem: str) -> None:
    """Bans of an unknown kind, a bad address, an empty value or a past end are refused."""
    with pytest.raises(BanError, match=problem):
        BanList(Clock().seconds).add(kind, value, until, "", "admin")


def test_the_list_is_bounded() -> None:
    """The ban list is bounded; an expired ban makes room."""
    clock = Clock()
    bans = BanList(clock.seconds, max_bans=2)
    bans.add("client_id", "a", None, "", "x")
    bans.add("client_id", "b", 5.0, "", "x")
    with pytest.raises(BanError, match="full"):
        bans.add("client_id", "c", None, "", "x")
    clock.advance(10)                   # an expired ban makes room
    bans.add("client_id", "c", None, "", "x")
    assert len(bans) == 2


def test_bans_are_durable_and_come_back_after_a_restart() -> None:
    """Bans are committed, refuse matching MQTT and AMQP clients with the reason, are
    counted, and come back after a restart."""
    clock = Clock()
    store = MemoryStore()
    broker = Broker(clock, store, Limits(sys_interval=0),
                    guards=guards(clock.seconds, Limits(sys_interval=0)))
    broker.start()
    _, d = broker.commands.ban("client_id", "dev-9", None, "flapping", "admin")
    assert d.called
    broker.commands.ban("address", "10.1.2.3", 3600.0, "", "admin")
    assert broker.gate.banned("MQTT", "dev-9", None, "10.0.0.1:5000") == \
        "client id 'dev-9' is banned (flapping)"
    assert broker.gate.banned("AMQP", "app", None, "10.1.2.3:6000") is not None
    assert broker.gate.banned("MQTT", "dev-8", None, "10.1.2.4:6000") is None
    assert broker.stats.limits["banned"] == 2
    again = Broker(clock, store, Limits(sys_interval=0),
                   guards=guards(clock.seconds, Limits(sys_interval=0)))
    again.start()
    assert [(b.kind, b.value) for b in again.view.bans()] == [("address", "10.1.2.3"),
                                                              ("client_id", "dev-9")]
    lifted = again.commands.unban("client_id", "dev-9")
    assert lifted is not None and lifted.called
    assert again.commands.unban("client_id", "dev-9") is None
    assert [b.value for b in store.load().bans] == ["10.1.2.3"]


# -- the console ---------------------------------------------------------------------------


@pytest.fixture
def console(tmp_path: Any) -> Any:
    console, service, clock = make_console(tmp_path)
    client = Client(console)
    assert client.login().code == 303
    return service.broker, clock, client


def test_ban_from_the_console_disconnects_and_is_listed(console: Any, log_lines: Any) -> None:
    """A ban set in the console closes the banned client's connections only, and is listed
    escaped with its time left."""
    broker, clock, client = console
    device = connect(broker, "noisy-<b>dev</b>", remote="10.9.8.7:4000")
    bystander = connect(broker, "calm", remote="10.9.8.6:4000")
    reply = client.post("/bans/add", kind="client_id", value="noisy-<b>dev</b>",
                        seconds="3600", reason="floods <i>us</i>", disconnect="1")
    assert reply.code == 303 and reply.header("location") == "/bans"
    assert device.closed and not bystander.closed
    page = client.get("/bans").text
    assert "Banned client id noisy-&lt;b&gt;dev&lt;/b&gt; for 1h 0m; closed 1 connection(s)." \
        in page
    assert "noisy-<b>" not in page and "floods &lt;i&gt;us&lt;/i&gt;" in page
    assert "1h" in page                          # time left
    items = client.get("/api/bans").json()["items"]
    assert [(b["kind"], b["value"], b["until"], b["by"]) for b in items] == [
        ("client_id", "noisy-<b>dev</b>", clock.seconds() + 3600, "admin")]
    assert any("action=ban" in line and "noisy-<b>dev</b>" in line for line in log_lines)
    assert broker.gate.banned("MQTT", "noisy-<b>dev</b>", None, "10.0.0.1:1") is not None

    reply = client.post("/bans/remove", kind="client_id", value="noisy-<b>dev</b>")
    assert reply.code == 303
    assert client.get("/api/bans").json()["items"] == []
    assert any("action=unban" in line for line in log_lines)


def test_ban_api_errors(console: Any) -> None:
    """The bans API refuses bad addresses and past ends (400), bans for good without a
    time, and answers 404 for an unknown ban."""
    _, _, client = console
    client.get("/bans")
    headers = {"X-CSRF-Token": client.csrf}
    bad = client.post_json("/api/bans/add", {"kind": "address", "value": "nope"}, headers)
    assert bad.code == 400 and "not an IP address" in bad.json()["error"]
    bad = client.post_json("/api/bans/add", {"kind": "user", "value": "u", "seconds": "-5"},
                           headers)
    assert bad.code == 400
    ok = client.post_json("/api/bans/add", {"kind": "user", "value": "mallory"}, headers)
    assert ok.code == 200 and ok.json()["until"] is None      # for good
    gone = client.post_json("/api/bans/remove", {"kind": "user", "value": "nobody"}, headers)
    assert gone.code == 404


def test_a_banned_mqtt5_client_gets_0x8a() -> None:
    """MQTT 5 has its own CONNACK code for a ban (0x8A); 3.1.1 clients get 5."""
    from amqp_memory import Net
    from twisted.internet.testing import StringTransport

    from mqttamqp.mqtt.codec import Decoder, encode
    from mqttamqp.mqtt.packets import Connack, Connect

    net = Net()
    net.broker.commands.ban("client_id", "evil", None, "test", "admin")
    for level, code in ((5, 0x8A), (4, 5)):
        proto = net.mqtt_factory.buildProtocol(None)
        wire = StringTransport()
        proto.makeConnection(wire)
        proto.dataReceived(encode(Connect("MQTT", level, "evil", True, 0), level))
        net.pump()
        decoder = Decoder(protocol_level=level)
        decoder.feed(wire.value())
        [ack] = list(decoder)
        assert isinstance(ack, Connack) and ack.return_code == code
