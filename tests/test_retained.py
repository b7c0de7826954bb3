"""Unit tests for the in-memory retained message store."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mqttamqp.core.message import Message
from mqttamqp.core.retained import RetainedStore
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
