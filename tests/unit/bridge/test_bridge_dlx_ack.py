"""A bridge's ``in`` message that an ``x-overflow reject-publish-dlx`` queue here
refuses for good, on fake transports, a store whose commits the test fires and
``task.Clock``: its refusal comes with the commit holding the dead letter, and the
remote is told (MQTT: PUBACK with the reason code; AMQP: rejected) only once that
commit is durable; a failed commit drops the connection instead, the remote
keeping the message."""

from __future__ import annotations

from typing import Any

import pytest
from bridge_remote import TABLE, Remote, remote_received
from core_broker import make_broker
from fakes import ManualStore
from loglines import LogLines
from twisted.internet.defer import Deferred

import mqttamqp.bridge.amqp as amqp
from mqttamqp.amqp.codec.contract import Mqtt5Props
from mqttamqp.amqp.codec.encode import encode_publish5
from mqttamqp.bridge.amqp import REJECTED, AmqpBridge
from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Connack, Puback, Publish, Suback, Subscribe

DLX = {"x-max-length-bytes": 4, "x-overflow": "reject-publish-dlx",
       "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "over"}


def _broker() -> tuple[Any, Any, ManualStore]:
    """A broker with ``jobs`` (4 payload bytes at most, refusing more and
    dead-lettering what it refuses to ``over``), everything so far committed."""
    store = ManualStore()
    broker, clock, _ = make_broker(store)
    broker.exchanges.declare_queue("over", "c1", durable=True)
    broker.exchanges.declare_queue("jobs", "c1", durable=True, arguments=DLX)
    store.commit_all()
    return broker, clock, store


def _dead(broker: Any) -> list[bytes]:
    return [m.payload for m in broker.queues.queues["over"].log.values()]


def _mqtt() -> tuple[Bridge, Remote, Any, ManualStore]:
    """An MQTT 5 bridge with the rule ``$queue/jobs/# in 2``, connected and
    subscribed, nothing pending in the store."""
    broker, clock, store = _broker()
    remote = Remote()
    remote.up = True
    table = {**TABLE, "topics": ["$queue/jobs/# in 2"], "protocol": "5"}
    bridge = Bridge(broker, clock, BridgeSettings.from_table(table), remote)
    bridge.start()
    store.commit_all()
    assert remote.client is not None and remote.transport is not None
    remote.transport.clear()
    remote.client.dataReceived(encode(Connack(False, 0, None), 5))
    store.commit_all()
    (sub,) = remote_received(remote)
    assert isinstance(sub, Subscribe)
    remote.client.dataReceived(encode(Suback(sub.packet_id, (2,)), 5))
    store.commit_all()
    remote_received(remote)
    return bridge, remote, broker, store


def test_mqtt_puback_waits_for_the_dead_letters_commit() -> None:
    """Review probe: the PUBACK (0x97) of a message refused and dead-lettered was
    sent before the commit holding the dead letter; now only once it is durable."""
    bridge, remote, broker, store = _mqtt()
    assert remote.client is not None
    remote.client.dataReceived(encode(Publish("$queue/jobs/a", b"x" * 10, 1, False,
                                              False, 7), 5))
    assert store.pending, "the dead letter's commit"
    assert remote_received(remote) == []
    assert bridge.dropped_in == 0
    with LogLines("refused here for good") as lines:
        store.commit_all()
    (ack,) = remote_received(remote)
    assert isinstance(ack, Puback) and (ack.packet_id, ack.reason_code) == (7, 0x97)
    assert _dead(broker) == [b"x" * 10]
    assert bridge.refused_here == bridge.dropped_in == 1
    assert remote.transport is not None and not remote.transport.disconnecting
    # its one line says where the message went: a dead letter here, not dropped
    (line,) = lines
    assert "acknowledged to the remote, dead-lettered here;" in line


def test_mqtt_a_failed_dead_letter_commit_drops_the_connection() -> None:
    """The dead letter's commit failing: no PUBACK, the connection is dropped so
    that the remote keeps the message and sends it again."""
    bridge, remote, _, store = _mqtt()
    assert remote.client is not None
    remote.client.dataReceived(encode(Publish("$queue/jobs/a", b"x" * 10, 1, False,
                                              False, 7), 5))
    _, d = store.pending.pop(0)
    d.errback(OSError("disk gone"))
    assert [p for p in remote_received(remote) if isinstance(p, Puback)] == []
    assert remote.transport is not None and remote.transport.disconnecting
    assert bridge.dropped_in == 0


class _AmqpRemote:
    """What the AMQP bridge uses of an ``AmqpRemote`` for an in message: its
    answers, and whether it was dropped; ``reject_held`` is the real one."""

    container = "fake"

    def __init__(self) -> None:
        self.answers: list[tuple[Any, int]] = []
        self.held: set[Any] = set()
        self.dropped: str | None = None
        self.paused_for: set[str] = set()

    def answer(self, dlv: Any, impl: Any, state: int, invalid: str | None = None,
               condition: str = "amqp:invalid-field") -> None:
        self.answers.append((dlv, state))

    def answer_later(self, dlv: Any, impl: Any) -> Any:
        self.held.add(dlv)
        return lambda: self.answer(dlv, impl, amqp.ACCEPTED)

    def drop(self, reason: str) -> None:
        self.dropped = reason

    def send(self, *a: Any) -> int:
        return 0

    def disconnect(self) -> None:
        pass

    def backlog(self) -> int:
        return 0

    reject_held = amqp.AmqpRemote.reject_held


def test_amqp_rejected_waits_for_the_dead_letters_commit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The AMQP bridge (the same ``take_in``): rejected only once the commit holding
    the dead letter is durable, not before."""
    monkeypatch.setattr(amqp, "decref", lambda dlv: None)
    monkeypatch.setattr(amqp, "incref", lambda dlv: None)
    monkeypatch.setattr(amqp, "delivery_settled", lambda dlv: False)
    broker, clock, store = _broker()
    settings = BridgeSettings.from_table({
        "name": "hq", "address": "amqp://127.0.0.1:5672",
        "topics": ["$queue/jobs/# in 1"]})
    bridge = AmqpBridge(broker, clock, settings, lambda client: Deferred())
    bridge.start()
    remote = _AmqpRemote()
    bridge._client = remote  # type: ignore[assignment]
    bridge.links_ready(remote)
    store.commit_all()
    data = encode_publish5("$queue/jobs/a", b"x" * 10, 1, False, 0, "someone", None,
                           Mqtt5Props(None, None, None, None, None, ()))
    bridge.remote_message(remote, bridge.in_rules[0], "dlv", "impl", data)
    assert store.pending and remote.answers == []
    store.commit_all()
    assert remote.answers == [("dlv", REJECTED)] and remote.dropped is None
    assert _dead(broker) == [b"x" * 10] and bridge.dropped_in == 1
