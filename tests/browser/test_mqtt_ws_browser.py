"""MQTT over WebSockets from a real browser: MQTT.js (vendored in ``tests/mqttjs``)
in Debian's Chromium via Playwright, against a real broker process, with paho-mqtt
over TCP on the other side.

The page comes from a small HTTP server on loopback (Chromium lets a loopback page
reach loopback; a page Playwright made up would be refused by Chromium's local
network access checks before the broker saw it).  As ``http://127.0.0.1:PORT`` it
is a page of the broker's host; as ``http://localhost:PORT`` it is not (the
broker is reached as 127.0.0.1), which is how the Origin refusal is shown.  MQTT
3.1.1 only for now (MQTT 5 is built separately).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pahoclient
import pytest
from brokerproc import BrokerProcess
from chromium import NEEDS_CHROMIUM, WAIT_MS

sync_api = pytest.importorskip("playwright.sync_api")

MQTTJS = Path(__file__).resolve().parents[1] / "support" / "mqttjs" / "mqtt.min.js"
HTML = b'<!doctype html><title>mqtt over ws</title><script src="/mqtt.min.js"></script>'

pytestmark = [pytest.mark.timeout(120), NEEDS_CHROMIUM]


@pytest.fixture
def ws_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path / "data"), listeners=("--mqtt", "--mqtt-ws"))
    proc.start()
    yield proc
    proc.stop()


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body, ctype = {"/": (HTML, "text/html"),
                       "/mqtt.min.js": (MQTTJS.read_bytes(), "text/javascript")
                       }.get(self.path, (b"", ""))
        if not body:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page_port() -> Iterator[int]:
    """The port of a loopback HTTP server serving the test page and MQTT.js."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def open_page(chromium: Any, page_port: int, host: str = "127.0.0.1") -> Any:
    """The test page (MQTT.js loaded), recording errors in ``window.errors``."""
    page = chromium.new_page()
    page.goto(f"http://{host}:{page_port}/")
    page.wait_for_function("() => typeof mqtt === 'object'", timeout=WAIT_MS)
    page.evaluate("() => { window.errors = []; window.got = []; }")
    return page


# Resolves true once connected, false if the connection closes first (never hangs:
# MQTT.js gives up after connectTimeout).
CONNECT = """async ({url, clientId, will}) => {
    const options = {protocolVersion: 4, clientId, reconnectPeriod: 0,
                     connectTimeout: 5000, clean: true};
    if (will) options.will = will;
    const client = mqtt.connect(url, options);
    const ok = await new Promise((resolve) => {
        client.once('connect', () => resolve(true));
        client.once('close', () => resolve(false));
    });
    if (!ok) return false;
    client.on('error', (e) => window.errors.push(String(e)));
    client.on('message', (topic, payload, packet) => window.got.push(
        {topic, payload: new TextDecoder().decode(payload), qos: packet.qos,
         retain: packet.retain}));
    window.client = client;
    return client.connected;
}"""


def test_browser_subscribes_publishes_at_each_qos_and_gets_messages(
        browser: Any, ws_broker: BrokerProcess, page_port: int) -> None:
    """MQTT.js in Chromium connects over WebSockets (MQTT 3.1.1), subscribes, publishes
    at QoS 0, 1 and 2 (each promise resolving once its flow completed) and receives
    its own messages and a TCP client's; the TCP client receives the browser's."""
    url = f"ws://127.0.0.1:{ws_broker.ports['MQTT-WS']}/mqtt"
    tcp = pahoclient.PahoClient(ws_broker.mqtt_port, "tcp-peer")
    page = open_page(browser, page_port)
    try:
        tcp.subscribe(("browser/out/#", 2))
        assert page.evaluate(CONNECT, {"url": url, "clientId": "chromium-1", "will": None})
        granted = page.evaluate("""async () => (await window.client.subscribeAsync(
            'browser/in/#', {qos: 2})).map((g) => g.qos)""")
        assert granted == [2]
        page.evaluate("""async () => {
            for (const qos of [0, 1, 2]) {
                await window.client.publishAsync('browser/out/q' + qos, 'from chromium ' + qos,
                                                 {qos});
                await window.client.publishAsync('browser/in/q' + qos, 'to myself ' + qos,
                                                 {qos});
            }
        }""")
        tcp.publish("browser/in/tcp", b"from paho", 1)
        page.wait_for_function("() => window.got.length >= 4", timeout=WAIT_MS)
        got = page.evaluate("() => window.got")
        assert sorted((m["topic"], m["payload"], m["qos"]) for m in got) == [
            ("browser/in/q0", "to myself 0", 0), ("browser/in/q1", "to myself 1", 1),
            ("browser/in/q2", "to myself 2", 2), ("browser/in/tcp", "from paho", 1)]
        from_browser = sorted((m.topic, m.payload, m.qos) for m in (tcp.get() for _ in range(3)))
        assert from_browser == [(f"browser/out/q{q}", b"from chromium %d" % q, q)
                                for q in (0, 1, 2)]
        assert page.evaluate("() => window.errors") == []
        page.evaluate("async () => { await window.client.endAsync(); }")
    finally:
        page.close()
        tcp.stop()


