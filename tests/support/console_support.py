"""Helpers for the console's tests: a broker service without sockets or threads,
a logged-in ``StubTreq`` client, and fake connections (MQTT-like and AMQP-like)
that register with the real ``Broker`` the way the protocols do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from fakes import FailingStore
from paho.mqtt.client import MQTTv311
from pahoclient import TIMEOUT, PahoClient, Received
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mqttamqp.console.app import Console
from mqttamqp.console.context import ConsoleContext
from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.connections import ConnectionInfo, LinkInfo
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.security.admission import guards
from mqttamqp.security.userstore import UserStore

PASSWORD = "correct horse battery"
BASE = "http://console.test"
CHEAP = {"n": 2 ** 10, "r": 8, "p": 1}   # scrypt cost for tests only


@dataclass
class Listener:
    kind: str
    description: str
    address: str


class FakeService:
    """What ``make_site`` needs from ``BrokerService``, over a real ``Broker``."""

    def __init__(self, data_dir: str, clock: Clock) -> None:
        self.reactor = clock
        self.data_dir = data_dir
        self.store = FailingStore()      # commits succeed until told to fail
        self.broker = Broker(clock, self.store, Limits(sys_interval=0),
                             guards=guards(clock.seconds, Limits(sys_interval=0)))
        self.listeners = [Listener("MQTT", "tcp:1883", "127.0.0.1:1883"),
                          Listener("web", "tcp:8080", "127.0.0.1:8080")]
        self.broker.start()


def run_now(f: Any, *args: Any) -> Deferred[Any]:
    """Synchronous stand-in for deferToThread (no reactor runs in pytest)."""
    return succeed(f(*args))


@dataclass
class Reply:
    code: int
    headers: Any
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def header(self, name: str) -> str | None:
        values = self.headers.getRawHeaders(name)
        return values[0] if values else None

    def json(self) -> Any:
        import json
        return json.loads(self.body)


def _result(d: Deferred[Any]) -> Any:
    box: list[Any] = []
    d.addBoth(box.append)
    assert box, "request did not finish"
    if isinstance(box[0], Failure):
        box[0].raiseException()
    return box[0]


class Client:
    """A browser-like client over StubTreq: cookies kept, CSRF token remembered."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.treq = StubTreq(console.resource())
        self.csrf = ""

    def request(self, method: str, path: str, **kw: Any) -> Reply:
        kw.setdefault("allow_redirects", False)
        d = self.treq.request(method, BASE + path, **kw)
        self.treq.flush()
        response = _result(d)
        body_d = response.content()
        self.treq.flush()
        body = _result(body_d)
        reply = Reply(response.code, response.headers, body)
        m = re.search(rb'name="csrf-token" content="([^"]*)"', body)
        if m and m.group(1):
            self.csrf = m.group(1).decode()
        return reply

    def get(self, path: str, **params: Any) -> Reply:
        query = ("?" + urlencode(params)) if params else ""
        return self.request("GET", path + query)

    def post(self, path: str, csrf: bool = True, **form: Any) -> Reply:
        data = dict(form)
        if csrf:
            data["csrf_token"] = self.csrf
        return self.request("POST", path, data=data)

    def post_json(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
                  ) -> Reply:
        import json
        h = {"Content-Type": ["application/json"]}
        for k, v in (headers or {}).items():
            h[k] = [v]
        return self.request("POST", path, data=json.dumps(body).encode(), headers=h)

    def login(self, user: str = "admin", password: str = PASSWORD) -> Reply:
        page = self.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]*)"', page.text)
        assert token is not None
        reply = self.request("POST", "/login", data={
            "csrf_token": token.group(1), "username": user, "password": password, "next": "/"})
        if reply.code == 303:
            self.get("/")  # picks up the session's CSRF token
        return reply


def make_console(tmp_path: Any, clock: Clock | None = None
                 ) -> tuple[Console, FakeService, Clock]:
    clock = clock or Clock()
    clock.advance(1_700_000_000)
    service = FakeService(str(tmp_path), clock)
    users = UserStore(str(tmp_path))
    users.set_password("admin", PASSWORD, role="admin", **CHEAP)
    console = Console(ConsoleContext.of(service), clock=clock, run_in_thread=run_now,
                      users=users)
    return console, service, clock


