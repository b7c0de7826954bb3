"""Active/standby on PostgreSQL (``--ha``), with real brokers as processes.

Two brokers on one throw-away database: the second is the standby (its MQTT port
refuses, ``/readyz`` says 503 ``standby``); after ``kill -9`` of the leader the
standby takes over with the persistent sessions, their queued messages and the
retained messages; after ``pg_terminate_backend`` of the leader's connections while a
client publishes at QoS 1, the old leader stops and every PUBACKed message is on the
new one.  Every wait is on a log line, a socket or a paho event, with a time-out.
``HA_DUMP=1`` prints each broker's log at the end of a test (with ``-s``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from brokerproc import BrokerProcess
from pahoclient import PahoClient
from pahokeep import KeepPubrel
from ports import free_port

from mqttamqp.store.engines import SERVING_LOCK_KEY

pytestmark = pytest.mark.timeout(90)

TAKEOVER = 30.0   # generous: two shared cores
CHECK_LEADER = Path(__file__).resolve().parents[3] / "contrib" / "keepalived" / "check-leader"


def _readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def _check_leader(broker: BrokerProcess) -> int:
    """The exit status of contrib/keepalived/check-leader against ``broker``."""
    out = subprocess.run([sys.executable, str(CHECK_LEADER),
                          f"http://127.0.0.1:{broker.ports['METRICS']}/readyz"],
                         capture_output=True, timeout=30)
    return out.returncode


def _refused(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:port (connection refused)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


Start = Callable[..., BrokerProcess]


@pytest.fixture
def database(postgres_cluster: Any) -> str:
    return str(postgres_cluster.create_database())


@pytest.fixture
def ha_broker(tmp_path: Any, database: str) -> Iterator[Start]:
    """``ha_broker(leader=True)``: a broker with ``--ha`` on the test's database, its
    MQTT listener on a port chosen here (so a standby's closed port can be tried)."""
    started: list[BrokerProcess] = []

    def start(leader: bool = True, *extra: str, watch: str = "0.2") -> BrokerProcess:
        port = free_port()
        proc = BrokerProcess(
            os.path.join(str(tmp_path), f"data{len(started)}"), "--storage", database,
            "--ha", "--ha-poll", "0.2", "--ha-watch", watch, "--no-archive",
            "--will-grace", "0", "--max-queued-messages", "60000", *extra,
            listeners=("--mqtt", "--metrics"),
            descriptions={"--mqtt": f"tcp:{port}:interface=127.0.0.1"})
        started.append(proc)
        proc.start(timeout=TAKEOVER, expect=None if leader else ("--metrics",))
        if not leader:
            proc.wait_for_line(r"standby: waiting for the serving lock", TAKEOVER)
        proc.ports.setdefault("MQTT", port)
        return proc

    yield start
    for proc in started:
        proc.stop()
        if os.environ.get("HA_DUMP"):
            print(proc.output())


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_second_broker_is_standby_and_takes_over_after_kill(ha_broker: Start) -> None:
    """A second --ha broker waits as standby (MQTT refused, /readyz 503 standby); after
    kill -9 of the leader it serves the persistent session, its queued messages and
    subscriptions, the retained messages and a durable queue's messages, and publishes
    the will of a client that was connected to the old leader."""
    leader = ha_broker()
    standby = ha_broker(leader=False)
    code, body = _readyz(standby.ports["METRICS"])
    assert (code, body["status"]) == (503, "standby"), body
    assert not body["checks"]["role"]["ok"]
    assert _refused(standby.mqtt_port)
    assert 'mqttamqp_ha_role{role="standby"} 1.0' in _metrics(standby.ports["METRICS"])
    assert _check_leader(standby) == 1 and _check_leader(leader) == 0
    code, body = _readyz(leader.ports["METRICS"])
    assert body["checks"]["role"] == {"ok": True, "reason": "leader"}, body

    sub_id = uid("sub")
    sub = PahoClient(leader.mqtt_port, sub_id, mqtt.MQTTv311, clean=False)
    assert sub.subscribe(("ha/t/#", 1)) == [1]
    sub.disconnect()
    worker = PahoClient(leader.mqtt_port, "worker-1")   # consumer group "worker"
    assert worker.subscribe(("$queue/hajobs/#", 1)) == [1]
    worker.disconnect()
    pub = PahoClient(leader.mqtt_port, uid("pub"))
    pub.publish("ha/retained", b"kept", 1, retain=True)
    for i in range(5):
        pub.publish("ha/t/x", b"m%d" % i, 1)   # PUBACKed: stored for the session
    for i in range(3):
        pub.publish("$queue/hajobs/eu", b"job%d" % i, 1)   # appended to the queue
    pub.stop()
    # Connected to the leader when it dies: its will is the new leader's to publish
    # (after --will-grace, 0 here), queued for the session after the five.
    victim = PahoClient(leader.mqtt_port, uid("victim"),
                        will=("ha/t/will", b"gone", 1, False))

    leader.kill()
    victim.stop()
    standby.wait_for_line(r"listening for MQTT", TAKEOVER)
    line = standby.wait_for_line(r"took over as leader", 10)
    assert "epoch 2" in line, line

    back = PahoClient(standby.mqtt_port, sub_id, mqtt.MQTTv311, clean=False)
    try:
        assert back.session_present is True
        got = [back.get() for _ in range(6)]
        assert [m.payload for m in got] == [b"m%d" % i for i in range(5)] + [b"gone"]
        pub = PahoClient(standby.mqtt_port, uid("pub"))
        pub.publish("ha/t/y", b"after", 1)   # the subscription came along
        assert back.get().payload == b"after"
        pub.stop()
    finally:
        back.stop()
    fresh = PahoClient(standby.mqtt_port, uid("fresh"))
    try:
        fresh.subscribe(("ha/retained", 1))
        msg = fresh.get()
        assert (msg.payload, msg.retain) == (b"kept", True)
        fresh.subscribe(("$SYS/broker/ha/role", 0))
        assert fresh.get().payload == b"leader"
    finally:
        fresh.stop()
    worker = PahoClient(standby.mqtt_port, "worker-2")   # the same group, durable
    try:
        assert worker.subscribe(("$queue/hajobs/#", 1)) == [1]
        assert sorted(worker.get().payload for _ in range(3)) == [b"job0", b"job1", b"job2"]
    finally:
        worker.stop()
    code, body = _readyz(standby.ports["METRICS"])
    assert body["checks"]["role"] == {"ok": True, "reason": "leader"}, body
    assert _check_leader(standby) == 0   # keepalived would move the address here
    metrics = _metrics(standby.ports["METRICS"])
    assert 'mqttamqp_ha_role{role="leader"} 1.0' in metrics
    assert "mqttamqp_ha_epoch 2.0" in metrics


class _Publisher:
    """Publishes QoS 1 to one broker on paho's thread, keeping what was PUBACKed,
    until its connection goes (it does not reconnect)."""

    def __init__(self, port: int, topic: str) -> None:
        self.acked: list[bytes] = []
        self.sent: dict[int, bytes] = {}
        self.lock = threading.Lock()
        self.enough = threading.Event()
        self.gone = threading.Event()
        self.topic = topic
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=uid("qos1"),
                             reconnect_on_failure=False)
        self.c.max_inflight_messages_set(20)
        self.c.on_publish = self._on_publish
        self.c.on_disconnect = lambda *a: self.gone.set()
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.n = 0
        for _ in range(20):
            self._next()

    def _next(self) -> None:
        payload = b"p%06d" % self.n
        self.n += 1
        info = self.c.publish(self.topic, payload, 1)
        if info.rc == mqtt.MQTT_ERR_SUCCESS:
            with self.lock:
                self.sent[info.mid] = payload

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any,
                    props: Any) -> None:
        with self.lock:
            payload = self.sent.pop(mid, None)
            if payload is not None:
                self.acked.append(payload)
            if len(self.acked) >= 200:
                self.enough.set()
        if not self.gone.is_set() and self.n < 50_000:   # (bounded)
            self._next()

    def stop(self) -> list[bytes]:
        self.c.loop_stop()
        with self.lock:
            return list(self.acked)


