"""An AMQP 1.0 bridge's settlement of its out session, on a fake remote, an in-memory
broker and ``task.Clock``: accepted ends an entry, rejected drops it (counted, logged
once a minute per cause), released sends it again after ``reconnect-min``; no credit
from the remote holds the session, a flow lets it go on; the ``amqp://`` table."""

from __future__ import annotations

from typing import Any

import pytest
from core_broker import make_broker
from loglines import LogLines
from twisted.internet.defer import Deferred

import mqttamqp.bridge.amqp as amqp
from mqttamqp.amqp.codec.contract import Mqtt5Props
from mqttamqp.amqp.codec.encode import encode_publish5
from mqttamqp.bridge.amqp import ACCEPTED, REJECTED, RELEASED, AmqpBridge, AmqpLink
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.core.message import Message
from mqttamqp.ops.config import TableKeyError

TABLE = {"name": "hq", "address": "amqp://127.0.0.1:5672", "topics": ["out/# out 1"],
         "reconnect-min": 2.0}


class FakeRemote:
    """What the bridge uses of an ``AmqpRemote``: what was sent, and the credit."""

    container = "fake"

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, int | None, bool]] = []
        self.no_credit = False
        self.paused_for: set[str] = set()
        self.dropped: str | None = None
        self.answers: list[tuple[Any, int]] = []
        self.invalid: str | None = None
        self.condition = ""
        self.unsent = 0
        self.held: set[Any] = set()

    def send(self, address: str, message: Message, qos: int, retain: bool, dup: bool,
             hops: int, packet_id: int | None, now: float) -> int:
        self.sent.append((address, message.payload, packet_id, dup))
        if self.no_credit:
            self.unsent += len(message.payload)
        return 0

    def drop(self, reason: str) -> None:
        self.dropped = reason

    def answer(self, dlv: Any, impl: Any, state: int, invalid: str | None = None,
               condition: str = "amqp:invalid-field") -> None:
        self.answers.append((dlv, state))
        self.invalid = invalid
        self.condition = condition

    def disconnect(self) -> None:
        pass

    def backlog(self) -> int:
        return self.unsent

    def answer_later(self, dlv: Any, impl: Any) -> Any:
        self.held.add(dlv)
        return lambda: self.answer(dlv, impl, ACCEPTED)

    # The real rule (which refusal is rejected, with which condition), on this fake's
    # ``answer`` (``decref`` is made a no-op by ``_connected``).
    reject_held = amqp.AmqpRemote.reject_held


@pytest.fixture(autouse=True)
def _no_proton_refcounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake remote's deliveries are plain values: no proton reference counts."""
    monkeypatch.setattr(amqp, "decref", lambda dlv: None)
    monkeypatch.setattr(amqp, "incref", lambda dlv: None)


def _connected(limits: dict[str, Any] | None = None, **table: Any
               ) -> tuple[AmqpBridge, FakeRemote, Any, Any]:
    broker, clock, _ = make_broker(**(limits or {}))
    settings = BridgeSettings.from_table({**TABLE, **table})
    bridge = AmqpBridge(broker, clock, settings, lambda client: Deferred())
    bridge.start()
    remote = FakeRemote()
    bridge._client = remote
    bridge.links_ready(remote)
    return bridge, remote, broker, clock


def _publish(broker: Any, n: int) -> None:
    for i in range(n):
        broker.publish(Message(f"out/{i}", str(i).encode(), 1, False, "p", 0.0))


def test_accepted_ends_the_entry_and_the_remote_address_is_mapped() -> None:
    """A QoS 1 message goes unsettled to remote-prefix + topic; the remote's accepted
    takes it out of the session."""
    bridge, remote, broker, clock = _connected(topics=['out/# out 1 "" far/'])
    _publish(broker, 1)
    assert [(a, p) for a, p, _, _ in remote.sent] == [("far/out/0", b"0")]
    packet_id = remote.sent[0][2]
    assert packet_id is not None and bridge.session is not None
    assert packet_id in bridge.session.inflight
    bridge.outcome(remote, packet_id, ACCEPTED, "")
    clock.advance(0.1)   # (whatever settles later has had its turn)
    assert not bridge.session.inflight and bridge.sent == 1


