"""The broker with a real client library: paho-mqtt 2.x, as MQTT 3.1 and 3.1.1.

Each test runs for both protocol versions (``proto``).  Clients run their network
loop in a thread (``loop_start``); tests wait on ``threading.Event`` and
``queue.Queue`` with timeouts.  Where a test must show that something does *not*
arrive, it publishes a marker after it on the same path and checks that the marker
is the next message (ordering from one publisher is preserved), so no test waits
for an absence with a sleep.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator

import paho.mqtt.client as mqtt
import pahoclient
import pytest
from brokerproc import BrokerProcess

# Against a broker and through a gateway in front of one (the folder conftest).
pytestmark = [pytest.mark.timeout(60), pytest.mark.through_gateway]

TIMEOUT = 5.0
_ids = itertools.count(1)


def uid(prefix: str = "p") -> str:
    """Unique id, at most 23 characters (the MQTT 3.1 client id limit)."""
    return f"{prefix}{next(_ids)}-{uuid.uuid4().hex[:10]}"[:23]


class PahoClient(pahoclient.PahoClient):
    """The shared paho wrapper (``pahoclient``) with this module's shorter waits."""

    timeout = TIMEOUT


@pytest.fixture(params=[mqtt.MQTTv31, mqtt.MQTTv311], ids=["3.1", "3.1.1"])
def proto(request: pytest.FixtureRequest) -> int:
    return int(request.param)


Open = Callable[..., PahoClient]


@pytest.fixture
def paho(broker: BrokerProcess, proto: int) -> Iterator[Open]:
    """``paho(client_id, clean=True, will=None, protocol=proto)``: a connected client."""
    made: list[PahoClient] = []

    def open_client(client_id: str, clean: bool = True,
                    will: tuple[str, bytes, int, bool] | None = None,
                    protocol: int | None = None) -> PahoClient:
        c = PahoClient(broker.mqtt_port, client_id, protocol or proto, clean, will)
        made.append(c)
        return c

    yield open_client
    for c in made:
        c.stop()


# ==================================================================================
# QoS


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_round_trip_at_each_qos(paho, qos: int) -> None:
    """Messages published at QoS q complete their flow and arrive in order at QoS q."""
    topic = uid("rt") + "/t"
    sub = paho(uid("s"))
    assert sub.subscribe((topic, 2)) == [2]
    pub = paho(uid("p"))
    for i in range(5):
        pub.publish(topic, b"m%d" % i, qos)
    got = [sub.get() for _ in range(5)]
    assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
        (topic, b"m%d" % i, qos, False) for i in range(5)]


def test_delivery_qos_is_min_of_publish_and_granted(paho) -> None:
    """Each subscriber gets each message at min(publish QoS, granted QoS)."""
    base = uid("mq")
    subs = {}
    for granted in (0, 1, 2):
        s = paho(uid(f"g{granted}"))
        assert s.subscribe((f"{base}/t", granted), (f"{base}/end", 2)) == [granted, 2]
        subs[granted] = s
    pub = paho(uid("p"))
    for qos in (0, 1, 2):
        pub.publish(f"{base}/t", b"q%d" % qos, qos)
    pub.publish(f"{base}/end", b"", 2)
    for granted, s in subs.items():
        got = s.until(f"{base}/end")[:-1]
        assert sorted((m.payload, m.qos) for m in got) == [
            (b"q%d" % q, min(q, granted)) for q in (0, 1, 2)], f"granted {granted}"


def test_subscribe_grants_requested_qos(paho) -> None:
    """SUBACK grants the requested QoS for each filter, in order."""
    base = uid("sg")
    c = paho(uid("c"))
    assert c.subscribe((f"{base}/a", 0), (f"{base}/b", 1), (f"{base}/c", 2)) == [0, 1, 2]


# ==================================================================================
# Topic filters


