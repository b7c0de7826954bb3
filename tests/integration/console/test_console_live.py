"""The console of a real broker process (``twistd mqttamqp --web``) driven over HTTP,
with real paho-mqtt clients seeing the effect of every action, and restarts proving
that stored changes (cleared sessions, deleted retained messages) are durable."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from console_support import ConsoleHTTP, Paho, initial_password, web_broker_process

MARKER = b"--marker--"


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One broker with console for the tests that do not restart it."""
    data = str(tmp_path_factory.mktemp("console-data"))
    proc = web_broker_process(data).start()
    yield proc, data
    proc.stop()


@pytest.fixture
def console(running: Any) -> ConsoleHTTP:
    proc, data = running
    http = ConsoleHTTP(proc.ports["WEB"])
    assert http.login(initial_password(data)) == 303
    return http


def _clients(_proc: Any, *clients: Paho) -> None:
    for c in clients:
        c.stop()


def _expect_marker_first(sub: Paho, http: ConsoleHTTP, topic: str) -> None:
    """Publish a marker through the console; it must be the next message (nothing before)."""
    assert http.post("/publish", topic=topic, payload=MARKER.decode(), qos="1").code == 303
    msg = sub.expect()
    assert (msg.topic, msg.payload) == (topic, MARKER)


def test_first_admin_password_only_in_a_private_file(running: Any) -> None:
    """First start: the generated password is in a 0600 file, never in the log (which
    says once where it is), and it logs in to the console."""
    proc, data = running
    password = initial_password(data)         # (asserts the file's mode is 0600)
    assert not [line for line in proc.log if password in line]
    lines = [line for line in proc.log if "created the first admin user" in line]
    assert len(lines) == 1 and os.path.join(data, "admin-password.txt") in lines[0]
    assert os.stat(os.path.join(data, "users.json")).st_mode & 0o077 == 0
    assert ConsoleHTTP(proc.ports["WEB"]).login(password) == 303


def test_anonymous_requests_and_security_headers(running: Any) -> None:
    """Over real HTTP: pages redirect to login, the API answers 401, headers are set."""
    proc, _ = running
    http = ConsoleHTTP(proc.ports["WEB"])
    page = http.get("/clients")
    assert page.code == 303 and page.header("location").startswith("/login")
    assert http.get("/api/clients").code == 401
    login = http.get("/login")
    assert login.header("x-frame-options") == "DENY"
    assert "script-src 'self'" in login.header("content-security-policy")
    assert login.header("cache-control") == "no-store"
    assert "HttpOnly" in login.header("set-cookie")
    assert http.login("not the password") == 401


def test_force_will_reaches_a_real_subscriber(running: Any, console: ConsoleHTTP) -> None:
    """Force will: a paho subscriber gets the will, the paho client is disconnected, audited."""
    proc, _ = running
    watcher = Paho(proc.mqtt_port, "fw-watcher")
    watcher.subscribe("fw/status/#")
    device = Paho(proc.mqtt_port, "fw-device", will=("fw/status/device", b"offline", 1, False))
    try:
        assert "fw-device" in console.get("/clients", q="fw-device").text
        reply = console.post("/clients/force-will", key="mqtt:fw-device")
        assert reply.code == 303
        msg = watcher.expect()
        assert (msg.topic, msg.payload) == ("fw/status/device", b"offline")
        assert device.disconnected.wait(10)
        items = console.get("/api/clients", q="fw-device").json()["items"]
        assert items == []
        proc.wait_for_line(r"audit: user='admin' action=force-will key='mqtt:fw-device'")
    finally:
        _clients(proc, watcher, device)


