"""AMQP connections against brokers of their own: SASL PLAIN with ``--users``, the
idle time-out, and AMQP wills across a crash and restart (the grace rule).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from amqp_clients import TIMEOUT, Paho, body_bytes, paho, receiver, take, uid
from amqp_messages import publish_message, will_message
from brokerproc import BrokerProcess
from proton import ConnectionException
from proton.utils import BlockingConnection

pytestmark = pytest.mark.timeout(120)
__all__ = ["paho"]


def url(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.ports['AMQP']}"


@pytest.fixture
def users_broker(tmp_path: os.PathLike[str]) -> Iterator[BrokerProcess]:
    users = os.path.join(str(tmp_path), "users")
    for name, password in (("alice", "wonderland"), ("bob", "builder")):
        subprocess.run([sys.executable, "-m", "mqttamqp.security.users", "add", users, name],
                       input=password + "\n", text=True, check=True, capture_output=True)
    proc = BrokerProcess(os.path.join(str(tmp_path), "data"), "--users", users,
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def test_sasl_plain_good_password(users_broker) -> None:
    """SASL PLAIN with a user of the --users file connects and can publish and receive."""
    conn = BlockingConnection(url(users_broker), timeout=TIMEOUT, user="alice",
                              password="wonderland", allowed_mechs="PLAIN",
                              allow_insecure_mechs=True)
    try:
        topic = uid("sp") + "/t"
        rcv = receiver(conn, topic)
        conn.create_sender(topic).send(publish_message(None, b"hi", qos=1))
        m, _ = take(conn, rcv)
        rcv.accept()
        assert body_bytes(m) == b"hi"
    finally:
        conn.close()


def test_sasl_plain_bad_password_is_unauthorized(users_broker) -> None:
    """A bad password closes the connection with amqp:unauthorized-access."""
    with pytest.raises(ConnectionException) as err:
        BlockingConnection(url(users_broker), timeout=TIMEOUT, user="alice", password="nope",
                           allowed_mechs="PLAIN", allow_insecure_mechs=True)
    assert "amqp:unauthorized-access" in str(err.value)
    with pytest.raises(ConnectionException) as err:
        BlockingConnection(url(users_broker), timeout=TIMEOUT, user="mallory", password="x",
                           allowed_mechs="PLAIN", allow_insecure_mechs=True)
    assert "amqp:unauthorized-access" in str(err.value)


def test_anonymous_refused_with_users_file(users_broker) -> None:
    """With --users, ANONYMOUS is not offered (AMQP) and MQTT refuses anonymous and bad logins."""
    with pytest.raises(ConnectionException):
        BlockingConnection(url(users_broker), timeout=TIMEOUT, allowed_mechs="ANONYMOUS")
    # skipping SASL altogether is refused too: the broker answers with its SASL header
    with socket.create_connection(("127.0.0.1", users_broker.ports["AMQP"]),
                                  timeout=TIMEOUT) as s:
        s.sendall(b"AMQP\x00\x01\x00\x00")
        assert s.recv(8) == b"AMQP\x03\x01\x00\x00"
    Paho(users_broker.mqtt_port, uid("anon"), expect_rc=5).stop()
    Paho(users_broker.mqtt_port, uid("bad"), username="bob", password="x",
         expect_rc=4).stop()
    Paho(users_broker.mqtt_port, uid("good"), username="bob", password="builder").stop()


@pytest.fixture
def idle_broker(tmp_path: os.PathLike[str]) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(os.path.join(str(tmp_path), "data"), "--amqp-idle-timeout", "1",
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def _frames(data: bytes) -> list[bytes]:
    frames, pos = [], 8
    while pos + 8 <= len(data):
        size = struct.unpack_from(">I", data, pos)[0]
        frames.append(data[pos:pos + size])
        pos += size
    return frames


def test_idle_timeout_closes_a_silent_peer(idle_broker) -> None:
    """A peer silent past the idle time-out is closed with amqp:resource-limit-exceeded:
    still open half a second in, closed within TIMEOUT (the exact rule, open just before
    the time-out and closed past it, is on a Clock in unit/amqp/test_amqp_adapter.py)."""
    with socket.create_connection(("127.0.0.1", idle_broker.ports["AMQP"]), timeout=TIMEOUT) as s:
        s.sendall(b"AMQP\x00\x01\x00\x00")
        data = b""
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):     # half a second in: open, nothing closed it
            while chunk := s.recv(4096):
                data += chunk
            raise AssertionError(f"closed within half a second: {data!r}")
        s.settimeout(TIMEOUT)
        while chunk := s.recv(4096):          # then closed, within TIMEOUT
            data += chunk
    assert data.startswith(b"AMQP\x00\x01\x00\x00")
    assert b"amqp:resource-limit-exceeded" in data


def test_idle_timeout_advertised_and_heartbeats_keep_alive(idle_broker) -> None:
    """The broker advertises its idle time-out; a client that heartbeats stays connected."""
    conn = BlockingConnection(url(idle_broker), timeout=TIMEOUT)
    try:
        assert conn.conn.transport.remote_idle_timeout > 0
        topic = uid("hb") + "/t"
        rcv = receiver(conn, topic)
        snd = conn.create_sender(topic)
        deadline = time.monotonic() + 3       # three idle periods, pumped by wait()
        while time.monotonic() < deadline:
            try:
                conn.wait(lambda: False, timeout=0.5)
            except Exception as exc:          # proton's Timeout: nothing happened, fine
                assert type(exc).__name__ == "Timeout", exc
        snd.send(publish_message(None, b"alive", qos=1))
        m, _ = take(conn, rcv)
        rcv.accept()
        assert body_bytes(m) == b"alive"
    finally:
        conn.close()


def test_idle_timeout_publishes_the_will(idle_broker, paho) -> None:
    """An AMQP client that stops talking after setting a will is timed out; its will fires."""
    topic = uid("it") + "/will"
    sub = paho(idle_broker, uid("s"))
    sub.subscribe((topic, 1))
    conn = BlockingConnection(url(idle_broker), timeout=TIMEOUT)
    try:
        ws = conn.create_sender("$mqtt.willservice", name=uid("fe"))
        ws.send(will_message(topic, b"timed-out", qos=1))
        m = sub.get()       # the client does not pump its connection meanwhile
        assert (m.payload, m.qos) == (b"timed-out", 1)
    finally:
        try:
            conn.close()
        except Exception:
            pass


def test_amqp_wills_survive_a_restart_with_the_grace_rule(tmp_path, paho) -> None:
    """After kill -9 and restart, an AMQP will fires after --will-grace unless its link is back."""
    data = os.path.join(str(tmp_path), "data")
    first = BrokerProcess(data, "--will-grace", "2", "--sys-interval", "1",
                          listeners=("--mqtt", "--amqp")).start()
    gone, back = uid("gone"), uid("back")
    try:
        conn = BlockingConnection(url(first), timeout=TIMEOUT)
        for name in (gone, back):
            ws = conn.create_sender("$mqtt.willservice", name=name)
            ws.send(will_message(f"{name}/will", b"from " + name.encode(), qos=1,
                                 retain=True))
        counter = paho(first, uid("sys"))
        counter.subscribe(("$SYS/broker/wills/count", 0))
        while counter.get().payload != b"2":    # one store: $SYS counts AMQP wills
            pass
    finally:
        first.kill()
    second = BrokerProcess(data, "--will-grace", "2", listeners=("--mqtt", "--amqp")).start()
    try:
        conn2 = BlockingConnection(url(second), timeout=TIMEOUT)
        conn2.create_sender("$mqtt.willservice", name=back)     # back within the grace period
        second.wait_for_line(back + " is back within the will grace period", TIMEOUT)
        sub = paho(second, uid("s"))
        sub.subscribe((f"{gone}/will", 1), (f"{back}/will", 1))
        m = sub.get(TIMEOUT)
        assert (m.topic, m.payload) == (f"{gone}/will", b"from " + gone.encode())
        second.wait_for_line("publishing will of " + gone, TIMEOUT)
        paho(second, uid("p")).publish(f"{back}/will", b"marker", qos=1)
        assert [x.payload for x in sub.until(f"{back}/will")] == [b"marker"]
        conn2.close()
    finally:
        second.stop()


def _wait_sys(client: Paho, values: dict[str, bytes], name: str, value: bytes) -> None:
    """Read $SYS updates into ``values`` (each topic's last value: a burst publishes
    only what changed) until ``name`` shows ``value`` (bounded by the client's waits)."""
    seen = []
    deadline = time.monotonic() + TIMEOUT
    while values.get(name) != value and time.monotonic() < deadline:
        try:
            m = client.get(max(0.1, deadline - time.monotonic()))
        except AssertionError:
            break
        values[m.topic[len("$SYS/broker/"):]] = m.payload
        seen.append(m.topic)
    if values.get(name) != value:
        raise AssertionError(f"{name} never showed {value!r}; saw {seen}, {values}")


def test_sys_counts_amqp_connections_as_clients(tmp_path, paho) -> None:
    """$SYS clients/connected, total and maximum count an AMQP connection from its open
    (even with no links) to its close, like the console does."""
    proc = BrokerProcess(os.path.join(str(tmp_path), "data"), "--sys-interval", "1",
                         listeners=("--mqtt", "--amqp")).start()
    try:
        watcher = paho(proc, uid("sys"))
        watcher.subscribe(("$SYS/broker/clients/+", 0))
        values: dict[str, bytes] = {}
        _wait_sys(watcher, values, "clients/connected", b"1")
        conn = BlockingConnection(url(proc), timeout=TIMEOUT)      # no links at all
        _wait_sys(watcher, values, "clients/connected", b"2")
        _wait_sys(watcher, values, "clients/total", b"2")
        conn.close()
        _wait_sys(watcher, values, "clients/connected", b"1")
        _wait_sys(watcher, values, "clients/maximum", b"2")
    finally:
        proc.stop()
