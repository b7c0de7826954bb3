"""The console over StubTreq: every route and action, login, CSRF, tokens, headers,
escaping and the live feed — against a real ``Broker`` on a ``task.Clock``."""

from __future__ import annotations

import re
from typing import Any

import console_support
import pytest
from console_support import (
    PASSWORD,
    Client,
    audit_text,
    connect,
    connect_amqp,
    make_console,
    sse_frames,
)

from mqttamqp.console.feed import EventStream
from mqttamqp.core.auth import Identity
from mqttamqp.core.clients.connections import LinkInfo
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.persistence import DeleteRetained, DeleteSession

PAGES = ["/", "/clients", "/client?key=mqtt:x", "/sessions", "/retained",
         "/retained/message?topic=a", "/retained/delete-matching?filter=%23", "/wills",
         "/traffic", "/publish", "/topics", "/subscriptions", "/bans", "/tail"]
APIS = ["/api/", "/api/topics", "/api/subscriptions", "/api/bans", "/api/tail",
        "/api/overview", "/api/clients", "/api/client?key=mqtt:x", "/api/sessions",
        "/api/retained", "/api/retained/message?topic=a", "/api/retained/count?filter=%23",
        "/api/wills", "/api/traffic", "/api/whoami", "/api/events"]
ACTIONS = ["/clients/force-will", "/clients/disconnect", "/sessions/clear",
           "/retained/delete", "/retained/delete-matching", "/wills/fire", "/wills/discard",
           "/publish", "/clients/bulk", "/bans/add", "/bans/remove"]


@pytest.fixture
def env(tmp_path: Any) -> Any:
    console, service, clock = make_console(tmp_path)
    client = Client(console)
    return console, service.broker, clock, client


@pytest.fixture
def logged_in(env: Any) -> Any:
    client = env[3]
    assert client.login().code == 303
    return env


def subscriber(broker: Any, client_id: str, topic_filter: str) -> console_support.FakeLink:
    return connect(broker, client_id, subscriptions=(topic_filter,))


# -- login required ---------------------------------------------------------------------


@pytest.mark.parametrize("path", PAGES)
def test_pages_redirect_to_login_without_a_session(env: Any, path: str) -> None:
    """Every HTML page sends an anonymous visitor to the login form (and back after)."""
    _, _, _, client = env
    reply = client.get(path)
    assert reply.code == 303
    assert reply.header("location").startswith("/login?next=%2F")


@pytest.mark.parametrize("path", APIS)
def test_api_answers_401_without_credentials(env: Any, path: str) -> None:
    """Every API route answers 401 JSON with a Bearer challenge to anonymous callers."""
    _, _, _, client = env
    reply = client.get(path)
    assert reply.code == 401
    assert reply.json() == {"error": "login required"}
    assert reply.header("www-authenticate").startswith("Bearer")


@pytest.mark.parametrize("path", ACTIONS)
def test_actions_refuse_anonymous_posts(env: Any, path: str) -> None:
    """Form POSTs redirect to login and API POSTs get 401 when nobody is logged in."""
    _, broker, _, client = env
    broker.publish(Message("a", b"x", 0, True))
    assert client.post(path, csrf=False, topic="a").code == 303
    assert client.post_json("/api" + path, {"topic": "a"}).code == 401
    assert broker.retained.get("a") is not None


def test_login_sets_a_fresh_hardened_cookie(env: Any) -> None:
    """Login rotates the session id; the cookie is HttpOnly, SameSite=Strict, not Secure on http."""
    console, _, _, client = env
    page = client.get("/login")
    before = re.search(r"mqttamqp_console=([^;]+)", page.header("set-cookie")).group(1)
    reply = client.login()
    assert reply.code == 303 and reply.header("location") == "/"
    cookie = reply.header("set-cookie")
    after = re.search(r"mqttamqp_console=([^;]+)", cookie).group(1)
    assert after != before
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie
    assert console.gate.sessions.get(before) is None
    assert client.get("/").code == 200


def test_cookie_is_secure_under_tls(tmp_path: Any, monkeypatch: Any) -> None:
    """Over https the session cookie carries Secure and responses carry HSTS."""
    monkeypatch.setattr(console_support, "BASE", "https://console.test")
    console, _, _ = make_console(tmp_path)
    client = Client(console)
    reply = client.login()
    assert "Secure" in reply.header("set-cookie")
    assert reply.header("strict-transport-security")


def test_wrong_password_and_unknown_user_are_refused(env: Any) -> None:
    """A wrong password or unknown user gets 401 and the login form again, no session."""
    _, _, _, client = env
    assert client.login(password="wrong").code == 401
    assert client.login(user="nobody").code == 401
    assert client.get("/").code == 303


def test_login_form_without_csrf_is_refused(env: Any) -> None:
    """A login POST without the form's CSRF token gets 403, even with the right password."""
    _, _, _, client = env
    client.get("/login")
    reply = client.request("POST", "/login", data={"username": "admin", "password": PASSWORD})
    assert reply.code == 403
    assert client.get("/").code == 303