def test_cutting_the_leaders_connections_fences_it_and_loses_nothing_acked(
        ha_broker: Start, postgres_cluster: Any, database: str) -> None:
    """pg_terminate_backend on every connection of the leader while a client publishes
    QoS 1: the old leader stops (one line, its port closed), the standby takes over,
    and every message the old leader PUBACKed is queued for the persistent session."""
    leader = ha_broker()
    standby = ha_broker(leader=False)
    sub_id = uid("sub")
    sub = PahoClient(leader.mqtt_port, sub_id, mqtt.MQTTv311, clean=False)
    assert sub.subscribe(("cut/#", 1)) == [1]
    sub.disconnect()

    pub = _Publisher(leader.mqtt_port, "cut/x")
    assert pub.enough.wait(30), "the leader acknowledged fewer than 200 messages"
    # Every backend but psql's own: the leader's lock and storage connections (and
    # the standby's lock connection, which reconnects at its next poll).
    postgres_cluster.psql(database, "SELECT pg_terminate_backend(pid) FROM "
                                    "pg_stat_activity WHERE datname = current_database() "
                                    "AND pid <> pg_backend_pid()")
    leader.wait_for_line(r"lost the leadership", TAKEOVER)
    assert pub.gone.wait(TAKEOVER), "the old leader kept the publisher connected"
    acked = pub.stop()
    assert leader.proc is not None and leader.proc.wait(TAKEOVER) == 1
    assert _refused(leader.mqtt_port)
    standby.wait_for_line(r"took over as leader", TAKEOVER)

    back = PahoClient(standby.mqtt_port, sub_id, mqtt.MQTTv311, clean=False)
    try:
        assert back.session_present is True
        pending = set(acked)
        received: set[bytes] = set()
        while pending:
            payload = back.get(timeout=15).payload
            received.add(payload)
            pending.discard(payload)
        assert set(acked) <= received
    finally:
        back.stop()


