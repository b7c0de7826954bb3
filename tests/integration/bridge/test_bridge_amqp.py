"""AMQP 1.0 bridges (``amqp://``, ``amqps://``) to a second mqttamqp process on
loopback, through its AMQP listener: ``out`` to a topic address and ``in`` from a
durable queue, at QoS 1, with the remote stopped mid-stream and started again on the
same ports (nothing acknowledged lost, first copies in order); a ``both`` rule each
way without echoes; a message the remote rejects dropped while the rest go on; one
it refuses for now (a full queue count there) kept and delivered once it has room; TLS
verified by name with a ``mqttamqp-admin gen-cert`` certificate, a wrong name failing."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from brokerproc import BrokerProcess
from pahoclient import PahoClient
from ports import free_port

from mqttamqp.console.credentials import main as admin_main

COUNT = 300        # messages each way
STOP_AFTER = 100   # the remote is stopped once this many are acknowledged


def _far(tmp_path: Path, ports: dict[str, int] | None = None,
         descriptions: dict[str, str] | None = None, *extra: str) -> BrokerProcess:
    """The remote: a second mqttamqp with MQTT and AMQP listeners (on ``ports`` when
    it starts again)."""
    if descriptions is None:
        # (ports below the ephemeral range: a restart listens on them again, and a
        # port the kernel handed out could meanwhile be a client's — "in use")
        ports = ports or {"MQTT": free_port(), "AMQP": free_port()}
        descriptions = {"--mqtt": f"tcp:{ports['MQTT']}:interface=127.0.0.1",
                        "--amqp": f"tcp:{ports['AMQP']}:interface=127.0.0.1"}
    return BrokerProcess(os.path.join(tmp_path, "far"), *extra, listeners=("--mqtt", "--amqp"),
                         descriptions=descriptions).start()


def _near(tmp_path: Path, address: str, body: str) -> BrokerProcess:
    config = tmp_path / "near.toml"
    config.write_text(f"""