def test_repeated_failures_slow_down_logins(env: Any) -> None:
    """After three failures the next attempts are refused (429) until the back-off passes."""
    _, _, clock, client = env
    for _ in range(3):
        assert client.login(password="wrong").code == 401
    reply = client.login()                                  # right password, too soon
    assert reply.code == 429 and reply.header("retry-after") == "1"
    assert "Too many failed attempts" in reply.text
    clock.advance(1.1)
    assert client.login(password="wrong").code == 401       # checked again; back-off doubles
    assert client.login().header("retry-after") == "2"
    clock.advance(2.1)
    assert client.login().code == 303


def test_idle_sessions_expire_and_background_requests_do_not_keep_them(env: Any) -> None:
    """A login idle past the timeout ends; live refreshes (X-Background) are not activity."""
    console, _, clock, client = env
    client.login()
    clock.advance(console.gate.sessions.idle_timeout - 10)
    assert client.request("GET", "/clients?partial=1",
                          headers={"X-Background": ["1"]}).code == 200
    clock.advance(20)
    assert client.get("/").code == 303


def test_password_change_ends_open_sessions(env: Any) -> None:
    """Changing a user's password (e.g. with mqttamqp-admin) logs out their sessions."""
    console, _, clock, client = env
    client.login()
    clock.advance(1)
    console.users.set_password("admin", "another password", **console_support.CHEAP)
    assert client.get("/").code == 303
    assert client.login(password="another password").code == 303


def test_logout_ends_the_session(logged_in: Any) -> None:
    """Logout (a CSRF-protected POST) ends the session and clears the cookie."""
    _, _, _, client = logged_in
    assert client.post("/logout", csrf=False).code == 403
    reply = client.post("/logout")
    assert reply.code == 303 and "Max-Age=0" in reply.header("set-cookie")
    assert client.get("/").code == 303


def test_next_parameter_never_leaves_the_site(env: Any) -> None:
    """Login's next= only accepts local paths (no open redirect)."""
    _, _, _, client = env
    page = client.get("/login")
    token = re.search(r'name="csrf_token" value="([^"]*)"', page.text).group(1)
    reply = client.request("POST", "/login", data={
        "csrf_token": token, "username": "admin", "password": PASSWORD,
        "next": "//evil.example/"})
    assert reply.code == 303 and reply.header("location") == "/"


def test_login_page_when_logged_in_goes_home(logged_in: Any) -> None:
    """Visiting /login while logged in goes to the console."""
    _, _, _, client = logged_in
    assert client.get("/login").header("location") == "/"


# -- security headers, static, errors ------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/login", "/api/overview", "/static/console.css",
                                  "/nope"])
def test_security_headers_on_every_response(logged_in: Any, path: str) -> None:
    """CSP without inline script, frame denial, nosniff and no caching of pages."""
    _, _, _, client = logged_in
    reply = client.get(path)
    csp = reply.header("content-security-policy")
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert reply.header("x-frame-options") == "DENY"
    assert reply.header("x-content-type-options") == "nosniff"
    expected = "no-cache" if path.startswith("/static/") else "no-store"
    assert reply.header("cache-control") == expected


def test_static_files_are_served_without_login(env: Any) -> None:
    """CSS and JS load on the login page; nothing else under /static/ is reachable."""
    _, _, _, client = env
    css = client.get("/static/console.css")
    assert css.code == 200 and css.header("content-type").startswith("text/css")
    js = client.get("/static/console.js")
    assert js.code == 200 and js.header("content-type").startswith("text/javascript")
    assert client.get("/static/..%2Fpyproject.toml").code == 404
    assert client.get("/static/missing.css").code == 404
    assert client.get("/static/base.html").code == 404


def test_unknown_routes_and_methods(logged_in: Any) -> None:
    """404 and 405 come back as pages (HTML) or JSON (under /api/)."""
    _, _, _, client = logged_in
    assert client.get("/nope").code == 404
    assert client.get("/api/nope").json() == {"error": "no such page"}
    assert client.get("/clients/force-will").code == 405
    assert client.get("/api/sessions/clear").code == 405


def test_templates_have_no_inline_script_or_safe_filter() -> None:
    """The CSP would block inline script anyway; templates must not need it or |safe."""
    from mqttamqp.console.rendering import templates_dir
    for path in templates_dir().glob("*.html"):
        text = path.read_text()
        assert "|safe" not in text.replace(" ", ""), path
        assert re.search(r"<script(?![^>]*\bsrc=)", text) is None, path
        assert re.search(r"\son[a-z]+=", text) is None, path   # no inline event handlers


# -- CSRF and tokens --------------------------------------------------------------------


def test_form_posts_need_the_csrf_token(logged_in: Any, audit: Any) -> None:
    """A logged-in POST without or with a wrong CSRF token is refused with 403, no effect."""
    _, broker, _, client = logged_in
    broker.publish(Message("keep/me", b"1", 0, True))
    assert client.post("/retained/delete", csrf=False, topic="keep/me").code == 403
    reply = client.request("POST", "/retained/delete",
                           data={"topic": "keep/me", "csrf_token": "forged"})
    assert reply.code == 403
    assert broker.retained.get("keep/me") is not None
    assert not audit


