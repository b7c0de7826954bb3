"""Gateway mode end to end: a core broker process with its AMQP listener, gateway
processes (``--upstream``) in front of it, paho clients on both, all on loopback.
What the gateway must show: the core keeps every session (a client finds it through
another gateway), messages cross gateways at QoS 1 without loss, a gateway killed
with SIGKILL fires its clients' wills at the core, and without an upstream a CONNECT
gets "server unavailable"."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from brokerproc import BrokerProcess, RestartableBroker
from gateway_proc import UPSTREAM_OPEN, start_gateway, uid
from paho.mqtt.packettypes import PacketTypes
from pahoclient import Paho5, PahoClient, props
from ports import free_port

Gateways = Callable[..., BrokerProcess]


def test_session_found_through_another_gateway(core: BrokerProcess, gateways: Gateways,
                                               clients: Callable[..., PahoClient]) -> None:
    """A persistent session made through one gateway is present through another, with
    the QoS 1 message queued at the core while the client was away."""
    gw1, gw2 = gateways(), gateways()
    cid = uid("roam")
    first = clients(gw1.mqtt_port, cid, clean=False)
    assert first.session_present is False
    assert first.subscribe((f"{cid}/t", 1)) == [1]
    first.disconnect()
    clients(core.mqtt_port, uid("pub")).publish(f"{cid}/t", b"while-away", qos=1)
    again = clients(gw2.mqtt_port, cid, clean=False)
    assert again.session_present is True
    m = again.get()
    assert (m.topic, m.payload, m.qos) == (f"{cid}/t", b"while-away", 1)


def test_clean_session_is_removed_at_disconnect(core: BrokerProcess, gateways: Gateways,
                                                clients: Callable[..., PahoClient]) -> None:
    """A clean-session client's subscriptions are gone after it disconnects (AMQP_CLOSE)."""
    gw = gateways()
    cid = uid("clean")
    c = clients(gw.mqtt_port, cid, clean=True)
    assert c.subscribe((f"{cid}/t", 1)) == [1]
    c.disconnect()
    back = clients(gw.mqtt_port, cid, clean=False)
    assert back.session_present is False


def test_qos1_between_three_gateways_loses_nothing(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient]) -> None:
    """3 gateways and 1 core: a publisher on each gateway sends 100 QoS 1 messages; a
    subscriber on each gateway and one on the core get all 300, each publisher's in
    order."""
    gws = [gateways() for _ in range(3)]
    topic = uid("flow") + "/data"
    subs = [clients(gw.mqtt_port, uid(f"sub{i}")) for i, gw in enumerate(gws)]
    subs.append(clients(core.mqtt_port, uid("direct")))
    for sub in subs:
        assert sub.subscribe((topic, 1)) == [1]
    pubs = [clients(gw.mqtt_port, uid(f"pub{i}")) for i, gw in enumerate(gws)]
    for n in range(100):
        for i, pub in enumerate(pubs):
            pub.publish(topic, b"g%d-%03d" % (i, n), qos=1)
    for sub in subs:
        got: list[bytes] = []
        while len(set(got)) < 300:
            m = sub.get()
            assert m.qos == 1
            got.append(m.payload)
        firsts = list(dict.fromkeys(got))
        for i in range(3):
            assert [p for p in firsts if p.startswith(b"g%d-" % i)] == [
                b"g%d-%03d" % (i, n) for n in range(100)]


def test_qos0_and_retained_through_a_gateway(core: BrokerProcess, gateways: Gateways,
                                             clients: Callable[..., PahoClient]) -> None:
    """A retained message published through a gateway is kept by the core and sent,
    retained, to a later subscriber on the gateway; QoS 0 flows both ways."""
    gw = gateways()
    topic = uid("ret") + "/state"
    pub = clients(gw.mqtt_port, uid("pub"))
    pub.publish(topic, b"on", qos=1, retain=True)
    sub = clients(gw.mqtt_port, uid("sub"))
    assert sub.subscribe((topic, 0)) == [0]
    m = sub.get()
    assert (m.payload, m.retain) == (b"on", True)
    clients(core.mqtt_port, uid("p0")).publish(topic, b"live", qos=0)
    m = sub.get()
    assert (m.payload, m.retain, m.qos) == (b"live", False, 0)


def test_qos2_both_ways_through_a_gateway(core: BrokerProcess, gateways: Gateways,
                                          clients: Callable[..., PahoClient]) -> None:
    """QoS 2 from a client on a gateway to one on another completes both flows once."""
    gw1, gw2 = gateways(), gateways()
    topic = uid("q2") + "/t"
    sub = clients(gw1.mqtt_port, uid("sub"))
    assert sub.subscribe((topic, 2)) == [2]
    pub = clients(gw2.mqtt_port, uid("pub"))
    for i in range(5):
        pub.publish(topic, b"x%d" % i, qos=2)
    got = [sub.get() for _ in range(5)]
    assert [(m.payload, m.qos) for m in got] == [(b"x%d" % i, 2) for i in range(5)]
    # A marker in the same ordered flow: a duplicate of the five would come before it.
    pub.publish(topic, b"end", qos=2)
    assert [m.payload for m in sub.until(topic)] == [b"end"]


