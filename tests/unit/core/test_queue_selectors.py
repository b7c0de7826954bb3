"""Queue members with selectors (issue 30) in memory: a member takes only what its
selector is true of; what no member with credit selects stays in the queue, in
order, for a member that comes to take it; each message is tested once per
member."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from queue_facade import client, got, join, make, send

from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.queues.dispatch import Dispatch


def _payload_is(*wanted: bytes) -> tuple[Callable[[Message], bool], list[bytes]]:
    """A selector on the payload, recording what it was asked."""
    asked: list[bytes] = []

    def selector(message: Message) -> bool:
        asked.append(message.payload)
        return message.payload in wanted
    return selector, asked


def test_selective_members_share_a_group() -> None:
    """Two members of one group with different selectors each get what they select;
    what neither selects waits, and a plain member that joins gets it, in order."""
    broker, _, _ = make()
    red_sel, red_asked = _payload_is(b"red-1", b"red-2")
    green_sel, _ = _payload_is(b"green-1")
    red, red_link = client(broker, "red")
    green, green_link = client(broker, "green")
    join(broker, red, "$queue/jobs/#", consumer=Consumer("g", selector=red_sel))
    join(broker, green, "$queue/jobs/#", consumer=Consumer("g", selector=green_sel))
    for payload in (b"red-1", b"blue-1", b"green-1", b"blue-2", b"red-2"):
        send(broker, "$queue/jobs/k", payload)
    assert [p for _, p in got(red_link)] == [b"red-1", b"red-2"]
    assert [p for _, p in got(green_link)] == [b"green-1"]
    assert red_asked.count(b"blue-1") == 1 and red_asked.count(b"blue-2") == 1
    view = broker.queues.views()[0]
    assert view.depth == 5
    plain, plain_link = client(broker, "plain")
    join(broker, plain, "$queue/jobs/#", consumer=Consumer("g"))
    assert [p for _, p in got(plain_link)] == [b"blue-1", b"blue-2"]
    assert red_asked.count(b"blue-1") == 1   # (remembered: not tested again)


def test_a_selective_member_does_not_block_the_others() -> None:
    """A message that only a member without credit selects does not hold back what
    another member selects after it; it goes to its member once that has credit."""
    broker, _, _ = make(queue_prefetch=1)
    a_sel, _ = _payload_is(b"a-1", b"a-2")
    b_sel, _ = _payload_is(b"b-1")
    slow, slow_link = client(broker, "slow")
    join(broker, slow, "$queue/jobs/#", consumer=Consumer("g", selector=a_sel))
    other, other_link = client(broker, "other")
    join(broker, other, "$queue/jobs/#", consumer=Consumer("g", selector=b_sel))
    for payload in (b"a-1", b"a-2", b"b-1"):
        send(broker, "$queue/jobs/k", payload)
    assert [p for _, p in got(slow_link)] == [b"a-1"]
    assert [p for _, p in got(other_link)] == [b"b-1"]
    (_, _, pid, _, _), = slow_link.published()
    broker.acknowledged(slow, pid)
    assert [p for _, p in got(slow_link)] == [b"a-1", b"a-2"]


def _counting_selects(monkeypatch: Any) -> list[int]:
    """Count every look of a member's selector at an offset (the predicate or its
    remembered refusal): what a hand-out costs with messages parked."""
    looks = [0]
    real = Dispatch._selects

    def counted(member: Any, selector: Any, group: Any, offset: int) -> bool:
        looks[0] += 1
        return real(member, selector, group, offset)
    monkeypatch.setattr(Dispatch, "_selects", staticmethod(counted))
    return looks


def test_parked_messages_are_not_looked_at_again_on_every_hand_out(monkeypatch) -> None:
    """400 messages nobody selects wait parked; each of the 50 selected ones after
    them costs a look or two, not a walk over the parked ones (before: every
    hand-out and acknowledgement walked them all, 4,000 took seconds)."""
    broker, _, _ = make(queue_prefetch=1)
    red_sel, red_asked = _payload_is(b"red")
    red, link = client(broker, "red")
    join(broker, red, "$queue/jobs/#", consumer=Consumer("g", selector=red_sel))
    for _ in range(400):
        send(broker, "$queue/jobs/k", b"blue")
    looks = _counting_selects(monkeypatch)
    for _ in range(50):
        send(broker, "$queue/jobs/k", b"red")
        (_, _, pid, _, _) = link.published()[-1]
        broker.acknowledged(red, pid)
    assert len(link.published()) == 50
    assert looks[0] <= 2 * 50
    assert red_asked.count(b"blue") == 400   # (each parked one asked once)


def test_parked_messages_are_offered_to_a_member_that_joins_or_gains_credit() -> None:
    """What waits parked goes to a member that joins and takes it, and to a member
    that had no credit when it was parked and has some again."""
    broker, _, _ = make(queue_prefetch=1)
    a_sel, a_asked = _payload_is(b"a-1", b"a-2")
    b_sel, _ = _payload_is(b"b-1", b"late")
    a, a_link = client(broker, "a")
    join(broker, a, "$queue/jobs/#", consumer=Consumer("g", selector=a_sel))
    send(broker, "$queue/jobs/k", b"b-1")          # (a refuses it: parked)
    send(broker, "$queue/jobs/k", b"a-1")
    send(broker, "$queue/jobs/k", b"late")         # (a has no credit: waits)
    assert [p for _, p in got(a_link)] == [b"a-1"]
    b, b_link = client(broker, "b")
    join(broker, b, "$queue/jobs/#", consumer=Consumer("g", selector=b_sel))
    assert [p for _, p in got(b_link)] == [b"b-1"]   # (joined: offered the parked)
    (_, _, pid, _, _), = a_link.published()
    broker.acknowledged(a, pid)                      # (a refuses late: parked, b full)
    send(broker, "$queue/jobs/k", b"a-2")
    assert [p for _, p in got(a_link)] == [b"a-1", b"a-2"]
    (_, _, pid, _, _), = b_link.published()
    broker.acknowledged(b, pid)                      # (b has credit again: offered)
    assert [p for _, p in got(b_link)] == [b"b-1", b"late"]
    assert a_asked.count(b"b-1") == 1 and a_asked.count(b"late") == 1


def test_an_idle_member_takes_over_only_what_its_selector_takes() -> None:
    """Half the visibility timeout on: an idle member takes over a silent member's
    message only if its selector takes it (before, it took any)."""
    broker, clock, _ = make(queue_visibility_timeout=10.0)
    slow, slow_link = client(broker, "slow-1", "mqtt5")
    join(broker, slow, "$queue/jobs/#", consumer=Consumer("g"))
    send(broker, "$queue/jobs/k", b"b-1")
    send(broker, "$queue/jobs/k", b"a-1")
    assert [p for _, p in got(slow_link)] == [b"b-1", b"a-1"]
    a_sel, _ = _payload_is(b"a-1")
    idle, idle_link = client(broker, "idle-1", "mqtt5")
    join(broker, idle, "$queue/jobs/#", consumer=Consumer("g", selector=a_sel))
    clock.advance(5.0)
    assert [p for _, p in got(idle_link)] == [b"a-1"]