def test_api_posts_with_a_cookie_need_the_csrf_header(logged_in: Any) -> None:
    """JSON API POSTs on a cookie session need X-CSRF-Token; with it they work."""
    _, broker, _, client = logged_in
    broker.publish(Message("keep/me", b"1", 0, True))
    assert client.post_json("/api/retained/delete", {"topic": "keep/me"}).code == 403
    token = client.get("/api/whoami").json()["csrf_token"]
    reply = client.post_json("/api/retained/delete", {"topic": "keep/me"},
                             {"X-CSRF-Token": token})
    assert reply.code == 200 and reply.json()["deleted"] == 1


def test_bearer_tokens_for_scripts(env: Any) -> None:
    """A bearer token reads and acts without CSRF; bad tokens get 401, read-only ones 403."""
    console, broker, _, client = env
    token = console.users.create_token("admin", "ci")
    ro = console.users.create_token("admin", "dashboards", read_only=True)
    auth = {"Authorization": [f"Bearer {token}"]}
    reply = client.request("GET", "/api/whoami", headers=auth)
    assert reply.json()["user"] == "admin" and reply.json()["via"] == "token"
    bad = client.request("GET", "/api/clients", headers={"Authorization": ["Bearer mqa_nope"]})
    assert bad.code == 401
    basic = client.request("GET", "/api/clients", headers={"Authorization": ["Basic eDp5"]})
    assert basic.code == 401
    broker.publish(Message("t/1", b"1", 0, True))
    reply = client.post_json("/api/retained/delete", {"topic": "t/1"},
                             {"Authorization": f"Bearer {ro}"})
    assert reply.code == 403
    reply = client.post_json("/api/retained/delete", {"topic": "t/1"},
                             {"Authorization": f"Bearer {token}"})
    assert reply.code == 200
    assert client.request("GET", "/clients", headers=auth).code == 303  # pages: cookie only
    console.users.revoke_token("admin", console.users.get("admin").tokens[0].id)
    assert client.request("GET", "/api/whoami", headers=auth).code == 401


# -- pages and their JSON -------------------------------------------------------------


def test_overview_page_and_api(logged_in: Any) -> None:
    """Overview shows listeners, version, clients by protocol, sessions, retained, wills, rates."""
    console, broker, clock, client = logged_in
    connect(broker, "a31", protocol="mqtt3.1")
    connect(broker, "b311", clean=False, will=WillMessage("b311", "w", b"x", 0, False))
    connect_amqp(broker, "app", 1, ())
    broker.publish(Message("r/1", b"abc", 0, True))
    page = client.get("/")
    assert page.code == 200
    for text in ("Listeners", "tcp:1883", "127.0.0.1:8080", "Message rate", "rate-chart"):
        assert text in page.text
    console.overview.feed.tick()
    for _ in range(3):
        broker.publish(Message("x", b"y", 0, False))
    clock.advance(1)
    console.overview.feed.tick()
    data = client.get("/api/overview").json()
    assert data["clients"] == {"connected": 3, "mqtt31": 1, "mqtt311": 1, "mqtt5": 0, "amqp": 1,
                               "amqp091": 0, "maximum": 3, "total": 3, "refused": 0}
    assert data["sessions"]["persistent"] == 1
    assert data["retained"]["count"] == 1 and data["wills"] == 1
    assert data["messages"]["queued"] == 0   # ($SYS messages/queued; QoS 0 never waits)
    assert data["rates"]["in"] == 3.0
    assert data["history"][-1]["in"] == 3.0
    assert {"kind": "MQTT", "description": "tcp:1883", "address": "127.0.0.1:1883"} \
        in data["listeners"]


def test_overview_shows_failing_storage_and_its_recovery(tmp_path: Any) -> None:
    """The Storage card and /api/overview say when commits fail, with the error,
    and go back to ok once one succeeds (issue 10, item 3)."""
    console, service, _clock = make_console(tmp_path)
    client = Client(console)
    assert client.login().code == 303
    assert client.get("/api/overview").json()["health"]["storage"] == "ok"
    service.store.failing = True
    service.broker.publish(Message("r/1", b"abc", 1, True), wait=False)
    health = client.get("/api/overview").json()["health"]
    assert health["storage"] == "failing" and health["storage_failures"] == 1
    assert "No space left on device" in health["storage_error"]
    assert "No space left on device" in client.get("/").text
    service.store.failing = False
    service.broker.publish(Message("r/2", b"abc", 1, True), wait=False)
    assert client.get("/api/overview").json()["health"] == {
        "storage": "ok", "storage_failures": 1, "storage_error": ""}


