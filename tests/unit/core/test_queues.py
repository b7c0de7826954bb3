"""Durable queues (``mqttamqp.core.queues.manager``) through the broker's façade, with fake
links, ``task.Clock`` and in-memory stores: groups, acknowledgements in each mode,
visibility timeout, takeover, dead letters, streams, retention and restarts."""

from __future__ import annotations

from fakes import FakeLink, ManualMemoryStore, ManualStore, MemoryStore
from queue_facade import ack, client, got, join, last, make, meta, send

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import SUBSCRIBE_FAILURE, Broker, Outcome
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.addresses import (
    NOT_QUEUED,
    QUEUE_COMMAND,
    QUEUED,
    Consumer,
    default_group,
    is_command,
    parse_queue_filter,
    parse_queue_topic,
    parse_stream_offset,
)
from mqttamqp.core.queues.model import Retention
from mqttamqp.core.sessions.session import Session

# -- parsing ------------------------------------------------------------------------


def test_parse_topics_filters_and_offsets() -> None:
    """Queue topics, filters and default group names parse; names without a queue,
    wildcards in a topic and publishing to $dlq/ are refused."""
    a = parse_queue_topic("$queue/orders/eu/new")
    assert not isinstance(a, str)
    assert (a.queue, a.rest, a.action) == ("orders", "eu/new", None)
    a = parse_queue_topic("$queue/orders/eu/$ack")
    assert not isinstance(a, str) and (a.queue, a.action) == ("orders", "$ack")
    assert isinstance(parse_queue_topic("$queue/"), str)           # no name
    assert isinstance(parse_queue_topic("$queue//x"), str)
    assert isinstance(parse_queue_topic("$queue/a/+/b"), str)      # wildcards
    assert isinstance(parse_queue_topic("$dlq/a/b"), str)          # only by dead-lettering
    f = parse_queue_filter("$queue/orders")
    assert not isinstance(f, str) and f.rest == "#"
    f = parse_queue_filter("$dlq/orders/#")
    assert not isinstance(f, str) and f.queue == "$dlq/orders"
    assert isinstance(parse_queue_filter("$queue/+/x"), str)
    assert default_group("worker-1") == "worker" == default_group("worker-22")
    assert parse_stream_offset("first") == ("first", 0.0)
    assert parse_stream_offset("17") == ("offset", 17.0)
    assert parse_stream_offset("@100.5") == ("time", 100.5)
    assert parse_stream_offset("1970-01-01T00:01:40Z") == ("time", 100.0)
    assert isinstance(parse_stream_offset("yesterday"), str)


def test_a_publish_topic_is_recognised_once_and_commands_told_apart() -> None:
    """``QueueManager.address``: None for other topics, the (cached) parse of a queue
    topic; ``is_command`` tells acknowledgements apart, also one that does not parse."""
    broker, _, _ = make()
    queues = broker.queues
    assert queues.address("$SYS/broker/uptime") is None
    plain = queues.address("$queue/jobs/eu")
    assert not isinstance(plain, str) and plain is queues.address("$queue/jobs/eu")
    assert not is_command(plain, "$queue/jobs/eu")
    assert is_command(queues.address("$queue/jobs/$ack") or "", "$queue/jobs/$ack")
    bad = queues.address("$queue/+/$nack")
    assert isinstance(bad, str) and is_command(bad, "$queue/+/$nack")


def test_kind_tells_the_adapters_what_a_publish_topic_is_to_the_queues() -> None:
    """``QueueManager.kind``, what parking and an AMQP sender ask: not the queues'
    (plain and other ``$`` topics), a queue publish (also one refused by the parse,
    and under ``$dlq/``), or an acknowledgement command (also one that does not
    parse)."""
    queues = make()[0].queues
    assert [queues.kind(t) for t in ("plain/t", "$SYS/broker/uptime", "$queues/x")] == [
        NOT_QUEUED] * 3
    assert [queues.kind(t) for t in ("$queue/jobs/eu", "$queue/a/+/b", "$dlq/a/b")] == [
        QUEUED] * 3
    assert [queues.kind(t) for t in ("$queue/jobs/$ack", "$queue/+/$nack",
                                     "$dlq/jobs/$reject")] == [QUEUE_COMMAND] * 3


# -- groups ---------------------------------------------------------------------------


def test_a_message_waits_for_its_first_consumer() -> None:
    """A message published before any member joins is kept and goes to the first one that
    does."""
    broker, _, _ = make()
    result = send(broker, "$queue/jobs/a", b"early")
    assert result.refusal is None and result.durable is not None
    worker, link = client(broker, "worker-1")
    assert join(broker, worker, "$queue/jobs/#") == 1
    assert got(link) == [("$queue/jobs/a", b"early")]