def test_force_will_keeping_the_client_connected(running: Any, console: ConsoleHTTP) -> None:
    """Force will, keep connected: the will arrives and the client can still publish."""
    proc, _ = running
    watcher = Paho(proc.mqtt_port, "fk-watcher")
    watcher.subscribe("fk/#")
    device = Paho(proc.mqtt_port, "fk-device", will=("fk/status", b"gone", 0, False))
    try:
        assert console.post("/clients/force-will", key="mqtt:fk-device",
                            keep_connected="1").code == 303
        assert watcher.expect().payload == b"gone"
        device.publish("fk/data", b"still here")
        assert watcher.expect().payload == b"still here"
        assert device.connected.is_set()
        detail = console.get("/api/client", key="mqtt:fk-device").json()
        assert detail["has_will"] is True
    finally:
        _clients(proc, watcher, device)


def test_disconnect_without_will_publishes_nothing(running: Any, console: ConsoleHTTP) -> None:
    """Disconnect without will: the client is dropped and its will never arrives."""
    proc, _ = running
    watcher = Paho(proc.mqtt_port, "dw-watcher")
    watcher.subscribe("dw/#")
    device = Paho(proc.mqtt_port, "dw-device", will=("dw/status", b"gone", 1, False))
    try:
        assert console.post("/clients/disconnect", key="mqtt:dw-device").code == 303
        assert device.disconnected.wait(10)
        _expect_marker_first(watcher, console, "dw/marker")
        owners = [w["owner"] for w in console.get("/api/wills").json()["items"]]
        assert "dw-device" not in owners
    finally:
        _clients(proc, watcher, device)


def test_disconnect_with_will(running: Any, console: ConsoleHTTP) -> None:
    """Disconnect with will: the client is dropped and its will arrives."""
    proc, _ = running
    watcher = Paho(proc.mqtt_port, "dww-watcher")
    watcher.subscribe("dww/#")
    device = Paho(proc.mqtt_port, "dww-device", will=("dww/status", b"gone", 1, False))
    try:
        assert console.post("/clients/disconnect", key="mqtt:dww-device",
                            with_will="1").code == 303
        assert device.disconnected.wait(10)
        assert watcher.expect().payload == b"gone"
    finally:
        _clients(proc, watcher, device)


def test_publish_form_reaches_real_subscribers(running: Any, console: ConsoleHTTP) -> None:
    """The Publish page's message is routed to a paho subscriber with its QoS and payload."""
    proc, _ = running
    watcher = Paho(proc.mqtt_port, "pub-watcher")
    watcher.subscribe("pub/#", 2)
    try:
        assert console.post("/publish", topic="pub/x", payload="00ff10", encoding="hex",
                            qos="2").code == 303
        msg = watcher.expect()
        assert (msg.topic, msg.payload, msg.qos) == ("pub/x", b"\x00\xff\x10", 2)
        proc.wait_for_line(r"audit: user='admin' action=publish topic='pub/x'")
    finally:
        watcher.stop()


def test_client_data_is_escaped_over_real_http(running: Any, console: ConsoleHTTP) -> None:
    """A real client with markup in its id, will topic and payload renders inert."""
    proc, _ = running
    evil_id = "<script>alert(1)</script>"
    evil_topic = 'xss/"><img src=x onerror=alert(2)>'
    device = Paho(proc.mqtt_port, evil_id, clean=False,
                  will=(evil_topic, b"<script>alert(3)</script>", 1, True))
    try:
        device.publish(evil_topic, b'"><img src=x onerror=alert(4)>', 1, True)
        device.subscribe(evil_topic.replace("xss/", "xss/+/") + "/#")
        from urllib.parse import quote
        for path in ["/clients", "/client?key=" + quote("mqtt:" + evil_id), "/sessions",
                     "/retained?filter=xss/%23", "/wills",
                     "/retained/message?topic=" + quote(evil_topic)]:
            html = console.get(path).text
            assert "<script>alert" not in html and "<img" not in html, path
            assert "&lt;" in html, path
    finally:
        device.stop()
        console.post("/sessions/clear", client_id=evil_id)
        console.post("/retained/delete", topic=evil_topic)


