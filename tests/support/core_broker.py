"""A ``Broker`` on a ``Clock`` with fake client links, for the in-process tests of the
core: sessions opened and activated as an adapter does, subscriptions, wills and
publishes."""

from __future__ import annotations

from typing import Any

import fakes
from fakes import NullStore
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.sessions.session import Session


class FakeLink(fakes.FakeLink):
    """Records publishes as (topic, payload, qos, packet_id, dup, retain)."""

    @property
    def sent(self) -> list[tuple[Any, ...]]:
        return [(m.topic, m.payload, q, pid, d, r) for m, q, pid, d, r in self.published()]


def make_broker(store: NullStore | None = None, **limits: Any
                ) -> tuple[Broker, Clock, NullStore]:
    clock = Clock()
    clock.advance(1000.0)
    store = store if store is not None else NullStore()
    return Broker(clock, store, Limits(**limits)), clock, store


def connect(broker: Broker, client_id: str, clean: bool = True,
            will: WillMessage | None = None, link: FakeLink | None = None
            ) -> tuple[Session, FakeLink, bool]:
    link = link or FakeLink(client_id)
    opened = broker.open_session(link, client_id, clean, will)
    session, present = opened.session, opened.present
    broker.activate(session, link, "mqtt3.1.1")
    return session, link, present


def subscribe(broker: Broker, session: Session, *requests: tuple[str, int]) -> list[int]:
    codes, _ = broker.subscribe(session, Identity(session.client_id), list(requests))
    return codes


def will(owner: str, topic: str = "will/t", payload: bytes = b"bye", qos: int = 0,
         retain: bool = False) -> WillMessage:
    return WillMessage(owner, topic, payload, qos, retain)


def pub(broker: Broker, topic: str, payload: bytes = b"x", qos: int = 0,
        retain: bool = False) -> Deferred[None] | None:
    return broker.publish(Message(topic, payload, qos, retain, "p", 0.0)).durable