# -- fake connections -----------------------------------------------------------------


@dataclass
class FakeLink:
    """What a protocol's connection is to the core: ClientLink + InspectableConnection."""

    broker: Broker
    client_id: str
    protocol: str = "mqtt3.1.1"
    remote: str = "10.0.0.7:50123"
    user: str | None = None
    clean: bool = True
    keepalive: int = 60
    since: float = 0.0
    links: tuple[LinkInfo, ...] = ()
    key_override: str | None = None
    sent: list[Message] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    session: Any = None

    congested = False
    backlog_bytes = 0

    @property
    def key(self) -> str:
        return self.key_override or ("mqtt:" + self.client_id)

    def send_publish(self, message: Message, qos: int, packet_id: int | None, dup: bool,
                     retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        self.sent.append(message)

    def send_pubrel(self, packet_id: int) -> None:
        pass

    def close(self, reason: str) -> None:
        self.closed.append(reason)
        self.broker.unregister_connection(self.key, self)

    def event_fields(self) -> tuple[str, str, str | None, bool | None, int]:
        return (self.client_id, self.remote, self.user, self.clean, self.keepalive)

    def info(self) -> ConnectionInfo:
        owners = (self.client_id,) if self.client_id in self.broker.wills else ()
        return ConnectionInfo(
            key=self.key, client_id=self.client_id, protocol=self.protocol,
            remote=self.remote, user=self.user, connected_since=self.since,
            keepalive=self.keepalive, clean_session=self.clean,
            session_id=None if self.protocol == "amqp" else self.client_id,
            will_owners=owners, links=self.links)


def connect(broker: Broker, client_id: str, clean: bool = True,
            will: WillMessage | None = None, subscriptions: tuple[str, ...] = (),
            **kw: Any) -> FakeLink:
    """Connect a fake MQTT client the way MQTTProtocol does (open, activate, register)."""
    link = FakeLink(broker, client_id, clean=clean, since=broker.clock.seconds(), **kw)
    session = broker.open_session(link, client_id, clean, will).session
    broker.activate(session, link, link.protocol)
    broker.register_connection(link.key, link, link.protocol)
    link.session = session
    if subscriptions:
        from mqttamqp.core.auth import Identity
        broker.subscribe(session, Identity(client_id), [(f, 1) for f in subscriptions])
    return link


def connect_amqp(broker: Broker, container: str, n: int, links: tuple[LinkInfo, ...],
                 will_owner: str | None = None) -> FakeLink:
    """A fake AMQP connection: no MQTT session, links listed, maybe an AMQP will."""
    conn = FakeLink(broker, container, protocol="amqp", links=links,
                    key_override=f"amqp:{n}", clean=None,  # type: ignore[arg-type]
                    since=broker.clock.seconds())
    if will_owner is not None:
        broker.set_will(WillMessage(will_owner, "amqp/will", b"gone", 1, False, "amqp"))

        def info() -> ConnectionInfo:
            return ConnectionInfo(
                key=conn.key, client_id=container, protocol="amqp", remote=conn.remote,
                user=None, connected_since=conn.since, keepalive=30, clean_session=None,
                session_id=None,
                will_owners=(will_owner,) if will_owner in broker.wills else (),
                links=links)
        conn.info = info  # type: ignore[method-assign]
    broker.register_connection(conn.key, conn, "amqp")
    return conn


# -- the real broker process with its console ----------------------------------------------


def web_broker_process(data_dir: str, *extra: str,
                       listeners: tuple[str, ...] = ("--mqtt", "--web")) -> Any:
    """A ``BrokerProcess`` with MQTT and the console.

    The service logs ``listening for web on ...`` while the harness waits for the
    upper-cased option name (``WEB``); the kind is upper-cased as lines are read.
    """
    from brokerproc import BrokerProcess

    class WebBrokerProcess(BrokerProcess):
        def wait_for_line(self, pattern: str, timeout: float = 10.0) -> str:
            line = super().wait_for_line(pattern, timeout)
            return re.sub(r"listening for (\w+)",
                          lambda m: "listening for " + m.group(1).upper(), line)

    return WebBrokerProcess(data_dir, *extra, listeners=listeners)


class ConsoleHTTP:
    """The console of a real broker process over urllib: cookies kept, no redirects followed."""

    def __init__(self, port: int) -> None:
        import http.cookiejar
        import urllib.request

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kw: Any) -> None:
                return None

        self.base = f"http://127.0.0.1:{port}"
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), NoRedirect())
        self.csrf = ""

    def request(self, method: str, path: str, data: bytes | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        import urllib.error
        import urllib.request
        from email.message import Message as Headers

        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=headers or {})
        try:
            with self.opener.open(req, timeout=20) as resp:
                code, hdrs, body = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as err:
            code, hdrs, body = err.code, err.headers, err.read()
        assert isinstance(hdrs, Headers)

        class _H:
            def getRawHeaders(self, name: str) -> list[str] | None:
                return hdrs.get_all(name)
        m = re.search(rb'name="csrf-token" content="([^"]+)"', body)
        if m:
            self.csrf = m.group(1).decode()
        return Reply(code, _H(), body)

    def get(self, path: str, **params: Any) -> Reply:
        return self.request("GET", path + (("?" + urlencode(params)) if params else ""))

    def post(self, path: str, **form: Any) -> Reply:
        form.setdefault("csrf_token", self.csrf)
        return self.request("POST", path, urlencode(form).encode(),
                            {"Content-Type": "application/x-www-form-urlencoded"})

    def login(self, password: str, user: str = "admin") -> int:
        page = self.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]*)"', page.text)
        assert token is not None
        reply = self.request("POST", "/login", urlencode({
            "csrf_token": token.group(1), "username": user, "password": password,
            "next": "/"}).encode(), {"Content-Type": "application/x-www-form-urlencoded"})
        if reply.code == 303:
            assert self.get("/").code == 200   # remember the session's CSRF token
        return reply.code