def test_rejected_drops_counts_and_logs_once_per_cause() -> None:
    """Two messages rejected for good for one condition and one for another: all
    leave the session for good (nothing is sent again over a long time), all are
    counted, one line per condition says each is dropped."""
    bridge, remote, broker, clock = _connected()
    with LogLines("the remote rejected a message") as lines:
        _publish(broker, 3)
        reasons = ["amqp:unauthorized-access: no", "amqp:unauthorized-access: again",
                   "amqp:not-allowed: never"]
        for (_, _, packet_id, _), reason in zip(list(remote.sent), reasons, strict=True):
            bridge.outcome(remote, packet_id, REJECTED, reason)
        for _ in range(100):   # 100 × 10 s: well past reconnect-max (60 s) many times
            clock.advance(10)
    assert bridge.session is not None and not bridge.session.inflight
    assert len(remote.sent) == 3, remote.sent[3:]
    assert bridge.refused == 3 and len(lines) == 2
    assert all("it is dropped" in line for line in lines), lines
    assert "1 rejected so far" in lines[0] and "3 rejected so far" in lines[1]
    assert "amqp:not-allowed" in lines[1]
    assert isinstance(bridge.link, AmqpLink) and bridge.link.released == 0


def test_rejected_for_now_is_sent_again_not_dropped() -> None:
    """A remote's rejected with amqp:resource-limit-exceeded (a full queue there, as
    the broker's own ingress and Artemis say it) is refused for now: the message is
    sent again with the release back-off, not dropped (within max-full-wait); counted
    and logged once a minute per condition."""
    bridge, remote, broker, clock = _connected()
    _publish(broker, 1)
    packet_id = remote.sent[0][2]
    with LogLines("the remote refused a message") as lines:
        for _ in range(5):   # (bounded: each resend comes within reconnect-max)
            sent = len(remote.sent)
            bridge.outcome(remote, packet_id, amqp.FULL, "amqp:resource-limit-exceeded: "
                           "queue 'jobs' is full")
            for _ in range(200):
                clock.advance(0.5)
                if len(remote.sent) > sent:
                    break
    assert len(remote.sent) == 6 and remote.sent[-1] == ("out/0", b"0", packet_id, True)
    assert bridge.session is not None and packet_id in bridge.session.inflight
    assert bridge.refused == 0 and bridge.refused_for_now == 5
    # (the five within 30 s: one line for the condition in the minute)
    assert len(lines) == 1 and "1 so far" in lines[0]
    assert "sent again later, for max-full-wait 3600 s at most" in lines[0]


