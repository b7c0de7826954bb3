"""Topic names, topic filters and the subscription trie.

Owns the MQTT topic rules (what a valid name and filter is, how ``+`` and ``#``
match, that ``$``-topics are not matched by a leading wildcard) and the trie that
answers "who is subscribed to this topic" without scanning every filter.
Subscribers are opaque hashable keys (the core uses sessions).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = [
    "validate_topic_name", "validate_topic_filter", "topic_matches", "SubscriptionTrie",
    "SYS_PREFIX", "is_sys_topic", "topic_size_problem",
]

K = TypeVar("K", bound=Hashable)

MAX_TOPIC_BYTES = 65535
SYS_PREFIX = "$SYS/"


def is_sys_topic(topic: str) -> bool:
    """``$SYS`` and below: the broker's own topics."""
    return topic.startswith(SYS_PREFIX) or topic == "$SYS"


def validate_topic_name(topic: str) -> str | None:
    """Return why ``topic`` is not a valid PUBLISH topic name, or None if it is."""
    if not topic:
        return "topic name is empty"
    if "+" in topic or "#" in topic:
        return "topic name contains a wildcard"
    if "\x00" in topic:
        return "topic name contains U+0000"
    try:
        size = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        return "topic name is not valid UTF-8 (lone surrogate)"
    if size > MAX_TOPIC_BYTES:
        return "topic name is longer than 65535 bytes"
    return None


def topic_size_problem(topic: str, max_levels: int, max_length: int,
                       what: str = "topic") -> str | None:
    """Why ``topic`` (a name or filter) breaks ``--max-topic-levels`` /
    ``--max-topic-length``, or None.  Cheap guards first: a topic of n characters
    has at most n + 1 levels and at most 4n UTF-8 bytes."""
    n = len(topic)
    if n >= max_levels:
        levels = topic.count("/") + 1
        if levels > max_levels:
            return f"{what} has {levels} levels, more than --max-topic-levels {max_levels}"
    if n * 4 > max_length:
        size = len(topic.encode("utf-8", "surrogatepass"))
        if size > max_length:
            return f"{what} is {size} bytes, longer than --max-topic-length {max_length}"
    return None


def validate_topic_filter(topic_filter: str) -> str | None:
    """Return why ``topic_filter`` is not a valid subscription filter, or None."""
    if not topic_filter:
        return "topic filter is empty"
    if "\x00" in topic_filter:
        return "topic filter contains U+0000"
    try:
        size = len(topic_filter.encode("utf-8"))
    except UnicodeEncodeError:
        return "topic filter is not valid UTF-8 (lone surrogate)"
    if size > MAX_TOPIC_BYTES:
        return "topic filter is longer than 65535 bytes"
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be the whole last level of a topic filter"
        if "+" in level and level != "+":
            return "'+' must occupy a whole level of a topic filter"
    return None


def topic_matches(topic_filter: str, topic: str) -> bool:
    """True if ``topic`` (a name) matches ``topic_filter`` (both assumed valid)."""
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    if topic.startswith("$") and f_levels[0] in ("+", "#"):
        return False
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


class _Node(Generic[K]):
    __slots__ = ("children", "subscribers")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K]] = {}
        self.subscribers: dict[K, int] = {}


# Topics whose matches a trie remembers (then it forgets them all and starts again).
MATCH_CACHE_SIZE = 4096
# Results with more subscribers than this are not remembered (bounds the memory to
# MATCH_CACHE_SIZE x this; walking is cheap next to delivering to that many).
MATCH_CACHE_LARGEST = 64


class SubscriptionTrie(Generic[K]):
    """Filters split by level into a trie; ``match`` walks only matching branches.

    Matches are remembered per topic until the next ``add`` or ``remove`` (a busy
    topic is matched once, not once per message), so ``match``'s result is shared:
    callers must not change it.
    """

    def __init__(self) -> None:
        self._root: _Node[K] = _Node()
        self._count = 0
        # topic -> ``match``'s result: a caller may look a topic up here first (no
        # call), and must not change it; only the trie adds, and clears it.
        self.cache: dict[str, dict[K, int]] = {}

    def __len__(self) -> int:
        """Number of (filter, subscriber) pairs."""
        return self._count

    def add(self, topic_filter: str, key: K, qos: int) -> bool:
        """Subscribe ``key``; returns True if it is new (False: QoS replaced)."""
        if self.cache:
            self.cache.clear()
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        new = key not in node.subscribers
        node.subscribers[key] = qos
        if new:
            self._count += 1
        return new

    def remove(self, topic_filter: str, key: K) -> bool:
        """Unsubscribe ``key``; prunes empty branches. Returns True if it was there."""
        if self.cache:
            self.cache.clear()
        path: list[tuple[_Node[K], str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.subscribers.pop(key, None) is None:
            return False
        self._count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.subscribers or child.children:
                break
            del parent.children[level]
        return True

    def match(self, topic: str) -> dict[K, int]:
        """Every subscriber whose filter matches ``topic``, with its highest QoS
        (shared: do not change it)."""
        cache = self.cache
        result = cache.get(topic)
        if result is not None:
            return result
        result = self._walk(topic)
        if len(result) <= MATCH_CACHE_LARGEST:   # (a big fan-out gains little from it)
            if len(cache) >= MATCH_CACHE_SIZE:
                cache.clear()
            cache[topic] = result
        return result

    def _walk(self, topic: str) -> dict[K, int]:
        result: dict[K, int] = {}
        levels = topic.split("/")
        last = len(levels)
        dollar = topic.startswith("$")
        # Iterative walk: (node, depth) pairs still to expand.
        stack: list[tuple[_Node[K], int]] = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            children = node.children
            if not children:
                continue
            wild_ok = not (dollar and depth == 0)
            if wild_ok:
                hash_node = children.get("#")
                if hash_node is not None:
                    _merge(result, hash_node.subscribers)
            # Only nodes above the last level are ever pushed, so depth < last here.
            exact = children.get(levels[depth])
            if exact is not None:
                if depth + 1 == last:
                    _merge(result, exact.subscribers)
                    hash_child = exact.children.get("#")
                    if hash_child is not None:  # "a/#" matches "a"
                        _merge(result, hash_child.subscribers)
                else:
                    stack.append((exact, depth + 1))
            if wild_ok:
                plus = children.get("+")
                if plus is not None:
                    if depth + 1 == last:
                        _merge(result, plus.subscribers)
                        hash_child = plus.children.get("#")
                        if hash_child is not None:
                            _merge(result, hash_child.subscribers)
                    else:
                        stack.append((plus, depth + 1))
        return result

    def filters(self) -> Iterator[tuple[str, K, int]]:
        """Every (filter, subscriber, qos); for inspection, not the hot path."""
        stack: list[tuple[_Node[K], tuple[str, ...]]] = [(self._root, ())]
        while stack:
            node, path = stack.pop()
            for key, qos in node.subscribers.items():
                yield "/".join(path), key, qos
            for level, child in node.children.items():
                stack.append((child, (*path, level)))


def _merge(result: dict[K, int], subscribers: dict[K, int]) -> None:
    for key, qos in subscribers.items():
        if result.get(key, -1) < qos:
            result[key] = qos
