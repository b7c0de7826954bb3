"""Durability with a real broker process: SIGKILL and SIGTERM, then a restart on the
same data directory.

What is proved here: every QoS 1/2 message the broker acknowledged (PUBACK, or
PUBREC for QoS 2, which is already the broker's promise) and that is destined for
an offline persistent session is delivered after the restart, QoS 2 exactly once
even when the publisher re-sends what it had not seen acknowledged; retained
messages survive; wills of clients connected at the crash are published after
``--will-grace`` unless the client comes back first; a graceful restart keeps
persistent sessions, their subscriptions, queues and in-flight messages; a QoS 2
PUBLISH is never sent again once its PUBREL went out, even across a kill -9.

The .tac file: ``twistd -ny tac/mqttamqp.tac`` as shipped would bind 0.0.0.0:1883,
5672 and 8080, which a test must not do.  So the unmodified file is loaded the way
twistd loads it (``loadApplication``, nothing started) and its service checked (in
process: ``unit/service/test_tac.py``), and
a copy whose argument list is edited (as its comment invites) to a loopback port 0
and a temporary data directory is run with ``twistd -ny`` and served a client.

Waits are reads with deadlines on raw sockets (``RawClient`` from
``support/rawclient.py``) or on the broker's log lines.
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from amqp_clients import TIMEOUT
from amqp_messages import publish_message
from brokerproc import TWISTD, BrokerProcess, RestartableBroker
from proton import ConnectionException, Delivery
from proton.utils import BlockingConnection
from rawclient import RawClient, uid

from mqttamqp.mqtt.packets import (
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Will,
)

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[3]
GRACE = 2.0


def stop_gracefully(proc: BrokerProcess) -> None:
    """SIGTERM; twistd shuts down cleanly, then re-raises the signal on itself, so
    the exit status is 0 or -SIGTERM; the log must show the orderly shutdown."""
    assert proc.stop() in (0, -signal.SIGTERM)
    proc.wait_for_line(r"Server Shut Down\.", timeout=10)  # EOF first: RuntimeError


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    return str(tmp_path / "data")


@pytest.fixture
def run(data_dir: str, storage_option: tuple[str, ...]
        ) -> Iterator[Callable[..., BrokerProcess]]:
    """``run(*options, grace=2)`` starts a broker on this test's data directory, on
    each storage engine in turn (the file storage, SQLite, PostgreSQL)."""
    procs: list[BrokerProcess] = []

    def start(*extra: str, grace: float = GRACE,
              listeners: tuple[str, ...] = ("--mqtt",)) -> BrokerProcess:
        proc = RestartableBroker(data_dir, "--will-grace", str(grace), *storage_option,
                                 *extra, listeners=listeners)
        procs.append(proc)
        return proc.start()

    yield start
    for proc in procs:
        proc.stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., RawClient]]:
    """``connect(port, client_id, clean=True, will=None, level=4)`` -> connected RawClient."""
    made: list[RawClient] = []

    def connect(port: int, client_id: str, clean: bool = True, will: Will | None = None,
                level: int = 4, expect_present: bool | None = None) -> RawClient:
        c = RawClient(port, level)
        made.append(c)
        ack = c.connect(client_id, clean, 60, will)
        assert ack.return_code == 0
        if expect_present is not None:
            assert ack.session_present is expect_present
        return c

    yield connect
    for c in made:
        c.close()


# ==================================================================================


def test_acknowledged_messages_survive_sigkill_and_qos2_is_exactly_once(run, clients) -> None:
    """Kill -9 while a publisher streams QoS 1/2 to an offline persistent session: every
    message acknowledged before the kill is delivered after restart; after the
    publisher re-sends what was unacknowledged, every message arrives and each QoS 2
    message exactly once."""
    n = 300
    proc = run()
    sub = clients(proc.mqtt_port, "dur-sub", clean=False)
    assert sub.subscribe(("dur/q1", 1), ("dur/q2", 2)) == (1, 2)
    sub.disconnect()

    pub = clients(proc.mqtt_port, "dur-pub", clean=False)
    qos_of = {pid: 1 if pid % 2 else 2 for pid in range(1, n + 1)}
    payload = {pid: b"m%03d" % pid for pid in qos_of}
    for pid, qos in qos_of.items():
        pub.send(Publish(f"dur/q{qos}", payload[pid], qos, False, False, pid))
    acked: set[int] = set()      # PUBACK or PUBREC seen: the broker promised
    completed: set[int] = set()  # QoS 2 PUBCOMP seen
    while len(acked) < n // 3:
        packet = pub.recv()
        if isinstance(packet, Puback):
            acked.add(packet.packet_id)
        elif isinstance(packet, Pubrec):
            acked.add(packet.packet_id)
            pub.send(Pubrel(packet.packet_id))
        elif isinstance(packet, Pubcomp):
            completed.add(packet.packet_id)
    proc.kill()
    assert acked, "nothing was acknowledged before the kill"

    proc = run()
    # Only what was promised, before the publisher re-sends anything.
    sub = clients(proc.mqtt_port, "dur-sub", clean=False, expect_present=True)
    counts: collections.Counter[bytes] = collections.Counter()
    promised = {payload[pid] for pid in acked}
    while not promised <= set(counts):
        try:
            m = sub.receive_acked()
        except AssertionError:
            lost = sorted(promised - set(counts))
            raise AssertionError(f"acknowledged before the kill but lost: {lost}") from None
        counts[m.payload] += 1
    sub.close()

    # The publisher resumes its session and re-sends: PUBLISH (DUP) if unacknowledged,
    # PUBREL if PUBREC came but PUBCOMP did not.
    pub = clients(proc.mqtt_port, "dur-pub", clean=False, expect_present=True)
    waiting = {}
    for pid, qos in qos_of.items():
        if pid not in acked:
            pub.send(Publish(f"dur/q{qos}", payload[pid], qos, False, True, pid))
            waiting[pid] = Puback if qos == 1 else Pubcomp
        elif qos == 2 and pid not in completed:
            pub.send(Pubrel(pid))
            waiting[pid] = Pubcomp
    while waiting:
        packet = pub.recv()
        if isinstance(packet, Pubrec):
            pub.send(Pubrel(packet.packet_id))
            continue
        assert type(packet) is waiting.pop(packet.packet_id), packet  # type: ignore[union-attr]
    pub.publish("dur/q1", b"end", 1)

    sub = clients(proc.mqtt_port, "dur-sub", clean=False, expect_present=True)
    while True:
        m = sub.receive_acked()
        if m.payload == b"end":
            break
        counts[m.payload] += 1
    missing = [pid for pid in qos_of if counts[payload[pid]] == 0]
    twice = [pid for pid in qos_of if qos_of[pid] == 2 and counts[payload[pid]] > 1]
    assert missing == [], f"never delivered: {missing}"
    assert twice == [], f"QoS 2 delivered more than once: {twice}"


def test_amqp_accepted_messages_survive_sigkill(run, clients) -> None:
    """Kill -9 while an AMQP sender streams unsettled QoS 1 messages (and one retained
    message) to an offline persistent MQTT session: every message the broker Accepted
    before the kill is delivered after the restart, and the retained one is kept.
    (A broker that answers Accepted before the commit fails this in about half the
    runs: 3 of 5 when tried; crash timing decides which messages were in flight.)"""
    n = 300
    both = ("--mqtt", "--amqp")
    proc = run(listeners=both)
    sub = clients(proc.mqtt_port, "amqp-dur-sub", clean=False)
    assert sub.subscribe(("adur/q1", 1)) == (1,)
    sub.disconnect()

    conn = BlockingConnection(f"127.0.0.1:{proc.ports['AMQP']}", timeout=TIMEOUT)
    snd = conn.create_sender("adur/q1")
    retained = conn.create_sender("adur/kept")
    kept = retained.send(publish_message(None, b"kept", qos=1, retain=True))
    assert kept.remote_state == Delivery.ACCEPTED
    payloads: dict[Delivery, bytes] = {}
    accepted: set[bytes] = set()

    def answered() -> set[bytes]:
        states = {d.remote_state for d in payloads} - {0, Delivery.ACCEPTED}
        assert not states, f"unexpected outcomes {states}"
        return {body for d, body in payloads.items() if d.remote_state == Delivery.ACCEPTED}

    def more_than(count: int) -> Callable[[], bool]:
        return lambda: len(answered()) > count

    while len(accepted) < n // 3:
        while snd.link.credit > 0 and len(payloads) < n:
            body = b"a%03d" % len(payloads) + b"." * 4000
            payloads[snd.link.send(publish_message(None, body, qos=1))] = body
        conn.wait(more_than(len(accepted)), timeout=TIMEOUT,
                  msg="the broker accepting more messages")
        accepted = answered()
    proc.kill()
    with pytest.raises(ConnectionException):   # the client sees its connection drop
        conn.wait(lambda: False, timeout=TIMEOUT, msg="the killed broker's socket closing")
    assert accepted

    proc = run(listeners=both)
    sub = clients(proc.mqtt_port, "amqp-dur-sub", clean=False, expect_present=True)
    got: set[bytes] = set()
    while not accepted <= got:
        try:
            got.add(sub.receive_acked().payload)
        except AssertionError:
            lost = sorted(accepted - got)
            raise AssertionError(f"Accepted before the kill but lost: {lost}") from None
    other = clients(proc.mqtt_port, uid("adur-r"))
    other.subscribe(("adur/kept", 0))
    m = other.receive()
    assert (m.topic, m.payload, m.retain) == ("adur/kept", b"kept", True)


def test_qos2_outbound_not_resent_after_pubrel_across_sigkill(run, clients) -> None:
    """Once the broker has sent PUBREL for a QoS 2 message it must never send that
    PUBLISH again (MQTT-4.3.3), not even after kill -9: a subscriber that keeps its
    own QoS 2 state across reconnect, as clients must, sees no message twice."""
    n = 12
    proc = run()
    sub = clients(proc.mqtt_port, "x2-sub", clean=False)
    sub.subscribe(("x2/t", 2))
    sub.disconnect()  # offline while publishing, or back-pressure would pause the publisher
    pub = clients(proc.mqtt_port, "x2-pub")
    # Large payloads make each commit take long enough for the kill below to land
    # between a PUBREL on the wire and the commit of its state, if the broker sends
    # PUBREL first.
    pad = b"." * 900_000  # under the default 1 MiB packet limit
    for i in range(n):
        pub.publish("x2/t", b"m%03d" % i + pad, 2)  # PUBCOMP: the broker holds each one
    delivered: collections.Counter[bytes] = collections.Counter()
    awaiting_pubrel: set[int] = set()  # the subscriber's QoS 2 state (deliver on PUBLISH)

    def handle(packet: object) -> None:
        if isinstance(packet, Publish):
            assert packet.packet_id is not None
            if packet.packet_id not in awaiting_pubrel:
                delivered[packet.payload] += 1
                awaiting_pubrel.add(packet.packet_id)
            sub.send(Pubrec(packet.packet_id))
        elif isinstance(packet, Pubrel):
            awaiting_pubrel.discard(packet.packet_id)
            sub.send(Pubcomp(packet.packet_id))

    # Take a window of PUBLISHes, answer them all with PUBREC at once, and kill the
    # broker the moment their PUBRELs are in.
    sub = clients(proc.mqtt_port, "x2-sub", clean=False, expect_present=True)
    window = [sub.receive() for _ in range(10)]
    for m in window:
        assert m.packet_id is not None
        delivered[m.payload] += 1
        awaiting_pubrel.add(m.packet_id)
    sub.send(b"".join(bytes((0x50, 2)) + m.packet_id.to_bytes(2, "big")  # type: ignore[union-attr]
                      for m in window))
    for m in window:
        handle(sub.expect(Pubrel, m.packet_id))
    proc.kill()
    sub.close()

    proc = run()
    sub = clients(proc.mqtt_port, "x2-sub", clean=False, expect_present=True)
    while len(delivered) < n:
        handle(sub.recv())
    clients(proc.mqtt_port, uid("p")).publish("x2/t", b"end", 2)
    while True:
        packet = sub.recv()
        handle(packet)
        if isinstance(packet, Publish) and packet.payload == b"end":
            break
    twice = sorted(p[:4] for p, k in delivered.items() if k > 1)
    assert twice == [], f"delivered twice: {twice}"


def test_retained_messages_survive_sigkill(run, clients) -> None:
    """Acknowledged retained messages (including replacements and deletions) are intact
    after kill -9."""
    proc = run()
    pub = clients(proc.mqtt_port, uid("p"))
    pub.publish("ret/a", b"a-old", 1, retain=True)
    pub.publish("ret/a", b"a-new", 1, retain=True)
    pub.publish("ret/b/c", b"bc", 2, retain=True)
    pub.publish("ret/gone", b"x", 1, retain=True)
    pub.publish("ret/gone", b"", 1, retain=True)
    pub.publish("ret/plain", b"not retained", 1)
    proc.kill()

    proc = run()
    sub = clients(proc.mqtt_port, uid("s"))
    sub.subscribe(("ret/#", 2))
    got = sorted((m.topic, m.payload, m.qos, m.retain)
                  for m in (sub.receive_acked(), sub.receive_acked()))
    assert got == [("ret/a", b"a-new", 1, True), ("ret/b/c", b"bc", 2, True)]
    clients(proc.mqtt_port, uid("p")).publish("ret/marker", b"m", 0)
    assert sub.receive().topic == "ret/marker"  # nothing else was retained


@pytest.mark.parametrize("stop", ["kill", "term"])
def test_will_of_client_connected_at_shutdown_fires_after_grace(run, clients,
                                                                stop: str) -> None:
    """A client connected (with a will) when the broker dies (SIGKILL) or stops
    (SIGTERM) has its will published --will-grace seconds after the restart, with
    its QoS and retain flag."""
    proc = run()
    observer = clients(proc.mqtt_port, "w-obs", clean=False)
    observer.subscribe(("will/+", 2))
    observer.disconnect()
    clients(proc.mqtt_port, "w-victim", will=Will("will/victim", b"lost", 2, True))
    if stop == "kill":
        proc.kill()
    else:
        stop_gracefully(proc)

    grace = 5.0  # (room for a slow start on a busy machine: the check needs 0.5 s of quiet)
    before_start = time.monotonic()  # the grace timer is armed after this
    proc = run(grace=grace)
    observer = clients(proc.mqtt_port, "w-obs", clean=False, expect_present=True)
    # Not before the grace period: silent until (a lower bound of) its end, less a margin.
    quiet = before_start + grace - 0.3 - time.monotonic()
    assert quiet > 0.5, "the broker took too long to start for this check"
    observer.assert_silent(quiet)
    will = observer.receive(timeout=grace + 3)
    observer.ack(will)
    assert (will.topic, will.payload, will.qos) == ("will/victim", b"lost", 2)
    late = clients(proc.mqtt_port, uid("l"))
    late.subscribe(("will/victim", 2))
    kept = late.receive_acked()
    assert (kept.payload, kept.qos, kept.retain) == (b"lost", 2, True)


def test_will_not_published_if_client_returns_within_grace(run, clients) -> None:
    """If the client id reconnects within --will-grace after the restart, the will it
    had when the broker died is never published."""
    proc = run()
    observer = clients(proc.mqtt_port, "g-obs", clean=False)
    observer.subscribe(("gwill/+", 1), ("gwill-marker", 1))
    observer.disconnect()
    clients(proc.mqtt_port, "g-victim", will=Will("gwill/victim", b"should not", 1, True))
    proc.kill()

    proc = run()
    victim = clients(proc.mqtt_port, "g-victim")  # back at once, without a will
    observer = clients(proc.mqtt_port, "g-obs", clean=False, expect_present=True)
    observer.assert_silent(GRACE + 1.5)  # grace passes: nothing is published
    victim.close()  # socket loss now: it has no will any more
    clients(proc.mqtt_port, uid("p")).publish("gwill-marker", b"m", 1)
    marker = observer.receive_acked()
    assert (marker.topic, marker.payload) == ("gwill-marker", b"m")
    late = clients(proc.mqtt_port, uid("l"))
    late.subscribe(("gwill/#", 1), ("gwill-marker2", 0))
    clients(proc.mqtt_port, uid("p")).publish("gwill-marker2", b"m", 0)
    assert late.receive().topic == "gwill-marker2"  # the old will was not retained


def test_graceful_restart_keeps_persistent_sessions(run, clients) -> None:
    """After SIGTERM and a restart a persistent session still has its subscriptions,
    its queued messages and its unacknowledged in-flight message (re-sent with DUP)."""
    proc = run()
    sub = clients(proc.mqtt_port, "g-sub", clean=False)
    sub.subscribe(("gr/a", 1), ("gr/b/+", 2))
    pub = clients(proc.mqtt_port, uid("p"))
    pub.publish("gr/a", b"inflight", 1)
    inflight = sub.receive()  # not acknowledged
    sub.close()
    pub.publish("gr/b/x", b"queued", 2)
    stop_gracefully(proc)

    proc = run()
    pub = clients(proc.mqtt_port, uid("p"))
    pub.publish("gr/b/y", b"after restart", 1)
    sub = clients(proc.mqtt_port, "g-sub", clean=False, expect_present=True)
    first = sub.receive_acked()
    assert (first.payload, first.dup, first.packet_id) == (b"inflight", True,
                                                           inflight.packet_id)
    rest = [sub.receive_acked() for _ in range(2)]
    assert [(m.topic, m.payload, m.qos) for m in rest] == [
        ("gr/b/x", b"queued", 2), ("gr/b/y", b"after restart", 1)]
    pub.publish("gr/a", b"live", 1)
    assert sub.receive_acked().payload == b"live"


def test_sigkill_keeps_persistent_subscriptions(run, clients) -> None:
    """Subscriptions (and unsubscriptions) of a persistent session acknowledged by
    SUBACK / UNSUBACK survive kill -9."""
    proc = run()
    sub = clients(proc.mqtt_port, "k-sub", clean=False)
    sub.subscribe(("ks/+/x", 1), ("ks/dropped", 1))
    sub.unsubscribe("ks/dropped")
    sub.disconnect()
    proc.kill()
    proc = run()
    pub = clients(proc.mqtt_port, uid("p"))
    pub.publish("ks/dropped", b"unsubscribed", 1)
    pub.publish("ks/a/x", b"hit", 1)
    sub = clients(proc.mqtt_port, "k-sub", clean=False, expect_present=True)
    m = sub.receive_acked()
    assert (m.topic, m.payload) == ("ks/a/x", b"hit")


# ==================================================================================
# The .tac file


def test_twistd_runs_the_tac(tmp_path: Path) -> None:
    """twistd -ny on a copy of the .tac (its argument list edited, as its comment
    invites, to a loopback port 0 and a temporary data directory) serves MQTT."""
    text = (ROOT / "tac" / "mqttamqp.tac").read_text()
    original = "options.parseOptions([])"
    assert original in text
    args = ["--mqtt", "tcp:0:interface=127.0.0.1", "--amqp", "none", "--web", "none",
            "--mqtt-ws", "none", "--metrics", "none", "--data", str(tmp_path / "data")]
    tac = tmp_path / "mqttamqp.tac"
    tac.write_text(text.replace(original, f"options.parseOptions({args!r})", 1))
    proc = BrokerProcess(str(tmp_path / "data"))
    proc.proc = subprocess.Popen([TWISTD, "-ny", str(tac), "--pidfile=", "--logfile=-"],
                                 cwd=str(tmp_path), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
    threading.Thread(target=proc._pump, daemon=True).start()
    try:
        line = proc.wait_for_line(r"listening for MQTT on", timeout=30)
        port = int(line.rsplit(":", 1)[1])
        c = RawClient(port)
        try:
            assert c.connect(uid("tac")).return_code == 0
            c.disconnect()
        finally:
            c.close()
        assert (tmp_path / "data").is_dir()
    finally:
        stop_gracefully(proc)
    shutil.rmtree(tmp_path / "data", ignore_errors=True)