FILTER_CASES = {
    # filter (after the base)   topics (after the base) it must receive
    "+/c": {"b/c", "/c"},
    "#": {"", "b", "b/c", "b/c/d", "/c", "x/"},
    "b/#": {"b", "b/c", "b/c/d"},
    "b/+": {"b/c"},
    "+/+/d": {"b/c/d"},
    "b/c/d": {"b/c/d"},
    "x/+": {"x/"},
}
TOPICS = ["", "b", "b/c", "b/c/d", "/c", "x/"]


def test_topic_filters_with_plus_and_hash(paho) -> None:
    """'+' matches exactly one level (also an empty one), '#' any remainder including
    none ('a/#' matches 'a')."""
    base = uid("tf")
    subs = {}
    for f in FILTER_CASES:
        s = paho(uid("f"))
        full = f"{base}/{f}" if f != "#" else f"{base}/#"
        s.subscribe((full, 0), (f"{base}-end", 2))
        subs[f] = s
    pub = paho(uid("p"))
    for t in TOPICS:
        pub.publish(f"{base}/{t}" if t else base, t.encode() or b"(base)", 1)
    pub.publish(f"{base}-end", b"", 2)
    for f, s in subs.items():
        got = {m.topic for m in s.until(f"{base}-end")[:-1]}
        want = {f"{base}/{t}" if t else base for t in FILTER_CASES[f]}
        if f == "#":
            want = {f"{base}/{t}" if t else base for t in TOPICS}
        assert got == want, f"filter {f!r}"


def test_sys_topics_not_matched_by_leading_wildcards(paho) -> None:
    """'#' and '+/...' do not receive $SYS topics (live or retained); '$SYS/#' does."""
    marker = uid("mk")
    wild = paho(uid("w"))
    wild.subscribe(("#", 0), ("+/broker/#", 0), ("+/broker/uptime", 0))
    dollar = paho(uid("y"))
    dollar.subscribe(("$SYS/#", 0))
    # Wait for a live $SYS refresh (retain flag clear) that both were subscribed for.
    while True:
        m = dollar.get()
        assert m.topic.startswith("$SYS/")
        if not m.retain and m.topic == "$SYS/broker/uptime":
            break
    paho(uid("p")).publish(marker, b"", 0)
    got = wild.until(marker)
    leaked = [m.topic for m in got if m.topic.startswith("$")]
    assert leaked == []


def test_overlapping_subscriptions_deliver_one_copy_at_highest_qos(paho) -> None:
    """A client whose filters overlap gets one copy, at the highest granted QoS."""
    base = uid("ov")
    c = paho(uid("c"))
    assert c.subscribe((f"{base}/#", 0), (f"{base}/+/x", 2), (f"{base}/a/x", 1),
                       (f"{base}/a/+", 1), (f"{base}-end", 2)) == [0, 2, 1, 1, 2]
    pub = paho(uid("p"))
    pub.publish(f"{base}/a/x", b"ax", 2)  # all four filters; max granted 2
    pub.publish(f"{base}/b/x", b"bx", 2)  # '#' (0) and '+/x' (2)
    pub.publish(f"{base}/a/y", b"ay", 2)  # '#' (0) and 'a/+' (1)
    pub.publish(f"{base}/z", b"z", 2)     # '#' only
    pub.publish(f"{base}-end", b"", 2)
    got = c.until(f"{base}-end")[:-1]
    # paho hands QoS 2 messages over at PUBREL, so compare without order.
    assert sorted((m.payload, m.qos) for m in got) == [(b"ax", 2), (b"ay", 1), (b"bx", 2),
                                                       (b"z", 0)]


# ==================================================================================
# Retained messages


