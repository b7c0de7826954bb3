"""In-process tests of ``mqttamqp.ops``: the metrics read the numbers ``$SYS`` reads,
the histograms, readiness and its reasons (a failing store, the will grace, an
unbound listener), the console's token-protected ``/metrics``, JSON log lines, the
OpenTelemetry export through the SDK's in-memory reader, and the options."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from core_broker import connect, make_broker, pub, subscribe, will
from fakes import FailingStore, FakeLink, MemoryStore, SnapshotStore
from prometheus_client.parser import text_string_to_metric_families
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Site

from mqttamqp.core.broker import Broker, Outcome
from mqttamqp.core.clients.connections import ConnectionInfo
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Snapshot
from mqttamqp.core.stats import Histogram
from mqttamqp.ops.health import Readiness
from mqttamqp.ops.logs import make_observer
from mqttamqp.ops.metrics import broker_registry, exposition
from mqttamqp.ops.web import MetricsResource, ops_site, with_metrics
from mqttamqp.options import Options


def scrape(broker: Broker) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of one scrape: name -> {sorted labels: value}."""
    text = exposition(broker_registry(broker)).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(samples: dict[str, dict[Any, float]], name: str) -> float:
    return sum(samples[name].values())


def sys_value(broker: Broker, topic: str) -> str:
    broker.sys_topics.publish()
    message = broker.retained.get("$SYS/broker/" + topic)
    assert message is not None
    return message.payload.decode()


class _Live:
    """A registered connection (as an adapter registers one after CONNACK)."""

    def __init__(self, broker: Broker, client_id: str, protocol: str = "mqtt3.1.1") -> None:
        self.key = f"{protocol[:4]}:{client_id}"
        self.client_id, self.protocol = client_id, protocol
        broker.register_connection(self.key, self, protocol)

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(self.key, self.client_id, self.protocol, "127.0.0.1:1", None,
                              0.0, 60, True, self.client_id)

    def event_fields(self) -> tuple[str, str, str | None, bool | None, int]:
        return (self.client_id, "127.0.0.1:1", None, True, 60)

    def close(self, reason: str) -> None:
        pass


class _Listener:
    def __init__(self, kind: str, port: Any) -> None:
        self.kind, self.description, self.port = kind, "tcp:0", port


def readiness(broker: Broker, listeners: list[_Listener] | None = None) -> Readiness:
    return Readiness(broker, lambda: True, lambda: listeners or [_Listener("MQTT", 1)])


def get(treq: StubTreq, path: str, headers: dict[str, str] | None = None
        ) -> tuple[int, bytes]:
    d: Deferred[Any] = treq.get("http://metrics.test" + path, headers=headers)
    response: list[Any] = []
    d.addCallback(lambda r: treq.content(r).addCallback(lambda b: response.append((r, b))))
    treq.flush()
    assert response, f"no response for {path}"
    r, body = response[0]
    return r.code, body


# -- the numbers ---------------------------------------------------------------


def test_metrics_read_the_numbers_sys_publishes() -> None:
    """After real routing, /metrics and $SYS say the same for every shared counter."""
    broker, _clock, _ = make_broker(MemoryStore())
    broker.start()
    try:
        sub, _link, _ = connect(broker, "sub", clean=False)
        subscribe(broker, sub, ("plant/#", 1))
        connect(broker, "other")
        _Live(broker, "sub"), _Live(broker, "other"), _Live(broker, "app", "amqp")
        for i in range(5):
            pub(broker, f"plant/{i}", b"21.5", qos=1, retain=i < 2)
        s = scrape(broker)
        assert total(s, "mqttamqp_messages_received_total") == 5 == int(
            sys_value(broker, "messages/received"))
        assert total(s, "mqttamqp_messages_sent_total") == broker.stats.messages_sent
        assert s["mqttamqp_messages_received_total"][(("protocol", "mqtt"),)] == 5
        assert s["mqttamqp_retained_messages"][()] == 2 == int(
            sys_value(broker, "retained messages/count"))
        assert total(s, "mqttamqp_connections") == 3 == int(
            sys_value(broker, "clients/connected"))
        assert s["mqttamqp_connections"][(("protocol", "amqp"),)] == 1
        assert s["mqttamqp_connects_total"][(("protocol", "mqtt"),)] == 2
        assert s["mqttamqp_sessions"] == {(("state", "offline"),): 0,
                                          (("state", "online"),): 2}
        assert s["mqttamqp_subscriptions"][()] == 1 == int(
            sys_value(broker, "subscriptions/count"))
        assert s["mqttamqp_commits_total"][()] == broker.stats.commits > 0
        assert s["mqttamqp_commit_batch_size_count"][()] == broker.stats.commits
        assert s["process_open_fds"][()] > 0 and s["process_max_fds"][()] > 0
    finally:
        broker.stop()


