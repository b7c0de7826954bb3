"""MQTT bridges against Mosquitto as the remote: ``out`` and ``in`` at QoS 1 through
the real broker process configured with a ``[[bridge]]`` table, and the remote
stopped mid-stream and restarted, or SIGKILLed under QoS 1 load (no QoS 1 message
lost, order kept, duplicates only the in-flight resends)."""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from brokerproc import BrokerProcess, RestartableBroker
from mosquitto_server import MosquittoServer, running_mosquitto
from paho.mqtt.enums import CallbackAPIVersion
from pahoclient import PahoClient
from pki import make_pki

CONNECTED = r"bridge hq to \S+: connected"
WAITING = r"bridge hq to \S+: (lost|failing)"
SUBSCRIBED = "bridge hq: subscribed on the remote"


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[MosquittoServer]:
    yield from running_mosquitto(tmp_path)


@pytest.fixture
def bridged(tmp_path: Path, remote: MosquittoServer) -> Iterator[BrokerProcess]:
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
address = "mqtt://127.0.0.1:{remote.port}"
topics = ["sensors/# out 1", "commands/# in 1"]
reconnect-min = 0.2
reconnect-max = 1.0
""")
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config))
    broker.start()
    broker.wait_for_line(CONNECTED, timeout=15)
    broker.wait_for_line(SUBSCRIBED, timeout=15)
    yield broker
    broker.stop()


def _firsts(payloads: list[bytes]) -> list[bytes]:
    """Each payload once, in the order first seen (QoS 1 allows duplicates)."""
    seen: set[bytes] = set()
    return [p for p in payloads if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def test_out_qos1_reaches_mosquitto_in_order(bridged: BrokerProcess,
                                              remote: MosquittoServer) -> None:
    """Messages published here on an ``out`` topic reach a Mosquitto subscriber, in order."""
    sub = PahoClient(remote.port, "far-sub")
    sub.subscribe(("sensors/#", 1))
    pub = PahoClient(bridged.mqtt_port, "near-pub")
    for i in range(50):
        pub.publish("sensors/t", b"m%03d" % i, qos=1)
    got = [sub.get() for _ in range(50)]
    assert [m.payload for m in got] == [b"m%03d" % i for i in range(50)]
    assert {(m.topic, m.qos) for m in got} == {("sensors/t", 1)}
    pub.stop()
    sub.stop()


def test_in_qos1_reaches_local_subscriber(bridged: BrokerProcess,
                                          remote: MosquittoServer) -> None:
    """Messages published on Mosquitto on an ``in`` topic reach a subscriber here at QoS 1."""
    sub = PahoClient(bridged.mqtt_port, "near-sub")
    sub.subscribe(("commands/#", 1))
    pub = PahoClient(remote.port, "far-pub")
    for i in range(20):
        pub.publish("commands/go", b"c%02d" % i, qos=1)
    got = [sub.get() for _ in range(20)]
    assert [m.payload for m in got] == [b"c%02d" % i for i in range(20)]
    assert {(m.topic, m.qos) for m in got} == {("commands/go", 1)}
    pub.stop()
    sub.stop()


def test_remote_restart_mid_stream_loses_no_qos1(bridged: BrokerProcess,
                                                 remote: MosquittoServer) -> None:
    """Mosquitto stopped mid-stream and restarted: every QoS 1 message arrives, in order."""
    sub = PahoClient(remote.port, "far-keeper", clean=False)
    sub.subscribe(("sensors/#", 1))
    pub = PahoClient(bridged.mqtt_port, "near-pub2")
    for i in range(30):
        pub.publish("sensors/r", b"r%03d" % i, qos=1)
    before = [sub.get().payload for _ in range(30)]
    sub.stop()
    remote.stop()
    bridged.wait_for_line(WAITING, timeout=15)
    for i in range(30, 90):       # acknowledged here while the remote is away
        pub.publish("sensors/r", b"r%03d" % i, qos=1)
    remote.start()
    again = PahoClient(remote.port, "far-keeper", clean=False)
    bridged.wait_for_line(CONNECTED, timeout=15)
    rest: list[bytes] = []
    for _ in range(200):          # bounded: 60 messages, and duplicates allowed
        rest.append(again.get().payload)
        if rest[-1] == b"r089":
            break
    assert _firsts(before + rest) == [b"r%03d" % i for i in range(90)], rest
    pub.stop()
    again.stop()


def test_backlog_survives_kill_9_of_the_broker(tmp_path: Path,
                                               remote: MosquittoServer) -> None:
    """QoS 1 messages acknowledged here while the remote is down survive ``kill -9``
    of this broker and reach the remote, in order, once both are back."""
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
address = "mqtt://127.0.0.1:{remote.port}"
topics = ["sensors/# out 1"]
reconnect-min = 0.2
reconnect-max = 1.0
""")
    sub = PahoClient(remote.port, "far-durable", clean=False)
    sub.subscribe(("sensors/#", 1))
    sub.stop()
    remote.stop()
    data = os.path.join(tmp_path, "data")
    broker = RestartableBroker(data, "--config", str(config)).start()
    pub = PahoClient(broker.mqtt_port, "near-pub3")
    for i in range(40):
        pub.publish("sensors/k", b"k%03d" % i, qos=1)
    pub.stop()
    broker.kill()
    remote.start()
    broker = RestartableBroker(data, "--config", str(config)).start()
    try:
        broker.wait_for_line(CONNECTED, timeout=15)
        again = PahoClient(remote.port, "far-durable", clean=False)
        got: list[bytes] = []
        for _ in range(200):      # bounded: 40 messages, and duplicates allowed
            got.append(again.get().payload)
            if got[-1] == b"k039":
                break
        assert _firsts(got) == [b"k%03d" % i for i in range(40)], got
        again.stop()
    finally:
        broker.stop()