def test_groups_fan_out_and_members_share_round_robin() -> None:
    """Each group gets every message; members of one group share them in turn."""
    broker, _, _ = make()
    links = {}
    for cid in ("worker-1", "worker-2", "audit-1"):
        session, links[cid] = client(broker, cid)
        join(broker, session, "$queue/jobs/#")
    for i in range(4):
        send(broker, "$queue/jobs/t", b"%d" % i)
    assert [p for _, p in got(links["audit-1"])] == [b"0", b"1", b"2", b"3"]
    one, two = [p for _, p in got(links["worker-1"])], [p for _, p in got(links["worker-2"])]
    assert sorted(one + two) == [b"0", b"1", b"2", b"3"] and len(one) == len(two) == 2


def test_a_filter_is_a_group_of_its_own_and_sees_only_its_keys() -> None:
    """Also: MQTT 3.x deliveries carry no metadata (they could not show it)."""
    broker, _, _ = make()
    eu, eu_link = client(broker, "w-1", "amqp")     # (3.x deliveries carry no metadata)
    join(broker, eu, "$queue/orders/eu/#")
    all_, all_link = client(broker, "w-2")
    join(broker, all_, "$queue/orders/#")
    send(broker, "$queue/orders/eu/1", b"eu")
    send(broker, "$queue/orders/us/1", b"us")
    assert got(eu_link) == [("$queue/orders/eu/1", b"eu")]
    assert [p for _, p in got(all_link)] == [b"eu", b"us"]
    assert meta(last(eu_link))["group-id"] == "w@eu/#"
    assert last(all_link).props is None


def test_queue_messages_never_enter_the_trie_and_back() -> None:
    """$queue/ messages reach queue members only, and plain topics reach plain subscribers
    only."""
    broker, _, _ = make()
    plain, plain_link = client(broker, "plain")
    join(broker, plain, "#")
    queue_member, q_link = client(broker, "q")
    join(broker, queue_member, "$queue/jobs/#")
    send(broker, "$queue/jobs/a")
    send(broker, "jobs/a")
    assert got(plain_link) == [("jobs/a", b"x")]
    assert got(q_link) == [("$queue/jobs/a", b"x")]


def test_bad_queue_input_is_refused_with_a_reason() -> None:
    """Publishes to a nameless queue or to $dlq/ are refused with a reason; wildcard queue
    filters and unknown modes refuse the subscription."""
    broker, _, _ = make()
    for topic in ("$queue/", "$dlq/jobs/x"):
        result = send(broker, topic)
        assert result.refusal is not None and result.refusal.reason
    session, _ = client(broker, "c", "mqtt5")
    assert join(broker, session, "$queue/+/x") == SUBSCRIBE_FAILURE
    assert join(broker, session, "$queue/a", consumer=Consumer(mode="fast")) == \
        SUBSCRIBE_FAILURE


# -- acknowledgements ---------------------------------------------------------------------


def test_mqtt311_puback_acknowledges_and_the_log_is_trimmed() -> None:
    """For an MQTT 3.1.1 member the PUBACK is the acknowledgement: the message leaves the
    queue."""
    broker, _, _ = make()
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/a")
    (_, _, pid, _, _), = link.published()
    assert pid is not None
    view = broker.queues.views()[0]
    assert view.depth == 1 and view.groups[0].pending == 1
    broker.acknowledged(worker, pid)
    view = broker.queues.views()[0]
    assert view.depth == 0 and view.groups[0].pending == 0 and view.acknowledged == 1


def test_acknowledged_queue_deliveries_are_freed_without_the_cycle_collector() -> None:
    """A queue delivery and its receipt point at each other while it is pending; once
    acknowledged nothing keeps them: freed at once by reference counting, not left
    for the garbage collector (with it off, no delivery entry is left alive)."""
    import gc

    from mqttamqp.core.sessions.entries import OutEntry

    broker, _, _ = make()
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/freed/#")
    gc.collect()
    gc.disable()
    try:
        for n in range(20):
            send(broker, f"$queue/freed/{n}")
            broker.acknowledged(worker, link.published()[-1][2])
        alive = sum(1 for o in gc.get_objects() if type(o) is OutEntry
                    and o.message.topic.startswith("$queue/freed/"))
    finally:
        gc.enable()
    assert broker.queues.views()[0].acknowledged == 20
    assert alive == 0


def test_qos0_membership_acknowledges_on_send() -> None:
    """A QoS 0 member's message counts as acknowledged once it is sent."""
    broker, _, _ = make()
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#", qos=0)
    send(broker, "$queue/jobs/a")
    assert len(got(link)) == 1
    assert broker.queues.views()[0].depth == 0