def test_disconnect_causes_drops_and_queues_are_counted() -> None:
    """Disconnects by cause, queue drops at the bound and the queued gauge."""
    broker, _clock, _ = make_broker(MemoryStore(), max_queued_messages=2, max_inflight=1)
    sub, link, _ = connect(broker, "slow", clean=False)
    live = _Live(broker, "slow")
    subscribe(broker, sub, ("q/#", 1))
    for _ in range(6):
        pub(broker, "q/1", b"abc", qos=1)
    s = scrape(broker)
    assert s["mqttamqp_queued_messages"][()] == 2
    assert s["mqttamqp_queued_bytes"][()] == 6
    queue_mqtt = (("protocol", "mqtt"), ("reason", "queue"))
    assert s["mqttamqp_messages_dropped_total"][queue_mqtt] == 3 == int(
        sys_value(broker, "messages/dropped"))
    stuck, stuck_link, _ = connect(broker, "stuck")
    subscribe(broker, stuck, ("q/#", 1))
    pub(broker, "q/2", b"x", qos=1)                  # "slow" is full: one more drop
    stuck_link.congested, stuck_link.backlog_bytes = True, 1 << 30
    pub(broker, "q/0", b"x", qos=0)                  # "slow" gets it, "stuck" does not
    inflight = next(iter(stuck.inflight))
    broker.settle(stuck, inflight, Outcome.REJECTED)  # as an AMQP receiver may
    s = scrape(broker)
    assert s["mqttamqp_messages_dropped_total"] == {
        (("protocol", "mqtt"), ("reason", "congestion")): 1,
        (("protocol", "amqp"), ("reason", "denied")): 0,
        (("protocol", "amqp0-9-1"), ("reason", "denied")): 0,
        (("protocol", "mqtt"), ("reason", "denied")): 0,
        (("protocol", "mqtt"), ("reason", "queue")): 4,
        (("protocol", "amqp"), ("reason", "rejected")): 0,
        # (settled Rejected as an AMQP receiver would, on an MQTT session here)
        (("protocol", "mqtt"), ("reason", "rejected")): 1}
    assert total(s, "mqttamqp_messages_dropped_total") == 6 == int(
        sys_value(broker, "messages/dropped"))
    broker.unregister_connection(live.key, live, "keepalive")
    broker.end_session(link, sub, False, "keepalive expired")
    s = scrape(broker)
    assert s["mqttamqp_disconnects_total"] == {(("cause", "keepalive"),): 1}
    assert s["mqttamqp_sessions"][(("state", "offline"),)] == 1


def test_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    """Histogram buckets are cumulative, a value counting in every bucket whose bound is at
    least it."""
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 3.0):
        h.observe(v)
    assert h.cumulative() == [(1.0, 2), (2.0, 3), (float("inf"), 4)]
    assert (h.count, h.total) == (4, 6.0)


def test_publish_to_deliver_latency_is_sampled() -> None:
    """One delivery in 1024 is observed, with the time since the message arrived."""
    broker, clock, _ = make_broker()
    _sub, _link, _ = connect(broker, "s")
    stats = broker.stats
    message = Message("t", b"x", 0, False, None, clock.seconds() - 0.003)
    for _ in range(2048):
        stats.messages_sent += 1
        if not stats.messages_sent & 1023:
            stats.deliver_sampled(message.timestamp)
    s = scrape(broker)
    assert s["mqttamqp_publish_deliver_latency_seconds_count"][()] == 2
    assert s["mqttamqp_publish_deliver_latency_seconds_bucket"][(("le", "0.0025"),)] == 0
    assert s["mqttamqp_publish_deliver_latency_seconds_bucket"][(("le", "0.005"),)] == 2