def test_admin_cli_changes_the_password_of_a_running_broker(tmp_path: Any) -> None:
    """mqttamqp-admin user passwd works while the broker runs and logs out the old session."""
    data = str(tmp_path / "data")
    proc = web_broker_process(data).start()
    try:
        http = ConsoleHTTP(proc.ports["WEB"])
        old = initial_password(data)
        assert http.login(old) == 303
        done = subprocess.run(
            [sys.executable, "-m", "mqttamqp.console.credentials", "user", "passwd", "--data", data,
             "--password-stdin", "admin"], input="the new password\n", text=True,
            capture_output=True, timeout=60, check=True)
        assert "changed the password" in done.stdout
        assert not os.path.exists(os.path.join(data, "admin-password.txt"))
        assert http.get("/").code == 303
        fresh = ConsoleHTTP(proc.ports["WEB"])
        assert fresh.login(old) == 401
        assert fresh.login("the new password") == 303
    finally:
        proc.stop()


def test_clear_session_is_durable_across_a_restart(tmp_path: Any) -> None:
    """Cleared persistent session: queue and subscriptions are gone, also after a restart."""
    data = str(tmp_path / "data")
    proc = web_broker_process(data).start()
    try:
        sleeper = Paho(proc.mqtt_port, "cs-sleeper", clean=False)
        sleeper.subscribe("cs/#", 1)
        sleeper.stop()
        publisher = Paho(proc.mqtt_port, "cs-publisher")
        publisher.publish("cs/1", b"queued while away", 1)
        publisher.stop()
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(data)) == 303
        row = http.get("/api/sessions", q="cs-sleeper").json()["items"][0]
        assert row["queued"] == 1 and row["online"] is False
        assert http.post("/sessions/clear", client_id="cs-sleeper").code == 303
        assert http.get("/api/sessions", q="cs-sleeper").json()["total"] == 0
        proc.wait_for_line(r"audit: user='admin' action=clear-session")
    finally:
        proc.stop()
    proc = web_broker_process(data).start()
    try:
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(data)) == 303
        assert http.get("/api/sessions", q="cs-sleeper").json()["total"] == 0
        back = Paho(proc.mqtt_port, "cs-sleeper", clean=False)
        assert back.session_present is False
        back.subscribe("marker/#", 1)
        _expect_marker_first(back, http, "marker/cs")   # nothing queued came before it
        back.stop()
    finally:
        proc.stop()


def test_deleted_retained_messages_stay_deleted_after_a_restart(tmp_path: Any) -> None:
    """Delete one and delete-by-filter (with its confirm count) survive a restart."""
    data = str(tmp_path / "data")
    proc = web_broker_process(data).start()
    try:
        publisher = Paho(proc.mqtt_port, "rt-publisher")
        for topic in ("rt/a/1", "rt/a/2", "rt/a/3"):
            publisher.publish(topic, b"v", 1, True)
        publisher.stop()
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(data)) == 303
        assert http.post("/publish", topic="rt/keep", payload="kept", qos="1",
                         retain="1").code == 303
        assert http.post("/retained/delete", topic="rt/a/1").code == 303
        confirm = http.get("/retained/delete-matching", filter="rt/a/#").text
        assert 'name="expected" value="2"' in confirm
        assert http.post("/retained/delete-matching", filter="rt/a/#",
                         expected="2").code == 303
        topics = [r["topic"] for r in http.get("/api/retained", filter="rt/#").json()["items"]]
        assert topics == ["rt/keep"]
    finally:
        proc.stop()
    proc = web_broker_process(data).start()
    try:
        http = ConsoleHTTP(proc.ports["WEB"])
        assert http.login(initial_password(data)) == 303
        topics = [r["topic"] for r in http.get("/api/retained", filter="rt/#").json()["items"]]
        assert topics == ["rt/keep"]
        reader = Paho(proc.mqtt_port, "rt-reader")
        reader.subscribe("rt/#", 1)
        first = reader.expect()
        assert (first.topic, first.payload, first.retain) == ("rt/keep", b"kept", True)
        _expect_marker_first(reader, http, "rt/marker")
        reader.stop()
    finally:
        proc.stop()
