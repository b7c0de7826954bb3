"""``[[bridge]]`` tables: the issue's form as written, Mosquitto-shaped topic rules,
and one-line errors naming the key for bad tables."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from mqttamqp.bridge.config import BridgeSettings, parse_rule
from mqttamqp.ops.config import TableKeyError

ISSUE_FORM = {"name": "hq", "address": "mqtt://127.0.0.1:1884",
              "topics": ["sensors/# out 1", "commands/# in 1"]}


def test_the_issue_form_loads_with_its_defaults() -> None:
    """The issue's three-key table gives a persistent bridge with both rules."""
    s = BridgeSettings.from_table(dict(ISSUE_FORM))
    assert (s.host, s.port, s.session_id, s.remote_client_id) == (
        "127.0.0.1", 1884, "$bridge/hq", socket.gethostname() + ".hq")
    assert s.clean_session is False and s.try_private is True
    assert [(r.pattern, r.direction, r.qos) for r in s.rules] == [
        ("sensors/#", "out", 1), ("commands/#", "in", 1)]


def test_prefixes_map_topics_both_ways() -> None:
    """Table prefixes apply to every rule; a rule's own prefixes win."""
    s = BridgeSettings.from_table({**ISSUE_FORM, "local-prefix": "site/",
                                   "remote-prefix": "hq/", "topics": [
                                       "a/# out 1", 'b/# in 0 "" far/']})
    a, b = s.rules
    assert (a.local_filter, a.remote_filter) == ("site/a/#", "hq/a/#")
    assert (b.local_filter, b.remote_filter) == ("b/#", "far/b/#")


def test_round_trip_through_as_table() -> None:
    """``as_table`` (``--print-config``) reads back to the same settings."""
    s = BridgeSettings.from_table({**ISSUE_FORM, "username": "u", "password": "p"})
    assert BridgeSettings.from_table(s.as_table()) == s


@pytest.mark.parametrize(("change", "key"), [
    ({"name": None}, "name"),
    ({"address": "http://x"}, "address"),
    ({"address": "http://x:8083"}, "address"),
    ({"tls-ca": "/nonexistent.pem"}, "tls-ca"),
    ({"address": "mqtts://x", "tls-ca": "/nonexistent.pem"}, "tls-ca"),
    ({"server-name": "x"}, "server-name"),
    ({"protocol": "4"}, "protocol"),
    ({"topics": ["a/# sideways 1"]}, "topics"),
    ({"topics": ["a/# out 3"]}, "topics"),
    ({"topics": ["a/#/b out 1"]}, "topics"),
    ({"topics": []}, "topics"),
    ({"keepalive": "60"}, "keepalive"),
    ({"keepalive": 70000}, "keepalive"),
    ({"reconnect-min": 10, "reconnect-max": 5}, "reconnect-min"),
    ({"colour": "blue"}, "colour"),
    ({"password": "p"}, "password"),
])
def test_bad_tables_name_their_key(change: dict[str, Any], key: str) -> None:
    """Each bad table is refused with a one-line error naming the offending key."""
    table = {**ISSUE_FORM, **change}
    table = {k: v for k, v in table.items() if v is not None}
    with pytest.raises(TableKeyError) as e:
        BridgeSettings.from_table(table)
    assert e.value.key == key and "\n" not in str(e.value)


def test_rule_defaults_follow_mosquitto() -> None:
    """A bare pattern is ``out`` at QoS 0, as in Mosquitto's ``topic`` line."""
    r = parse_rule("x/#", "", "")
    assert (r.direction, r.qos, r.outbound, r.inbound) == ("out", 0, True, False)
    assert parse_rule("x/# both 2", "", "").inbound


def test_a_bad_table_stops_the_options_with_one_line(tmp_path: Any) -> None:
    """``--config`` with a bad ``[[bridge]]`` exits with one line naming key and line."""
    from mqttamqp.options import Options

    path = tmp_path / "bad.toml"
    path.write_text('[[bridge]]\nname = "hq"\naddress = "mqtt://127.0.0.1:1884"\n'
                    'topics = ["sensors/# sideways 1"]\n')
    with pytest.raises(SystemExit) as e:
        Options().parseOptions(["--config", str(path)])
    first = str(e.value).splitlines()[0]
    assert "line 4: bridge.topics: 'sensors/# sideways 1': direction 'sideways'" in first