[[bridge]]
name = "hq"
address = "{address}"
reconnect-min = 0.2
reconnect-max = 1.0
{body}
""")
    return BrokerProcess(os.path.join(tmp_path, "near"), "--config", str(config)).start()


def _first_copies(payloads: list[bytes]) -> list[int]:
    seen: set[bytes] = set()
    order: list[int] = []
    for p in payloads:
        if p not in seen:
            seen.add(p)
            order.append(int(p))
    return order


def test_out_to_a_topic_address_loses_nothing_over_a_remote_restart(tmp_path: Path) -> None:
    """QoS 1 ``out`` rule with a remote prefix: each local ``out/N`` reaches the remote
    as address ``far/out/N``; the remote killed mid-stream and started again, every
    message acknowledged here arrives there, first copies in order."""
    far = _far(tmp_path)
    near = _near(tmp_path, f"amqp://127.0.0.1:{far.ports['AMQP']}",
                 'topics = ["out/# out 1 \\"\\" far/"]')
    try:
        near.wait_for_line(r"bridge hq to amqp://\S+: connected", timeout=15)
        sub = PahoClient(far.mqtt_port, "far-sub", clean=False)
        sub.subscribe(("far/out/#", 1))
        pub = PahoClient(near.mqtt_port, "near-pub")
        halfway = threading.Event()
        done = threading.Event()

        def publish() -> None:
            for i in range(COUNT):
                pub.publish(f"out/{i}", str(i).encode(), qos=1)
                if i == STOP_AFTER:
                    halfway.set()
            done.set()

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        assert halfway.wait(30), "the first messages were not acknowledged here"
        ports = dict(far.ports)
        far.kill()   # (-9: what it accepted it had stored)
        sub.stop()
        near.wait_for_line(r"bridge hq to amqp://\S+: lost", timeout=15)
        assert done.wait(60), "publishing here stalled while the remote was away"
        far = _far(tmp_path, ports)
        near.wait_for_line(r"bridge hq to amqp://\S+: connected", timeout=15)
        again = PahoClient(far.mqtt_port, "far-sub", clean=False)
        _receive_all(again, "far/out/", [m.payload for m in _drain(sub)])
        for c in (pub, again):
            c.stop()
    finally:
        near.stop()
        far.stop()


def _receive_all(client: PahoClient, prefix: str, payloads: list[bytes]) -> None:
    """Receive (after ``payloads``, already had) until every one of the COUNT messages
    came, each on ``prefix`` + its number; their first copies in order."""
    for _ in range(2 * COUNT):
        if len(set(payloads)) == COUNT:
            break
        msg = client.get(30)
        assert msg.topic == f"{prefix}{int(msg.payload)}"
        payloads.append(msg.payload)
    assert _first_copies(payloads) == list(range(COUNT))


def _drain(client: PahoClient) -> list[object]:
    """What a stopped client had received (its queue, without waiting)."""
    got = []
    while not client.messages.empty():
        got.append(client.messages.get_nowait())
    return got


def test_in_from_a_remote_queue_loses_nothing_over_a_remote_restart(tmp_path: Path) -> None:
    """QoS 1 ``in`` rule reading the remote's durable queue ``jobs`` (``$queue/jobs/#``)
    into local topics ``in/N``, accepted there only once stored here: the remote
    stopped mid-stream and started again, every message its publisher had
    acknowledged arrives here, first copies in order."""
    far = _far(tmp_path)
    near = _near(tmp_path, f"amqp://127.0.0.1:{far.ports['AMQP']}",
                 'topics = ["# in 1 in/ $queue/jobs/"]')
    try:
        near.wait_for_line(r"bridge hq: receiving from the remote's \$queue/jobs/#",
                           timeout=15)
        sub = PahoClient(near.mqtt_port, "near-sub", clean=False)
        sub.subscribe(("in/#", 1))
        pub = PahoClient(far.mqtt_port, "far-pub")
        for i in range(STOP_AFTER):
            pub.publish(f"$queue/jobs/{i}", str(i).encode(), qos=1)
        pub.stop()
        ports = dict(far.ports)
        far.stop()
        near.wait_for_line(r"bridge hq to amqp://\S+: lost", timeout=15)
        far = _far(tmp_path, ports)
        pub = PahoClient(far.mqtt_port, "far-pub")
        for i in range(STOP_AFTER, COUNT):
            pub.publish(f"$queue/jobs/{i}", str(i).encode(), qos=1)
        _receive_all(sub, "in/", [])
        for c in (pub, sub):
            c.stop()
    finally:
        near.stop()
        far.stop()


def _gen_cert(directory: Path, host: str) -> tuple[str, str]:
    """(certificate, key) written by ``mqttamqp-admin gen-cert``."""
    assert admin_main(["gen-cert", "--data", str(directory), "--host", host]) == 0
    return str(directory / "tls" / "server.crt"), str(directory / "tls" / "server.key")


def test_amqps_verifies_the_remote_by_name(tmp_path: Path) -> None:
    """``amqps://`` to a remote serving a gen-cert certificate for localhost: with its
    CA and the right name the bridge connects and carries a message; a second bridge
    naming ``wrong.example`` fails verification (VerificationError, in one line)."""
    crt, key = _gen_cert(tmp_path / "pki", "localhost")
    far = _far(tmp_path, descriptions={
        "--amqp": f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={crt}"})
    address = f"amqps://localhost:{far.ports['AMQP']}"
    near = _near(tmp_path, address, f'topics = ["tls/# out 1"]\ntls-ca = "{crt}"\n'
                 f"""