def test_a_leader_that_missed_its_lock_loss_is_fenced_by_the_epoch(
        ha_broker: Start, postgres_cluster: Any, database: str) -> None:
    """Only the leader's lock connection is cut, and it checks it too rarely to notice
    (--ha-watch 600): the standby takes over and claims epoch 2, and the old leader's
    next commit fails on the epoch, so it stops (saying so) without acknowledging;
    everything it PUBACKed is on the new leader."""
    leader = ha_broker(watch="600")
    standby = ha_broker(leader=False)
    sub_id = uid("sub")
    sub = PahoClient(leader.mqtt_port, sub_id, mqtt.MQTTv311, clean=False)
    assert sub.subscribe(("fence/#", 1)) == [1]
    sub.disconnect()

    pub = _Publisher(leader.mqtt_port, "fence/x")
    assert pub.enough.wait(30), "the leader acknowledged fewer than 200 messages"
    # The backend holding the serving lock: the leader's lock connection, only.
    out = postgres_cluster.psql(database, (
        "SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.locktype = 'advisory' "
        "AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database "
        "WHERE datname = current_database()) AND (l.classid::bigint << 32 | "
        f"l.objid::bigint) = {SERVING_LOCK_KEY & 0xFFFFFFFFFFFFFFFF}"))
    assert out.strip() == "t", out
    standby.wait_for_line(r"took over as leader", TAKEOVER)
    line = leader.wait_for_line(r"lost the leadership", TAKEOVER)
    assert "another broker took over the storage" in line, line
    assert pub.gone.wait(TAKEOVER), "the old leader kept the publisher connected"
    acked = pub.stop()
    assert leader.proc is not None and leader.proc.wait(TAKEOVER) == 1

    back = PahoClient(standby.mqtt_port, sub_id, mqtt.MQTTv311, clean=False)
    try:
        assert back.session_present is True
        pending = set(acked)
        while pending:
            pending.discard(back.get(timeout=15).payload)
    finally:
        back.stop()


