"""Exchanges and bindings as values, and how each kind of exchange matches.

``Exchange`` holds its bindings (indexed by routing key for a direct exchange; a
topic exchange remembers, bounded, which bindings each routing key matched);
``Binding`` is one binding to a queue or to another exchange; ``topic_words`` and
``topic_match`` are 0.9.1's topic patterns (``*`` one word, ``#`` zero or more,
anywhere in the key), matched by a set of states (linear in key and pattern, so
no binding key can make a publish slow); ``headers_match`` is the headers
exchange's ``x-match`` rule.

What this module must not do: hold the broker's state or decide declare rules
(``exchanges.py`` does); it only answers "which bindings does this message match".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mqttamqp.core.exchanges.queuedecl import Frozen, freeze_value
from mqttamqp.records import record

__all__ = ["Exchange", "Binding", "MatchBudget", "KINDS", "DIRECT", "FANOUT", "TOPIC", "HEADERS",
           "key_words", "topic_words", "topic_match", "headers_match", "X_MATCH_VALUES"]

DIRECT, FANOUT, TOPIC, HEADERS = "direct", "fanout", "topic", "headers"
KINDS = (DIRECT, FANOUT, TOPIC, HEADERS)
X_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")
# Routing keys the topic exchanges remember the matches of, all of them together
# (most publishes repeat a few keys: a publish then costs a lookup, not a match per
# binding), and the longest key remembered (0.9.1's keys are short strings; an MQTT
# topic reaching amq.topic may be 64 KiB: matched each time, never kept).  At most
# MATCH_CACHE x MATCH_KEY_LONGEST characters of keys are held, whatever the count
# of exchanges.
MATCH_CACHE = 4096
MATCH_KEY_LONGEST = 255


class MatchBudget:
    """What the topic exchanges' match caches (``Exchange.matched``) hold in all:
    one count shared by every exchange of a broker; past ``MATCH_CACHE`` every
    cache starts again."""

    __slots__ = ("caches", "used")

    def __init__(self) -> None:
        self.used = 0
        self.caches: dict[int, dict[str, list[Binding]]] = {}   # id -> a non-empty cache

    def clear(self, cache: dict[str, list[Binding]]) -> None:
        self.used -= len(cache)
        self.caches.pop(id(cache), None)
        cache.clear()

    def full(self) -> None:
        for cache in self.caches.values():
            cache.clear()
        self.caches.clear()
        self.used = 0


@record
class Binding:
    """``source`` routes to ``destination`` (a queue, or an exchange when
    ``to_exchange``) what matches ``routing_key`` / ``arguments``."""

    source: str
    destination: str
    to_exchange: bool
    routing_key: str
    arguments: Frozen = ()


class Exchange:
    """One exchange: what it was declared as, and its bindings as a source."""

    __slots__ = ("arguments", "auto_delete", "bindings", "budget", "by_key", "durable",
                 "internal", "kind", "matched", "name", "patterns")

    def __init__(self, name: str, kind: str, durable: bool, auto_delete: bool = False,
                 internal: bool = False, arguments: Frozen = (),
                 budget: MatchBudget | None = None) -> None:
        self.name = name
        self.kind = kind
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments
        self.bindings: dict[Binding, None] = {}      # (ordered set)
        self.by_key: dict[str, list[Binding]] = {}   # direct: routing key -> bindings
        self.patterns: dict[Binding, tuple[str, ...]] = {}   # topic: compiled keys
        # topic: routing key -> the bindings it matched (emptied when a binding
        # comes or goes; bounded with every other exchange's by ``budget``)
        self.matched: dict[str, list[Binding]] = {}
        self.budget = budget if budget is not None else MatchBudget()

    def add(self, binding: Binding) -> bool:
        """Add ``binding``; False if it was there already."""
        if binding in self.bindings:
            return False
        self.bindings[binding] = None
        if self.kind == DIRECT:
            self.by_key.setdefault(binding.routing_key, []).append(binding)
        elif self.kind == TOPIC:
            self.patterns[binding] = topic_words(binding.routing_key)
            if self.matched:
                self.budget.clear(self.matched)
        return True

    def remove(self, binding: Binding) -> bool:
        if binding not in self.bindings:
            return False
        del self.bindings[binding]
        if self.kind == DIRECT:
            same = self.by_key.get(binding.routing_key)
            if same is not None:
                same.remove(binding)
                if not same:
                    del self.by_key[binding.routing_key]
        if self.patterns.pop(binding, None) is not None and self.matched:
            self.budget.clear(self.matched)
        return True

    def matches(self, routing_key: str, headers: Mapping[str, object] | None
                ) -> Iterable[Binding]:
        """The bindings a message with ``routing_key`` and ``headers`` takes."""
        kind = self.kind
        if kind == DIRECT:
            return self.by_key.get(routing_key, ())
        if kind == FANOUT:
            return self.bindings
        if kind == TOPIC:
            found = self.matched.get(routing_key)
            if found is None:
                words = key_words(routing_key)
                found = [b for b, p in self.patterns.items() if topic_match(p, words)]
                if len(routing_key) <= MATCH_KEY_LONGEST:
                    budget = self.budget
                    if budget.used >= MATCH_CACHE:
                        budget.full()
                    cache = self.matched
                    if not cache:
                        budget.caches[id(cache)] = cache
                    cache[routing_key] = found
                    budget.used += 1
            return found
        return [b for b in self.bindings if headers_match(b.arguments, headers)]


def key_words(key: str) -> list[str]:
    """A routing key as words: ``""`` has none (as RabbitMQ splits it: ``*``
    does not match it, ``#`` does); ``a..b`` has an empty one."""
    return key.split(".") if key else []


def topic_words(key: str) -> tuple[str, ...]:
    """A binding key as words (``""``: none), runs of ``#`` collapsed (they mean
    the same)."""
    words: list[str] = []
    for word in key_words(key):
        if word == "#" and words and words[-1] == "#":
            continue
        words.append(word)
    return tuple(words)


def topic_match(pattern: tuple[str, ...], words: list[str]) -> bool:
    """Does the routing key ``words`` match the binding key ``pattern``?"""
    end = len(pattern)
    states = _closure({0}, pattern)
    for word in words:
        following: set[int] = set()
        for i in states:
            if i < end:
                p = pattern[i]
                if p == "#":
                    following.add(i)
                elif p == "*" or p == word:
                    following.add(i + 1)
        if not following:
            return False
        states = _closure(following, pattern)
    return end in states


def _closure(states: set[int], pattern: tuple[str, ...]) -> set[int]:
    # (``#`` matches zero words too)
    more = [i + 1 for i in states if i < len(pattern) and pattern[i] == "#"]
    while more:
        i = more.pop()
        if i not in states:
            states.add(i)
            if i < len(pattern) and pattern[i] == "#":
                more.append(i + 1)
    return states


def headers_match(arguments: Frozen, headers: Mapping[str, object] | None) -> bool:
    """The headers exchange's rule: with ``x-match`` ``all`` (the default) every
    binding argument must be a header with that value (a void argument: present
    with any value), with ``any`` one of them; ``x-`` arguments take part only in
    ``all-with-x`` / ``any-with-x``."""
    mode = "all"
    for key, value in arguments:
        if key == "x-match":
            mode = str(value)
            break
    with_x = mode.endswith("-with-x")
    pairs = [(k, v) for k, v in arguments
             if k != "x-match" and (with_x or not k.startswith("x-"))]
    given = headers or {}

    def one(key: str, value: object) -> bool:
        if key not in given:
            return False
        return value is None or freeze_value(given[key]) == value

    if mode.startswith("any"):
        return any(one(k, v) for k, v in pairs)
    return all(one(k, v) for k, v in pairs)
