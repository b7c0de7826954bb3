"""Unit tests for the in-memory retained message store."""

from __future__ import annotations

from amqp_memory import Net
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttamqp.core.message import Message
from mqttamqp.core.routing.retained import RetainedStore
from mqttamqp.core.topics import topic_matches


def msg(topic: str, payload: bytes = b"x", qos: int = 0, retain: bool = True) -> Message:
    return Message(topic, payload, qos, retain, "pub", 1.0)


def topics_of(messages: list[Message]) -> list[str]:
    return [m.topic for m in messages]


def test_put_then_get() -> None:
    """A put message is found by its topic and nowhere else."""
    store = RetainedStore()
    store.put(msg("a/b", b"hello"))
    got = store.get("a/b")
    assert got is not None and got.payload == b"hello"
    assert store.get("a") is None
    assert store.get("a/b/c") is None
    assert store.get("x") is None
    assert len(store) == 1


def test_put_marks_retain() -> None:
    """The stored copy always has retain set, even if the message given did not."""
    store = RetainedStore()
    store.put(msg("a", retain=False))
    got = store.get("a")
    assert got is not None and got.retain is True


def test_put_replaces_same_topic() -> None:
    """A second put on a topic replaces the first; the count and byte total follow."""
    store = RetainedStore()
    store.put(msg("a", b"12345"))
    store.put(msg("a", b"12"))
    assert len(store) == 1
    assert store.payload_bytes == 2
    got = store.get("a")
    assert got is not None and got.payload == b"12"


def test_payload_bytes_tracks_put_replace_delete() -> None:
    """payload_bytes is the sum of the payloads currently retained."""
    store = RetainedStore()
    assert store.payload_bytes == 0
    store.put(msg("a", b"abc"))
    store.put(msg("b/c", b"defgh"))
    assert store.payload_bytes == 8
    store.put(msg("a", b"z" * 10))
    assert store.payload_bytes == 15
    assert store.delete("b/c") is True
    assert store.payload_bytes == 10
    assert store.delete("b/c") is False
    assert store.payload_bytes == 10
    assert len(store) == 1


def test_delete_missing_topics() -> None:
    """Deleting a topic that has no message (or only children) returns False and changes nothing."""
    store = RetainedStore()
    store.put(msg("a/b"))
    assert store.delete("a") is False
    assert store.delete("a/b/c") is False
    assert store.delete("zzz") is False
    assert len(store) == 1


def test_delete_prunes_and_keeps_children() -> None:
    """Deleting a parent keeps its children; deleting the last leaf prunes the branch."""
    store = RetainedStore()
    store.put(msg("a"))
    store.put(msg("a/b/c"))
    assert store.delete("a") is True
    assert topics_of(store.match("#")) == ["a/b/c"]
    assert store.delete("a/b/c") is True
    assert store._root.children == {}
    assert len(store) == 0


def test_match_exact_and_plus() -> None:
    """Exact filters and '+' find the messages at exactly that depth, sorted by topic."""
    store = RetainedStore()
    for t in ("a/b", "a/c", "a/b/c", "a", "b/b"):
        store.put(msg(t))
    assert topics_of(store.match("a/b")) == ["a/b"]
    assert topics_of(store.match("a/+")) == ["a/b", "a/c"]
    assert topics_of(store.match("+/b")) == ["a/b", "b/b"]
    assert topics_of(store.match("+")) == ["a"]
    assert topics_of(store.match("+/+/+")) == ["a/b/c"]
    assert store.match("c") == []


def test_match_hash_includes_parent() -> None:
    """'a/#' returns 'a' itself and everything under it, not 'ab'."""
    store = RetainedStore()
    for t in ("a", "a/b", "a/b/c", "ab", "b"):
        store.put(msg(t))
    assert topics_of(store.match("a/#")) == ["a", "a/b", "a/b/c"]
    assert topics_of(store.match("#")) == ["a", "a/b", "a/b/c", "ab", "b"]
    assert topics_of(store.match("+/#")) == ["a", "a/b", "a/b/c", "ab", "b"]