class _FailoverClient:
    """A persistent-session paho client given both brokers' ports: when its
    connection goes, or a connect fails, it tries the next one (paho reconnects)."""

    def __init__(self, ports: list[int], client_id: str) -> None:
        self.ports = ports
        self.index = 0
        self.connects: list[tuple[int, bool]] = []   # (port, session present)
        self.cv = threading.Condition()
        self.messages: list[bytes] = []
        self.subacks = 0
        # (KeepPubrel: paho would re-send a QoS 2 PUBLISH after its PUBREL once a
        # reconnect attempt is refused, a duplicate that is the client's)
        self.c = KeepPubrel(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                            clean_session=False)
        self.c.reconnect_delay_set(min_delay=1, max_delay=1)
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = lambda *a: self._failed()
        self.c.on_connect_fail = lambda *a: self._failed()
        self.c.on_pre_connect = lambda *a: self._next()
        self.rotate = False
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.connect("127.0.0.1", ports[0])
        self.c.loop_start()

    def _failed(self) -> None:
        self.rotate = True

    def _next(self) -> None:
        """Before paho's (re)connect: the next address after a failure.  (paho 2's
        ``port`` setter refuses while it reconnects, hence its attribute.)"""
        if self.rotate:
            self.rotate = False
            self.index = (self.index + 1) % len(self.ports)
            self.c._port = self.ports[self.index]

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any,
                    props: Any) -> None:
        with self.cv:
            self.connects.append((self.ports[self.index], bool(flags.session_present)))
            self.cv.notify_all()

    def _on_subscribe(self, *args: Any) -> None:
        with self.cv:
            self.subacks += 1
            self.cv.notify_all()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.cv:
            self.messages.append(msg.payload)
            self.cv.notify_all()

    def wait(self, what: Callable[[], bool]) -> None:
        with self.cv:
            assert self.cv.wait_for(what, TAKEOVER), (self.connects, self.messages)

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def test_a_client_given_both_addresses_follows_the_leader(ha_broker: Start) -> None:
    """A client that knows both brokers' addresses and tries the next one when its
    connection goes ends up on the new leader after kill -9 of the old one, with its
    persistent session (subscription and messages)."""
    leader = ha_broker()
    standby = ha_broker(leader=False)
    client = _FailoverClient([leader.mqtt_port, standby.mqtt_port], uid("fo"))
    try:
        client.wait(lambda: len(client.connects) == 1)
        rc, _ = client.c.subscribe("fo/#", 1)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        client.wait(lambda: client.subacks == 1)
        pub = PahoClient(leader.mqtt_port, uid("pub"))
        pub.publish("fo/x", b"before", 1)
        pub.stop()
        client.wait(lambda: client.messages == [b"before"])

        leader.kill()
        standby.wait_for_line(r"took over as leader", TAKEOVER)
        client.wait(lambda: client.connects[-1][0] == standby.mqtt_port)
        assert client.connects[-1] == (standby.mqtt_port, True)
        pub = PahoClient(standby.mqtt_port, uid("pub"))
        pub.publish("fo/x", b"after", 1)
        pub.stop()
        client.wait(lambda: client.messages[-1:] == [b"after"])
    finally:
        client.stop()


def test_qos2_stays_exactly_once_across_a_takeover(ha_broker: Start) -> None:
    """A QoS 2 publisher and a QoS 2 persistent subscriber, both given both addresses,
    go on across kill -9 of the leader: every message arrives, none twice."""
    leader = ha_broker()
    standby = ha_broker(leader=False)
    ports = [leader.mqtt_port, standby.mqtt_port]
    sub = _FailoverClient(ports, uid("q2s"))
    pub = _FailoverClient(ports, uid("q2p"))
    count = 2000
    try:
        sub.wait(lambda: len(sub.connects) == 1)
        sub.c.subscribe("q2/#", 2)
        sub.wait(lambda: sub.subacks == 1)
        pub.wait(lambda: len(pub.connects) == 1)
        infos = [pub.c.publish("q2/x", b"%04d" % i, 2) for i in range(count)]
        sub.wait(lambda: len(sub.messages) >= 50)
        leader.kill()
        at_kill = len(sub.messages)
        standby.wait_for_line(r"took over as leader", TAKEOVER)
        for info in infos:            # PUBCOMP for each, from one leader or the other
            info.wait_for_publish(TAKEOVER)
            assert info.is_published()
        marker = pub.c.publish("q2/x", b"end", 2)   # after every PUBCOMP: comes last
        marker.wait_for_publish(TAKEOVER)
        sub.wait(lambda: b"end" in sub.messages)
        got = [m for m in sub.messages if m != b"end"]
        assert at_kill < count, "the flow was over before the kill: nothing tested"
        assert sorted(got) == [b"%04d" % i for i in range(count)], (
            f"{len(got)} received, {len(set(got))} distinct")
    finally:
        pub.stop()
        sub.stop()