def test_clients_search_sort_and_page(logged_in: Any) -> None:
    """The clients table searches id/address/user, sorts, and pages server-side."""
    _, broker, _, client = logged_in
    connect(broker, "alpha", remote="192.168.1.5:1000", user="operator")
    connect(broker, "bravo", remote="10.1.1.1:2000")
    connect(broker, "charlie", remote="10.1.1.2:3000", user="alice")
    ids = lambda r: [i["client_id"] for i in r.json()["items"]]  # noqa: E731
    assert ids(client.get("/api/clients")) == ["alpha", "bravo", "charlie"]
    assert ids(client.get("/api/clients", q="192.168")) == ["alpha"]
    assert ids(client.get("/api/clients", q="ALICE")) == ["charlie"]
    assert ids(client.get("/api/clients", sort="remote", dir="desc")) == [
        "alpha", "charlie", "bravo"]
    page = client.get("/api/clients", per_page=25, page=1).json()
    assert page["total"] == 3 and page["pages"] == 1
    html = client.get("/clients", q="bravo").text
    assert "bravo" in html and "charlie" not in html
    partial = client.get("/clients", partial=1).text
    assert "<html" not in partial and "client-table" in partial


def test_ten_thousand_clients_are_paged_on_the_server(logged_in: Any) -> None:
    """With 10,000 connections a page renders 50 rows and the right total."""
    _, broker, _, client = logged_in
    for i in range(10_000):
        link = console_support.FakeLink(broker, f"dev-{i:05d}", since=1.0)
        broker.register_connection(link.key, link, link.protocol)
    data = client.get("/api/clients", page=3, per_page=50).json()
    assert data["total"] == 10_000 and data["pages"] == 200 and len(data["items"]) == 50
    assert data["items"][0]["client_id"] == "dev-00100"
    html = client.get("/clients", page=200).text
    assert html.count('href="/client?key=') == 50
    assert "Page 200 of 200" in html


def test_client_detail_shows_session_will_and_inflight(logged_in: Any) -> None:
    """Detail: connection facts, subscriptions with QoS, the will (text or hex), in-flight."""
    _, broker, _, client = logged_in
    will = WillMessage("dev", "status/dev", b"\x00\x01offline", 1, True)
    dev = connect(broker, "dev", clean=False, will=will, user="u1")
    broker.subscribe(dev.session, Identity("dev"), [("cmd/#", 2), ("cfg", 0)])
    broker.publish(Message("cmd/x", b"hello", 1, False))
    html = client.get("/client", key="mqtt:dev").text
    for text in ("status/dev", "cmd/#", "hex", "00 01 6f 66", "In flight", "hello",
                 "persistent session", "u1"):
        assert text in html, text
    data = client.get("/api/client", key="mqtt:dev").json()
    assert data["session"]["subscriptions"] == [{"filter": "cfg", "qos": 0},
                                                {"filter": "cmd/#", "qos": 2}]
    assert data["wills"][0]["topic"] == "status/dev" and data["wills"][0]["retain"] is True
    assert data["session"]["inflight"][0]["topic"] == "cmd/x"
    assert data["has_will"] is True and data["online"] is True


def test_client_detail_shows_amqp_links(logged_in: Any) -> None:
    """An AMQP connection's links appear with every field, from ConnectionInfo.links."""
    _, broker, _, client = logged_in
    links = (LinkInfo("recv-1", "sender", "sensors/+/temp", "unsettled", "first", 20, 3, 1234),
             LinkInfo("send-1", "receiver", "cmd/pump", "settled", "second", 5, 0, 7))
    connect_amqp(broker, "analytics", 4, links)
    html = client.get("/client", key="amqp:4").text
    for text in ("AMQP links", "recv-1", "sensors/+/temp", "unsettled", "first", "1,234",
                 "send-1", "cmd/pump", "settled", "second"):
        assert text in html, text
    # The role as the client sees it: the broker's sender is the client's receiver.
    roles = re.findall(r"<td>client&#39;s (\w+)</td>", html)
    assert roles == ["receiver", "sender"]
    data = client.get("/api/client", key="amqp:4").json()
    assert data["link_list"][0] == {
        "name": "recv-1", "role": "sender", "address": "sensors/+/temp",
        "snd_settle_mode": "unsettled", "rcv_settle_mode": "first", "credit": 20,
        "unsettled": 3, "delivered": 1234, "session": 0}
    row = client.get("/api/clients").json()["items"][0]
    assert row["protocol"] == "amqp" and row["links"] == 2
    assert "2 links" in client.get("/clients").text


def test_client_detail_of_an_offline_session_and_unknown_client(logged_in: Any) -> None:
    """An offline persistent session has a detail page; an unknown key is a 404."""
    _, broker, _, client = logged_in
    dev = connect(broker, "sleepy", clean=False, subscriptions=("a/b",))
    broker.end_session(dev, dev.session, clean=True, reason="bye")
    broker.unregister_connection(dev.key, dev)
    html = client.get("/client", session="sleepy").text
    assert "offline" in html and "a/b" in html and "Clear session" in html
    assert client.get("/client", key="mqtt:sleepy").code == 200
    assert client.get("/client", key="amqp:99").code == 404
    assert client.get("/api/client", key="amqp:99").code == 404
    assert client.get("/api/client").code == 400


