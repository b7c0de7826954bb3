"""Unit tests for topic names, topic filters and the subscription trie."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttamqp.core.topics import (
    SubscriptionTrie,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

# --------------------------------------------------------------------------
# validation


@pytest.mark.parametrize("topic", [
    "a", "a/b", "/", "/a", "a/", "a//b", "$SYS/broker/uptime", "sport/tennis player1",
    "ünïcödé/主题", "x" * 65535,
])
def test_valid_topic_names(topic: str) -> None:
    """Ordinary names, empty levels, $-topics and the 65535-byte maximum are valid names."""
    assert validate_topic_name(topic) is None


@pytest.mark.parametrize("topic", [
    "", "+", "#", "a/+", "a/#", "a+b", "a#", "a/\x00", "x" * 65536, "é" * 32768,
])
def test_invalid_topic_names(topic: str) -> None:
    """Empty names, wildcards anywhere, U+0000 and names over 65535 UTF-8 bytes are refused."""
    assert isinstance(validate_topic_name(topic), str)


@pytest.mark.parametrize("topic_filter", [
    "a", "a/b", "#", "+", "+/+", "a/#", "a/+/b", "+/#", "/#", "/+", "$SYS/#", "a//#",
    "x" * 65535,
])
def test_valid_topic_filters(topic_filter: str) -> None:
    """Whole-level '+' anywhere and a whole last-level '#' are valid filters."""
    assert validate_topic_filter(topic_filter) is None


@pytest.mark.parametrize("topic_filter", [
    "", "a#", "#a", "a/#/b", "#/a", "##", "a/b#", "a+", "+a", "a/+b/c", "a/\x00",
])
def test_invalid_topic_filters(topic_filter: str) -> None:
    """Empty filters, '#' not alone at the end, '+' sharing a level and U+0000 are refused."""
    assert isinstance(validate_topic_filter(topic_filter), str)


def test_topic_filter_longer_than_65535_bytes_is_invalid() -> None:
    """A filter that encodes to more than 65535 UTF-8 bytes is refused (MQTT-4.7.3-3)."""
    assert validate_topic_filter("x" * 65536) is not None
    assert validate_topic_filter("é" * 32768) is not None


@pytest.mark.parametrize("topic_filter,topic,expected", [
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
    ("a/+", "a/b", True),
    ("a/+", "a", False),
    ("a/+", "a/b/c", False),
    ("a/+", "a/", True),
    ("+", "a", True),
    ("+", "/a", False),
    ("+/+", "/a", True),
    ("#", "a/b/c", True),
    ("#", "/", True),
    ("a/#", "a", True),
    ("a/#", "a/b/c", True),
    ("a/#", "ab", False),
    ("+/#", "a", True),
    ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False),
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS/x", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/+", "$SYS/x", True),
    ("a/+", "a/$x", True),
])
def test_topic_matches(topic_filter: str, topic: str, expected: bool) -> None:
    """topic_matches follows the MQTT 3.1.1 wildcard and '$' rules."""
    assert topic_matches(topic_filter, topic) is expected


# --------------------------------------------------------------------------
# the trie


def test_exact_filter_matches_only_its_topic() -> None:
    """A wildcard-free filter matches exactly its own topic."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/b", "k", 1)
    assert trie.match("a/b") == {"k": 1}
    assert trie.match("a") == {}
    assert trie.match("a/b/c") == {}
    assert trie.match("a/c") == {}


def test_plus_matches_one_level() -> None:
    """'+' matches exactly one level, including an empty one."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/+/c", "k", 0)
    assert trie.match("a/b/c") == {"k": 0}
    assert trie.match("a//c") == {"k": 0}
    assert trie.match("a/c") == {}
    assert trie.match("a/b/x/c") == {}


def test_hash_matches_any_depth_and_the_parent() -> None:
    """'a/#' matches 'a' itself and everything below it, but not 'ab'."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/#", "k", 2)
    assert trie.match("a") == {"k": 2}
    assert trie.match("a/b") == {"k": 2}
    assert trie.match("a/b/c/d") == {"k": 2}
    assert trie.match("ab") == {}
    assert trie.match("b/a") == {}