def test_retained_stored_replaced_deleted_and_flagged(paho) -> None:
    """Retained messages: stored, replaced by a newer one, sent on SUBSCRIBE (also to
    wildcard filters) with the retain flag, forwarded live without it, deleted by an
    empty payload."""
    base = uid("rt")
    pub = paho(uid("p"))
    pub.publish(f"{base}/a", b"old", 1, retain=True)
    pub.publish(f"{base}/a", b"new", 1, retain=True)
    pub.publish(f"{base}/b/c", b"bc", 2, retain=True)
    pub.publish(f"{base}/d", b"not kept", 1, retain=False)

    exact = paho(uid("e"))
    exact.subscribe((f"{base}/a", 2))
    m = exact.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (f"{base}/a", b"new", 1, True)

    wild = paho(uid("w"))
    wild.subscribe((f"{base}/#", 2))
    got = sorted((m.topic, m.payload, m.qos, m.retain) for m in (wild.get(), wild.get()))
    assert got == [(f"{base}/a", b"new", 1, True), (f"{base}/b/c", b"bc", 2, True)]

    plus = paho(uid("l"))
    plus.subscribe((f"{base}/+/c", 1))
    m = plus.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (f"{base}/b/c", b"bc", 1, True)

    # Live forwarding of a retained publish clears the flag for existing subscribers.
    pub.publish(f"{base}/a", b"live", 1, retain=True)
    m = exact.get()
    assert (m.payload, m.retain) == (b"live", False)

    # An empty retained payload deletes it (and is itself forwarded, flag clear).
    pub.publish(f"{base}/a", b"", 1, retain=True)
    m = exact.get()
    assert (m.payload, m.retain) == (b"", False)
    late = paho(uid("t"))
    late.subscribe((f"{base}/#", 1), (f"{base}-end", 0))
    pub.publish(f"{base}-end", b"", 0)
    got2 = late.until(f"{base}-end")
    assert [(m.topic, m.payload, m.retain) for m in got2[:-1]] == [(f"{base}/b/c", b"bc", True)]
    pub.publish(f"{base}/b/c", b"", 1, retain=True)


# ==================================================================================
# Wills, takeover, sessions


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_will_on_socket_loss_with_qos_and_retain(paho, qos: int) -> None:
    """A paho client that loses its socket has its will published with its QoS, and
    a retained will is kept for later subscribers."""
    topic = uid("wl") + "/will"
    observer = paho(uid("o"))
    observer.subscribe((topic, 2))
    victim = paho(uid("v"), will=(topic, b"bye", qos, True))
    victim.lose_socket()
    m = observer.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"bye", qos, False)
    late = paho(uid("l"))
    late.subscribe((topic, 2))
    m = late.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"bye", qos, True)
    late.publish(topic, b"", 0, retain=True)


def test_no_will_after_clean_disconnect(paho) -> None:
    """A paho client that disconnects cleanly never has its will published."""
    base = uid("nw")
    observer = paho(uid("o"))
    observer.subscribe((f"{base}/will", 1), (f"{base}/end", 0))
    victim = paho(uid("v"), will=(f"{base}/will", b"no", 1, False))
    victim.disconnect()
    paho(uid("p")).publish(f"{base}/end", b"", 0)
    got = observer.until(f"{base}/end")
    assert [m.topic for m in got] == [f"{base}/end"]


def test_takeover_disconnects_old_client_and_publishes_its_will(paho) -> None:
    """Connecting with a client id already in use closes the old connection (its will
    fires) and the new one keeps working."""
    base = uid("tk")
    cid = uid("t")
    observer = paho(uid("o"))
    observer.subscribe((f"{base}/will", 1))
    old = paho(cid, will=(f"{base}/will", b"taken over", 1, False))
    new = paho(cid)
    assert old.disconnected.wait(TIMEOUT), "old connection not closed"
    m = observer.get()
    assert (m.topic, m.payload, m.qos) == (f"{base}/will", b"taken over", 1)
    new.subscribe((f"{base}/data", 1))
    paho(uid("p")).publish(f"{base}/data", b"x", 1)
    assert new.get().payload == b"x"
    assert not new.disconnected.is_set()