def test_mqtt5_ack_nack_reject_and_refusals() -> None:
    """MQTT 5 members answer with $ack, $nack (redelivered, count + 1) and $reject (dead-
    lettered with the reason); a PUBACK is not an ack."""
    broker, _, _ = make()
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#", consumer=Consumer(group="g"))
    send(broker, "$queue/jobs/a", b"a")
    first = last(link)
    m = meta(first)
    assert (m["message-id"], m["group-id"], m["queue"], m["offset"], m["delivery-count"]) \
        == ("jobs:0", "g", "jobs", "0", "1")
    broker.acknowledged(worker, link.published()[-1][2])    # PUBACK: not the ack
    assert broker.queues.views()[0].groups[0].pending == 1
    # nack: redelivered at once, count + 1
    assert ack(broker, worker, first, "$nack").refusal is None
    again = last(link)
    assert meta(again)["delivery-count"] == "2" and again.payload == b"a"
    # reject: to the dead-letter queue with the reason
    assert ack(broker, worker, again, "$reject", reason="bad data").refusal is None
    dlq = {v.name: v for v in broker.queues.views()}["$dlq/jobs"]
    assert dlq.depth == 1
    dead = broker.queues.browse("$dlq/jobs")[0]
    users = dict(dead.user_properties)
    assert dead.topic == "$dlq/jobs/a"
    assert (users["origin-queue"], users["origin-offset"], users["reason"],
            users["delivery-count"]) == ("jobs", "0", "bad data", "2")
    # the same message again: not pending any more
    refused = ack(broker, worker, again)
    assert refused.refusal is not None and refused.refusal.code == 0x80
    assert "not pending" in refused.refusal.reason
    # malformed and foreign acknowledgements
    send(broker, "$queue/jobs/b", b"b")
    pending = last(link)
    outsider, _ = client(broker, "o-1", "mqtt5")
    refused = ack(broker, outsider, pending)
    assert refused.refusal is not None and "not a member" in refused.refusal.reason
    bad = broker.publish(Message("$queue/jobs/$ack", b"", 1, False, "w-1", 0.0,
                                 props=MessageProperties(user_properties=(
                                     ("message-id", "jobs-7"),))), Identity("w-1"))
    assert bad.refusal is not None and "malformed" in bad.refusal.reason
    assert ack(broker, worker, pending).refusal is None


def test_amqp_outcomes_on_queue_deliveries() -> None:
    """AMQP outcomes on queue deliveries: released is not counted, modified-failed is,
    rejected dead-letters with its reason, accepted acknowledges."""
    broker, _, _ = make()
    worker, link = client(broker, "r-1", "amqp")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/a", b"a")
    pid = link.published()[-1][2]
    broker.settle(worker, pid, Outcome.RELEASED)               # not counted
    assert meta(last(link))["delivery-count"] == "1"
    pid = link.published()[-1][2]
    broker.settle(worker, pid, Outcome.MODIFIED, failed=True)  # counted
    assert meta(last(link))["delivery-count"] == "2"
    pid = link.published()[-1][2]
    broker.settle(worker, pid, Outcome.REJECTED, reason="cannot parse")
    dead = broker.queues.browse("$dlq/jobs")[0]
    assert dict(dead.user_properties)["reason"] == "cannot parse"
    send(broker, "$queue/jobs/b", b"b")
    broker.settle(worker, link.published()[-1][2], Outcome.ACCEPTED)
    view = {v.name: v for v in broker.queues.views()}["jobs"]
    assert view.depth == 0 and view.acknowledged == 1


def test_visibility_timeout_then_dead_letter_after_max_deliveries() -> None:
    """An unanswered delivery is redelivered after the visibility timeout, then dead-
    lettered after the last allowed delivery."""
    broker, clock, _ = make(queue_visibility_timeout=10.0, queue_max_deliveries=3)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/a")
    for count in ("1", "2", "3"):
        assert meta(last(link))["delivery-count"] == count
        before = len(link.published())
        clock.advance(10.0)
        if count != "3":
            assert len(link.published()) == before + 1
    assert len(link.published()) == 3
    views = {v.name: v for v in broker.queues.views()}
    assert views["jobs"].depth == 0 and views["$dlq/jobs"].depth == 1
    reason = dict(broker.queues.browse("$dlq/jobs")[0].user_properties)["reason"]
    assert "visibility timeout" in reason


