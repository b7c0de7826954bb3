"""Queue browsers in memory (``core/queues/browsing.py``): a browser reads the queue
without taking anything, from the head and then as messages come, at QoS 0, only
while its link can take more, and is gone with its session."""

from __future__ import annotations

from queue_facade import client, got, join, make, send

from mqttamqp.core.queues.addresses import Consumer

BROWSE = Consumer(browse=True)


def test_a_browser_reads_what_is_there_and_what_comes_without_taking_it() -> None:
    """A browser joining a queue of two gets both at QoS 0, then a third as it
    comes; the member of the queue still gets all three."""
    broker, _, _ = make()
    send(broker, "$queue/jobs/a", b"1")
    send(broker, "$queue/jobs/b", b"2")
    browser, browser_link = client(broker, "browser")
    join(broker, browser, "$queue/jobs/#", 0, consumer=BROWSE)
    broker.link_drained(browser)
    send(broker, "$queue/jobs/c", b"3")
    assert [p for _, p in got(browser_link)] == [b"1", b"2", b"3"]
    assert all(packet_id is None for _m, _q, packet_id, *_ in browser_link.published())
    member, member_link = client(broker, "member")
    join(broker, member, "$queue/jobs/#", consumer=Consumer("g"))
    assert [p for _, p in got(member_link)] == [b"1", b"2", b"3"]


def test_a_browser_without_room_waits_and_its_filter_applies() -> None:
    """A congested browser gets nothing until its link drains; its filter (the
    routing keys after the queue's name) chooses what it reads."""
    broker, _, _ = make()
    browser, browser_link = client(broker, "browser")
    browser_link.congested = True
    join(broker, browser, "$queue/jobs/eu/#", 0, consumer=BROWSE)
    for key, payload in (("eu/x", b"1"), ("us/x", b"2"), ("eu/y", b"3")):
        send(broker, f"$queue/jobs/{key}", payload)
    assert got(browser_link) == []
    browser_link.congested = False
    broker.link_drained(browser)
    assert [p for _, p in got(browser_link)] == [b"1", b"3"]


def test_a_browser_is_gone_with_its_session() -> None:
    """After its session leaves, a browser reads nothing more."""
    broker, _, _ = make()
    browser, browser_link = client(broker, "browser")
    join(broker, browser, "$queue/jobs/#", 0, consumer=BROWSE)
    broker.queues.forget_session(browser)
    send(broker, "$queue/jobs/a", b"1")
    assert got(browser_link) == []
    assert not broker.queues.feeding(browser)
