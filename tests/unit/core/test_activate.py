"""``SessionRegistry.activate`` (the broker's ``activate``, once per connect) calls the
queue manager's ``session_online`` only for a session its tables name: a member of a
consumer group, a browser, or a persistent session stored as a member before a
restart.  Each case is fed on connect; a session in none is not handed over."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FakeLink, MemoryStore
from queue_facade import client, got, join, make, send

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.queues.addresses import Consumer


def _spy(broker: Broker) -> list[str]:
    called: list[str] = []
    online = broker.queues.session_online

    def session_online(session: Any) -> None:
        called.append(session.client_id)
        online(session)

    broker.queues.session_online = session_online   # type: ignore[method-assign]
    return called


def test_a_member_back_online_gets_what_came_while_it_was_away() -> None:
    broker, _, _ = make()
    worker, link = client(broker, "w-1", clean=False)
    join(broker, worker, "$queue/jobs/#")
    broker.end_session(link, worker, clean=True, reason="bye")   # offline, kept
    send(broker, "$queue/jobs/a", b"1")
    called = _spy(broker)
    _, back = client(broker, "w-1", clean=False)
    assert called == ["w-1"]
    assert got(back) == [("$queue/jobs/a", b"1")]


def test_a_queue_receiver_joined_before_it_is_activated_is_fed() -> None:
    """An AMQP (or 0.9.1) queue consumer's session joins the group first, then is
    activated when its link is ready: a clean member, in the memberships only."""
    broker, _, _ = make()
    send(broker, "$queue/jobs/a", b"1")
    session = broker.add_topic_receiver("c1/r1", "$queue/jobs/#", Identity("c1"), 1)
    assert session is not None
    called = _spy(broker)
    link = FakeLink("c1/r1")
    broker.start_topic_receiver(session, link)
    assert called == ["c1/r1"]
    assert got(link) == [("$queue/jobs/a", b"1")]


def test_a_member_stored_before_a_restart_is_fed_on_its_first_connect() -> None:
    store = MemoryStore()
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", clean=False)
    join(broker, worker, "$queue/jobs/#")
    broker.end_session(link, worker, clean=True, reason="bye")
    broker.stop()
    again, _, _ = make(store)
    send(again, "$queue/jobs/a", b"1")
    called = _spy(again)
    _, back = client(again, "w-1", clean=False)
    assert called == ["w-1"]
    assert got(back) == [("$queue/jobs/a", b"1")]


@pytest.mark.parametrize("clean", [True, False])
def test_a_session_in_no_table_is_not_handed_to_the_queue_manager(clean: bool) -> None:
    broker, _, _ = make()
    member, _ = client(broker, "w-1")
    join(broker, member, "$queue/jobs/#")      # (a clean member: not stored as one)
    called = _spy(broker)
    client(broker, "plain", clean=clean)
    assert called == []


def test_once_a_persistent_member_is_stored_every_persistent_connect_is_handed_over(
        ) -> None:
    """(The stored members' table is read as a whole, and a clean session is never
    a returning member.)"""
    broker, _, _ = make()
    member, _ = client(broker, "w-1", clean=False)
    join(broker, member, "$queue/jobs/#")
    called = _spy(broker)
    client(broker, "plain", clean=False)
    client(broker, "clean")
    assert called == ["plain"]


def test_while_a_browser_is_open_every_connect_is_handed_over() -> None:
    """(The browsers' table is read as a whole: any open browser may be waiting for a
    session's room, so the queue manager decides.)"""
    broker, _, _ = make()
    browser, _ = client(broker, "browser")
    join(broker, browser, "$queue/jobs/#", 0, consumer=Consumer(browse=True))
    called = _spy(broker)
    client(broker, "plain")
    assert called == ["plain"]