[[bridge]]
name = "wrong"
address = "{address}"
topics = ["nothing/# out 1"]
tls-ca = "{crt}"
server-name = "wrong.example"
""")
    try:
        said: dict[str, str] = {}
        for _ in range(2):   # (the two bridges' first lines, in either order)
            line = near.wait_for_line(r"bridge (hq|wrong) to \S+: (connected|failing)", 15)
            said[line.split("bridge ", 1)[1].split(" ", 1)[0]] = line
        assert ": connected" in said["hq"], said
        assert "VerificationError" in said["wrong"] and "wrong.example" in said["wrong"], said
        sub = PahoClient(far.mqtt_port, "far-sub")
        sub.subscribe(("tls/#", 1))
        pub = PahoClient(near.mqtt_port, "near-pub")
        pub.publish("tls/a", b"over TLS", qos=1)
        msg = sub.get(15)
        assert (msg.topic, msg.payload) == ("tls/a", b"over TLS")
        for c in (pub, sub):
            c.stop()
    finally:
        near.stop()
        far.stop()


def test_a_both_rule_carries_each_message_once_each_way(tmp_path: Path) -> None:
    """A ``both`` rule to a second mqttamqp over AMQP: a publish on either side arrives
    once on each side; the remote's copy of ours is not published here again."""
    far = _far(tmp_path)
    near = _near(tmp_path, f"amqp://127.0.0.1:{far.ports['AMQP']}", 'topics = ["t/# both 1"]')
    try:
        near.wait_for_line(r"bridge hq: receiving from the remote's t/#", timeout=15)
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
        for sub in (far_sub, near_sub):
            topics = [sub.get(15).topic for _ in range(4)]
            assert sorted(topics) == ["t/a", "t/b", "t/end", "t/end2"], topics
        # An echo would have come before the markers that followed it on the same
        # path; one more round proves nothing else is on its way.
        near_pub.publish("t/last", b"l", qos=1)
        assert far_sub.get(15).topic == "t/last"
        assert near_sub.get(15).topic == "t/last"
        for c in (far_sub, near_sub, near_pub, far_pub):
            c.stop()
    finally:
        near.stop()
        far.stop()


def test_a_message_the_remote_rejects_is_dropped_and_the_rest_go_on(tmp_path: Path) -> None:
    """The remote rejects a message (its address ``$queue/q/$ack`` is refused there):
    it is dropped here, logged with the remote's reason, and the messages after it go
    through on the same connection."""
    far = _far(tmp_path)
    near = _near(tmp_path, f"amqp://127.0.0.1:{far.ports['AMQP']}",
                 'topics = ["q/# out 1 \\"\\" $queue/", "ok/# out 1"]')
    try:
        near.wait_for_line(r"bridge hq to amqp://\S+: connected", timeout=15)
        sub = PahoClient(far.mqtt_port, "far-sub")
        sub.subscribe(("ok/#", 1))
        pub = PahoClient(near.mqtt_port, "near-pub")
        pub.publish("q/$ack", b"refused there", qos=1)
        line = near.wait_for_line("bridge hq: the remote rejected a message", timeout=15)
        assert "q/$ack" in line and "dropped" in line, line
        pub.publish("ok/after", b"taken", qos=1)
        msg = sub.get(15)
        assert (msg.topic, msg.payload) == ("ok/after", b"taken")
        assert not any(": lost" in line for line in near.log), near.output()
        for c in (pub, sub):
            c.stop()
    finally:
        near.stop()
        far.stop()


def test_a_message_the_remote_refuses_for_now_is_kept_and_arrives_later(
        tmp_path: Path) -> None:
    """The remote rejects a message for now (amqp:resource-limit-exceeded: no room
    for another queue there, --queue-max-queues 1): said in one line, not dropped
    here (no "dropped" line); it stays in the bridge's session, and once the remote
    has room (started again with the default bound) the resend after the reconnect
    brings it to the queue ``q`` there.  (The back-off resends while connected are
    the unit tests'.)"""
    far = _far(tmp_path, None, None, "--queue-max-queues", "1")
    near = _near(tmp_path, f"amqp://127.0.0.1:{far.ports['AMQP']}",
                 'topics = ["q/# out 1 \\"\\" $queue/"]')
    try:
        near.wait_for_line(r"bridge hq to amqp://\S+: connected", timeout=15)
        first = PahoClient(far.mqtt_port, "far-pub")
        first.publish("$queue/a/x", b"takes the one queue", qos=1)
        first.stop()
        pub = PahoClient(near.mqtt_port, "near-pub")
        pub.publish("q/b/1", b"kept", qos=1)
        line = near.wait_for_line("bridge hq: the remote refused a message on q/b/1 for now",
                                  timeout=15)
        assert "amqp:resource-limit-exceeded" in line and "sent again later" in line, line
        assert not any("the remote rejected a message" in x for x in near.log), near.output()
        ports = dict(far.ports)
        far.stop()
        near.wait_for_line(r"bridge hq to amqp://\S+: lost", timeout=15)
        far = _far(tmp_path, ports)
        sub = PahoClient(far.mqtt_port, "far-sub")
        sub.subscribe(("$queue/q/#", 1))
        msg = sub.get(30)
        assert (msg.topic, msg.payload) == ("$queue/q/b/1", b"kept")
        assert not any("it is dropped" in x for x in near.log), near.output()
        for c in (pub, sub):
            c.stop()
    finally:
        near.stop()
        far.stop()


