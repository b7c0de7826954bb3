"""The 0.9.1 permission checks (``amqp091.permissions``) with a fake connection and
a real ``AclAuthorizer``: the defaults the topic rules imply, the queue/exchange
lines on top, the owner's exclusive queues, and 403 texts that name what was refused."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mqttamqp.amqp091 import permissions as p
from mqttamqp.core.auth import AllowAll, Identity, LoopbackOnly
from mqttamqp.core.exchanges.errors import ChannelError
from mqttamqp.security.acl import AclAuthorizer

ACL = """\
user alice
topic readwrite $queue/jobs/#
topic read $queue/in/#
topic write $queue/out
topic read sensors/alice/#
exchange write orders
queue read audit
"""


def host(authorizer: Any, declared: dict[str, Any] | None = None) -> Any:
    gate = SimpleNamespace(may_write=lambda identity, topic: authorizer.may_publish(
        identity, topic, False))
    broker = SimpleNamespace(authorizer=authorizer, gate=gate,
                             exchanges=SimpleNamespace(declared=declared or {}))
    return SimpleNamespace(broker=broker, identity=Identity("c1", "alice", "amqp0-9-1"),
                           username="alice", key="conn-1")


@pytest.fixture
def alice(tmp_path: Any) -> Any:
    path = tmp_path / "acl"
    path.write_text(ACL)
    return host(AclAuthorizer(str(path)), {
        "mine": SimpleNamespace(exclusive=True, owner="conn-1"),
        "theirs": SimpleNamespace(exclusive=True, owner="conn-2")})


def refused(f: Any, *args: Any) -> str:
    with pytest.raises(ChannelError) as info:
        f(*args)
    assert info.value.code == 403
    return info.value.text


def test_queue_defaults_mirror_the_topic_rules(alice: Any) -> None:
    """Read needs a read grant on $queue/<name>, write a write grant, configure
    either; a queue line adds its access; the connection's own exclusive queue is
    its own."""
    p.check_queue(alice, p.READ, "jobs")
    p.check_queue(alice, p.WRITE, "jobs")
    p.check_queue(alice, p.CONFIGURE, "in")
    p.check_queue(alice, p.CONFIGURE, "out")
    p.check_queue(alice, p.READ, "audit")
    p.check_queue(alice, p.READ, "mine")
    assert refused(p.check_queue, alice, p.WRITE, "in") == (
        "ACCESS_REFUSED - write access to queue 'in' in vhost '/' refused for user 'alice'")
    assert "read access to queue 'out'" in refused(p.check_queue, alice, p.READ, "out")
    assert "configure access to queue 'audit'" in refused(p.check_queue, alice,
                                                          p.CONFIGURE, "audit")
    assert "queue 'theirs'" in refused(p.check_queue, alice, p.READ, "theirs")


def test_exchanges_need_their_lines_and_amq_topic_reads_topics(alice: Any) -> None:
    """Publishing to an exchange needs an exchange line (default exchange: a write on
    the queue; amq.topic: the model checks each topic); binding from amq.topic is a
    read of the key's MQTT filter; standard exchanges and passive declares need none."""
    p.check_publish(alice, "orders", "k")
    p.check_publish(alice, "", "jobs")
    p.check_publish(alice, "amq.topic", "anything.at.all")
    assert "write access to exchange 'amq.direct'" in refused(
        p.check_publish, alice, "amq.direct", "k")
    assert "write access to queue 'in'" in refused(p.check_publish, alice, "", "in")
    p.check_bind(alice, "jobs", False, "amq.topic", "sensors.alice.*.t")
    assert "read access to topic 'sensors.#'" in refused(
        p.check_bind, alice, "jobs", False, "amq.topic", "sensors.#")
    assert "write access to queue 'in'" in refused(
        p.check_bind, alice, "in", False, "amq.topic", "sensors.alice.#")
    assert "read access to exchange 'orders'" in refused(
        p.check_bind, alice, "jobs", False, "orders", "")
    p.check_exchange_declare(alice, "amq.fanout", False)
    p.check_exchange_declare(alice, "orders", True)
    assert "configure access to exchange 'orders'" in refused(
        p.check_exchange_declare, alice, "orders", False)
    assert p.binding_filter("a.*.#") == "a/+/#"


def test_without_an_acl_everything_is_allowed() -> None:
    """AllowAll: every check passes and consumers join as the connection."""
    open_host = host(AllowAll())
    for access in (p.CONFIGURE, p.WRITE, p.READ):
        p.check_queue(open_host, access, "q")
        p.check_exchange(open_host, access, "x", "#")
    assert p.consumer_identity(open_host, "q") is open_host.identity


def test_a_consumer_granted_by_a_queue_line_joins_as_the_broker(alice: Any) -> None:
    """A read the topic rules do not give (a queue line, an owned exclusive queue)
    joins its group as the broker's own identity, which the core does not check
    again; one the topic rules give joins as the connection."""
    assert p.consumer_identity(alice, "jobs") is alice.identity
    joined = p.consumer_identity(alice, "audit")
    assert (joined.client_id, joined.username, joined.protocol) == ("c1", "alice", "")


def test_a_dead_letter_or_alternate_exchange_needs_write_on_it(alice: Any) -> None:
    """A declare naming x-dead-letter-exchange or alternate-exchange needs write on
    that exchange (the default exchange: on the dead-letter routing key's queue)."""
    p.check_routes_to(alice, {"x-dead-letter-exchange": "orders"}, "jobs")
    p.check_routes_to(alice, {"x-dead-letter-exchange": "",
                              "x-dead-letter-routing-key": "out"}, "jobs")
    p.check_routes_to(alice, {"x-dead-letter-exchange": ""}, "jobs")
    p.check_routes_to(alice, {"x-max-length": 3}, "jobs")
    assert "write access to exchange 'amq.fanout'" in refused(
        p.check_routes_to, alice, {"alternate-exchange": "amq.fanout"})
    assert "write access to queue 'in'" in refused(
        p.check_routes_to, alice, {"x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": "in"}, "jobs")


def test_publish_asks_nothing_only_of_allow_all_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_publish skips the authorizer for ``AllowAll`` and ``LoopbackOnly``
    themselves (nothing asked), not for a subclass that overrides a verdict: such
    a one is still asked (and refuses)."""
    asked: list[str] = []

    class NoQueueWrites(AllowAll):
        def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
            asked.append(topic)
            return False

        def may_use_resource(self, identity: Identity, kind: str, access: str,
                             name: str) -> bool:
            return False

    # (their verdicts recorded on the class, where check_publish's callees look
    # them up: the instances' type stays exact, and a compiled instance's methods
    # are read-only)
    monkeypatch.setattr(AllowAll, "may_publish", lambda *a: asked.append("publish") or True)
    monkeypatch.setattr(AllowAll, "may_use_resource",
                        lambda *a: asked.append("resource") or True)
    for allows in (AllowAll(), LoopbackOnly()):
        assert allows.may_publish(Identity("c"), "t", False)   # (recorded: ...
        assert asked.pop() == "publish"                       # ... else this proves nothing)
        for exchange in ("", "orders", "amq.topic"):
            p.check_publish(host(allows), exchange, "jobs")
    assert asked == []
    assert "write access to queue 'jobs'" in refused(p.check_publish,
                                                     host(NoQueueWrites()), "", "jobs")
    assert asked == ["$queue/jobs"]
