"""Durable queues driven through the broker's façade for the in-process tests: a
``Broker`` on a ``Clock`` with fake links, members joining groups, publishes and the
acknowledgement actions of ``$queue/`` consumers."""

from __future__ import annotations

from typing import Any

from fakes import FakeLink, NullStore
from twisted.internet.task import Clock

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.addresses import (
    Consumer,
    QueueAddress,
)
from mqttamqp.core.sessions.session import Session


def make(store: NullStore | None = None, **limits: Any) -> tuple[Broker, Clock, NullStore]:
    clock = Clock()
    clock.advance(1000.0)
    store = store if store is not None else NullStore()
    limits.setdefault("sys_interval", 0)
    broker = Broker(clock, store, Limits(**limits))
    broker.start()
    return broker, clock, store


def client(broker: Broker, client_id: str, protocol: str = "mqtt3.1.1",
           clean: bool = True) -> tuple[Session, FakeLink]:
    link = FakeLink(client_id)
    session = broker.open_session(link, client_id, clean, None).session
    broker.activate(session, link, protocol)
    return session, link


def join(broker: Broker, session: Session, topic_filter: str, qos: int = 1,
         consumer: Consumer | None = None) -> int:
    codes, _ = broker.router.subscribe(session, Identity(session.client_id),
                                        [(topic_filter, qos)], consumer=consumer)
    return codes[0]


def send(broker: Broker, topic: str, payload: bytes = b"x", qos: int = 1,
         props: MessageProperties | None = None, publisher: str = "p") -> Any:
    return broker.publish(Message(topic, payload, qos, False, publisher,
                                  broker.clock.seconds(), props=props))


def got(link: FakeLink) -> list[tuple[str, bytes]]:
    return [(m.topic, m.payload) for m, *_ in link.published()]


def meta(message: Message) -> dict[str, str]:
    assert message.props is not None
    return dict(message.props.user_properties)


def ack(broker: Broker, session: Session, message: Message, action: str = "$ack",
        **extra: str) -> Any:
    m = meta(message)
    users = (("message-id", m["message-id"]), ("group-id", m["group-id"]),
             *extra.items())
    return broker.publish(
        Message(f"$queue/{m['queue']}/{action}", b"", 1, False, session.client_id,
                broker.clock.seconds(), props=MessageProperties(user_properties=users)),
        Identity(session.client_id, None, session.protocol))


def last(link: FakeLink) -> Message:
    message: Message = link.published()[-1][0]
    return message


def warm_member(store: NullStore) -> tuple[Broker, Session, FakeLink]:
    """A broker on ``store`` with queue ``jobs`` and an MQTT 5 member of its group,
    its first delivery acknowledged and committed (``store`` a ``ManualStore``), so
    that what follows starts from a quiet queue: the broker, the member's session
    and its link."""
    broker, _, _ = make(store)
    worker, link = client(broker, "w-1", "mqtt5")
    join(broker, worker, "$queue/jobs/#")
    broker.queues.publish(Message("$queue/jobs", b"first", 1), QueueAddress("jobs", ""), "p")
    commit_all = store.commit_all
    commit_all()
    ack(broker, worker, last(link))
    commit_all()
    return broker, worker, link
