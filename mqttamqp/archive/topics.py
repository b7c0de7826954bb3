"""Which topics the archive keeps: ``--archive-include`` / ``--archive-exclude``.

MQTT filter matching (``+`` one level, ``#`` the rest, wildcards at the first level
never match a ``$`` topic), with a bounded cache of decisions so a busy topic costs
one dict look-up. Runs in the archive's writer process only; it must not be used on
the reactor's hot path, and it keeps its own matcher so that it does not depend on
the core's routing structures.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TopicSelector", "filter_matches", "CACHE_LIMIT"]

CACHE_LIMIT = 10_000


def filter_matches(topic_filter: str, topic: str) -> bool:
    """True if ``topic`` matches the MQTT topic filter ``topic_filter``."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_parts = topic_filter.split("/")
    t_parts = topic.split("/")
    for i, f in enumerate(f_parts):
        if f == "#":
            return True
        if i >= len(t_parts):
            return False
        if f != "+" and f != t_parts[i]:
            return False
    return len(f_parts) == len(t_parts)


class TopicSelector:
    """Keeps a topic when an include filter matches it and no exclude filter does."""

    def __init__(self, include: Sequence[str] = ("#",),
                 exclude: Sequence[str] = ("$SYS/#",)) -> None:
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self._cache: dict[str, bool] = {}

    def wanted(self, topic: str) -> bool:
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        keep = (any(filter_matches(f, topic) for f in self.include)
                and not any(filter_matches(f, topic) for f in self.exclude))
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[topic] = keep
        return keep