def test_brute_disconnect_fires_the_will_clean_does_not(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient]) -> None:
    """A socket lost at the gateway publishes the client's will at the core; a
    DISCONNECT does not."""
    gw = gateways()
    base = uid("will")
    watcher = clients(core.mqtt_port, uid("watch"))
    assert watcher.subscribe((f"{base}/#", 1)) == [1]
    polite = clients(gw.mqtt_port, uid("polite"), will=(f"{base}/polite", b"gone", 1, False))
    polite.disconnect()
    rude = clients(gw.mqtt_port, uid("rude"), will=(f"{base}/rude", b"lost", 1, False))
    rude.lose_socket()
    m = watcher.get()
    assert (m.topic, m.payload, m.qos) == (f"{base}/rude", b"lost", 1)


def test_kill9_of_a_gateway_fires_its_clients_wills(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient]) -> None:
    """SIGKILL of a gateway process: the core publishes the wills of its clients."""
    gw = gateways()
    base = uid("k9")
    watcher = clients(core.mqtt_port, uid("watch"))
    assert watcher.subscribe((f"{base}/#", 1)) == [1]
    for i in range(3):
        clients(gw.mqtt_port, f"{base}-c{i}", will=(f"{base}/c{i}", b"dead", 1, False))
    gw.kill()
    got = sorted(watcher.get().topic for _ in range(3))
    assert got == [f"{base}/c{i}" for i in range(3)]


def test_no_upstream_refuses_connect_with_server_unavailable(
        tmp_path: Path, clients: Callable[..., PahoClient]) -> None:
    """With nothing at the upstream address, CONNECT gets CONNACK 3 (server unavailable)."""
    gw = start_gateway(tmp_path, f"amqp://127.0.0.1:{free_port()}", wait_open=False)
    try:
        gw.wait_for_line(r"upstream connection 0 to \S+ is down", timeout=15)
        clients(gw.mqtt_port, uid("early"), expect_rc=3)
    finally:
        gw.stop()


def test_core_stopped_closes_clients_then_refuses(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient]) -> None:
    """When the core goes away, the gateway closes its clients, and a new CONNECT gets
    CONNACK 3 until it is back."""
    gw = gateways()
    c = clients(gw.mqtt_port, uid("held"))
    core.kill()
    assert c.disconnected.wait(15)
    gw.wait_for_line(r"upstream connection \d+ to \S+ is down", timeout=15)
    clients(gw.mqtt_port, uid("late"), expect_rc=3)


def test_gateway_reconnects_when_the_core_is_back(
        tmp_path: Path, clients: Callable[..., PahoClient]) -> None:
    """After the core was killed and restarted on the same address, the gateway's
    upstream connections open again and CONNECTs are served, with the session kept."""
    port = free_port()
    where = {"--amqp": f"tcp:{port}:interface=127.0.0.1"}

    def start_core() -> RestartableBroker:
        return RestartableBroker(str(tmp_path / "core"), "--will-grace", "2",
                                 listeners=("--mqtt", "--amqp"), descriptions=where).start()

    core = start_core()
    gw = start_gateway(tmp_path, f"amqp://127.0.0.1:{port}")
    try:
        cid = uid("back")
        first = clients(gw.mqtt_port, cid, clean=False)
        assert first.subscribe((f"{cid}/t", 1)) == [1]
        core.kill()
        assert first.disconnected.wait(15)
        gw.wait_for_line(r"upstream connection \d+ to \S+ is down", timeout=15)
        core = start_core()
        gw.wait_for_line(r"upstream connection \d+ to \S+ is open", timeout=30)
        again = clients(gw.mqtt_port, cid, clean=False, expect_rc=0)
        assert again.session_present is True
    finally:
        gw.stop()
        core.stop()


def test_websocket_client_through_a_gateway(tmp_path: Path, core: BrokerProcess,
                                            clients: Callable[..., PahoClient]) -> None:
    """An MQTT-over-WebSocket client of a gateway (--mqtt-ws) publishes and receives
    at QoS 1 through the core."""
    gw = BrokerProcess(str(tmp_path / "gw-ws"), "--upstream",
                       f"amqp://127.0.0.1:{core.ports['AMQP']}",
                       listeners=("--mqtt", "--mqtt-ws"))
    gw.start()
    try:
        gw.wait_for_line(UPSTREAM_OPEN, timeout=15)
        topic = uid("ws") + "/t"
        ws = clients(gw.ports["MQTT-WS"], uid("wsc"), transport="websockets")
        assert ws.subscribe((topic, 1)) == [1]
        direct = clients(core.mqtt_port, uid("direct"))
        assert direct.subscribe((f"{topic}/back", 1)) == [1]
        clients(core.mqtt_port, uid("p")).publish(topic, b"to-ws", qos=1)
        m = ws.get()
        assert (m.payload, m.qos) == (b"to-ws", 1)
        ws.publish(f"{topic}/back", b"from-ws", qos=1)
        m = direct.get()
        assert (m.payload, m.qos) == (b"from-ws", 1)
    finally:
        gw.stop()