def test_idle_member_takes_over_after_half_the_visibility_timeout() -> None:
    """An idle member takes a message another member holds after half the visibility
    timeout; the first member's late ack is refused."""
    broker, clock, _ = make(queue_visibility_timeout=10.0)
    slow, slow_link = client(broker, "w-1", "mqtt5")
    join(broker, slow, "$queue/jobs/#")
    send(broker, "$queue/jobs/a", b"a")
    assert got(slow_link) == [("$queue/jobs/a", b"a")]
    idle, idle_link = client(broker, "w-2", "mqtt5")
    join(broker, idle, "$queue/jobs/#")
    clock.advance(4.0)
    assert got(idle_link) == []
    clock.advance(1.0)
    assert got(idle_link) == [("$queue/jobs/a", b"a")]
    assert meta(last(idle_link))["delivery-count"] == "2"
    # the slow member's late ack is refused: it is not pending on it any more
    assert ack(broker, slow, last(slow_link)).refusal is not None


def test_a_member_that_leaves_gives_its_messages_back_at_once() -> None:
    """A member that goes away hands its pending messages to the other members at once."""
    broker, _, _ = make()
    one, one_link = client(broker, "w-1")
    join(broker, one, "$queue/jobs/#")
    two, two_link = client(broker, "w-2")
    join(broker, two, "$queue/jobs/#")
    send(broker, "$queue/jobs/a", b"a")
    holder, other_link = (one, two_link) if got(one_link) else (two, one_link)
    broker.end_session(holder.connection, holder, False, "lost")  # type: ignore[arg-type]
    assert got(other_link) == [("$queue/jobs/a", b"a")]


def test_credit_limits_what_a_member_holds() -> None:
    """A member holds at most the prefetch; each ack lets one more through."""
    broker, _, _ = make(queue_prefetch=2)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    for i in range(5):
        send(broker, "$queue/jobs/t", b"%d" % i)
    assert len(got(link)) == 2
    ack(broker, worker, link.published()[0][0])
    assert len(got(link)) == 3


# -- streams ----------------------------------------------------------------------------


def test_stream_reads_from_first_offset_and_time_without_claiming() -> None:
    """Stream readers start at first, an offset, a time or last, and claim nothing from the
    classic groups."""
    broker, clock, _ = make()
    for i in range(4):
        send(broker, "$queue/log/t", b"%d" % i)
        clock.advance(10.0)
    starts = {"first": [b"0", b"1", b"2", b"3"], "2": [b"2", b"3"],
              "@1015": [b"2", b"3"], "last": []}
    for n, (start, want) in enumerate(starts.items()):
        reader, link = client(broker, f"s{n}-1", "mqtt5")
        join(broker, reader, "$queue/log/#",
             consumer=Consumer(group=f"s{n}", mode="stream", stream_offset=start))
        assert [p for _, p in got(link)] == want, start
    # a classic group still has all four: the stream did not claim any
    worker, wlink = client(broker, "w-1")
    join(broker, worker, "$queue/log/#")
    assert len(got(wlink)) == 4


def test_amqp_outcomes_other_than_accepted_free_a_stream_members_prefetch() -> None:
    """A stream group does not redeliver; an AMQP member's Released or Rejected still
    ends the delivery, so its prefetch is not used up by them."""
    broker, _, _ = make(queue_prefetch=2)
    for i in range(4):
        send(broker, "$queue/log/t", b"%d" % i)
    reader, link = client(broker, "r-1", "amqp")
    join(broker, reader, "$queue/log/#",
         consumer=Consumer(group="s", mode="stream", explicit=False))
    assert [p for _, p in got(link)] == [b"0", b"1"]
    first, second = (pid for _, _, pid, *_ in link.published())
    broker.settle(reader, first, Outcome.RELEASED)
    broker.settle(reader, second, Outcome.REJECTED, reason="no")
    assert [p for _, p in got(link)] == [b"0", b"1", b"2", b"3"]


def test_stream_cursor_is_stored_and_resumed_after_a_restart() -> None:
    """A persistent stream reader's cursor is stored and it resumes after a restart with
    what it had not read."""
    store = MemoryStore()
    broker, clock, _ = make(store)
    for i in range(3):
        send(broker, "$queue/log/t", b"%d" % i)
    reader, link = client(broker, "s-1", "mqtt5", clean=False)
    join(broker, reader, "$queue/log/#", consumer=Consumer(mode="stream"))
    assert len(got(link)) == 3
    clock.advance(6.0)                                     # the cursor is stored
    broker.stop()
    send(broker, "$queue/log/t", b"3")
    again, _, _ = make(store)
    reader, link = client(again, "s-1", "mqtt5", clean=False)
    assert [p for _, p in got(link)] == [b"3"]


# -- retention and durability ------------------------------------------------------------


def test_retention_bounds_drop_the_oldest() -> None:
    """Retention by count and by age drops the oldest messages and counts them as expired."""
    broker, clock, _ = make(queue_max_messages=3, queue_max_age=60.0)
    for i in range(5):
        send(broker, "$queue/jobs/t", b"%d" % i)
    view = broker.queues.views()[0]
    assert view.depth == 3 and view.expired == 2
    assert [m.payload for m in broker.queues.browse("jobs")] == [b"2", b"3", b"4"]
    clock.advance(61.0)
    assert broker.queues.views()[0].depth == 0