@pytest.mark.parametrize(("condition", "expected"), [
    ("amqp:resource-limit-exceeded", amqp.FULL),
    ("amqp:internal-error", amqp.FAILED),
    ("amqp:not-allowed", REJECTED),
    ("amqp:invalid-field", REJECTED),
    ("amqp:unauthorized-access", REJECTED),
    ("", REJECTED),
])
def test_a_remote_rejection_is_read_by_its_condition(
        condition: str, expected: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The remote's rejected is read through the table the broker's own AMQP ingress
    rejects with (``amqp.refusals``): for now, a failed attempt, or for good."""
    from types import SimpleNamespace

    import mqttamqp.bridge.amqpterms as terms

    monkeypatch.setattr(terms, "delivery_remote_state", lambda dlv: REJECTED)
    monkeypatch.setattr(terms, "delivery_remote", lambda dlv: dlv)
    monkeypatch.setattr(terms, "lib", SimpleNamespace(pn_disposition_condition=lambda d: d))
    both = (condition, "why") if condition else None
    monkeypatch.setattr(terms, "condition", lambda cond: both)
    monkeypatch.setattr(terms, "describe", lambda cond: f"{condition}: why" if both else None)
    state, reason = terms.outcome_of("dlv")
    assert state == expected
    assert condition in reason


def test_released_is_sent_again_after_reconnect_min() -> None:
    """Released: the entry stays in flight and goes again (DUP) once reconnect-min has
    passed, not before."""
    bridge, remote, broker, clock = _connected()
    _publish(broker, 1)
    packet_id = remote.sent[0][2]
    bridge.outcome(remote, packet_id, RELEASED, "")
    assert len(remote.sent) == 1
    clock.advance(1.9)
    assert len(remote.sent) == 1
    clock.advance(0.2)
    assert remote.sent[1] == ("out/0", b"0", packet_id, True)
    assert isinstance(bridge.link, AmqpLink) and bridge.link.released == 1
    assert bridge.session is not None and packet_id in bridge.session.inflight


def test_no_credit_holds_the_session_until_a_flow() -> None:
    """Without credit from the remote nothing more is sent; the remote's flow (drained)
    lets the queued messages go, in order."""
    bridge, remote, broker, _ = _connected()
    remote.no_credit = True
    _publish(broker, 3)
    held = len(remote.sent)
    assert held == 0, remote.sent
    remote.no_credit = False
    bridge.client_drained(remote)
    assert [p for _, p, _, _ in remote.sent] == [b"0", b"1", b"2"]


def test_the_amqp_table() -> None:
    """amqp:// and amqps:// are read (default ports 5672 and 5671; TLS keys only with
    amqps://; ``credit`` 1 to 10000, 100 by default); a path is refused."""
    plain = BridgeSettings.from_table(TABLE)
    assert plain.amqp and not plain.tls and plain.port == 5672 and plain.credit == 100
    with pytest.raises(TableKeyError, match="credit"):
        BridgeSettings.from_table({**TABLE, "credit": 0})
    tls = BridgeSettings.from_table({**TABLE, "address": "amqps://core.example",
                                     "server-name": "core"})
    assert tls.amqp and tls.tls and tls.port == 5671
    with pytest.raises(TableKeyError, match="server-name"):
        BridgeSettings.from_table({**TABLE, "server-name": "core"})
    with pytest.raises(TableKeyError, match="address"):
        BridgeSettings.from_table({**TABLE, "address": "amqp://h/queue"})


def test_figures_name_the_amqp_remote() -> None:
    """The Bridges page's figures say AMQP 1.0 (not an MQTT version) and count what
    the remote released."""
    from mqttamqp.bridge.service import figures

    bridge, remote, broker, _ = _connected()
    _publish(broker, 1)
    bridge.outcome(remote, remote.sent[0][2], RELEASED, "")
    f = figures(bridge)
    assert f["protocol"] == "AMQP 1.0" and f["released"] == 1 and f["state"] == "connected"


def test_released_and_echoes_are_metrics() -> None:
    """The metrics listener has an AMQP bridge's released and echoes counts."""
    from mqttamqp.bridge.service import figures
    from mqttamqp.ops.metrics import BridgeCollector, broker_registry, exposition

    bridge, remote, broker, _ = _connected()
    _publish(broker, 1)
    bridge.outcome(remote, remote.sent[0][2], RELEASED, "")
    registry = broker_registry(broker)
    registry.register(BridgeCollector(lambda: [figures(bridge)]))
    text = exposition(registry).decode()
    assert 'mqttamqp_bridge_released_total{bridge="hq"} 1.0' in text
    assert 'mqttamqp_bridge_echoes_total{bridge="hq"} 0.0' in text


def test_an_in_message_above_max_packet_size_is_rejected_and_counted() -> None:
    """An in message larger than --max-packet-size is rejected to the remote (not
    published here), counted as too large."""
    bridge, remote, _, _ = _connected({"max_packet_size": 64}, topics=["in/# in 1"])
    bridge.remote_message(remote, bridge.in_rules[0], "dlv", "impl", b"x" * 65)
    assert remote.answers == [("dlv", REJECTED)]
    assert bridge.too_large_in == 1 and bridge.received == 0


def _in_message(topic: str) -> bytes:
    return encode_publish5(topic, b"bad", 1, False, 0, "someone", None,
                           Mqtt5Props(None, None, None, None, None, ()))


@pytest.mark.parametrize("topic", ["a/#", "a/+/b", "a/b/c/d"])
def test_an_in_message_with_a_bad_topic_is_rejected_not_published(
        topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An in message whose topic here is not a valid topic name (a wildcard) or breaks
    --max-topic-levels is rejected as amqp:invalid-field, counted, not published."""
    monkeypatch.setattr(amqp, "delivery_settled", lambda dlv: False)
    bridge, remote, _, _ = _connected({"max_topic_levels": 3}, topics=["# in 1"])
    bridge.remote_message(remote, bridge.in_rules[0], "dlv", "impl", _in_message(topic))
    assert remote.answers == [("dlv", REJECTED)] and remote.invalid is not None
    assert topic in remote.invalid
    assert bridge.refused_here == 1 and bridge.received == 0


@pytest.mark.parametrize(("topic", "condition"), [
    ("$queue/jobs/$ack", "amqp:not-allowed"), ("$dlq/jobs/x", "amqp:invalid-field"),
    ("$mqtt.control", "amqp:invalid-field")])
def test_an_in_message_the_core_refuses_for_good_is_rejected_not_a_reconnect(
        topic: str, condition: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An in message to a queue acknowledgement, a $dlq/ publish or a control address
    is rejected to the remote once, with the condition the core's AMQP ingress gives
    it, and for good: over a long time no reconnect brings it back; counted, and the
    line says so."""
    monkeypatch.setattr(amqp, "delivery_settled", lambda dlv: False)
    bridge, remote, _, clock = _connected(topics=[f"{topic} in 1"])
    attempts = bridge.attempts
    with LogLines("rejected") as lines:
        bridge.remote_message(remote, bridge.in_rules[0], "dlv", "impl", _in_message(topic))
        for _ in range(100):   # 100 × 10 s: well past reconnect-max (60 s) many times
            clock.advance(10)
    assert remote.dropped is None, remote.dropped
    assert bridge.attempts == attempts and bridge.state == "connected"
    assert remote.answers == [("dlv", REJECTED)] and remote.invalid
    assert remote.condition == condition and not remote.held
    assert bridge.refused_here == 1
    assert len(lines) == 1 and "rejected" in lines[0] and topic.split("/")[0] in lines[0]


def test_an_in_refusal_gets_the_core_ingress_condition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding: the bridge had its own table (anything but an invalid topic
    was amqp:not-allowed); a refusal the core's ingress rejects with
    amqp:precondition-failed (code 0x80) gets that condition from the bridge too,
    and the refusal is for good: no reconnect over a long time."""
    from types import SimpleNamespace

    from mqttamqp.amqp.refusals import condition_of
    from mqttamqp.core.queues.addresses import UNSPECIFIED_ERROR, Refusal

    monkeypatch.setattr(amqp, "delivery_settled", lambda dlv: False)
    bridge, remote, broker, clock = _connected(topics=["$queue/# in 1"])
    monkeypatch.setattr(broker, "publish", lambda *a, **k: SimpleNamespace(
        refusal=Refusal(UNSPECIFIED_ERROR, "not for this queue"), blocked=False,
        congested=(), durable=None))
    with LogLines("refused here for good") as lines:
        bridge.remote_message(remote, bridge.in_rules[0], "dlv", "impl",
                              _in_message("$queue/jobs/a"))
        clock.advance(1000)
    assert remote.answers == [("dlv", REJECTED)] and remote.dropped is None
    assert remote.condition == condition_of(UNSPECIFIED_ERROR) == "amqp:precondition-failed"
    assert bridge.refused_here == 1 and len(lines) == 1 and "not for this queue" in lines[0]


def test_an_in_message_a_full_queue_refuses_drops_the_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal that may pass later (quota: a full queue) is not rejected: the
    connection is dropped so that the remote keeps the message."""
    from types import SimpleNamespace

    from mqttamqp.core.queues.addresses import QUOTA_EXCEEDED, Refusal

    monkeypatch.setattr(amqp, "delivery_settled", lambda dlv: False)
    bridge, remote, broker, _ = _connected(topics=["$queue/# in 1"])
    monkeypatch.setattr(broker, "publish", lambda *a, **k: SimpleNamespace(
        refusal=Refusal(QUOTA_EXCEEDED, "queue 'jobs' is full"), blocked=False,
        congested=(), durable=None))
    bridge.remote_message(remote, bridge.in_rules[0], "dlv", "impl",
                          _in_message("$queue/jobs/a"))
    assert remote.answers == [] and remote.dropped is not None
    assert "full" in remote.dropped and bridge.refused_here == 1


def test_qos2_accepted_completes_the_entry() -> None:
    """QoS 2: the remote's accepted is the end; the entries leave the session once the
    clock has run (the completion is settled later)."""
    bridge, remote, broker, clock = _connected(topics=["out/# out 2"])
    for i in range(3):
        broker.publish(Message(f"out/{i}", b"0", 2, False, "p", 0.0))
    clock.advance(0.1)
    for _, _, packet_id, _ in list(remote.sent):
        bridge.outcome(remote, packet_id, ACCEPTED, "")
    clock.advance(0.1)
    assert bridge.session is not None and not bridge.session.inflight
    assert len(remote.sent) == 3


def test_released_for_a_long_time_never_drops_an_acknowledged_message() -> None:
    """Default settings: a remote releasing a QoS 1 message for far longer than
    max-resends tries keeps it in flight, sent again with a doubling delay."""
    bridge, remote, broker, clock = _connected(**{"reconnect-min": 1.0})
    _publish(broker, 1)
    packet_id = remote.sent[0][2]
    start, times = clock.seconds(), []
    for _ in range(15):
        bridge.outcome(remote, packet_id, RELEASED, "")
        sent = len(remote.sent)
        for _ in range(200):   # (bounded: the resend comes within reconnect-max)
            clock.advance(0.5)
            if len(remote.sent) > sent:
                break
        times.append(clock.seconds())
    assert bridge.session is not None and packet_id in bridge.session.inflight
    assert bridge.refused == 0 and len(remote.sent) == 16
    gaps = [b - a for a, b in zip([start, *times], times, strict=False)]
    assert gaps[0] == 1.0 and gaps[1] == 2.0 and gaps[-1] == 60.0


def test_delivery_failed_is_sent_again_max_resends_times_then_dropped() -> None:
    """A message the remote fails each time (modified with delivery-failed) is sent
    again max-resends times, then dropped as a poison message, counted as rejected."""
    bridge, remote, broker, clock = _connected(**{"max-resends": 2})
    _publish(broker, 1)
    packet_id = remote.sent[0][2]
    for _ in range(3):
        bridge.outcome(remote, packet_id, amqp.FAILED, "modified: delivery-failed")
        clock.advance(8.1)
    assert len(remote.sent) == 3
    assert bridge.session is not None and packet_id not in bridge.session.inflight
    assert bridge.refused == 1


def _publish_to(broker: Any, topic: str, n: int) -> None:
    for i in range(n):
        broker.publish(Message(topic, str(i).encode(), 1, False, "p", 0.0))


def test_an_accepted_outcome_starts_the_resend_delay_over() -> None:
    """After releases have doubled an address's resend delay, a message accepted on
    that address brings its next resend back to reconnect-min."""
    bridge, remote, broker, clock = _connected()
    _publish_to(broker, "out/a", 2)
    first, second = remote.sent[0][2], remote.sent[1][2]
    bridge.outcome(remote, first, RELEASED, "")
    clock.advance(2.1)
    bridge.outcome(remote, first, RELEASED, "")
    clock.advance(4.1)
    link = bridge.link
    assert isinstance(link, AmqpLink) and link.delay("out/a") == 4.0
    bridge.outcome(remote, second, ACCEPTED, "")
    bridge.outcome(remote, first, RELEASED, "")
    assert link.delay("out/a") == 2.0


def test_an_accept_on_another_address_keeps_the_back_off() -> None:
    """Review finding: the back-off was one per bridge, so the remote accepting
    messages on one address made the address it keeps releasing resend at
    reconnect-min each time; it is per address now."""
    bridge, remote, broker, clock = _connected()
    _publish_to(broker, "out/refused", 1)
    refused = remote.sent[0][2]
    resent: list[float] = []
    for _ in range(5):   # (bounded: each resend comes within reconnect-max)
        bridge.outcome(remote, refused, RELEASED, "")
        _publish_to(broker, "out/taken", 1)   # accepted on its own address
        bridge.outcome(remote, remote.sent[-1][2], ACCEPTED, "")
        before, sent = clock.seconds(), len(remote.sent)
        for _ in range(200):
            clock.advance(0.5)
            if len(remote.sent) > sent:
                break
        resent.append(clock.seconds() - before)
    link = bridge.link
    assert isinstance(link, AmqpLink)
    assert resent == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert link.delay("out/refused") == 32.0 and link.delay("out/taken") == 0.0
    assert set(link.resends) == {"out/refused"}


def test_a_resend_waits_for_credit() -> None:
    """Released messages are not sent again while the remote grants no credit; they go
    on the first try after it does."""
    bridge, remote, broker, clock = _connected()
    _publish(broker, 2)
    for _, _, packet_id, _ in list(remote.sent):
        bridge.outcome(remote, packet_id, RELEASED, "")
    remote.no_credit = True
    clock.advance(2.1)
    assert len(remote.sent) == 2
    remote.no_credit = False
    clock.advance(2.1)   # (the next try: the same delay, no credit is no release)
    assert [(p, dup) for _, p, _, dup in remote.sent[2:]] == [(b"0", True), (b"1", True)]


def test_a_resend_waiting_for_credit_after_an_accept_does_not_spin() -> None:
    """Review finding: an accept between a release and its resend set the delay to 0,
    so with no credit the resend was scheduled again at once, every reactor turn."""
    bridge, remote, broker, clock = _connected()
    _publish_to(broker, "out/a", 2)
    (_, _, first, _), (_, _, second, _) = remote.sent[:2]
    bridge.outcome(remote, first, RELEASED, "")
    bridge.outcome(remote, second, ACCEPTED, "")
    remote.no_credit = True
    clock.advance(2.1)              # the resend's try: no credit
    assert isinstance(bridge.link, AmqpLink)
    retry = bridge.link.resends["out/a"].call
    assert retry is not None and retry.getTime() - clock.seconds() >= 1.0
    remote.no_credit = False
    clock.advance(retry.getTime() - clock.seconds())
    assert [p for _, p, _, _ in remote.sent[2:]] == [b"0"]
    assert not bridge.link.resends   # (accepted since, nothing waiting: forgotten)


def test_an_in_message_is_accepted_only_once_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """take_in with the store's Deferred still pending: the remote is not answered;
    once it fires the message is accepted, once."""
    from types import SimpleNamespace

    bridge, remote, broker, _ = _connected(topics=["in/# in 1"])
    stored: Deferred[None] = Deferred()
    monkeypatch.setattr(broker, "publish", lambda *a, **k: SimpleNamespace(
        refusal=None, blocked=False, congested=(), durable=stored))
    acks: list[int] = []
    bridge.take_in(remote, Message("in/a", b"a", 1, False, "hq", 0.0), lambda: acks.append(1))
    assert acks == [] and remote.dropped is None
    stored.callback(None)
    assert acks == [1]


def test_the_per_address_back_off_is_bounded() -> None:
    """Addresses released once and then dropped (rejected for good) leave an idle
    back-off behind; past max(16, --max-inflight) addresses the idle ones are
    forgotten, so the table stays bounded however many addresses pass."""
    bridge, remote, broker, clock = _connected(limits={"max_inflight": 4})
    link = bridge.link
    assert isinstance(link, AmqpLink)
    for i in range(100):
        _publish_to(broker, f"out/{i}", 1)
        packet_id = remote.sent[-1][2]
        bridge.outcome(remote, packet_id, RELEASED, "")
        clock.advance(2.1)   # (sent again once)
        bridge.outcome(remote, packet_id, REJECTED, "amqp:not-allowed: no")
        assert len(link.resends) <= 17
    assert bridge.refused == 100 and bridge.session is not None
    assert not bridge.session.inflight


def _grow(bridge: Any, remote: FakeRemote, clock: Any, packet_id: int | None,
          waits: tuple[float, ...]) -> None:
    """Release ``packet_id`` and let each resend go (after each of ``waits``): its
    address's delay doubles, and it is left awaiting the remote's outcome."""
    for wait in waits:
        bridge.outcome(remote, packet_id, RELEASED, "")
        clock.advance(wait)


def test_pruning_keeps_a_grown_back_off() -> None:
    """Review finding: making room in the bounded table forgot every address with
    nothing waiting, so one whose delay had grown to 8 s resent at reconnect-min
    again after 17 other addresses passed; those at reconnect-min go first now."""
    bridge, remote, broker, clock = _connected(limits={"max_inflight": 4})
    link = bridge.link
    assert isinstance(link, AmqpLink)
    _publish_to(broker, "out/x", 1)
    x = remote.sent[-1][2]
    _grow(bridge, remote, clock, x, (2.1, 4.1, 8.1))   # resent; awaits an outcome
    assert link.delay("out/x") == 8.0 and link.resends["out/x"].call is None
    for i in range(17):   # other addresses: released once, then rejected for good
        _publish_to(broker, f"out/{i}", 1)
        pid = remote.sent[-1][2]
        _grow(bridge, remote, clock, pid, (2.1,))
        bridge.outcome(remote, pid, REJECTED, "amqp:not-allowed: no")
        assert len(link.resends) <= 16
    bridge.outcome(remote, x, RELEASED, "")   # still never accepted on out/x
    assert link.delay("out/x") == 16.0


def test_pruning_forgets_the_longest_released_one_at_a_time() -> None:
    """With every address's delay grown, room for a new one is made by forgetting
    one only, the one released longest ago; the others keep their back-off."""
    bridge, remote, broker, clock = _connected(limits={"max_inflight": 4})
    link = bridge.link
    assert isinstance(link, AmqpLink)
    for i in range(16):
        _publish_to(broker, f"out/{i}", 1)
        pid = remote.sent[-1][2]
        _grow(bridge, remote, clock, pid, (2.1, 4.1))
        bridge.outcome(remote, pid, REJECTED, "amqp:not-allowed: no")
    _publish_to(broker, "out/0", 1)   # released again last: out/1 is the oldest now
    _grow(bridge, remote, clock, remote.sent[-1][2], (8.1,))
    assert link.delay("out/0") == 8.0 and link.resends["out/0"].call is None
    _publish_to(broker, "out/new", 1)
    bridge.outcome(remote, remote.sent[-1][2], RELEASED, "")
    assert len(link.resends) == 16 and "out/1" not in link.resends
    assert link.delay("out/0") == 8.0 and link.delay("out/new") == 2.0
    assert all(link.delay(f"out/{i}") == 4.0 for i in range(2, 16))


def _refuse_for_now_until_dropped(bridge: Any, remote: FakeRemote, clock: Any,
                                  packet_id: int | None, tries: int = 20) -> list[float]:
    """Refuse ``packet_id`` for now each time it comes, at most ``tries`` times,
    until it leaves the session: the times it was refused."""
    times: list[float] = []
    for _ in range(tries):
        assert bridge.session is not None
        if packet_id not in bridge.session.inflight:
            break
        times.append(clock.seconds())
        sent = len(remote.sent)
        bridge.outcome(remote, packet_id, amqp.FULL,
                       "amqp:resource-limit-exceeded: queue 'jobs' is full")
        for _ in range(200):   # (bounded: the resend comes within reconnect-max)
            clock.advance(0.5)
            if len(remote.sent) > sent or packet_id not in bridge.session.inflight:
                break
    return times


def test_refused_for_now_past_max_full_wait_is_dropped_for_good() -> None:
    """Review finding: a message a remote refuses for now every time (a queue that
    stays full, or one it could never fit) was sent again for ever; past
    max-full-wait seconds since its first such refusal it is dropped for good:
    counted, one line, never sent again."""
    bridge, remote, broker, clock = _connected(**{"max-full-wait": 100})
    _publish(broker, 1)
    packet_id = remote.sent[0][2]
    with LogLines("the remote rejected a message") as lines:
        times = _refuse_for_now_until_dropped(bridge, remote, clock, packet_id)
        sent = len(remote.sent)
        clock.advance(1000)
    # refused at 0, 2, 6, 14, 30, 62 s (back-off from reconnect-min 2 s), dropped at 122
    assert [t - times[0] for t in times] == [0, 2, 6, 14, 30, 62, 122]
    assert bridge.session is not None and packet_id not in bridge.session.inflight
    assert len(remote.sent) == sent == 7
    assert bridge.full_dropped == 1 and bridge.refused == 1 and bridge.refused_for_now == 6
    assert len(lines) == 1 and "max-full-wait" in lines[0] and "it is dropped" in lines[0]
    assert isinstance(bridge.link, AmqpLink) and not bridge.link.full
    from mqttamqp.bridge.service import figures
    from mqttamqp.ops.metrics import BridgeCollector, broker_registry, exposition
    registry = broker_registry(broker)
    registry.register(BridgeCollector(lambda: [figures(bridge)]))
    assert figures(bridge)["full_dropped"] == 1
    assert 'mqttamqp_bridge_full_dropped_total{bridge="hq"} 1.0' in exposition(
        registry).decode()


def test_another_outcome_starts_the_full_wait_over() -> None:
    """The wait is of refusals for now in a row: a release between them (the remote
    took the message again) starts it over, so the message is not dropped then."""
    bridge, remote, broker, clock = _connected(**{"max-full-wait": 20})
    _publish(broker, 1)
    packet_id = remote.sent[0][2]
    link = bridge.link
    assert isinstance(link, AmqpLink) and bridge.session is not None
    for state in (amqp.FULL, amqp.FULL, amqp.FULL, RELEASED, amqp.FULL, amqp.FULL):
        bridge.outcome(remote, packet_id, state, "amqp:resource-limit-exceeded: full"
                       if state == amqp.FULL else "")
        clock.advance(8.1)   # (2, 4, 8, 16 s delays: each resend has gone)
    # (refused for now at 0, 8.1, 16.2 s, released at 24.3, refused at 32.4, 40.5:
    # without the release, 32.4 s would have been past max-full-wait)
    assert packet_id in bridge.session.inflight and bridge.full_dropped == 0
    clock.advance(4.0)   # 20.2 s since the first refusal after the release
    bridge.outcome(remote, packet_id, amqp.FULL, "amqp:resource-limit-exceeded: full")
    assert packet_id not in bridge.session.inflight and bridge.full_dropped == 1


def test_the_full_wait_table_is_bounded_by_the_window() -> None:
    """The first refusals for now are kept for messages in flight only: entries of
    messages gone another way are forgotten once the window's worth is reached."""
    bridge, remote, broker, clock = _connected(limits={"max_inflight": 4})
    link = bridge.link
    assert isinstance(link, AmqpLink)
    for i in range(50):
        _publish_to(broker, f"out/{i}", 1)
        pid = remote.sent[-1][2]
        assert pid is not None and bridge.session is not None
        link.full[pid + 1000] = (object(), 0.0)   # (one the session no longer has)
        bridge.outcome(remote, pid, amqp.FULL, "amqp:resource-limit-exceeded: full")
        assert len(link.full) <= 5
        bridge.outcome(remote, pid, ACCEPTED, "")
        clock.advance(60)
