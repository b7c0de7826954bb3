"""The default exchange only: what the 0.9.1 adapter routes through while the
broker has no 0.9.1 model (``Broker.exchanges``, core/exchanges, issue 27).

What it owns: ``DefaultExchange``, the shape of ``Exchanges`` the adapter calls
(declare, publish, the consumer a ``basic.consume`` joins), reduced to the
default exchange (routing key = queue name) and ``amq.topic`` (the MQTT topic
space: ``a.b.c`` is ``a/b/c``), with ``ChannelError`` for the rest.

What it must not do: hold queue rules (the queue manager does) or know frames.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import replace

from twisted.internet.defer import Deferred

from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import QUEUE_PREFIX, Consumer

__all__ = ["ChannelError", "QueueDeclared", "DefaultExchange", "NOT_FOUND",
           "ACCESS_REFUSED", "PRECONDITION_FAILED", "NOT_IMPLEMENTED", "NOT_ALLOWED"]

ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
_NAMES = {403: "ACCESS_REFUSED", 404: "NOT_FOUND", 405: "RESOURCE_LOCKED",
          406: "PRECONDITION_FAILED", 530: "NOT_ALLOWED", 540: "NOT_IMPLEMENTED",
          503: "COMMAND_INVALID", 504: "CHANNEL_ERROR", 505: "UNEXPECTED_FRAME"}
_CONNECTION_ERRORS = frozenset({530, 540, 541, 501, 502, 503, 504, 505})


class ChannelError(Exception):
    """A 0.9.1 channel error (or a connection error, ``connection_error``)."""

    def __init__(self, code: int, detail: str) -> None:
        self.code = code
        self.text = f"{_NAMES.get(code, 'ERROR')} - {detail}"[:255]
        super().__init__(self.text)

    @property
    def connection_error(self) -> bool:
        return self.code in _CONNECTION_ERRORS


class QueueDeclared:
    __slots__ = ("consumer_count", "message_count", "name")

    def __init__(self, name: str, message_count: int, consumer_count: int) -> None:
        self.name = name
        self.message_count = message_count
        self.consumer_count = consumer_count


def topic_of(routing_key: str) -> str:
    """``amq.topic``'s routing key as an MQTT topic (``.`` separates levels)."""
    return routing_key.replace(".", "/")


class DefaultExchange:
    """The default exchange and ``amq.topic`` over the broker's port."""

    BUILT_IN = frozenset(("", "amq.topic", "amq.direct", "amq.fanout"))

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.declared: set[str] = set()

    def declare_exchange(self, name: str, kind: str, passive: bool) -> None:
        if name in self.BUILT_IN:
            return
        raise ChannelError(NOT_FOUND if passive else NOT_IMPLEMENTED,
                           f"no exchange '{name}' in vhost '/'" if passive else
                           "declared exchanges are not supported yet")

    def declare_queue(self, name: str, passive: bool) -> QueueDeclared:
        queues = self.broker.queues.queues
        if not name:
            name = "amq.gen-" + secrets.token_urlsafe(16)
        if "/" in name or "+" in name or "#" in name or name.startswith("$"):
            raise ChannelError(PRECONDITION_FAILED, f"queue name {name!r} holds / + # or "
                               "starts with $ (it is also MQTT's $queue/<name>)")
        if passive and name not in queues and name not in self.declared:
            raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '/'")
        self.declared.add(name)
        queue = queues.get(name)
        count = 0
        if queue is not None:
            count = max(0, queue.next_offset - getattr(queue, "first_offset", 0)) \
                if hasattr(queue, "next_offset") else 0
        return QueueDeclared(name, 0 if queue is None else count, 0)

    def publish(self, message: Message, exchange: str, routing_key: str,
                headers: Mapping[str, object] | None, identity: Identity,
                mandatory: bool) -> tuple[bool, Deferred[None] | None]:
        if exchange == "":
            if routing_key not in self.declared and routing_key not in self.broker.queues.queues:
                return False, None
            topic = QUEUE_PREFIX + routing_key
        elif exchange == "amq.topic":
            topic = topic_of(routing_key)
        else:
            raise ChannelError(NOT_FOUND, f"no exchange '{exchange}' in vhost '/'")
        published = self.broker.publish(replace(message, topic=topic), identity)
        if published.denied:
            raise ChannelError(ACCESS_REFUSED, f"write access to '{exchange or 'amq.default'}"
                               f"' with routing key '{routing_key}' refused")
        if published.refusal is not None:
            from twisted.internet.defer import fail
            return True, fail(RuntimeError(published.refusal.reason))
        return True, published.durable

    def consumer_filter(self, queue: str) -> tuple[str, Consumer]:
        if queue not in self.declared and queue not in self.broker.queues.queues:
            raise ChannelError(NOT_FOUND, f"no queue '{queue}' in vhost '/'")
        return QUEUE_PREFIX + queue + "/#", Consumer(queue, None, None, explicit=False)

    def connection_closed(self, owner: str) -> None:
        pass