def test_sessions_page_lists_offline_persistent_sessions(logged_in: Any) -> None:
    """Sessions: persistent sessions online and offline, with queue depth and drops."""
    _, broker, _, client = logged_in
    off = connect(broker, "offline-1", clean=False, subscriptions=("q/#",))
    broker.end_session(off, off.session, clean=True, reason="bye")
    broker.unregister_connection(off.key, off)
    broker.publish(Message("q/1", b"12345", 1, False))
    connect(broker, "online-1", clean=False)
    connect(broker, "clean-1")
    data = client.get("/api/sessions").json()
    assert [s["client_id"] for s in data["items"]] == ["offline-1", "online-1"]
    first = data["items"][0]
    assert first["online"] is False and first["queued"] == 1 and first["queued_bytes"] == 5
    assert [s["client_id"] for s in
            client.get("/api/sessions", state="offline").json()["items"]] == ["offline-1"]
    html = client.get("/sessions").text
    assert "offline-1" in html and "clean-1" not in html
    assert "<html" not in client.get("/sessions", partial=1).text


def test_retained_browse_and_payload_views(logged_in: Any) -> None:
    """Retained: browse by filter, view payload as text, JSON (pretty) and hex."""
    _, broker, _, client = logged_in
    broker.publish(Message("plant/1/temp", b'{"c": 21.5, "ok": true}', 1, True, "sensor-1"))
    broker.publish(Message("plant/2/temp", b"\xff\xfe", 0, True))
    broker.publish(Message("other", b"x", 0, True))
    data = client.get("/api/retained", filter="plant/+/temp").json()
    assert [r["topic"] for r in data["items"]] == ["plant/1/temp", "plant/2/temp"]
    html = client.get("/retained", filter="plant/#").text
    assert "plant/1/temp" in html and "other" not in html and "Delete all 2 matching" in html
    pretty = client.get("/retained/message", topic="plant/1/temp").text
    assert "&#34;c&#34;: 21.5" in pretty and "\n  " in pretty
    assert "7b 22 63" in client.get("/retained/message", topic="plant/1/temp",
                                    view="hex").text
    assert "fffe" not in client.get("/retained/message", topic="plant/2/temp").text
    message = client.get("/api/retained/message", topic="plant/2/temp").json()
    assert message["payload_base64"] == "//4=" and message["payload_text"] is None
    assert client.get("/retained", filter="a/#/b").code == 200
    assert "Invalid topic filter" in client.get("/retained", filter="a/#/b").text
    assert client.get("/api/retained", filter="a/#/b").code == 400
    assert client.get("/retained/message", topic="nope").code == 404


def test_wills_page_lists_mqtt_and_amqp_wills(logged_in: Any) -> None:
    """Wills: every stored will with origin and whether its owner is connected."""
    _, broker, _, client = logged_in
    connect(broker, "m1", will=WillMessage("m1", "w/m1", b"bye", 1, False))
    broker.set_will(WillMessage("gone", "w/gone", b"x", 0, True))
    connect_amqp(broker, "app", 2, (), will_owner="app-will-link")
    items = {w["owner"]: w for w in client.get("/api/wills").json()["items"]}
    assert items["m1"]["owner_connected"] is True and items["m1"]["origin"] == "mqtt"
    assert items["gone"]["owner_connected"] is False
    assert items["app-will-link"]["origin"] == "amqp"
    assert items["app-will-link"]["owner_connected"] is True
    html = client.get("/wills").text
    assert "w/m1" in html and "AMQP" in html and "3 wills" in html


def test_publish_page_and_action(logged_in: Any, audit: Any) -> None:
    """Publish: text, hex and base64 payloads reach subscribers; bad input is refused."""
    _, broker, _, client = logged_in
    sub = subscriber(broker, "sub", "test/#")
    assert 'name="topic"' in client.get("/publish").text
    reply = client.post("/publish", topic="test/a", payload="hi", qos="1", retain="1")
    assert reply.code == 303
    assert "Published 2 byte(s)" in client.get("/publish").text
    assert sub.sent[-1].topic == "test/a" and sub.sent[-1].payload == b"hi"
    assert broker.retained.get("test/a") is not None
    assert client.post("/publish", topic="test/b", payload="00ff", encoding="hex").code == 303
    assert sub.sent[-1].payload == b"\x00\xff"
    token = client.get("/api/whoami").json()["csrf_token"]
    hdr = {"X-CSRF-Token": token}
    ok = client.post_json("/api/publish", {"topic": "test/c", "payload": "AAE=",
                                           "encoding": "base64", "qos": 2}, hdr)
    assert ok.code == 200 and sub.sent[-1].payload == b"\x00\x01"
    assert client.post_json("/api/publish", {"topic": "a/+", "payload": ""}, hdr).code == 400
    assert client.post_json("/api/publish", {"topic": "a", "qos": 3}, hdr).code == 400
    assert client.post_json("/api/publish", {"topic": "a", "payload": "zz",
                                             "encoding": "hex"}, hdr).code == 400
    client.post("/publish", topic="bad/#", payload="x")
    assert "invalid topic" in client.get("/publish").text
    # $SYS is the broker's own, as for clients: a watcher would keep a false value
    assert client.post_json("/api/publish", {"topic": "$SYS/broker/clients/connected",
                                             "payload": "999"}, hdr).code == 400
    assert not broker.retained.holds("$SYS/broker/clients/connected", b"999")
    assert "action=publish" in audit_text(audit) and "user='admin'" in audit_text(audit)