def test_qos2_and_qos0_both_ways(tmp_path: Path, remote: MosquittoServer) -> None:
    """QoS 2 and QoS 0 rules carry messages out to Mosquitto and in from it."""
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
address = "mqtt://127.0.0.1:{remote.port}"
topics = ["two/# out 2", "zero/# out 0", "back2/# in 2", "back0/# in 0"]
""")
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config)).start()
    try:
        broker.wait_for_line(CONNECTED, timeout=15)
        broker.wait_for_line(SUBSCRIBED, timeout=15)
        far = PahoClient(remote.port, "far2")
        far.subscribe(("two/#", 2), ("zero/#", 0))
        near = PahoClient(broker.mqtt_port, "near2")
        near.subscribe(("back2/#", 2), ("back0/#", 0))
        near.publish("two/a", b"t1", qos=2)
        near.publish("zero/a", b"z1", qos=0)
        got = {(m.topic, m.payload, m.qos) for m in (far.get(), far.get())}
        assert got == {("two/a", b"t1", 2), ("zero/a", b"z1", 0)}
        far.publish("back2/a", b"b2", qos=2)
        far.publish("back0/a", b"b0", qos=0)
        got = {(m.topic, m.payload, m.qos) for m in (near.get(), near.get())}
        assert got == {("back2/a", b"b2", 2), ("back0/a", b"b0", 0)}
        far.stop()
        near.stop()
    finally:
        broker.stop()


def test_bridge_to_a_second_mqttamqp(tmp_path: Path) -> None:
    """A bridge to another mqttamqp (bridge flag off) carries QoS 1 both ways."""
    far = BrokerProcess(os.path.join(tmp_path, "far")).start()
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "peer"
address = "mqtt://127.0.0.1:{far.mqtt_port}"
topics = ["up/# out 1", "down/# in 1"]
try-private = false
""")
    near = BrokerProcess(os.path.join(tmp_path, "near"), "--config", str(config))
    try:
        near.start()
        near.wait_for_line(r"bridge peer to \S+: connected", timeout=15)
        near.wait_for_line("bridge peer: subscribed on the remote", timeout=15)
        far_sub = PahoClient(far.mqtt_port, "far-sub")
        far_sub.subscribe(("up/#", 1))
        near_sub = PahoClient(near.mqtt_port, "near-sub")
        near_sub.subscribe(("down/#", 1))
        near_pub = PahoClient(near.mqtt_port, "near-pub")
        far_pub = PahoClient(far.mqtt_port, "far-pub")
        for i in range(10):
            near_pub.publish("up/x", b"u%d" % i, qos=1)
            far_pub.publish("down/x", b"d%d" % i, qos=1)
        assert [far_sub.get().payload for _ in range(10)] == [b"u%d" % i for i in range(10)]
        assert [near_sub.get().payload for _ in range(10)] == [b"d%d" % i for i in range(10)]
        for c in (far_sub, near_sub, near_pub, far_pub):
            c.stop()
    finally:
        near.stop()
        far.stop()