def test_closing_the_tab_publishes_the_browsers_will(
        browser: Any, ws_broker: BrokerProcess, page_port: int) -> None:
    """A browser client with a will whose tab is closed (no MQTT DISCONNECT) has its
    will published; one that ends with DISCONNECT does not."""
    url = f"ws://127.0.0.1:{ws_broker.ports['MQTT-WS']}/mqtt"
    tcp = pahoclient.PahoClient(ws_broker.mqtt_port, "will-watcher")
    try:
        tcp.subscribe(("browser/will/#", 1))
        polite = open_page(browser, page_port)
        assert polite.evaluate(CONNECT, {"url": url, "clientId": "polite", "will": {
            "topic": "browser/will/polite", "payload": "polite gone", "qos": 1,
            "retain": False}})
        polite.evaluate("async () => { await window.client.endAsync(); }")
        polite.close()
        page = open_page(browser, page_port)
        assert page.evaluate(CONNECT, {"url": url, "clientId": "tab", "will": {
            "topic": "browser/will/tab", "payload": "tab closed", "qos": 1,
            "retain": False}})
        page.close()
        m = tcp.get()
        assert (m.topic, m.payload, m.qos) == ("browser/will/tab", b"tab closed", 1)
        # the polite client's will (had it been published) would have come first
    finally:
        tcp.stop()


def test_a_page_of_another_origin_is_refused(
        browser: Any, ws_broker: BrokerProcess, page_port: int) -> None:
    """A page of another host (localhost, while the broker is reached as 127.0.0.1)
    cannot open MQTT over WebSockets to the broker."""
    url = f"ws://127.0.0.1:{ws_broker.ports['MQTT-WS']}/mqtt"
    page = open_page(browser, page_port, host="localhost")
    try:
        # (a refused handshake ends in 'close' without 'error' in MQTT.js)
        outcome = page.evaluate("""(url) => new Promise((resolve) => {
            const c = mqtt.connect(url, {protocolVersion: 4, reconnectPeriod: 0,
                                         connectTimeout: 5000});
            c.on('connect', () => resolve('connected'));
            c.on('error', (e) => resolve('refused: ' + e));
            c.on('close', () => resolve('refused: closed'));
        })""", url)
        assert outcome.startswith("refused"), outcome
        ws_broker.wait_for_line(r"refusing MQTT over WebSocket from .*origin "
                                rf"'http://localhost:{page_port}' is not this host")
    finally:
        page.close()


def test_browser_speaks_mqtt5_with_properties(
        browser: Any, ws_broker: BrokerProcess, page_port: int) -> None:
    """MQTT.js in Chromium over WebSockets with protocolVersion 5: publishes at QoS 0,
    1 and 2 with properties (user properties, content type, response topic,
    correlation data) reach an
    MQTT 5 paho client over TCP and the browser's own subscription, and a paho
    message's properties reach the browser."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties as PahoProperties

    url = f"ws://127.0.0.1:{ws_broker.ports['MQTT-WS']}/mqtt"
    tcp = pahoclient.PahoClient(ws_broker.mqtt_port, "tcp-peer-5", mqtt.MQTTv5)
    page = open_page(browser, page_port)
    try:
        tcp.subscribe(("b5/out", 1))
        assert page.evaluate("""async (url) => {
            const client = mqtt.connect(url, {protocolVersion: 5, clientId: 'chromium-5',
                reconnectPeriod: 0, connectTimeout: 5000, clean: true,
                properties: {sessionExpiryInterval: 0}});
            const ok = await new Promise((resolve) => {
                client.once('connect', () => resolve(true));
                client.once('close', () => resolve(false));
            });
            client.on('message', (topic, payload, packet) => window.got.push(
                {topic, payload: new TextDecoder().decode(payload),
                 props: packet.properties || {}}));
            window.client = client;
            return ok;
        }""", url)
        granted = page.evaluate("""async () => (await window.client.subscribeAsync(
            'b5/in', {qos: 1})).map((g) => g.qos)""")
        assert granted == [1]
        page.evaluate("""async () => {
            const properties = {userProperties: {site: 'lab', shift: 'night'},
                                contentType: 'text/plain', responseTopic: 'b5/reply',
                                correlationData: new TextEncoder().encode('c-42')};
            for (const qos of [0, 1, 2]) {
                await window.client.publishAsync('b5/out', 'from chromium 5 q' + qos,
                                                 {qos, properties});
            }
        }""")
        got = sorted((tcp.get() for _ in range(3)), key=lambda m: m.payload)
        assert [(m.topic, m.payload) for m in got] == [
            ("b5/out", b"from chromium 5 q%d" % q) for q in (0, 1, 2)]
        for m in got:
            props = m.properties
            assert props.ContentType == "text/plain" and props.ResponseTopic == "b5/reply"
            assert props.CorrelationData == b"c-42"
            assert sorted(props.UserProperty) == [("shift", "night"), ("site", "lab")]
        out = PahoProperties(PacketTypes.PUBLISH)
        out.UserProperty = [("from", "paho")]
        out.ContentType = "application/json"
        info = tcp.c.publish("b5/in", b'{"n": 1}', 1, properties=out)
        info.wait_for_publish(5)
        page.wait_for_function("() => window.got.length >= 1", timeout=WAIT_MS)
        [msg] = page.evaluate("() => window.got")
        assert msg["topic"] == "b5/in" and msg["payload"] == '{"n": 1}'
        assert msg["props"]["contentType"] == "application/json"
        assert msg["props"]["userProperties"] == {"from": "paho"}
        page.evaluate("async () => { await window.client.endAsync(); }")
    finally:
        page.close()
        tcp.stop()