# -- actions --------------------------------------------------------------------------


def test_force_will_publishes_and_disconnects(logged_in: Any, audit: Any) -> None:
    """Force will: the will reaches subscribers, the client is closed, the will is used up."""
    _, broker, _, client = logged_in
    sub = subscriber(broker, "watcher", "status/#")
    dev = connect(broker, "dev", will=WillMessage("dev", "status/dev", b"lost", 0, False))
    reply = client.post("/clients/force-will", key="mqtt:dev", back="/client?key=mqtt%3Adev")
    assert reply.code == 303 and reply.header("location") == "/clients"
    assert [m.payload for m in sub.sent] == [b"lost"]
    assert dev.closed and "dev" not in broker.wills and "mqtt:dev" not in broker.connections
    assert "dev" not in broker.sessions
    assert "Published the will of dev and disconnected it" in client.get("/clients").text
    text = audit_text(audit)
    assert "user='admin' action=force-will" in text and "'mqtt:dev'" in text


def test_force_will_keeping_the_client_connected(logged_in: Any) -> None:
    """Force will, keep connected: a copy is published; client and its will stay."""
    _, broker, _, client = logged_in
    sub = subscriber(broker, "watcher", "status/#")
    dev = connect(broker, "dev", will=WillMessage("dev", "status/dev", b"lost", 0, False))
    token = client.get("/api/whoami").json()["csrf_token"]
    reply = client.post_json("/api/clients/force-will",
                             {"key": "mqtt:dev", "keep_connected": True},
                             {"X-CSRF-Token": token})
    assert reply.json() == {"ok": True, "published": 1, "disconnected": False,
                            "message": reply.json()["message"]}
    assert [m.payload for m in sub.sent] == [b"lost"]
    assert not dev.closed and "dev" in broker.wills and "mqtt:dev" in broker.connections


def test_force_will_without_a_will_or_client(logged_in: Any) -> None:
    """Forcing a will a client does not have is a 409; an unknown client is a 404."""
    _, broker, _, client = logged_in
    dev = connect(broker, "nowill")
    token = client.get("/api/whoami").json()["csrf_token"]
    hdr = {"X-CSRF-Token": token}
    assert client.post_json("/api/clients/force-will", {"key": "mqtt:nowill"},
                            hdr).code == 409
    assert client.post_json("/api/clients/force-will", {"key": "mqtt:ghost"}, hdr).code == 404
    client.post("/clients/force-will", key="mqtt:nowill")
    assert "has no will" in client.get("/clients").text
    assert not dev.closed


def test_force_will_of_an_amqp_connection(logged_in: Any) -> None:
    """An AMQP connection's will (keyed by link name) is published and the connection closed."""
    _, broker, _, client = logged_in
    sub = subscriber(broker, "watcher", "amqp/#")
    conn = connect_amqp(broker, "app", 7, (), will_owner="will-link")
    assert client.post("/clients/force-will", key="amqp:7").code == 303
    assert [m.topic for m in sub.sent] == ["amqp/will"]
    assert conn.closed and "will-link" not in broker.wills


@pytest.mark.parametrize("with_will", [True, False])
def test_disconnect_with_or_without_will(logged_in: Any, with_will: bool) -> None:
    """Disconnect closes the client; its will is published only when asked."""
    _, broker, _, client = logged_in
    sub = subscriber(broker, "watcher", "status/#")
    dev = connect(broker, "dev", clean=False,
                  will=WillMessage("dev", "status/dev", b"lost", 0, False))
    form = {"key": "mqtt:dev"}
    if with_will:
        form["with_will"] = "1"
    assert client.post("/clients/disconnect", **form).code == 303
    assert dev.closed and "mqtt:dev" not in broker.connections
    assert [m.payload for m in sub.sent] == ([b"lost"] if with_will else [])
    assert "dev" not in broker.wills
    assert broker.sessions["dev"].connection is None          # persistent session stays
    assert client.post_json("/api/clients/disconnect", {"key": "mqtt:dev"}).code == 403


def test_clear_session_removes_it_durably(logged_in: Any, audit: Any) -> None:
    """Clear session: disconnects, removes subscriptions, queue and session from the store."""
    _, broker, _, client = logged_in
    dev = connect(broker, "dev", clean=False, subscriptions=("q/#",))
    broker.publish(Message("q/1", b"x", 1, False))
    reply = client.post("/sessions/clear", client_id="dev", back="/sessions")
    assert reply.code == 303 and reply.header("location") == "/sessions"
    assert dev.closed and "dev" not in broker.sessions
    assert DeleteSession("dev") in broker.store.submitted
    assert not broker.trie.match("q/1")
    assert "Cleared the session of dev" in client.get("/sessions").text
    assert client.post_json("/api/sessions/clear", {"client_id": "dev"},
                            {"Authorization": "Bearer x"}).code == 401
    assert "action=clear-session" in audit_text(audit)


