"""``Exchanges`` (``Broker.exchanges``): AMQP 0.9.1's exchanges and bindings over
the queue manager, and the one entry point of the 0.9.1 adapter into the core.

What it owns: the exchanges (the default one, ``amq.*``, declared ones), their
bindings (to queues and to other exchanges), routing a published message to the
queues its exchange and bindings name (``publish``: whether it was routed, for
``mandatory``, and the Deferred a publisher confirm waits for), and the queue
methods through ``QueueDeclarations``.

What it must not do: know the wire (pamqp, frames, channels: ``mqttamqp.amqp091``),
look inside a message's 0.9.1 properties, or change a queue other than through
the queue manager's commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from twisted.internet.defer import Deferred, fail

from mqttamqp.core.commits import all_durable
from mqttamqp.core.exchanges.errors import NOT_FOUND, RESOURCE_ERROR, ChannelError
from mqttamqp.core.exchanges.queuedecl import QueueDeclarations
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import QUEUE_PREFIX, QueueAddress
from mqttamqp.core.queues.manager import QueueManager

__all__ = ["Exchanges", "PublishRefused"]


class PublishRefused(Exception):
    """A queue refused a routed message (a publisher confirm is a ``basic.nack``)."""


def queue_topic(name: str, routing_key: str) -> str:
    """The topic a message routed to queue ``name`` with ``routing_key`` has in the
    queue: ``$queue/<name>/<routing key>`` (what MQTT and AMQP 1.0 consumers see),
    or ``$queue/<name>`` when the key is empty, the queue's name (the default
    exchange) or not a valid topic name."""
    if (not routing_key or routing_key == name or "+" in routing_key
            or "#" in routing_key or "\x00" in routing_key):
        return QUEUE_PREFIX + name
    return QUEUE_PREFIX + name + "/" + routing_key


class Exchanges(QueueDeclarations):
    """The 0.9.1 model: exchanges, bindings, declared queues, publishing."""

    def __init__(self, queues: QueueManager) -> None:
        super().__init__(queues)

    def publish(self, message: Message, exchange: str, routing_key: str,
                headers: Mapping[str, object] | None = None, publisher: str = "",
                mandatory: bool = False) -> tuple[bool, Deferred[None] | None]:
        """Route ``message`` published to ``exchange`` with ``routing_key``: whether
        any queue took it (False: ``basic.return`` when ``mandatory``) and the
        Deferred that fires once every durable copy is committed (None: nothing to
        wait for); it fails (``PublishRefused``) when a queue refused it."""
        if exchange == "":
            if routing_key not in self.queues.queues:
                return False, None
            return True, self._enqueue(message, (routing_key,), routing_key,
                                       publisher or message.publisher or "")
        raise ChannelError(NOT_FOUND, f"no exchange '{exchange}' in vhost '/'")

    def _enqueue(self, message: Message, names: tuple[str, ...] | list[str],
                 routing_key: str, publisher: str) -> Deferred[None] | None:
        """Append ``message`` to each queue of ``names``."""
        waits: list[Deferred[None] | None] = []
        queues = self.queues
        for name in names:
            copy = replace(message, topic=queue_topic(name, routing_key))
            d, refusal = queues.publish(copy, QueueAddress(name, ""), publisher)
            if refusal is not None:
                waits.append(fail(PublishRefused(f"queue '{name}': {refusal.reason}")))
            else:
                waits.append(d)
        return all_durable(waits)

    def _too_many(self, what: str, option: str, bound: int) -> ChannelError:
        return ChannelError(RESOURCE_ERROR, f"too many {what} ({option} {bound})")