def test_a_good_table_reaches_the_options(tmp_path: Any) -> None:
    """The issue's table, in a --config file, becomes one ``BridgeSettings``."""
    from mqttamqp.options import Options

    path = tmp_path / "ok.toml"
    path.write_text('[[bridge]]\nname = "hq"\naddress = "mqtt://127.0.0.1:1884"\n'
                    'topics = ["sensors/# out 1", "commands/# in 1"]\n')
    options = Options()
    options.parseOptions(["--config", str(path)])
    assert [b.name for b in options["bridge"]] == ["hq"]


def test_cert_file_and_key_file_go_together_and_are_read(tmp_path: Any) -> None:
    """cert-file without key-file, an mqtt:// address, or a file that is not a PEM
    certificate is refused naming the key."""
    plain = {"name": "hq", "address": "mqtt://hq.example", "topics": ["a/# out 1"]}
    base = {**plain, "address": "mqtts://hq.example"}
    cert = tmp_path / "c.pem"
    cert.write_text("not a certificate")
    for table, key in (({**base, "cert-file": str(cert)}, "key-file"),
                       ({**plain, "cert-file": str(cert), "key-file": str(cert)}, "cert-file"),
                       ({**base, "cert-file": str(cert), "key-file": str(cert)}, "cert-file")):
        with pytest.raises(TableKeyError) as caught:
            BridgeSettings.from_table(table)
        assert caught.value.key == key, caught.value


def test_ws_addresses_and_their_url() -> None:
    """ws:// and wss:// are read (default ports 80 and 443, path /mqtt unless given;
    wss is TLS); a path on an mqtt:// address is refused."""
    from mqttamqp.bridge.wsremote import url_of
    table = {"name": "hq", "topics": ["a/# out 1"]}
    ws = BridgeSettings.from_table({**table, "address": "ws://h.example"})
    assert (ws.port, ws.tls, ws.websocket, url_of(ws)) == (80, False, True,
                                                           "ws://h.example:80/mqtt")
    wss = BridgeSettings.from_table({**table, "address": "wss://h.example:9001/ws"})
    assert (wss.port, wss.tls, url_of(wss)) == (9001, True, "wss://h.example:9001/ws")
    with pytest.raises(TableKeyError, match="path"):
        BridgeSettings.from_table({**table, "address": "mqtt://h.example/x"})


def test_a_ws_url_keeps_an_ipv6_address_in_brackets_and_the_query() -> None:
    """ws://[::1]:8080 gives an URL autobahn accepts (it raised at start-up, stopping
    the broker's start), and a query on the address is kept."""
    from autobahn.websocket.util import parse_url

    from mqttamqp.bridge.wsremote import url_of
    table = {"name": "hq", "topics": ["a/# out 1"]}
    ws = BridgeSettings.from_table({**table, "address": "ws://[::1]:8080/mqtt?x=1"})
    assert url_of(ws) == "ws://[::1]:8080/mqtt?x=1"
    assert parse_url(url_of(ws))[1] == "::1"


def test_a_connector_that_raises_is_a_failed_attempt_retried() -> None:
    """A connector that raises at once (an address autobahn refuses) makes a failed
    attempt with its back-off, not an exception out of ``start`` (which stopped the
    broker's start-up and the bridges after it)."""
    from core_broker import make_broker

    from mqttamqp.bridge.bridge import Bridge
    broker, clock, _ = make_broker()
    calls: list[object] = []

    def connector(client: object) -> object:
        calls.append(client)
        raise ValueError("invalid WebSocket URL: missing hostname")

    bridge = Bridge(broker, clock, BridgeSettings.from_table(
        {"name": "hq", "address": "ws://h.example", "topics": ["a/# out 1"]}), connector)
    bridge.start()
    assert len(calls) == 1 and bridge.state != "connected"
    clock.advance(120)
    assert len(calls) > 1
    bridge.stop()