def test_a_message_above_the_remote_max_message_size_is_dropped(tmp_path: Path) -> None:
    """An out message larger than the max-message-size the remote announces is dropped
    here (logged, counted), the connection stays up and the next message goes through."""
    far = _far(tmp_path, None, None, "--max-packet-size", "2000")
    near = _near(tmp_path, f"amqp://127.0.0.1:{far.ports['AMQP']}", 'topics = ["out/# out 1"]')
    try:
        near.wait_for_line(r"bridge hq to amqp://\S+: connected", timeout=15)
        sub = PahoClient(far.mqtt_port, "far-sub")
        sub.subscribe(("out/#", 1))
        pub = PahoClient(near.mqtt_port, "near-pub")
        pub.publish("out/big", b"x" * 5000, qos=1)
        pub.publish("out/small", b"s", qos=1)
        line = near.wait_for_line(r"bridge hq: a message on out/big was dropped", timeout=15)
        assert "2000" in line, line
        msg = sub.get(15)
        assert (msg.topic, msg.payload) == ("out/small", b"s")
        assert not any(": lost" in line for line in near.log), near.output()
        for c in (pub, sub):
            c.stop()
    finally:
        near.stop()
        far.stop()


def test_a_receiver_the_remote_refuses_is_a_failing_attempt(tmp_path: Path) -> None:
    """The remote refuses the in rule's receiver (its source has more levels than its
    --max-topic-levels): the bridge never says connected, it logs the attempts as
    failing with the remote's reason, once however many fail (the back-off's growth
    is test_bridge_amqp_attach's, on a clock)."""
    far = _far(tmp_path, None, None, "--max-topic-levels", "2")
    near = _near(tmp_path, f"amqp://127.0.0.1:{far.ports['AMQP']}",
                 'topics = ["a/b/c/# in 1"]')
    try:
        line = near.wait_for_line(r"bridge hq to amqp://\S+: failing", timeout=15)
        assert "detached" in line, line
        for _ in range(4):   # (four attempts refused by the remote, each logged there)
            far.wait_for_line(r"refused link \S+:in:0 ", timeout=15)
        lines = [x for x in near.log if "bridge hq to" in x]
        assert [x for x in lines if ": failing" in x] == [line], lines
        assert not any(": connected" in x or ": lost" in x for x in lines), lines
    finally:
        near.stop()
        far.stop()


def test_in_loses_nothing_when_this_broker_is_killed(tmp_path: Path) -> None:
    """QoS 1 ``in`` rule reading the remote's durable queue: this broker killed (-9)
    mid-stream and started again on its data, every message the remote had is
    delivered here (what was accepted there had been stored here first)."""
    far = _far(tmp_path)
    address = f"amqp://127.0.0.1:{far.ports['AMQP']}"
    body = 'topics = ["# in 1 in/ $queue/jobs/"]'
    near = _near(tmp_path, address, body)
    try:
        near.wait_for_line(r"bridge hq: receiving from the remote's \$queue/jobs/#",
                           timeout=15)
        sub = PahoClient(near.mqtt_port, "near-sub", clean=False)
        sub.subscribe(("in/#", 1))
        pub = PahoClient(far.mqtt_port, "far-pub")
        for i in range(COUNT):
            pub.publish(f"$queue/jobs/{i}", str(i).encode(), qos=1)
        pub.stop()
        payloads = [sub.get(30).payload for _ in range(STOP_AFTER // 10)]
        near.kill()
        payloads += [m.payload for m in _drain(sub)]  # type: ignore[attr-defined]
        sub.stop()
        near = _near(tmp_path, address, body)
        again = PahoClient(near.mqtt_port, "near-sub", clean=False)
        for _ in range(2 * COUNT):
            if len(set(payloads)) == COUNT:
                break
            payloads.append(again.get(30).payload)
        assert set(payloads) == {str(i).encode() for i in range(COUNT)}
        again.stop()
    finally:
        near.stop()
        far.stop()