def test_plus_then_hash_matches_one_level_and_below() -> None:
    """'+/#' matches a single-level topic and every deeper one."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("+/#", "k", 1)
    assert trie.match("a") == {"k": 1}
    assert trie.match("a/b/c") == {"k": 1}


def test_dollar_topics_are_not_matched_by_leading_wildcards() -> None:
    """'$SYS/x' is not matched by '#' or '+/x', only by filters starting with '$SYS'."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("#", "hash", 0)
    trie.add("+/x", "plus", 0)
    trie.add("+", "single", 0)
    trie.add("$SYS/#", "sys", 1)
    trie.add("$SYS/+", "sysplus", 2)
    assert trie.match("$SYS/x") == {"sys": 1, "sysplus": 2}
    assert trie.match("$SYS") == {"sys": 1}
    assert trie.match("y/x") == {"hash": 0, "plus": 0}


def test_overlapping_filters_give_one_entry_with_highest_qos() -> None:
    """A key subscribed through several matching filters appears once, at its highest QoS."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/b", "k", 0)
    trie.add("a/+", "k", 2)
    trie.add("#", "k", 1)
    trie.add("a/#", "other", 1)
    assert trie.match("a/b") == {"k": 2, "other": 1}
    assert trie.match("a/c") == {"k": 2, "other": 1}
    assert trie.match("z") == {"k": 1}


def test_add_same_filter_twice_replaces_qos() -> None:
    """Re-adding a (filter, key) pair replaces its QoS and does not grow the count."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    assert trie.add("a", "k", 0) is True
    assert trie.add("a", "k", 2) is False
    assert len(trie) == 1
    assert trie.match("a") == {"k": 2}
    assert trie.add("a", "k", 1) is False
    assert trie.match("a") == {"k": 1}


def test_len_counts_filter_key_pairs() -> None:
    """len() is the number of (filter, key) pairs."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    assert len(trie) == 0
    trie.add("a", "k1", 0)
    trie.add("a", "k2", 0)
    trie.add("a/#", "k1", 0)
    assert len(trie) == 3
    trie.remove("a", "k2")
    assert len(trie) == 2
    trie.remove("a", "k2")
    assert len(trie) == 2


def test_remove_unsubscribes_only_that_pair() -> None:
    """Removing one (filter, key) leaves other keys and other filters of the key."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/b", "k1", 1)
    trie.add("a/b", "k2", 1)
    trie.add("a/+", "k1", 0)
    assert trie.remove("a/b", "k1") is True
    assert trie.match("a/b") == {"k1": 0, "k2": 1}
    assert trie.remove("a/b", "k1") is False
    assert trie.remove("x/y", "k1") is False
    assert trie.remove("a/b/c", "k1") is False


def test_remove_prunes_empty_branches() -> None:
    """After the last subscriber of a branch goes, the branch is gone and the trie is empty."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/b/c/d", "k", 1)
    trie.add("a/b", "k2", 1)
    trie.remove("a/b/c/d", "k")
    assert list(trie._root.children) == ["a"]
    assert list(trie._root.children["a"].children["b"].children) == []
    trie.remove("a/b", "k2")
    assert trie._root.children == {}
    assert len(trie) == 0
    assert list(trie.filters()) == []


def test_remove_keeps_branches_with_deeper_subscribers() -> None:
    """Removing a filter whose node still has children does not prune those children."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a", "k", 0)
    trie.add("a/b", "k", 1)
    trie.remove("a", "k")
    assert trie.match("a/b") == {"k": 1}
    assert trie.match("a") == {}


