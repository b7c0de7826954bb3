"""AMQP 0.9.1's model (``Broker.exchanges``) driven as the 0.9.1 adapter drives it,
for the in-process tests: messages as the adapter builds them, consumers and the
channel's session for basic.get, the code of a ``ChannelError``."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FakeLink

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.exchanges.errors import ChannelError
from mqttamqp.core.message import Message
from mqttamqp.core.sessions.session import Session


def message(payload: bytes = b"x", qos: int = 1, broker: Broker | None = None) -> Message:
    now = broker.clock.seconds() if broker is not None else 0.0
    return Message("", payload, qos, False, "pub", now)


def consume(broker: Broker, queue: str, owner: str = "c1", key: str = "ctag",
            arguments: dict[str, Any] | None = None) -> tuple[Session, FakeLink]:
    """A 0.9.1 consumer as the adapter makes one: the queue's filter and consumer."""
    topic_filter, consumer = broker.exchanges.consumer_filter(queue, owner, arguments)
    session = broker.add_topic_receiver(f"{owner}/{key}", topic_filter,
                                        Identity(owner, None, "amqp0-9-1"), 1,
                                        consumer=consumer)
    assert session is not None
    link = FakeLink(key)
    broker.start_topic_receiver(session, link)
    broker.exchanges.consumer_added(queue)
    return session, link


def code_of(call: Any, *args: Any, **kwargs: Any) -> int:
    with pytest.raises(ChannelError) as info:
        call(*args, **kwargs)
    return info.value.code


def declared(broker: Broker, *names: str, durable: bool = True) -> None:
    for name in names:
        broker.exchanges.declare_queue(name, "c1", durable=durable)


def depth(broker: Broker, name: str) -> int:
    return len(broker.queues.queues[name].log)


def get_session(broker: Broker, key: str = "c1/get") -> tuple[Session, FakeLink]:
    """A channel's session for basic.get: online, subscribed to nothing."""
    session = broker.registry.add_link_subscriber(key)
    link = FakeLink(key)
    broker.activate(session, link, "amqp0-9-1")
    return session, link