def test_match_empty_levels() -> None:
    """Empty levels are ordinary levels for '+' and '#'."""
    store = RetainedStore()
    for t in ("/", "/a", "a/"):
        store.put(msg(t))
    assert topics_of(store.match("+/+")) == ["/", "/a", "a/"]
    assert topics_of(store.match("/#")) == ["/", "/a"]
    assert topics_of(store.match("+")) == []


def test_dollar_topics_not_matched_by_leading_wildcards() -> None:
    """'#' and '+/...' skip '$' topics; '$SYS/#' and '$SYS/+' find them."""
    store = RetainedStore()
    for t in ("$SYS/x", "$SYS/y/z", "a/x", "$SYS"):
        store.put(msg(t))
    assert topics_of(store.match("#")) == ["a/x"]
    assert topics_of(store.match("+/x")) == ["a/x"]
    assert topics_of(store.match("+")) == []
    assert topics_of(store.match("$SYS/#")) == ["$SYS", "$SYS/x", "$SYS/y/z"]
    assert topics_of(store.match("$SYS/+")) == ["$SYS/x"]
    assert topics_of(store.match("$SYS/x")) == ["$SYS/x"]


def test_dollar_below_first_level_is_ordinary() -> None:
    """A '$' in a later level is matched by wildcards like any other level."""
    store = RetainedStore()
    store.put(msg("a/$b"))
    assert topics_of(store.match("#")) == ["a/$b"]
    assert topics_of(store.match("a/+")) == ["a/$b"]


def test_clear_removes_everything() -> None:
    """clear() empties the store, its count and its byte total."""
    store = RetainedStore()
    store.put(msg("a", b"123"))
    store.put(msg("$SYS/b", b"45"))
    store.clear()
    assert len(store) == 0
    assert store.payload_bytes == 0
    assert store.match("#") == []
    assert store.match("$SYS/#") == []
    assert list(store) == []


def test_iteration_lists_all_including_dollar() -> None:
    """Iterating yields every retained message, '$' topics too, sorted by topic."""
    store = RetainedStore()
    for t in ("b", "$SYS/a", "a/b"):
        store.put(msg(t))
    assert [m.topic for m in store] == ["$SYS/a", "a/b", "b"]


LEVEL = st.sampled_from(["a", "b", "$S", ""])
TOPIC = st.lists(LEVEL, min_size=1, max_size=4).map("/".join).filter(bool)
FILTER = st.lists(st.sampled_from(["a", "b", "$S", "", "+"]), min_size=1, max_size=4).map(
    "/".join).filter(bool)


@settings(max_examples=300, deadline=None)
@given(st.lists(TOPIC, max_size=10), st.lists(TOPIC, max_size=4), FILTER, st.booleans())
def test_match_equals_brute_force(puts: list[str], deletes: list[str], topic_filter: str,
                                  hash_tail: bool) -> None:
    """match(filter) returns exactly the retained topics that topic_matches(filter, topic)."""
    if hash_tail:
        topic_filter += "/#"
    store = RetainedStore()
    for t in puts:
        store.put(msg(t, t.encode()))
    for t in deletes:
        store.delete(t)
    live = sorted(set(puts) - set(deletes))
    assert len(store) == len(live)
    assert store.payload_bytes == sum(len(t.encode()) for t in live)
    expected = [t for t in live if topic_matches(topic_filter, t)]
    assert topics_of(store.match(topic_filter)) == expected


# -- issue #26, section 3: retained replay paced by the subscriber ---------------------


def _retained_net(n: int, size: int, **limits: object) -> Net:
    net = Net(**limits)
    for i in range(n):
        net.broker.publish(Message(f"r/{i}", b"%05d" % i + b"x" * (size - 5), 1, True))
    return net