def test_filters_lists_every_pair() -> None:
    """filters() yields each (filter, key, qos) once."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    pairs = {("a/b", "k1", 0), ("#", "k2", 2), ("a/+", "k1", 1), ("$SYS/#", "k3", 0)}
    for f, k, q in pairs:
        trie.add(f, k, q)
    assert sorted(trie.filters()) == sorted(pairs)


# --------------------------------------------------------------------------
# property: the trie agrees with brute force over topic_matches

LEVELS = st.sampled_from(["a", "b", "c", "$S", ""])
FILTER_LEVELS = st.sampled_from(["a", "b", "c", "$S", "", "+"])


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(FILTER_LEVELS, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "+"


topics = st.lists(LEVELS, min_size=1, max_size=5).map("/".join).filter(bool)
subscriptions = st.lists(
    st.tuples(topic_filters(), st.sampled_from(["k1", "k2", "k3"]), st.integers(0, 2)),
    max_size=12,
)


def brute_force(subs: dict[tuple[str, str], int], topic: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for (f, k), q in subs.items():
        if topic_matches(f, topic) and out.get(k, -1) < q:
            out[k] = q
    return out


@settings(max_examples=400, deadline=None)
@given(subscriptions, st.lists(topics, min_size=1, max_size=6),
       st.lists(st.integers(0, 11), max_size=4))
def test_trie_match_equals_brute_force(
    subs: list[tuple[str, str, int]], probe: list[str], removals: list[int]
) -> None:
    """trie.match(t) == {k: max qos over f with topic_matches(f, t)}, also after removals."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    model: dict[tuple[str, str], int] = {}
    for f, k, q in subs:
        assert validate_topic_filter(f) is None
        trie.add(f, k, q)
        model[(f, k)] = q
    for t in probe:
        assert trie.match(t) == brute_force(model, t), t
    for i in removals:
        if i < len(subs):
            f, k, _ = subs[i]
            assert trie.remove(f, k) is ((f, k) in model)
            model.pop((f, k), None)
    assert len(trie) == len(model)
    for t in probe:
        assert trie.match(t) == brute_force(model, t), t
    if not model:
        assert trie._root.children == {}


@settings(max_examples=200, deadline=None)
@given(topic_filters(), topics)
def test_whole_topic_filter_level_forms_agree(topic_filter: str, topic: str) -> None:
    """A one-filter trie matches exactly when topic_matches says so."""
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add(topic_filter, "k", 1)
    assert (trie.match(topic) == {"k": 1}) is topic_matches(topic_filter, topic)


def test_trie_matches_are_remembered_until_the_next_change() -> None:
    """A topic's matches are computed once; a subscribe or unsubscribe anywhere
    forgets them, so no publish sees an out-of-date subscriber list."""
    from mqttamqp.core import topics

    trie: topics.SubscriptionTrie[str] = topics.SubscriptionTrie()
    trie.add("a/+", "x", 1)
    first = trie.match("a/b")
    assert first == {"x": 1} and trie.match("a/b") is first
    trie.add("a/b", "y", 0)
    assert trie.match("a/b") == {"x": 1, "y": 0}
    trie.add("a/b", "y", 2)                     # a QoS change counts too
    assert trie.match("a/b") == {"x": 1, "y": 2}
    trie.remove("a/+", "x")
    assert trie.match("a/b") == {"y": 2}
    for i in range(topics.MATCH_CACHE_SIZE + 10):    # bounded: it starts again
        trie.match(f"a/{i}")
    assert len(trie.cache) <= topics.MATCH_CACHE_SIZE


def test_trie_does_not_remember_a_large_fan_out() -> None:
    """Review finding: 4096 remembered topics each matching thousands of subscribers
    could hold hundreds of MB; such results are walked each time instead."""
    from mqttamqp.core import topics

    trie: topics.SubscriptionTrie[int] = topics.SubscriptionTrie()
    for i in range(topics.MATCH_CACHE_LARGEST + 1):
        trie.add("#", i, 0)
    assert len(trie.match("a/b")) == topics.MATCH_CACHE_LARGEST + 1
    assert trie.cache == {}
