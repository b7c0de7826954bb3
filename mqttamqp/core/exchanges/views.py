"""Frozen views of AMQP 0.9.1's model for the console and its JSON API: the
exchanges, their bindings and the queues 0.9.1 declared (with their arguments,
unknown ones too, as RabbitMQ's management shows them).

What this module must not do: change anything, or hand out the model's own
objects (views are values)."""

from __future__ import annotations

from mqttamqp.core.exchanges.queuedecl import DeclaredQueue, Frozen
from mqttamqp.core.exchanges.routes import Binding, Exchange
from mqttamqp.records import record

__all__ = ["ExchangeView", "BindingView", "DeclaredQueueView", "exchange_view",
           "binding_view", "declared_view"]


@record
class BindingView:
    source: str
    destination: str
    destination_kind: str      # "queue" or "exchange"
    routing_key: str
    arguments: Frozen


@record
class ExchangeView:
    name: str
    kind: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: Frozen
    bindings: int


@record
class DeclaredQueueView:
    name: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    transient: bool
    arguments: Frozen
    consumers: int
    owner: str | None


def exchange_view(e: Exchange) -> ExchangeView:
    return ExchangeView(e.name, e.kind, e.durable, e.auto_delete, e.internal, e.arguments,
                        len(e.bindings))


def binding_view(b: Binding) -> BindingView:
    return BindingView(b.source, b.destination, "exchange" if b.to_exchange else "queue",
                       b.routing_key, b.arguments)


def declared_view(q: DeclaredQueue) -> DeclaredQueueView:
    return DeclaredQueueView(q.name, q.durable, q.exclusive, q.auto_delete, q.transient,
                             q.arguments, q.consumers, q.owner)