def _tls_bridge(tmp_path: Path, far: BrokerProcess, ca: str, extra: str) -> BrokerProcess:
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "sec"
address = "mqtts://localhost:{far.mqtt_port}"
topics = ["up/# out 1"]
try-private = false
tls-ca = "{ca}"
reconnect-min = 0.2
reconnect-max = 1.0
{extra}
""")
    return BrokerProcess(os.path.join(tmp_path, "near"), "--config", str(config)).start()


def test_mqtts_remote_verified_by_name(tmp_path: Path) -> None:
    """An mqtts:// remote whose certificate names it is accepted and carries QoS 1."""
    pki = make_pki(str(tmp_path))
    far = BrokerProcess(os.path.join(tmp_path, "far"),
                        descriptions={"--mqtt": pki.ssl()}).start()
    near = _tls_bridge(tmp_path, far, pki.ca, "")
    try:
        near.wait_for_line(r"bridge sec to \S+: connected", timeout=15)
        got: queue.Queue[bytes] = queue.Queue()
        subscribed = threading.Event()
        sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="far-tls")
        sub.tls_set(ca_certs=pki.ca)
        sub.on_message = lambda c, u, msg: got.put(msg.payload)
        sub.on_subscribe = lambda *a: subscribed.set()
        sub.on_connect = lambda c, *a: c.subscribe("up/#", 1)
        sub.connect("localhost", far.mqtt_port)
        sub.loop_start()
        try:
            assert subscribed.wait(10), "no SUBACK from the far broker"
            pub = PahoClient(near.mqtt_port, "near-tls")
            pub.publish("up/s", b"secret", qos=1)
            assert got.get(timeout=10) == b"secret"
            pub.stop()
        finally:
            sub.disconnect()
            sub.loop_stop()
    finally:
        near.stop()
        far.stop()


def test_mqtts_remote_with_a_wrong_name_is_refused(tmp_path: Path) -> None:
    """A certificate that does not name the expected server fails verification."""
    pki = make_pki(str(tmp_path))
    far = BrokerProcess(os.path.join(tmp_path, "far"),
                        descriptions={"--mqtt": pki.ssl()}).start()
    near = _tls_bridge(tmp_path, far, pki.ca, 'server-name = "wrong.example"')
    try:
        line = near.wait_for_line(r"bridge sec to \S+: (connected|failing)", timeout=15)
        assert "failing (connection lost: VerificationError" in line, line
        assert "wrong.example" in line, line
    finally:
        near.stop()
        far.stop()


def _until_both(client: PahoClient) -> list[str]:
    """Topics received up to both end markers (bounded)."""
    topics: list[str] = []
    for _ in range(20):
        topics.append(client.get().topic)
        if {"five/end", "five/end2"} <= set(topics):
            return topics
    raise AssertionError(topics)


