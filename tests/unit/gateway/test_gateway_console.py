"""A gateway's console and metrics on ``task.Clock``, ``StubTreq`` and a pool with a
fake connector: the upstream page (state, address, clients on it, last error,
reconnects) and the clients page (id, protocol, address, since, in flight, which
connection) with their JSON twins, client data escaped, login required, none of the
broker's pages; the ``mqttamqp_gateway_*`` series and ``/readyz``."""

from __future__ import annotations

from typing import Any

from console_support import CHEAP, PASSWORD, Client, run_now
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqttamqp.console.gatewaysite import GatewayConsole
from mqttamqp.core.limits import Limits
from mqttamqp.gateway.channel import Refused
from mqttamqp.gateway.engine import UpstreamConnection
from mqttamqp.gateway.figures import GatewayFigures
from mqttamqp.gateway.frontend import GatewayFactory, GatewayProtocol
from mqttamqp.gateway.pool import UpstreamPool
from mqttamqp.gateway.target import Upstream
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Connect, Publish
from mqttamqp.ops.gatewaymetrics import gateway_ops_site, gateway_registry
from mqttamqp.ops.metrics import exposition
from mqttamqp.security.userstore import UserStore

T0 = 1_700_000_000.0


class _Channel:
    """A client's channel that the test opens (``opened``) and that takes anything."""

    def __init__(self, conn: Any, client_id: str, owner: Any, clock: Any, credit: int,
                 timeout: float) -> None:
        self.conn = conn
        self.opened: Deferred[bool] = Deferred()
        self.blocked = False
        _Channel.made.append(self)

    made: list[_Channel] = []

    async def open(self, clean: bool, will: Any, persistent: bool | None = None) -> bool:
        return await self.opened

    def publish_message(self, *args: Any, **kw: Any) -> None:
        pass

    def close(self, brute: bool, clean_session: bool, reason: str) -> None:
        pass

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass


class _Connector:
    """Slot 0 connects (to a ``StringTransport``), slot 1 is refused."""

    def __init__(self) -> None:
        self.conns: list[UpstreamConnection] = []

    def __call__(self, conn: UpstreamConnection) -> Deferred[Any]:
        if conn.container_id.endswith("/1"):
            return fail(ConnectionRefusedError("<refused>"))
        conn.makeConnection(StringTransport())
        self.conns.append(conn)
        return succeed(conn)


def _gateway() -> tuple[GatewayFactory, UpstreamPool, Clock]:
    clock = Clock()
    clock.advance(T0)
    connector = _Connector()
    pool = UpstreamPool(clock, Upstream("core.test", 5672, False), connector, 2, "gw", 60.0,
                        65536)
    pool.start()
    (conn,) = connector.conns
    conn.open = True
    pool.upstream_open(conn)
    factory = GatewayFactory(pool, clock, Limits(), 8)
    _Channel.made = []
    factory.make_channel = _Channel  # type: ignore[assignment]
    return factory, pool, clock


def _client(factory: GatewayFactory, client_id: str, port: int, accept: bool = True
            ) -> GatewayProtocol:
    proto = factory.buildProtocol(None)
    assert isinstance(proto, GatewayProtocol)
    proto.makeConnection(StringTransport(peerAddress=_Peer(port)))
    proto.dataReceived(encode(Connect("MQTT", 4, client_id, True, 30)))
    if accept:
        _Channel.made[-1].opened.callback(False)
    return proto


class _Peer:
    def __init__(self, port: int) -> None:
        self.host = "127.0.0.1"
        self.port = port


