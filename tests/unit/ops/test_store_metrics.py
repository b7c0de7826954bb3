"""Unit tests for the store writer's metrics (``StoreCollector``): its commits, the
submits they held and the time spent in them, read from the store's ``stats()``."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from mqttamqp.ops.metrics import StoreCollector


def scrape(stats: Any) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(stats))
    return generate_latest(registry).decode()


def test_writer_commits_are_exported_as_counters() -> None:
    """Commits, committed submits and commit seconds appear as *_total counters."""
    text = scrape(lambda: {"commits": 12, "batches": 4000, "commit_seconds": 1.5})
    assert "mqttamqp_store_group_commits_total 12.0" in text
    assert "mqttamqp_store_committed_submits_total 4000.0" in text
    assert "mqttamqp_store_commit_seconds_total 1.5" in text


def test_nothing_while_the_store_is_not_open() -> None:
    """A standby (no store open yet) exports none of them."""
    assert "mqttamqp_store_" not in scrape(lambda: None)