def initial_password(data_dir: str) -> str:
    import os
    import stat

    path = os.path.join(data_dir, "admin-password.txt")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = open(path, encoding="utf-8").read()
    m = re.search(r"password: (\S+)", text)
    assert m is not None
    return m.group(1)


class Paho(PahoClient):
    """The shared paho wrapper (``pahoclient``) as MQTT 3.1.1, with the console tests'
    call shapes: one filter per ``subscribe`` and QoS 1 unless told."""

    def __init__(self, port: int, client_id: str, clean: bool = True,
                 will: tuple[str, bytes, int, bool] | None = None) -> None:
        super().__init__(port, client_id, MQTTv311, clean, will)

    def subscribe(self, topic_filter: str, qos: int = 1) -> list[int]:  # type: ignore[override]
        return super().subscribe((topic_filter, qos))

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        super().publish(topic, payload, qos, retain)

    def expect(self, timeout: float = TIMEOUT) -> Received:
        return self.get(timeout)


def logged_in(tmp_path: Any) -> tuple[Console, Any, Clock, Client]:
    """A console on a fresh broker with its admin logged in: (console, broker, clock,
    client), for the tests of the console's pages."""
    console, service, clock = make_console(tmp_path)
    client = Client(console)
    assert client.login().code == 303
    return console, service.broker, clock, client


def audit_text(events: list[dict[str, Any]]) -> str:
    """The console's audit log events as their text lines."""
    from twisted.logger import formatEvent
    return "\n".join(formatEvent(e) for e in events)


def sse_frames(chunks: list[bytes]) -> list[tuple[str, Any]]:
    """Server-Sent Events read back from the chunks of a stream: (event, data)."""
    out = []
    for block in b"".join(chunks).decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def fill(broker: Any, n: int, queue: str = "jobs", payload: bytes = b"job %d") -> None:
    """Publish ``n`` QoS 1 messages to ``$queue/<queue>/work`` through the façade."""
    for i in range(n):
        body = payload % i if b"%d" in payload else payload
        result = broker.publish(Message(f"$queue/{queue}/work", body, 1, False, "producer",
                                        broker.clock.seconds()))
        assert result.refusal is None