# -- health --------------------------------------------------------------------


def test_readyz_is_503_while_commits_fail_and_200_once_they_succeed() -> None:
    """/readyz answers 503 with the reason while commits fail and 200 again once one
    succeeds."""
    store = FailingStore()
    broker, _clock, _ = make_broker(store)
    broker.start()
    treq = StubTreq(ops_site(broker_registry(broker), readiness(broker),
                             lambda: {"status": "ok"}).resource)
    code, body = get(treq, "/readyz")
    assert code == 200 and json.loads(body)["status"] == "ready"
    store.failing = True
    d = pub(broker, "r/1", b"x", qos=1, retain=True)
    assert d is not None
    d.addErrback(lambda f: None)
    code, body = get(treq, "/readyz")
    checks = json.loads(body)["checks"]
    assert code == 503 and checks["commits"]["ok"] is False
    assert "No space left on device" in checks["commits"]["reason"]
    assert checks["store"]["ok"] and checks["listeners"]["ok"]
    assert get(treq, "/healthz")[0] == 200   # alive all the same
    store.failing = False
    pub(broker, "r/2", b"x", qos=1, retain=True)
    code, body = get(treq, "/readyz")
    assert code == 200
    broker.stop()


def test_not_ready_during_the_will_grace_after_a_restart() -> None:
    """The broker is not ready during the will grace after a restart, and ready after it."""
    snap = Snapshot(wills={"dev": will("dev")})
    broker, clock, _ = make_broker(SnapshotStore(snap), will_grace=30)
    broker.start()
    ok, body = readiness(broker).report()
    assert not ok and "grace period" in body["checks"]["will_grace"]["reason"]
    clock.advance(31)
    ok, body = readiness(broker).report()
    assert ok, body
    broker.stop()


def test_not_ready_with_an_unbound_listener() -> None:
    """A listener that is not bound makes the broker not ready, named in the reason."""
    broker, _clock, _ = make_broker()
    ok, body = readiness(broker, [_Listener("MQTT", 1), _Listener("AMQP", None)]).report()
    assert not ok
    assert body["checks"]["listeners"] == {"ok": False, "reason": "not bound: AMQP tcp:0"}


def test_console_metrics_need_the_bearer_token() -> None:
    """/metrics on the console: 401 without or with a wrong token, 200 with it; every
    other path still reaches the console."""
    broker, _clock, _ = make_broker()
    console = Resource()
    page = Resource()
    page.render_GET = lambda request: b"console page"  # type: ignore[attr-defined]
    console.putChild(b"clients", page)
    site = Site(console)
    token = "s3cret-token-0123456789"
    with_metrics(site, MetricsResource(broker_registry(broker), token))
    treq = StubTreq(site.resource)
    assert get(treq, "/metrics")[0] == 401
    assert get(treq, "/metrics", {"Authorization": "Bearer wrong"})[0] == 401
    code, body = get(treq, "/metrics", {"Authorization": f"Bearer {token}"})
    assert code == 200 and b"mqttamqp_messages_received_total" in body
    assert get(treq, "/clients") == (200, b"console page")


# -- logs ----------------------------------------------------------------------


def test_json_log_lines_have_the_stable_fields() -> None:
    """--log-format json writes one JSON object a line with the stable fields, at the
    chosen level."""
    out = io.StringIO()
    log = Logger(namespace="mqttamqp.test", observer=make_observer(out, "json", "info"))
    log.info("MQTT client {c} ({peer}) disconnected: {cause}", c="dev-1",
             peer="127.0.0.1:5555", cause="keepalive")
    log.warn("refusing {kind} connection from {peer}: {what}", kind="MQTT",
             peer="10.0.0.9:1", what="limit")
    log.debug("not shown at --log-level info")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["event"] == "MQTT client dev-1 (127.0.0.1:5555) disconnected: keepalive"
    assert (first["client"], first["remote"], first["reason"]) == (
        "dev-1", "127.0.0.1:5555", "keepalive")
    assert first["level"] == "info" and first["namespace"] == "mqttamqp.test"
    assert first["time"].endswith("+00:00")
    assert second["level"] == "warn" and second["remote"] == "10.0.0.9:1"
    assert "client" not in second


