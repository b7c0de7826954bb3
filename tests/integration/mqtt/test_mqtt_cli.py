"""The broker with Mosquitto's command-line clients, as MQTT 3.1 and 3.1.1.

``mosquitto_sub`` runs with ``-d`` so its debug lines tell when its SUBSCRIBE was
acknowledged ("Subscribed (mid: ...)"); the test publishes only after that line,
so nothing waits on a clock.  Messages are printed with ``-F`` as
``MSG|topic|qos|retain|payload``.  Every process is bounded by ``-C``/``-W`` and a
``subprocess`` timeout, and only processes started here are ever signalled.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
from mosquitto import pub

# Against a broker and through a gateway in front of one (the folder conftest).
pytestmark = [pytest.mark.timeout(60), pytest.mark.through_gateway]

_ids = itertools.count(1)
def uid(prefix: str = "c") -> str:
    """Unique id, at most 23 characters (the MQTT 3.1 client id limit)."""
    return f"{prefix}{next(_ids)}-{uuid.uuid4().hex[:10]}"[:23]


@pytest.fixture(params=["mqttv31", "mqttv311"])
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ==================================================================================


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_and_subscribe_each_qos(broker, subs, version: str, qos: int) -> None:
    """mosquitto_pub at QoS q completes its flow and mosquitto_sub (granted 2) gets the
    message at QoS q with the retain flag clear."""
    topic = uid("q") + "/t"
    s = subs(version, "-t", topic, "-q", "2", "-C", "2")
    s.wait_subscribed()
    for i in range(2):
        done = pub(broker, version, topic, "-q", str(qos), message=f"hello {i}")
        flow = {0: [], 1: ["received PUBACK"],
                2: ["received PUBREC", "sending PUBREL", "received PUBCOMP"]}[qos]
        for step in flow:
            assert step in done.stdout, done.stdout
    assert [s.message() for _ in range(2)] == [(topic, qos, False, f"hello {i}")
                                               for i in range(2)]
    assert s.finish() == 0


@pytest.mark.parametrize("granted", [0, 1])
def test_delivery_qos_is_capped_by_granted(broker, subs, version: str, granted: int) -> None:
    """A QoS 2 publish reaches a subscriber granted QoS g at QoS g."""
    topic = uid("g") + "/t"
    s = subs(version, "-t", topic, "-q", str(granted), "-C", "1")
    s.wait_subscribed()
    pub(broker, version, topic, "-q", "2", message="capped")
    assert s.message() == (topic, granted, False, "capped")
    assert s.finish() == 0


def test_retained_message_on_wildcard_subscribe(broker, subs, version: str) -> None:
    """A retained message reaches a later wildcard subscriber with the retain flag; a
    live retained publish is forwarded without it; an empty payload deletes it."""
    base = uid("r")
    pub(broker, version, f"{base}/a/b", "-q", "1", "-r", message="kept")
    pub(broker, version, f"{base}/a/b", "-q", "1", "-r", message="kept2")  # replaces
    s = subs(version, "-t", f"{base}/+/b", "-q", "1", "-C", "2")
    assert s.message() == (f"{base}/a/b", 1, True, "kept2")
    pub(broker, version, f"{base}/a/b", "-q", "1", "-r", message="live")
    assert s.message() == (f"{base}/a/b", 1, False, "live")
    assert s.finish() == 0
    pub(broker, version, f"{base}/a/b", "-q", "1", "-r")  # -n: empty payload deletes
    later = subs(version, "-t", f"{base}/#", "-q", "1", "-C", "1")
    later.wait_subscribed()
    pub(broker, version, f"{base}/marker", message="m")
    assert later.message() == (f"{base}/marker", 0, False, "m")


def test_persistent_session_gets_messages_queued_while_offline(broker, subs,
                                                               version: str) -> None:
    """mosquitto_sub -c (clean session off) receives QoS 1/2 messages published while it
    was offline, in order, after it reconnects."""
    base = uid("p")
    cid = uid("s")
    first = subs(version, "-c", "-i", cid, "-t", f"{base}/#", "-q", "2", "-E")
    assert first.finish() == 0  # -E: exit once subscribed
    for i, qos in enumerate((1, 2, 0, 1)):
        pub(broker, version, f"{base}/t", "-q", str(qos), message=f"m{i}")
    again = subs(version, "-c", "-i", cid, "-t", f"{base}/#", "-q", "2", "-C", "3")
    got = sorted((again.message() for _ in range(3)), key=lambda m: m[3])
    assert got == [(f"{base}/t", 1, False, "m0"), (f"{base}/t", 2, False, "m1"),
                   (f"{base}/t", 1, False, "m3")]
    # On the wire they came in publish order: QoS 1, 2, 1 (mids 1, 2, 3 or similar).
    assert [h.split(", ")[1] for h in again.publish_headers] == ["q1", "q2", "q1"]
    assert again.finish() == 0


def test_will_published_when_subscriber_is_killed(broker, subs, version: str) -> None:
    """A mosquitto_sub killed with SIGKILL (socket loss) has its will published with
    its QoS and retain flag."""
    topic = uid("w") + "/will"
    observer = subs(version, "-t", topic, "-q", "2", "-C", "2")
    observer.wait_subscribed()
    victim = subs(version, "-t", uid("x") + "/t", "--will-topic", topic, "--will-payload",
                  "victim died", "--will-qos", "2", "--will-retain", wait_secs=30)
    victim.wait_subscribed()
    victim.kill()
    assert observer.message() == (topic, 2, False, "victim died")
    late = subs(version, "-t", topic, "-q", "1", "-C", "1")
    assert late.message() == (topic, 1, True, "victim died")
    pub(broker, version, topic, "-r")  # clear the retained will
    assert observer.message() == (topic, 0, False, "")


def test_no_will_after_normal_exit(broker, subs, version: str) -> None:
    """A mosquitto_sub that exits normally (DISCONNECT after -C 1) has no will published."""
    base = uid("n")
    observer = subs(version, "-t", f"{base}/will", "-t", f"{base}/marker", "-q", "1",
                    "-C", "1")
    observer.wait_subscribed()
    victim = subs(version, "-t", f"{base}/go", "-C", "1", "--will-topic", f"{base}/will",
                  "--will-payload", "should not appear", "--will-qos", "1")
    victim.wait_subscribed()
    pub(broker, version, f"{base}/go", message="exit now")
    assert victim.message() == (f"{base}/go", 0, False, "exit now")
    assert victim.finish() == 0
    pub(broker, version, f"{base}/marker", message="m")
    assert observer.message() == (f"{base}/marker", 0, False, "m")


@pytest.mark.parametrize("length,accepted", [(23, True), (24, True)])
def test_mqtt31_client_id_limit(broker, length: int, accepted: bool) -> None:
    """mosquitto_pub -V mqttv31 with a 24-character id is accepted, as by Mosquitto
    (it was refused, identifier rejected, before issue 16, item 8; --strict-mqtt31
    still refuses it: test_conformance_mqtt); 23 characters are fine."""
    cid = (uid("i") + "z" * 30)[:length]
    done = pub(broker, "mqttv31", uid("t"), "-i", cid, message="x", check=False)
    if accepted:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "received CONNACK (0)" in done.stdout
    else:
        assert done.returncode != 0
        assert "identifier rejected" in (done.stdout + done.stderr)


def test_sys_version_topic(broker, subs, version: str) -> None:
    """$SYS/broker/version is retained and names the broker."""
    s = subs(version, "-t", "$SYS/broker/version", "-C", "1")
    topic, _qos, retain, payload = s.message()
    assert (topic, retain) == ("$SYS/broker/version", True)
    assert payload.startswith("mqttamqp ")
    assert s.finish() == 0


def test_unsubscribed_topic_not_delivered_to_cli(broker, subs, version: str) -> None:
    """mosquitto_sub with two filters sees only topics matching them."""
    base = uid("u")
    s = subs(version, "-t", f"{base}/a/+", "-t", f"{base}/b/#", "-C", "3")
    s.wait_subscribed()
    for t in ("a/1", "a/1/2", "c", "b", "b/2/3"):
        pub(broker, version, f"{base}/{t}", message=t)
    assert [s.message()[0] for _ in range(3)] == [f"{base}/a/1", f"{base}/b", f"{base}/b/2/3"]
    assert s.finish() == 0