def test_publisher_ack_waits_for_the_commit_and_qos2_delivery_follows_it() -> None:
    """The publisher's acknowledgement waits for the append's commit, and delivery follows
    it."""
    store = ManualStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#")
    store.commit_all()
    result = send(broker, "$queue/jobs/a", qos=2)
    assert result.durable is not None and not result.durable.called
    assert got(link) == []                   # not before the append is durable
    store.commit_all()
    assert result.durable.called
    assert got(link) == [("$queue/jobs/a", b"x")]


def flowing(store: ManualStore) -> tuple[Broker, Session, FakeLink]:
    """A broker on ``store`` with one 3.1.1 member of jobs, past its first stored
    dispatch watermark (deliveries no longer wait for a commit)."""
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/a")
    store.commit_all()
    return broker, worker, link


def test_qos1_goes_to_consumers_before_its_append_is_durable() -> None:
    """As to subscribers: the publisher's PUBACK still waits for the commit."""
    store = ManualStore()
    broker, _, link = flowing(store)
    result = send(broker, "$queue/jobs/b", b"b")
    assert result.durable is not None and not result.durable.called
    assert got(link)[-1] == ("$queue/jobs/b", b"b")
    store.commit_all()
    assert result.durable.called


def test_restart_keeps_unacknowledged_and_forgets_acknowledged() -> None:
    """After a restart the unacknowledged messages come back (delivery count raised) and
    the acknowledged ones do not."""
    store = MemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", "amqp")
    join(broker, worker, "$queue/jobs/#")
    for i in range(3):
        send(broker, "$queue/jobs/t", b"%d" % i)
    pids = [pid for _, _, pid, _, _ in link.published()]
    broker.acknowledged(worker, pids[1])             # out of order: 1 done, 0 and 2 not
    broker.stop()
    again, _, _ = make(store)
    worker, link = client(again, "w-1", "amqp")
    join(again, worker, "$queue/jobs/#")
    delivered = [(m.payload, meta(m)["delivery-count"]) for m, *_ in link.published()]
    assert delivered == [(b"0", "2"), (b"2", "2")]   # raised: they may have been seen


def test_a_redelivery_stores_its_raised_count_before_a_crash() -> None:
    """Delivered twice (a nack in between), then the broker dies: the next delivery
    after the restart counts 3.  Before, the second delivery's count lived only in
    memory until the group's next stored record, and the restart said 2."""
    store = MemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/t", b"a")
    assert meta(last(link))["delivery-count"] == "1"
    ack(broker, worker, last(link), "$nack")
    assert meta(last(link))["delivery-count"] == "2"
    broker.stop()
    again, _, _ = make(store)
    worker, link = client(again, "w-1", "mqtt5")
    join(again, worker, "$queue/jobs/#")
    assert [(m.payload, meta(m)["delivery-count"]) for m, *_ in link.published()] == [
        (b"a", "3")]


