"""Loops of bridges between two real mqttamqp processes on loopback: a ``both`` rule
at 3.1.1 (Mosquitto's bridge flag, which this broker now honours as Mosquitto does)
and at MQTT 5 (no-local) carries each message once to each side; two bridges that
form a loop at MQTT 5 stop at ``max-hops`` (counted, logged), with no storm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from pahoclient import Paho5, PahoClient


def _near(tmp_path: Path, name: str, far: BrokerProcess, body: str,
          *extra: str) -> BrokerProcess:
    config = tmp_path / f"{name}.toml"
    config.write_text(f"""
[[bridge]]
name = "{name}"
address = "mqtt://127.0.0.1:{far.mqtt_port}"
reconnect-min = 0.2
reconnect-max = 1.0
{body}
""")
    return BrokerProcess(os.path.join(tmp_path, name), "--config", str(config), *extra)


def _until(client: PahoClient, markers: set[str]) -> list[str]:
    """Topics received up to every marker (bounded)."""
    topics: list[str] = []
    for _ in range(30):
        topics.append(client.get().topic)
        if markers <= set(topics):
            return topics
    raise AssertionError(topics)


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_a_both_rule_between_two_mqttamqp_carries_each_message_once(
        tmp_path: Path, protocol: str) -> None:
    """A ``both`` rule to a second mqttamqp: a publish on either side arrives once on
    each side, none comes back (3.1.1: the bridge flag; 5: no-local)."""
    far = BrokerProcess(os.path.join(tmp_path, "far")).start()
    near = _near(tmp_path, "hq", far, f'topics = ["t/# both 1"]\nprotocol = "{protocol}"')
    try:
        near.start()
        near.wait_for_line(r"bridge hq to \S+: connected", timeout=15)
        near.wait_for_line("bridge hq: subscribed on the remote", timeout=15)
        far_sub = PahoClient(far.mqtt_port, "far-sub")
        far_sub.subscribe(("t/#", 1))
        near_sub = PahoClient(near.mqtt_port, "near-sub")
        near_sub.subscribe(("t/#", 1))
        near_pub = PahoClient(near.mqtt_port, "near-pub")
        far_pub = PahoClient(far.mqtt_port, "far-pub")
        near_pub.publish("t/a", b"a", qos=1)
        far_pub.publish("t/b", b"b", qos=1)
        near_pub.publish("t/end", b"e", qos=1)
        far_pub.publish("t/end2", b"e", qos=1)
        markers = {"t/end", "t/end2"}
        assert sorted(_until(far_sub, markers)) == ["t/a", "t/b", "t/end", "t/end2"]
        assert sorted(_until(near_sub, markers)) == ["t/a", "t/b", "t/end", "t/end2"]
        # A message sent back would have come before the markers that followed it on
        # the same path; one more round proves nothing is still going round.
        near_pub.publish("t/last", b"l", qos=1)
        assert far_sub.get().topic == "t/last"
        assert near_sub.get().topic == "t/last"
        for c in (far_sub, near_sub, near_pub, far_pub):
            c.stop()
    finally:
        near.stop()
        far.stop()


def test_two_bridges_in_a_loop_stop_at_max_hops(tmp_path: Path) -> None:
    """A bridge each way on the same topic (a loop) at MQTT 5 with max-hops 3: a
    message goes round until it has crossed 3 bridges, then is not forwarded
    (counted and logged); each side sees a bounded number of copies, with their
    hop counts."""
    a = BrokerProcess(os.path.join(tmp_path, "a0")).start()
    b = _near(tmp_path, "ba", a, 'topics = ["loop/# out 1"]\nprotocol = "5"\nmax-hops = 3')
    try:
        b.start()
        b.wait_for_line(r"bridge ba to \S+: connected", timeout=15)
        a.stop()
        # a again, now with its own bridge to b (its port may change: b reconnects to
        # the address it has, so a keeps its port by listening where it did)
        a_port = a.mqtt_port
        config = tmp_path / "ab.toml"
        config.write_text(f"""
[[bridge]]
name = "ab"
address = "mqtt://127.0.0.1:{b.mqtt_port}"
topics = ["loop/# out 1"]
protocol = "5"
max-hops = 3
reconnect-min = 0.2
reconnect-max = 1.0
""")
        a = BrokerProcess(os.path.join(tmp_path, "a0"), "--config", str(config),
                          descriptions={"--mqtt": f"tcp:{a_port}:interface=127.0.0.1"})
        a.start()
        a.wait_for_line(r"bridge ab to \S+: connected", timeout=15)
        b.wait_for_line(r"bridge ba to \S+: connected", timeout=15)
        a_sub = Paho5(a.mqtt_port, "a-sub")
        a_sub.subscribe(("loop/#", 1))
        b_sub = Paho5(b.mqtt_port, "b-sub")
        b_sub.subscribe(("loop/#", 1))
        a_pub = Paho5(a.mqtt_port, "a-pub")
        a_pub.publish("loop/x", b"x", qos=1)

        def hops(client: PahoClient) -> str:
            props = client.get().properties
            users = dict(getattr(props, "UserProperty", []) or [])
            return str(users.get("bridge-hops", "0"))

        # a: the original (0), back from b after 2 crossings; b: after 1 and 3.
        assert [hops(a_sub), hops(a_sub)] == ["0", "2"]
        assert [hops(b_sub), hops(b_sub)] == ["1", "3"]
        line = b.wait_for_line("bridge ba: a message on loop/x was not forwarded", 15)
        assert "crossed 3 bridges already (max-hops 3" in line, line
        # Nothing more goes round: the next message is the next one seen.
        a_pub.publish("loop/y", b"y", qos=1)
        assert a_sub.get().topic == "loop/y"
        assert b_sub.get().topic == "loop/y"
        for c in (a_sub, b_sub, a_pub):
            c.stop()
    finally:
        b.stop()
        a.stop()