def test_every_retained_message_reaches_a_qos1_subscriber() -> None:
    """A new QoS 1 subscriber to more retained messages than its queue holds gets all
    of them: they are fed as its window frees, not pushed into its bounded queue."""
    net = _retained_net(300, 64, max_queued_messages=20, max_inflight=4)
    sub = net.mqtt("sub")
    sub.subscribe(("r/#", 1))
    got: list[bytes] = []
    for _ in range(400):       # (bounded: one window of 4 a round)
        messages = sub.publishes()
        if not messages:
            break
        got += [m.payload[:5] for m in messages]
        assert all(m.retain for m in messages)
        sub.ack(messages)
    assert sorted(got) == [b"%05d" % i for i in range(300)]
    assert net.broker.registry.drops.dropped_total() == 0


def test_every_retained_message_reaches_a_qos0_subscriber_whose_socket_fills() -> None:
    """QoS 0: retained messages are sent while the subscriber's connection can take
    them (its write buffer not full) and resume when it drains, instead of piling
    up behind a full socket until the QoS 0 bound drops them."""
    net = _retained_net(200, 1024, congested_qos0_bytes=8 * 1024)
    sub = net.mqtt("sub")
    sub.proto.pauseProducing()          # (its socket's buffer is full)
    sub.subscribe(("r/#", 0))
    got = [m.payload[:5] for m in sub.publishes()]
    for _ in range(200):                # (bounded) the buffer drains, and fills again
        sub.proto.resumeProducing()
        net.pump()
        sub.proto.pauseProducing()
        fresh = [m.payload[:5] for m in sub.publishes()]
        if not fresh:
            break
        got += fresh
    assert sorted(got) == [b"%05d" % i for i in range(200)]
    assert net.broker.registry.drops.dropped_total() == 0


def test_a_retained_message_deleted_during_the_replay_is_skipped() -> None:
    """The replay reads each message when its turn comes: one deleted meanwhile is not
    sent; one replaced goes out as it is now (here live, so not again by the replay)."""
    net = _retained_net(10, 16, max_inflight=2)
    sub = net.mqtt("sub")
    sub.subscribe(("r/#", 1))
    first = sub.publishes()
    assert len(first) == 2
    topics = sorted(f"r/{i}" for i in range(10))     # (the replay's order: the tree's)
    sent = {m.topic for m in first}
    later = [t for t in topics if t not in sent]
    net.broker.publish(Message(later[-1], b"", 1, True))          # deleted
    net.broker.publish(Message(later[-2], b"replaced", 1, True))  # replaced
    got = {m.topic: m.payload for m in first}
    live: dict[str, bytes] = {}
    sub.ack(first)
    for _ in range(20):
        messages = sub.publishes()
        if not messages:
            break
        for m in messages:
            (got if m.retain else live)[m.topic] = m.payload
        sub.ack(messages)
    assert later[-1] not in got and live[later[-2]] == b"replaced"
    assert later[-2] not in got and len(got) == 8


def test_queue_bound_drops_are_logged_once_a_minute_per_session(log_lines: list[str]) -> None:
    """QoS 1 messages dropped at a subscriber's queue bound: one line per session a
    minute, saying how many."""
    net = Net(max_queued_messages=2, max_inflight=1)
    net.mqtt("slow").subscribe(("t", 1))
    for i in range(10):        # (the broker's own publish: no back-pressure)
        net.broker.publish(Message("t", b"%d" % i, 1))
    lines = [line for line in log_lines if "dropped at its queue bound" in line]
    assert len(lines) == 1 and "slow" in lines[0]
    net.advance(61, step=61)
    for i in range(5):
        net.broker.publish(Message("t", b"%d" % i, 1))
    lines = [line for line in log_lines if "dropped at its queue bound" in line]
    assert len(lines) == 2
    assert "7 QoS 1/2 message(s)" in lines[1] and "8 dropped in all" in lines[1]