def test_mqtt5_both_rule_sends_nothing_back(tmp_path: Path, remote: MosquittoServer) -> None:
    """MQTT 5 toward Mosquitto with a ``both`` rule: each message crosses once, none
    comes back (no-local on both sides)."""
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
address = "mqtt://127.0.0.1:{remote.port}"
protocol = "5"
topics = ["five/# both 1"]
""")
    broker = BrokerProcess(os.path.join(tmp_path, "data"), "--config", str(config)).start()
    try:
        broker.wait_for_line(CONNECTED, timeout=15)
        broker.wait_for_line(SUBSCRIBED, timeout=15)
        far_sub = PahoClient(remote.port, "far5-sub")
        far_sub.subscribe(("five/#", 1))
        near_sub = PahoClient(broker.mqtt_port, "near5-sub")
        near_sub.subscribe(("five/#", 1))
        near_pub = PahoClient(broker.mqtt_port, "near5-pub")
        far_pub = PahoClient(remote.port, "far5-pub")
        near_pub.publish("five/a", b"a", qos=1)
        assert far_sub.get().topic == "five/a"
        far_pub.publish("five/b", b"b", qos=1)
        assert near_sub.get().topic == "five/a"
        assert near_sub.get().topic == "five/b"
        near_pub.publish("five/end", b"e", qos=1)
        far_pub.publish("five/end2", b"e", qos=1)
        # (the two markers take different paths: their order is not fixed)
        assert sorted(_until_both(far_sub)) == ["five/b", "five/end", "five/end2"]
        assert sorted(_until_both(near_sub)) == ["five/end", "five/end2"]
        log = "".join(remote.log)
        assert ".hq (p5, c0," in log, "the bridge is an MQTT 5 client, clean start 0"
        for c in (far_sub, near_sub, near_pub, far_pub):
            c.stop()
    finally:
        broker.stop()


_RECEIVED = re.compile(r"Received PUBLISH from \S+\.hq \(d(\d), q1, r\d, m\d+, "
                       r"'sensors/load/(\d+)'")


def _arrivals(lines: list[str]) -> list[tuple[int, bool]]:
    """(message number, DUP) of each PUBLISH Mosquitto logged from the bridge."""
    return [(int(m.group(2)), m.group(1) == "1")
            for m in (_RECEIVED.search(line) for line in lines) if m]


def test_remote_kill_9_under_qos1_load_loses_nothing(bridged: BrokerProcess,
                                                     remote: MosquittoServer) -> None:
    """Mosquitto SIGKILLed (by PID) mid-stream under QoS 1 load and restarted: every
    message acknowledged here reaches it, first copies in order; the only duplicates
    are the DUP resends of what was in flight at the cut, sent first after the
    reconnect and at most --max-inflight (32) of them."""
    total, cut = 600, 150
    pub = PahoClient(bridged.mqtt_port, "near-load")
    failed: list[BaseException] = []


    def publish_all() -> None:
        try:
            infos = [pub.c.publish(f"sensors/load/{i}", b"x" * 64, 1) for i in range(total)]
            for info in infos:
                info.wait_for_publish(30)
                assert info.is_published(), "a QoS 1 publish was not acknowledged here"
        except BaseException as exc:   # (reported by the test thread)
            failed.append(exc)

    publisher = threading.Thread(target=publish_all, daemon=True)
    publisher.start()
    remote.wait_for(f"'sensors/load/{cut}'", timeout=30)
    remote.stop(signal.SIGKILL)
    bridged.wait_for_line(WAITING, timeout=15)
    remote.start()
    bridged.wait_for_line(CONNECTED, timeout=15)
    publisher.join(timeout=60)
    assert not publisher.is_alive() and not failed, failed
    last = f"'sensors/load/{total - 1}'"
    if not any(last in line for line in list(remote.log)):
        remote.wait_for(last, timeout=30)
    log = list(remote.log)
    restarted = max(i for i, line in enumerate(log) if " starting" in line)
    before, after = _arrivals(log[:restarted]), _arrivals(log[restarted:])
    numbers = [n for n, _ in before + after]
    assert _firsts([b"%d" % n for n in numbers]) == [b"%d" % i for i in range(total)]
    resent = [n for n, dup in after if dup]
    assert len(resent) <= 32, resent
    assert [dup for _, dup in after[:len(resent)]] == [True] * len(resent), after[:40]
    assert len(numbers) - total <= len(resent), (len(numbers), resent)
    pub.stop()