def test_clear_session_via_api_and_unknown(logged_in: Any) -> None:
    """The API clears an offline session; an unknown one is a 404."""
    _, broker, _, client = logged_in
    off = connect(broker, "off", clean=False)
    broker.end_session(off, off.session, clean=True, reason="bye")
    hdr = {"X-CSRF-Token": client.get("/api/whoami").json()["csrf_token"]}
    reply = client.post_json("/api/sessions/clear", {"client_id": "off"}, hdr)
    assert reply.code == 200 and reply.json()["was_connected"] is False
    assert client.post_json("/api/sessions/clear", {"client_id": "off"}, hdr).code == 404


def test_delete_retained_one_and_by_filter(logged_in: Any, audit: Any) -> None:
    """Delete one retained message, then all matching a filter after the confirm step."""
    _, broker, _, client = logged_in
    for t in ("r/1", "r/2", "r/3", "s/1"):
        broker.publish(Message(t, b"v", 0, True))
    assert client.post("/retained/delete", topic="r/1").code == 303
    assert broker.retained.get("r/1") is None
    assert DeleteRetained("r/1") in broker.store.submitted
    confirm = client.get("/retained/delete-matching", filter="r/#").text
    assert "Delete 2 retained messages?" in confirm and 'name="expected" value="2"' in confirm
    assert client.post("/retained/delete-matching", filter="r/#", expected="2").code == 303
    assert broker.retained.get("r/2") is None and broker.retained.get("s/1") is not None
    assert "Deleted 2 retained message(s)" in client.get("/retained").text
    hdr = {"X-CSRF-Token": client.get("/api/whoami").json()["csrf_token"]}
    assert client.get("/api/retained/count", filter="#").json()["count"] == 1
    stale = client.post_json("/api/retained/delete-matching", {"filter": "#", "expected": 5},
                             hdr)
    assert stale.code == 409 and broker.retained.get("s/1") is not None
    assert client.post_json("/api/retained/delete-matching", {"filter": "a/#/b"},
                            hdr).code == 400
    assert client.post_json("/api/retained/delete", {"topic": "nope"}, hdr).code == 404
    done = client.post_json("/api/retained/delete-matching", {"filter": "#"}, hdr)
    assert done.json()["deleted"] == 1 and len(broker.retained) == 0
    assert client.get("/retained/delete-matching", filter="a/#/b").code == 400
    assert "action=delete-retained-matching" in audit_text(audit)


def test_fire_and_discard_stored_wills(logged_in: Any) -> None:
    """Wills page actions: publish-and-remove, or remove without publishing."""
    _, broker, _, client = logged_in
    sub = subscriber(broker, "watcher", "w/#")
    broker.set_will(WillMessage("a", "w/a", b"A", 0, False))
    broker.set_will(WillMessage("b", "w/b", b"B", 0, False))
    assert client.post("/wills/fire", owner="a").code == 303
    assert client.post("/wills/discard", owner="b").code == 303
    assert [m.payload for m in sub.sent] == [b"A"]
    assert broker.wills == {}
    hdr = {"X-CSRF-Token": client.get("/api/whoami").json()["csrf_token"]}
    assert client.post_json("/api/wills/fire", {"owner": "a"}, hdr).code == 404
    assert client.post_json("/api/wills/discard", {"owner": "b"}, hdr).code == 404


def test_bad_json_and_parameters(logged_in: Any) -> None:
    """Malformed JSON bodies and non-numeric parameters are 400s, not 500s."""
    _, _, _, client = logged_in
    token = client.get("/api/whoami").json()["csrf_token"]
    reply = client.request("POST", "/api/publish", data=b"{nope",
                           headers={"Content-Type": ["application/json"],
                                    "X-CSRF-Token": [token]})
    assert reply.code == 400
    reply = client.request("POST", "/api/publish", data=b"[1]",
                           headers={"Content-Type": ["application/json"],
                                    "X-CSRF-Token": [token]})
    assert reply.code == 400
    assert client.get("/api/clients", page="x").code == 400


# -- escaping -----------------------------------------------------------------------------

EVIL_ID = "<script>alert('id')</script>"
EVIL_TOPIC = 'x/"><img src=x onerror=alert(1)>'
EVIL_PAYLOAD = b'<script>alert("payload")</script>"><img src=x onerror=alert(2)>'