def test_figures_count_clients_links_refusals_and_messages() -> None:
    """Clients with their connection, the open and the refused slot with its error,
    CONNECTs refused by cause and messages to the core."""
    factory, pool, clock = _gateway()
    clock.advance(5)
    a = _client(factory, "a", 1001)
    a.dataReceived(encode(Publish("t", b"x", 0, False, False, None)))
    _client(factory, "b", 1002, accept=False)
    pool.slots[0].state = "waiting"     # the one open connection goes: b is refused
    _Channel.made[-1].opened.errback(Refused("the core is gone"))
    figures = GatewayFigures(factory, pool, clock, started=T0)
    page = figures.clients()
    assert [c["client_id"] for c in page["items"]] == ["a", "b"]
    first = page["items"][0]
    assert first["protocol"] == "MQTT 3.1.1" and first["address"] == "127.0.0.1:1001"
    assert first["connected_since"] == T0 + 5 and first["upstream"] == 0
    assert first["state"] == "connected" and first["inflight"] == 0
    assert figures.clients(query="1002")["total"] == 1
    links = figures.links()
    assert links[0]["clients"] == 1 and links[0]["address"] == "amqp://core.test:5672"
    assert links[1]["state"] == "waiting" and "<refused>" in links[1]["last_error"]
    c = figures.counters()
    assert c["connected"] == 1 and c["messages_to_core"] == 1 and c["connects"] == 1
    assert c["connects_refused"]["server_unavailable"] == 1


def _console(tmp_path: Any, figures: GatewayFigures, clock: Clock) -> Client:
    users = UserStore(str(tmp_path))
    users.set_password("admin", PASSWORD, role="admin", **CHEAP)
    client = Client(GatewayConsole(figures, users, clock, run_now))  # type: ignore[arg-type]
    assert client.login().code == 303
    return client


def test_console_pages_and_api_show_upstream_and_clients(tmp_path: Any) -> None:
    """The upstream page and its API, the clients page (client ids escaped) and its
    API; no login: 401 or the login form; the broker's pages are not there."""
    factory, pool, clock = _gateway()
    _client(factory, "<b>dev</b>", 1001)
    pool.slots[1].last_error = "cannot connect: <i>refused</i>"
    figures = GatewayFigures(factory, pool, clock, started=T0)
    client = _console(tmp_path, figures, clock)
    api = client.get("/api/gateway").json()
    assert api["counters"]["clients"] == 1 and api["counters"]["upstream_up"] == 1
    assert [x["state"] for x in api["links"]] == ["open", "waiting"]
    page = client.get("/").text
    for text in ("core.test:5672", "gw/0", "gw/1", "open", "waiting",
                 "cannot connect: &lt;i&gt;refused&lt;/i&gt;"):
        assert text in page, text
    assert "<i>refused</i>" not in page
    assert "console.js" not in page   # (its live feed is the broker's /api/events)
    clients = client.get("/api/clients").json()
    assert clients["total"] == 1 and clients["items"][0]["client_id"] == "<b>dev</b>"
    page = client.get("/clients").text
    assert "&lt;b&gt;dev&lt;/b&gt;" in page and "<b>dev</b>" not in page
    assert "127.0.0.1:1001" in page and "MQTT 3.1.1" in page
    assert client.get("/sessions").code == 404
    anonymous = Client(client.console)
    assert anonymous.get("/api/clients").code == 401
    assert anonymous.get("/clients").code == 303


def test_metrics_and_readiness() -> None:
    """The mqttamqp_gateway_* series read the counters at scrape time; /readyz is 503
    while no upstream connection is open."""
    factory, pool, clock = _gateway()
    _client(factory, "a", 1001)
    factory.refused[5] = 2
    figures = GatewayFigures(factory, pool, clock, started=T0)
    text = exposition(gateway_registry(figures.counters)).decode()
    for line in ("mqttamqp_gateway_clients 1.0",
                 "mqttamqp_gateway_upstream_connections_up 1.0",
                 'mqttamqp_gateway_connects_refused_total{cause="not_authorized"} 2.0',
                 'mqttamqp_gateway_messages_total{direction="to_core"} 0.0',
                 "mqttamqp_gateway_held_deliveries_total 0.0",
                 "mqttamqp_gateway_connects_total 1.0"):
        assert line in text, line
    http = StubTreq(gateway_ops_site(gateway_registry(figures.counters),
                                     figures.counters).resource)

    def status(path: str) -> int:
        d = http.get("http://gw.test" + path)
        http.flush()
        box: list[Any] = []
        d.addCallback(box.append)
        return int(box[0].code)

    assert status("/readyz") == 200 and status("/metrics") == 200
    pool.slots[0].state = "waiting"
    assert status("/readyz") == 503 and status("/healthz") == 200