# -- OpenTelemetry ---------------------------------------------------------------


def test_otel_export_has_the_same_numbers() -> None:
    """The OpenTelemetry export reports the same numbers as the metrics."""
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from mqttamqp.ops.otel import OTelExport

    broker, clock, _ = make_broker()
    sub, _link, _ = connect(broker, "s")
    subscribe(broker, sub, ("o/#", 0))
    reader = InMemoryMetricReader()
    export = OTelExport(broker, clock, reader, interval=10)
    for _ in range(3):
        pub(broker, "o/1")
    export.refresh()
    metrics = {m.name: m for rm in reader.get_metrics_data().resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics}
    received = {dict(p.attributes)["protocol"]: p.value
                for p in metrics["mqttamqp_messages_received"].data.data_points}
    assert received["mqtt"] == 3 and metrics["mqttamqp_messages_received"].data.is_monotonic
    assert [p.value for p in metrics["mqttamqp_subscriptions"].data.data_points] == [1]
    # The histograms are mirrored as they are observed, with /metrics' buckets.
    latency = broker.stats.commit_latency
    for value in (0.0007, 0.003, 0.003):
        latency.observe(value)
    metrics = {m.name: m for rm in reader.get_metrics_data().resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics}
    [point] = metrics["mqttamqp_commit_latency_seconds"].data.data_points
    assert point.count == 3
    assert tuple(point.explicit_bounds) == latency.bounds
    assert point.bucket_counts[1] == 1 and point.bucket_counts[3] == 2   # le 0.001, 0.005
    export.unmirror()                       # (what stop() does first)
    assert not latency.listeners
    export.provider.shutdown()


# -- options -------------------------------------------------------------------


def test_metrics_none_and_log_options() -> None:
    """--metrics none and the log format and level options parse; a bad format is refused."""
    o = Options()
    o.parseOptions(["--metrics", "none", "--log-format", "JSON", "--log-level", "warn"])
    assert (o["metrics"], o["log-format"], o["log-level"]) == (None, "json", "warn")
    with pytest.raises(SystemExit, match="--log-format must be one of text, json"):
        Options().parseOptions(["--log-format", "xml"])


def test_a_bad_metrics_token_file_is_refused(tmp_path: Any) -> None:
    """A metrics token file that is short, unreadable or without the console is refused; a
    good one is read."""
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(SystemExit, match="at least 16 characters"):
        Options().parseOptions(["--metrics-token-file", str(short)])
    with pytest.raises(SystemExit, match="cannot read"):
        Options().parseOptions(["--metrics-token-file", str(tmp_path / "missing")])
    good = tmp_path / "good"
    good.write_text("0123456789abcdef0123\n")
    with pytest.raises(SystemExit, match="--web is none"):
        Options().parseOptions(["--metrics-token-file", str(good), "--web", "none"])
    o = Options()
    o.parseOptions(["--metrics-token-file", str(good)])
    assert o["metrics-token"] == "0123456789abcdef0123"


@pytest.mark.parametrize(("host", "warned"), [("127.0.0.1", False), ("0.0.0.0", True)])
def test_a_metrics_listener_beyond_loopback_warns(host: str, warned: bool,
                                                  log_lines: list[str]) -> None:
    """Its pages need no login: beyond loopback, the log says so once at start."""
    from twisted.internet.address import IPv4Address

    from mqttamqp.listeners import ListenerService

    class Port:
        def getHost(self) -> object:
            return IPv4Address("TCP", host, 9108)

    ListenerService("metrics", "tcp:9108", None, None, "open")._listening(Port())
    said = [line for line in log_lines if "need no login" in line]
    assert len(said) == (1 if warned else 0)