def test_client_data_is_escaped_everywhere(logged_in: Any) -> None:
    """Ids, users, topics, payloads and link names with markup render inert on every page."""
    _, broker, _, client = logged_in
    dev = connect(broker, EVIL_ID, clean=False, user='"><img src=x onerror=alert(3)>',
                  will=WillMessage(EVIL_ID, EVIL_TOPIC, EVIL_PAYLOAD, 1, True))
    broker.subscribe(dev.session, Identity(EVIL_ID), [(EVIL_TOPIC, 1)])
    broker.publish(Message(EVIL_TOPIC, EVIL_PAYLOAD, 1, True, EVIL_ID))
    connect_amqp(broker, EVIL_ID + "-amqp", 3, (LinkInfo(
        "<script>link</script>", "sender", EVIL_TOPIC, "unsettled", "first", 1, 0, 0),))
    from urllib.parse import quote
    pages = ["/", "/clients", "/clients?q=" + quote(EVIL_ID), "/client?key=" + quote(
        "mqtt:" + EVIL_ID), "/client?key=amqp%3A3", "/sessions", "/retained",
        "/retained/message?topic=" + quote(EVIL_TOPIC),
        "/retained/delete-matching?filter=" + quote(EVIL_TOPIC), "/wills"]
    for path in pages:
        html = client.get(path).text
        assert "<script>alert" not in html, path
        assert "<img" not in html, path
        assert "<script>link" not in html, path
    detail = client.get("/client?key=" + quote("mqtt:" + EVIL_ID)).text
    assert "&lt;script&gt;alert(&#39;id&#39;)&lt;/script&gt;" in detail
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in detail
    # The flash message after an action names the client; it is escaped too.
    client.post("/clients/force-will", key="mqtt:" + EVIL_ID, keep_connected="1")
    flashed = client.get("/clients").text
    assert "Published the will of &lt;script&gt;" in flashed
    data = client.get("/api/client", key="mqtt:" + EVIL_ID)
    assert data.header("content-type").startswith("application/json")
    assert data.json()["client_id"] == EVIL_ID


# -- live feed --------------------------------------------------------------------------


def test_event_stream_sends_stats_every_second_and_ends_at_logout(logged_in: Any) -> None:
    """SSE: history and stats at once, stats each tick, a logout event when the login ends."""
    console, broker, clock, client = logged_in
    import treq

    d = client.treq.get(console_support.BASE + "/api/events")
    client.treq.flush()
    response = console_support._result(d)
    assert response.code == 200
    assert response.headers.getRawHeaders("content-type")[0].startswith("text/event-stream")
    chunks: list[bytes] = []
    done = treq.collect(response, chunks.append)
    client.treq.flush()
    assert [e for e, _ in sse_frames(chunks)] == ["history", "stats"]
    console.overview.feed.start()
    connect(broker, "newcomer")
    clock.advance(1)
    client.treq.flush()
    frames = sse_frames(chunks)
    assert frames[-1][0] == "stats" and frames[-1][1]["clients"]["connected"] == 1
    assert len(console.overview.feed.streams) == 1
    client.post("/logout")
    clock.advance(1)
    client.treq.flush()
    assert sse_frames(chunks)[-1][0] == "logout"
    assert done.called and not console.overview.feed.streams
    console.overview.feed.stop()


def test_event_stream_cancel_unsubscribes_and_streams_are_bounded(logged_in: Any) -> None:
    """A cancelled stream (browser gone) leaves the feed; past the bound, 503."""
    console, _, _, client = logged_in
    console.overview.feed.max_streams = 1
    d = client.treq.get(console_support.BASE + "/api/events")
    client.treq.flush()
    assert console_support._result(d).code == 200
    assert client.get("/api/overview").code == 200
    second = client.treq.get(console_support.BASE + "/api/events")
    client.treq.flush()
    assert console_support._result(second).code == 503
    stream: EventStream = next(iter(console.overview.feed.streams))
    stream.done.cancel()
    assert not console.overview.feed.streams


def test_root_app_mounts_every_area_route_as_the_area_declares_it() -> None:
    """Each area app's routes are served by the root app with the same path, methods
    and endpoint, and no endpoint is mounted twice."""
    from mqttamqp.console.app import AREAS, Console

    rules = list(Console.app.url_map.iter_rules())
    served = {(r.rule, frozenset(r.methods or ()), r.endpoint) for r in rules}
    for _, area in AREAS:
        for rule in area.app.url_map.iter_rules():
            assert (rule.rule, frozenset(rule.methods or ()), rule.endpoint) in served
    endpoints = [r.endpoint for r in rules]
    assert len(endpoints) == len(set(endpoints))
    assert len(rules) == 2 + sum(len(list(a.app.url_map.iter_rules())) for _, a in AREAS)


def test_api_index_lists_every_endpoint(logged_in: Any) -> None:
    """/api/ lists every /api/ route of the console with its methods, parameters and a
    description, says how to authenticate, and answers 401 without a login."""
    from mqttamqp.console.apidoc import ENDPOINTS
    console, _, _, client = logged_in
    index = client.get("/api/").json()
    listed = {e["path"]: e for e in index["endpoints"]}
    routes = {r.rule for r in console.app.url_map.iter_rules() if r.rule.startswith("/api/")}
    assert set(listed) == routes
    assert set(ENDPOINTS) <= routes, set(ENDPOINTS) - routes        # nothing stale
    assert all(e["description"] for e in index["endpoints"]), [
        p for p, e in listed.items() if not e["description"]]
    assert listed["/api/bans/add"]["methods"] == ["POST"]
    assert listed["/api/bans/add"]["kind"] == "action"
    assert listed["/api/clients"]["methods"] == ["GET"] and "protocol=" in \
        listed["/api/clients"]["parameters"]
    assert "Bearer" in index["auth"]
    anonymous = Client(console).get("/api/")
    assert anonymous.code == 401
