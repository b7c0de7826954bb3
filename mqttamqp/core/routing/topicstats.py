"""Per-topic message counts for the console's Topics page.

What it owns: one counter per topic routed (``note``), at most ``max_topics`` of
them; once that many are tracked, messages on other topics are only counted in
``untracked`` (the page says so).  Cost on the route path: one dict lookup and
one store per message; nothing else runs until the console reads ``counts``.
Rates are the reader's business (the difference between two reads).

What it must not do: hold messages or grow without bound.  ``$SYS`` updates are
not traffic and are not counted (the façade only notes clients' messages).
"""

from __future__ import annotations

__all__ = ["TopicStats", "MAX_TRACKED_TOPICS"]

MAX_TRACKED_TOPICS = 10_000


class TopicStats:
    __slots__ = ("by_topic", "max_topics", "untracked")

    def __init__(self, max_topics: int = MAX_TRACKED_TOPICS) -> None:
        self.max_topics = max_topics
        # topic -> messages routed (``note`` adds; ``Publishing`` adds to a topic
        # already here itself, without the call)
        self.by_topic: dict[str, int] = {}
        self.untracked = 0        # messages on topics beyond the cap

    def note(self, topic: str) -> None:
        counts = self.by_topic
        n = counts.get(topic)
        if n is not None:
            counts[topic] = n + 1
        elif len(counts) < self.max_topics:
            counts[topic] = 1
        else:
            self.untracked += 1

    def counts(self) -> dict[str, int]:
        """A copy: topic -> messages routed since the broker started."""
        return dict(self.by_topic)

    def __len__(self) -> int:
        return len(self.by_topic)