def test_reactor_lag_is_how_late_the_timer_fired() -> None:
    """The reactor lag gauge is how late its timer fired; the maximum resets at each
    scrape."""
    from twisted.internet.task import Clock

    from mqttamqp.ops.lag import ReactorLag

    clock = Clock()
    lag = ReactorLag(clock, 1.0)
    lag.start()
    clock.advance(1.5)           # the timer ran half a second late
    clock.advance(1.0)           # on time
    values = {m.name: m.samples[0].value for m in lag.collect()}
    assert values == {"mqttamqp_reactor_lag_seconds": 0.0,
                      "mqttamqp_reactor_lag_max_seconds": 0.5}
    values = {m.name: m.samples[0].value for m in lag.collect()}
    assert values["mqttamqp_reactor_lag_max_seconds"] == 0.0   # since the last scrape
    lag.stop()
    assert clock.getDelayedCalls() == []


def test_sighup_changes_the_log_level_of_the_installed_observer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The observer installed on twistd's application keeps its level filter, and the
    'log level' reloader sets a new level on it at once."""
    from twisted.application.service import Application
    from twisted.logger import ILogObserver

    from mqttamqp.ops.wiring import OpsWiring

    class Service:
        log = Logger()

    out = io.StringIO()
    wiring = OpsWiring(Service())
    wiring.log_level = "warn"
    wiring.log_format = "json"
    app = Application("t")
    monkeypatch.setattr("mqttamqp.ops.wiring.open_destination", lambda *a: out)
    wiring.set_log_observer(app)
    observer = ILogObserver(app)
    log = Logger(namespace="t", observer=observer)
    log.info("hidden at warn")
    wiring.reload_log_level({"log-level": "info"})
    log.info("shown at info")
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == ["shown at info"]


def test_drops_are_labelled_with_the_protocol() -> None:
    """Issue 14: messages dropped by reason AND protocol: an AMQP receiver's queue
    drops and an AMQP sender's denied publish are labelled amqp, an MQTT one's mqtt;
    every series sums to $SYS's dropped total (plus the denied ones)."""
    from mqttamqp.core.auth import Identity

    broker, _clock, _ = make_broker(MemoryStore(), max_queued_messages=1, max_inflight=1)
    amqp_link = FakeLink("fe")
    session = broker.open_session(amqp_link, "fe", True, None).session
    broker.activate(session, amqp_link, "amqp")
    subscribe(broker, session, ("a/#", 1))
    for _ in range(4):
        pub(broker, "a/1", b"x", qos=1)              # 1 in flight, 1 queued, 2 dropped
    broker.publish(Message("$SYS/x", b"no", 0), Identity("app", None, "amqp"))
    broker.publish(Message("$SYS/y", b"no", 0), Identity("dev", None, "mqtt3.1.1"))
    s = scrape(broker)["mqttamqp_messages_dropped_total"]
    assert s[(("protocol", "amqp"), ("reason", "queue"))] == 2
    assert s[(("protocol", "amqp"), ("reason", "denied"))] == 1
    assert s[(("protocol", "mqtt"), ("reason", "denied"))] == 1
    assert sum(v for k, v in s.items() if ("reason", "denied") not in k) == int(
        sys_value(broker, "messages/dropped"))


def test_readiness_says_standby_under_ha() -> None:
    """Under --ha the standby is not ready, with status 'standby' and the reason in
    the role check; the leader's role check passes; a fenced broker is not ready."""
    broker, _clock, _ = make_broker(MemoryStore())
    role = ["standby"]
    ready = Readiness(broker, lambda: False, lambda: [_Listener("MQTT", None)],
                      role=lambda: role[0])
    ok, body = ready.report()
    assert not ok and body["status"] == "standby"
    assert not body["checks"]["role"]["ok"]
    assert "standby" in body["checks"]["role"]["reason"]
    role[0] = "leader"
    ready = Readiness(broker, lambda: True, lambda: [_Listener("MQTT", 1)],
                      role=lambda: role[0])
    assert ready.report()[1]["checks"]["role"] == {"ok": True, "reason": "leader"}
    role[0] = "fenced"
    ok, body = ready.report()
    assert not ok and body["status"] == "not ready"