def crash_losing_an_append(kept: bytes) -> tuple[ManualMemoryStore, dict[str, bytes]]:
    """Queue "jobs" with one MQTT 5 member: ``kept`` is committed, then "lost" is
    delivered before its append is durable, and the broker dies.  Returns the store
    and what the member saw (message id -> payload)."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    store.commit_all()
    send(broker, "$queue/jobs/t", kept)
    store.commit_all()
    send(broker, "$queue/jobs/t", b"lost")        # delivered, its append not durable
    seen = {meta(m)["message-id"]: m.payload for m, *_ in link.published()}
    store.pending.clear()                         # crash
    return store, seen


def test_an_offset_seen_before_a_crash_never_names_another_message() -> None:
    """A QoS 1 message goes to its consumer before its append is durable; the crash
    loses the append.  After the restart the publisher's resend (and anything new)
    gets an offset above every stored watermark, so ``jobs:<offset>`` seen before
    the crash never names a different message (before, the offset was reused)."""
    store, seen = crash_losing_an_append(b"kept")
    assert set(seen.values()) == {b"kept", b"lost"}
    again, _, _ = make(store)
    worker, link = client(again, "w-1", "mqtt5")
    join(again, worker, "$queue/jobs/#")
    send(again, "$queue/jobs/t", b"new")
    send(again, "$queue/jobs/t", b"lost")         # the publisher's resend
    store.commit_all()
    after = [(meta(m)["message-id"], m.payload) for m, *_ in link.published()]
    assert [p for _, p in after] == [b"kept", b"new", b"lost"]
    for mid, payload in after:
        assert seen.get(mid, payload) == payload, (mid, seen[mid], payload)
    # nothing is stuck behind the skipped offsets: all acknowledged, the log empties
    for m, *_ in link.published():
        ack(again, worker, m)
    store.commit_all()
    assert again.queues.views()[0].depth == 0


def test_skipped_offsets_cost_nothing_and_count_in_no_lag() -> None:
    """The offsets skipped at a restart are one range, not thousands of done
    offsets per group, and no group's lag counts them (review: lag 4096 with two
    messages waiting); the floor jumps them once the messages below are done."""
    store = MemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/t", b"a")           # delivered, not acknowledged
    send(broker, "$queue/jobs/t", b"b")
    broker.stop()
    again, _, _ = make(store)
    view = again.queues.views()[0]
    assert view.depth == 2 and [g.lag for g in view.groups] == [2]
    group = next(iter(again.queues.queues["jobs"].groups.values()))
    assert len(group.done) < 10
    worker, link = client(again, "w-1", "mqtt5")
    join(again, worker, "$queue/jobs/#")
    send(again, "$queue/jobs/t", b"c")
    for m, *_ in link.published():
        ack(again, worker, m)
    view = again.queues.views()[0]
    assert view.depth == 0 and [g.lag for g in view.groups] == [0]
    assert group.floor == again.queues.queues["jobs"].next_offset and not group.done


def test_a_second_restart_still_skips_the_first_restarts_offsets() -> None:
    """The skipped offsets are found again from the log at every restart: after a
    second one, with a message below the first skipped range still unacknowledged,
    the lag counts messages, not offsets, and the floor jumps the old range without
    a done offset (or a stored op) per offset (review: lag 4,099 with one message
    waiting, then ~4,096 QueueDone ops in one commit)."""
    store, _ = crash_losing_an_append(b"a")
    second, _, _ = make(store)
    worker, link = client(second, "w-1", "mqtt5")
    join(second, worker, "$queue/jobs/#")
    for i in range(3):
        send(second, "$queue/jobs/t", b"n%d" % i)
    store.commit_all()
    for m, *_ in link.published():
        if m.payload != b"a":                     # "a" stays unacknowledged
            ack(second, worker, m)
    store.commit_all()
    second.stop()
    store.commit_all()                            # a clean stop
    third, _, _ = make(store)
    view = third.queues.views()[0]
    # "a" and n0..n2 (acknowledged, kept until the floor passes them): 4 messages
    assert view.depth == 4 and [g.lag for g in view.groups] == [4]
    worker, link = client(third, "w-1", "mqtt5")
    join(third, worker, "$queue/jobs/#")
    ops_before = len(store.pending)
    (only,) = [m for m, *_ in link.published()]
    assert only.payload == b"a"
    ack(third, worker, only)
    assert len(store.pending) - ops_before < 10   # (not one op per skipped offset)
    store.commit_all()
    view = third.queues.views()[0]
    assert view.depth == 0 and [g.lag for g in view.groups] == [0]
    group = next(iter(third.queues.queues["jobs"].groups.values()))
    assert not group.done and group.floor == third.queues.queues["jobs"].next_offset


def test_no_delivery_goes_out_above_the_stored_watermark() -> None:
    """A classic delivery leaves only once the dispatch watermark above it is
    durable, so a crash right after it still raises its count on redelivery."""
    store = ManualMemoryStore()
    broker, _, _ = make(store, queue_prefetch=500)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#", qos=0)
    store.commit_all()
    send(broker, "$queue/jobs/a", b"a")
    store.commit_next()                      # the append: durable, not yet delivered
    assert got(link) == []
    store.commit_all()                       # the watermark: now it goes out
    assert meta(last(link))["delivery-count"] == "1"
    acked = {}
    for i in range(100):                     # a crash may come after any commit
        acked[b"%d" % i] = send(broker, "$queue/jobs/t", b"%d" % i).durable
        store.commit_next()
    # (QoS 1 goes to consumers before its append is durable, as pub/sub does: one
    # whose append was lost in the crash had no PUBACK, and its publisher resends)
    before = {m.payload for m, *_ in link.published()
              if m.payload == b"a" or acked[m.payload].called}
    assert len(before) > 64                  # (past the first stored watermark)
    store.pending.clear()                    # crash: what was not committed is lost
    again, _, _ = make(store, queue_prefetch=500)
    worker, link = client(again, "w-1", "mqtt5")
    join(again, worker, "$queue/jobs/#", qos=0)
    after = {m.payload: meta(m)["delivery-count"] for m, *_ in link.published()}
    assert {p: after.get(p) for p in before} == {p: "2" for p in before}


def test_a_failed_watermark_commit_is_retried_by_the_next_pump() -> None:
    """A watermark commit that fails holds delivery back until the next pump retries it."""
    store = ManualMemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#", qos=0)
    store.commit_all()
    send(broker, "$queue/jobs/a", b"a")
    store.commit_next()                      # the append
    _, d = store.pending.pop(0)              # the watermark: the disk is full
    d.errback(OSError(28, "No space left on device"))
    assert got(link) == []
    send(broker, "$queue/jobs/b", b"b")      # storage is back: the next pump retries
    store.commit_all()
    assert [p for _, p in got(link)] == [b"a", b"b"]


def test_dead_letters_are_requeued_to_their_origin() -> None:
    """Requeued dead letters go back to their queue at a new offset, without the reason,
    and leave the DLQ."""
    broker, _, _ = make()
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/a", b"a")
    ack(broker, worker, last(link), "$reject", reason="no")
    moved, _ = broker.queues.requeue("$dlq/jobs")
    assert moved == 1
    again = last(link)
    assert again.topic == "$queue/jobs/a" and meta(again)["offset"] == "1"
    assert "reason" not in meta(again)
    assert {v.name: v.depth for v in broker.queues.views()}["$dlq/jobs"] == 0


def test_purge_delete_and_retention_change() -> None:
    """The console's admin commands: a retention change trims, purge empties, delete
    removes the queue."""
    broker, _, _ = make()
    for i in range(3):
        send(broker, "$queue/jobs/t", b"%d" % i)
    broker.queues.set_retention("jobs", Retention(None, None, 1))
    assert broker.queues.views()[0].depth == 1
    broker.queues.purge("jobs")
    assert broker.queues.views()[0].depth == 0
    broker.queues.delete("jobs")
    assert broker.queues.views() == []


def test_a_deleted_queue_tells_its_hooks_after_its_members_left() -> None:
    """``deleted_hooks`` hear a deleted queue's name once its members are out of it
    (the console's delete reaches the 0.9.1 consumers this way); a missing queue
    tells nobody."""
    broker, _, _ = make()
    worker, _link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    heard: list[tuple[str, int]] = []

    def hook(name: str) -> None:
        groups = {g.name: g for v in broker.queues.views() for g in v.groups}
        heard.append((name, len(groups)))

    broker.queues.deleted_hooks.append(hook)
    broker.queues.delete("jobs")
    assert heard == [("jobs", 0)]
    broker.queues.delete("jobs")
    assert heard == [("jobs", 0)]


def test_a_persistent_members_queue_deliveries_are_never_stored_in_its_session() -> None:
    """The queue keeps its messages: a persistent session that takes one (QoS 2 up to
    PUBCOMP) stores no copy of its own, which a restart would deliver again."""
    from mqttamqp.core.persistence import PutQueued

    broker, _, store = make()
    worker, link = client(broker, "w-1", clean=False)
    join(broker, worker, "$queue/jobs/#", qos=2)
    send(broker, "$queue/jobs/a", qos=2)
    pid = link.published()[-1][2]
    broker.received(worker, pid)
    assert link.pubrels == [pid]                     # PUBREL at once, nothing to store
    broker.completed(worker, pid)
    assert not [op for op in store.submitted if isinstance(op, PutQueued)]
    assert broker.queues.views()[0].depth == 0


def test_a_queue_delivery_rides_on_its_receipt_and_is_not_held() -> None:
    """A persistent member's QoS 2 queue delivery carries the queue's receipt and
    is sent once the queue's own commit is durable (the session holds it for none)."""
    store = ManualStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", clean=False)
    join(broker, worker, "$queue/jobs/#", qos=2)
    send(broker, "$queue/jobs/a", qos=2)
    store.commit_all()
    assert got(link) == [("$queue/jobs/a", b"x")]
    entry = worker.inflight[link.published()[-1][2]]
    assert entry.receipt is not None and not entry.held


def test_a_receipt_counts_only_while_its_delivery_is_pending() -> None:
    """A delivery taken back (the visibility timeout) voids its receipt: a late
    acknowledgement through it finishes nothing, not even the same offset's
    redelivery to the same member."""
    broker, clock, _ = make(queue_visibility_timeout=30.0)
    worker, link = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/a")
    first = worker.inflight[link.published()[-1][2]].receipt
    assert first is not None
    clock.advance(31.0)
    assert got(link) == [("$queue/jobs/a", b"x")] * 2
    first.acknowledged()
    view = broker.queues.views()[0]
    assert view.acknowledged == 0 and view.groups[0].pending == 1
    broker.acknowledged(worker, link.published()[-1][2])
    assert broker.queues.views()[0].acknowledged == 1


def test_a_retention_change_that_frees_credit_delivers_at_once() -> None:
    """Pending messages the new bound drops give their member's credit back, and the
    next messages go out then, not at the next tick or publish."""
    broker, _, _ = make(queue_prefetch=2)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#", consumer=Consumer(group="g"))
    for i in range(5):
        send(broker, "$queue/jobs/t", b"%d" % i)
    assert [p for _, p in got(link)] == [b"0", b"1"]
    broker.queues.set_retention("jobs", Retention(None, None, 3))
    assert [p for _, p in got(link)] == [b"0", b"1", b"2", b"3"]
    assert broker.queues.views()[0].groups[0].pending == 2


def test_a_message_consumed_before_its_commit_is_acknowledged_at_once() -> None:
    """As for persistent sessions: once every classic group has acknowledged it, the
    publisher's PUBACK need not wait for the writer (the message is consumed)."""
    store = ManualStore()
    broker, worker, link = flowing(store)
    result = send(broker, "$queue/jobs/b", b"b")
    assert result.durable is not None and not result.durable.called
    broker.acknowledged(worker, link.published()[-1][2])
    assert result.durable.called             # before the commit
    waiting = send(broker, "$queue/other/c")  # (no group: waits for its commit)
    assert waiting.durable is not None and not waiting.durable.called
    store.commit_all()
    assert waiting.durable.called


# -- review findings (session 6) --------------------------------------------------------


def test_a_rejected_message_never_acknowledges_its_publisher_early() -> None:
    """Dead-lettered is not consumed: the publisher's PUBACK waits for the commits
    (the dead letter's included), or a crash would lose a PUBACKed message."""
    store = ManualStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/a")
    store.commit_all()
    ack(broker, worker, last(link))
    store.commit_all()
    result = send(broker, "$queue/jobs/b", b"b")
    ack(broker, worker, last(link), "$reject", reason="no")
    assert result.durable is not None and not result.durable.called
    store.commit_all()
    assert result.durable.called


def test_stream_readers_hold_what_they_have_not_read() -> None:
    """A classic group's acknowledgements do not trim messages a stream group has
    still to read (every group, as the issue says)."""
    broker, _, _ = make(queue_prefetch=1)
    reader, rlink = client(broker, "s-1", "mqtt5")
    join(broker, reader, "$queue/jobs/#", consumer=Consumer(group="s", mode="stream"))
    worker, _ = client(broker, "w-1")
    join(broker, worker, "$queue/jobs/#", qos=0)      # consumes on send
    for i in range(4):
        send(broker, "$queue/jobs/t", b"%d" % i)
    assert [m.payload for m in broker.queues.browse("jobs")] == [b"1", b"2", b"3"]
    broker.acknowledged(reader, rlink.published()[-1][2])
    assert [p for _, p in got(rlink)] == [b"0", b"1"]


def test_a_stream_commit_beyond_what_was_read_is_refused() -> None:
    """A stream reader's commit of an offset it was never sent is refused; its real ack is
    taken."""
    broker, _, _ = make()
    send(broker, "$queue/log/t")
    reader, link = client(broker, "s-1", "mqtt5")
    join(broker, reader, "$queue/log/#", consumer=Consumer(group="s", mode="stream"))
    bad = broker.publish(Message("$queue/log/$ack", b"", 1, False, "s-1", 0.0,
                                 props=MessageProperties(user_properties=(
                                     ("message-id", "log:99999"), ("group-id", "s")))),
                         Identity("s-1", None, "mqtt5"))
    assert bad.refusal is not None and "not one group" in bad.refusal.reason
    assert ack(broker, reader, last(link)).refusal is None


def test_dead_letter_offsets_are_not_given_out_again_after_a_restart() -> None:
    """A dead-letter queue emptied by a requeue does not hand out its old offsets again
    after a restart."""
    store = MemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    send(broker, "$queue/jobs/a")
    ack(broker, worker, last(link), "$reject", reason="no")
    assert broker.queues.requeue("$dlq/jobs")[0] == 1    # the DLQ is empty again
    broker.stop()
    again, _, _ = make(store)
    worker, link = client(again, "w-1", "mqtt5")
    join(again, worker, "$queue/jobs/#")
    ack(again, worker, last(link), "$reject", reason="still no")
    assert [m.offset for m in again.queues.browse("$dlq/jobs")] == [1]


def test_deleting_a_queue_hands_nothing_round_its_departing_members() -> None:
    """Deleting a queue delivers nothing more to its members as they leave it."""
    broker, _, _ = make()
    links = []
    for cid in ("w-1", "w-2"):
        session, link = client(broker, cid)
        join(broker, session, "$queue/jobs/#")
        links.append(link)
    send(broker, "$queue/jobs/a")
    before = [len(link.published()) for link in links]
    broker.queues.delete("jobs")
    assert [len(link.published()) for link in links] == before
    assert broker.queues.views() == []
