"""A dead letter's death history (core.queues.deaths) and the x-death headers the
0.9.1 adapter builds from it."""

from __future__ import annotations

from mqttamqp.amqp091.properties import _x_death
from mqttamqp.core.queues.deaths import DEATHS_MAX_CHARS, add_death, read_deaths


def test_a_deaths_property_the_broker_did_not_write_reads_as_none() -> None:
    """A publisher's own ``deaths`` user property, deeply nested or over the bound,
    is no history (it used to raise RecursionError inside dead-lettering)."""
    assert read_deaths("[" * 5000) == []
    assert read_deaths("[" * (DEATHS_MAX_CHARS + 1)) == []
    assert read_deaths('[["q","rejected",1,0,0,null,null]]') == [
        ("q", "rejected", 1, 0, 0, None, None)]
    assert add_death("[" * 5000, "q", "rejected", 5.0, "", "k") == (
        '[["q","rejected",1,5,5,"","k"]]')


def test_x_first_death_stays_the_first_when_a_death_repeats() -> None:
    """W rejected, then R expired, then W rejected again: x-first-death is still W
    rejected (RabbitMQ sets it once), x-last-death W; x-death has both, W first."""
    deaths = None
    for queue, reason, now in (("W", "rejected", 10), ("R", "expired", 20),
                               ("W", "rejected", 30)):
        deaths = add_death(deaths, queue, reason, now, "ex", "key")
    headers = _x_death(read_deaths(deaths), "ex", "key")
    assert (headers["x-first-death-queue"], headers["x-first-death-reason"]) == (
        "W", "rejected")
    assert headers["x-last-death-queue"] == "W"
    assert [(t["queue"], t["count"]) for t in headers["x-death"]] == [("W", 2), ("R", 1)]