def test_persistent_session_survives_disconnect(paho, proto: int) -> None:
    """Clean session off: subscriptions survive a disconnect, QoS 1/2 messages are
    queued while offline and delivered on reconnect (QoS 0 is not queued)."""
    base = uid("ps")
    cid = uid("s")
    sub = paho(cid, clean=False)
    assert sub.session_present is False
    sub.subscribe((f"{base}/#", 2))
    sub.disconnect()
    pub = paho(uid("p"))
    pub.publish(f"{base}/a", b"zero", 0)
    pub.publish(f"{base}/a", b"one", 1)
    pub.publish(f"{base}/b", b"two", 2)
    sub = paho(cid, clean=False)
    assert sub.session_present is (proto == mqtt.MQTTv311)
    got = [sub.get(), sub.get()]
    assert [(m.payload, m.qos) for m in got] == [(b"one", 1), (b"two", 2)]
    pub.publish(f"{base}/c", b"live", 0)
    assert sub.get().payload == b"live"
    sub.disconnect()
    # Clean session on reconnect throws the session away.
    sub = paho(cid, clean=True)
    assert sub.session_present is False
    sub.subscribe((f"{base}-end", 0))
    pub.publish(f"{base}/a", b"unseen", 1)
    pub.publish(f"{base}-end", b"", 0)
    assert [m.topic for m in sub.until(f"{base}-end")] == [f"{base}-end"]


def test_mixed_protocol_versions_interoperate(broker: BrokerProcess) -> None:
    """A 3.1 publisher reaches a 3.1.1 subscriber and vice versa."""
    base = uid("mx")
    port = broker.mqtt_port
    a = PahoClient(port, uid("a"), mqtt.MQTTv31)
    b = PahoClient(port, uid("b"), mqtt.MQTTv311)
    try:
        a.subscribe((f"{base}/to31", 2))
        b.subscribe((f"{base}/to311", 2))
        a.publish(f"{base}/to311", b"from 3.1", 2)
        b.publish(f"{base}/to31", b"from 3.1.1", 1)
        assert (b.get().payload, a.get().payload) == (b"from 3.1", b"from 3.1.1")
    finally:
        a.stop()
        b.stop()


# ==================================================================================
# $SYS


SYS_TOPICS = {
    "version", "uptime", "clients/connected", "clients/total", "clients/maximum",
    "messages/received", "messages/sent", "messages/dropped", "bytes/received",
    "bytes/sent", "subscriptions/count", "retained messages/count",
}


def test_sys_broker_topics_are_retained_and_plausible(paho) -> None:
    """$SYS/broker/... carries version, uptime, client, message, byte, subscription,
    retained and dropped counts, retained so a new subscriber gets them at once;
    a burst publishes again what changed (as Mosquitto), so the retained copies and
    the live changes after them are the current values."""
    c = paho(uid("y"))
    c.subscribe(("$SYS/broker/#", 0))
    values: dict[str, bytes] = {}
    while not SYS_TOPICS <= set(values):  # the last values, at once and flagged retained
        m = c.get()
        assert m.topic.startswith("$SYS/broker/")
        assert m.retain, f"{m.topic} was not retained"
        values[m.topic[len("$SYS/broker/"):]] = m.payload
    # A burst made while we are connected counts us (it changed these two).
    while int(values["clients/connected"]) < 1 or int(values["subscriptions/count"]) < 1:
        m = c.get()
        values[m.topic[len("$SYS/broker/"):]] = m.payload
    assert values["version"].startswith(b"mqttamqp ")
    assert values["uptime"].endswith(b" seconds")
    numbers = {k: int(v) for k, v in values.items()
               if k in SYS_TOPICS and k not in ("version", "uptime")}
    assert all(n >= 0 for n in numbers.values()), numbers
    assert numbers["clients/maximum"] >= numbers["clients/connected"] >= 1
    assert numbers["clients/total"] >= numbers["clients/connected"]
    assert numbers["subscriptions/count"] >= 1
    # The counters move: wait for a refresh that counts our own traffic.
    before = numbers["messages/received"]
    p = paho(uid("p"))
    for _ in range(3):
        p.publish(uid("noise"), b"x", 1)
    while True:
        m = c.get(timeout=5)
        if m.topic == "$SYS/broker/messages/received" and int(m.payload) >= before + 3:
            break