def test_an_amqp_receiver_gets_every_retained_message_as_its_credit_allows() -> None:
    """An AMQP receiver on a topic filter (pre-settled, QoS 0): retained messages are
    paced by its credit, not held in the engine until the QoS 0 bound drops them."""
    from proton import Link

    net = Net(congested_qos0_bytes=8 * 1024)
    for i in range(300):
        net.broker.publish(Message(f"r/{i}", b"%05d" % i + b"x" * 1019, 1, True))
    receiver = net.amqp().receiver("r/#", credit=10, snd_settle_mode=Link.SND_SETTLED)
    got: list[bytes] = []
    for _ in range(100):       # (bounded: 10 a round)
        receiver.collect()
        fresh = receiver.bodies()
        if not fresh:
            break
        got += [body[:5] for body in fresh]
        receiver.link.flow(len(fresh))
        net.pump()
    assert sorted(got) == [b"%05d" % i for i in range(300)]
    assert net.broker.registry.drops.dropped_total() == 0


def test_subscribing_again_replaces_what_the_replay_owes() -> None:
    """Review finding: each SUBSCRIBE to the same filter replaces that filter's
    pending replay instead of adding one (the state stays bounded)."""
    net = _retained_net(100, 16, max_inflight=2)
    sub = net.mqtt("sub")
    for _ in range(50):
        sub.subscribe(("r/#", 1))
    replays = net.broker.router.retained_feed.by_session[net.broker.sessions["sub"]]
    assert len(replays) == 1 and len(replays[0].topics) == 100
    got: set[str] = set()
    for _ in range(200):       # (bounded)
        messages = sub.publishes()
        if not messages:
            break
        got |= {m.topic for m in messages}
        sub.ack(messages)
    assert got == {f"r/{i}" for i in range(100)}


def test_a_topic_published_live_during_the_replay_is_not_sent_again() -> None:
    """Review finding: a retained message the session got live while its replay still
    owed that topic is not sent a second time by the replay."""
    net = _retained_net(5, 16, max_inflight=2)
    sub = net.mqtt("sub")
    sub.subscribe(("r/#", 1))
    first = sub.publishes()
    assert len(first) == 2
    sent = {m.topic for m in first}
    owed = sorted(f"r/{i}" for i in range(5) if f"r/{i}" not in sent)[-1]
    net.broker.publish(Message(owed, b"new", 1, True))   # live, while still owed
    got: list[tuple[str, bytes]] = [(m.topic, m.payload) for m in first]
    sub.ack(first)
    for _ in range(20):        # (bounded)
        messages = sub.publishes()
        if not messages:
            break
        got += [(m.topic, m.payload) for m in messages]
        sub.ack(messages)
    assert [payload for topic, payload in got if topic == owed] == [b"new"]
    assert len(got) == 5


def test_a_session_s_drop_line_is_not_used_up_by_the_global_limit(
        log_lines: list[str]) -> None:
    """Review finding: when the all-sessions limit refuses a queue-bound drop line,
    the session's own minute is not used up: its next drop after the global limit
    recovers is logged."""
    net = Net(max_queued_messages=1, max_inflight=1)
    for n in range(21):
        net.mqtt(f"s{n}").subscribe((f"t/{n}", 1))

    def overflow(n: int) -> None:
        for i in range(3):     # (1 in flight, 1 queued, then drops)
            net.broker.publish(Message(f"t/{n}", b"%d" % i, 1))

    for n in range(20):
        overflow(n)            # 20 lines: the all-sessions burst
    net.advance(30, step=30)
    overflow(20)               # refused by the all-sessions limit
    net.advance(31, step=31)   # (the all-sessions minute is over, s20's would not be)
    overflow(20)
    lines = [line for line in log_lines if "dropped at its queue bound" in line]
    assert len(lines) == 21 and "s20" in lines[-1]