def test_takeover_on_one_gateway_keeps_the_session_and_no_will(
        core: BrokerProcess, gateways: Gateways, clients: Callable[..., PahoClient]) -> None:
    """A second connection with the same client id through the same gateway closes the
    first (its will is not published), and serves the session the first had."""
    gw = gateways()
    cid = uid("twin")
    watcher = clients(core.mqtt_port, uid("watch"))
    assert watcher.subscribe((f"{cid}/#", 1)) == [1]
    first = clients(gw.mqtt_port, cid, clean=False, will=(f"{cid}/will", b"w", 1, False))
    assert first.subscribe((f"{cid}/data", 1)) == [1]
    second = clients(gw.mqtt_port, cid, clean=False)
    assert first.disconnected.wait(10)
    assert second.session_present is True
    clients(core.mqtt_port, uid("pub")).publish(f"{cid}/data", b"for-second", qos=1)
    assert second.get().payload == b"for-second"
    # The watcher sees the data message and nothing before it: no will came.
    assert [m.topic for m in watcher.until(f"{cid}/data")] == [f"{cid}/data"]


def test_mqtt5_message_properties_cross_the_gateway(
        core: BrokerProcess, gateways: Gateways) -> None:
    """MQTT 5: user properties, content type, response topic and correlation data of a
    PUBLISH through a gateway reach an MQTT 5 subscriber on the core, and those of a
    PUBLISH on the core reach one on the gateway."""
    gw = gateways()
    topic = uid("v5") + "/t"
    on_gw = Paho5(gw.mqtt_port, uid("g5"))
    on_core = Paho5(core.mqtt_port, uid("c5"))
    try:
        assert on_gw.subscribe((f"{topic}/down", 1)) == [1]
        assert on_core.subscribe((f"{topic}/up", 1)) == [1]
        sent = props(PacketTypes.PUBLISH, UserProperty=[("k", "v")], ContentType="text/x",
                     ResponseTopic="r/t", CorrelationData=b"c1")
        on_gw.publish(f"{topic}/up", b"up", qos=1, properties=sent)
        on_core.publish(f"{topic}/down", b"down", qos=1, properties=sent)
        for client, payload in ((on_core, b"up"), (on_gw, b"down")):
            m = client.get()
            assert m.payload == payload
            p = m.properties
            assert (p.UserProperty, p.ContentType, p.ResponseTopic, p.CorrelationData) == (
                [("k", "v")], "text/x", "r/t", b"c1")
    finally:
        on_gw.stop()
        on_core.stop()


def test_mqtt5_connect_without_upstream_is_0x88(tmp_path: Path) -> None:
    """MQTT 5 CONNECT with no upstream: CONNACK reason code 0x88 (server unavailable)."""
    gw = start_gateway(tmp_path, f"amqp://127.0.0.1:{free_port()}", wait_open=False)
    try:
        gw.wait_for_line(r"upstream connection 0 to \S+ is down", timeout=15)
        c = Paho5(gw.mqtt_port, uid("v5-early"))
        assert int(c.connack.value) == 0x88
        c.stop()
    finally:
        gw.stop()


def test_gateway_checks_clients_against_its_user_store(
        tmp_path: Path, core: BrokerProcess, clients: Callable[..., PahoClient]) -> None:
    """With a client user in the gateway's user store (mqttamqp-admin user add), a
    wrong password gets CONNACK 4 and an anonymous client 5; the right one connects."""
    data = tmp_path / "gw-users"
    data.mkdir()
    admin = os.path.join(os.path.dirname(sys.executable), "mqttamqp-admin")
    out = subprocess.run([admin, "user", "add", "-d", str(data), "--password-stdin", "alice"],
                         input="alice password\n", text=True, capture_output=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    gw = BrokerProcess(str(data), "--upstream", f"amqp://127.0.0.1:{core.ports['AMQP']}",
                       listeners=("--mqtt",)).start()
    try:
        gw.wait_for_line(UPSTREAM_OPEN, timeout=15)
        clients(gw.mqtt_port, uid("bad"), username="alice", password="wrong", expect_rc=4)
        clients(gw.mqtt_port, uid("anon"), expect_rc=5)
        ok = clients(gw.mqtt_port, uid("alice"), username="alice",
                     password="alice password", expect_rc=0)
        assert ok.subscribe((uid("a") + "/t", 1)) == [1]
    finally:
        gw.stop()
