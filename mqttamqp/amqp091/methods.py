"""The exchange and queue methods of a 0.9.1 channel, carried out against the
broker's 0.9.1 model (``Broker.exchanges``): declare, delete, bind, unbind, purge.

What it owns: the mapping of each method's fields to the model's call and the
answer it gets (``-ok`` once the model's commit is durable, in the order the
methods came: ``Channel.answer``), after the permission each needs
(``permissions``).  The model raises ``ChannelError`` for the
spec's refusals (403, 404, 405, 406, 530, 540); the channel turns it into
``channel.close`` or ``connection.close``.

What it must not do: hold the rules of exchanges and queues (``core.exchanges``)
or write to the socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import commands

from mqttamqp.amqp091.hosts import MethodHost
from mqttamqp.amqp091.permissions import (
    CONFIGURE,
    READ,
    check_bind,
    check_exchange,
    check_exchange_declare,
    check_queue,
    check_routes_to,
)

__all__ = ["MODEL_METHODS"]

E, Q = commands.Exchange, commands.Queue


def exchange_declare(ch: MethodHost, m: Any) -> None:
    check_exchange_declare(ch.connection, m.exchange, m.passive)
    if not m.passive:
        check_routes_to(ch.connection, m.arguments)
    d = ch.exchanges.declare_exchange(m.exchange, m.exchange_type, m.durable, m.auto_delete,
                                      m.internal, m.arguments, m.passive)
    ch.answer(None if m.nowait else E.DeclareOk(), d)


def exchange_delete(ch: MethodHost, m: Any) -> None:
    check_exchange(ch.connection, CONFIGURE, m.exchange)
    d = ch.exchanges.delete_exchange(m.exchange, m.if_unused)
    ch.answer(None if m.nowait else E.DeleteOk(), d)


def exchange_bind(ch: MethodHost, m: Any) -> None:
    check_bind(ch.connection, m.destination, True, m.source, m.routing_key)
    d = ch.exchanges.bind_exchange(m.destination, m.source, m.routing_key, m.arguments)
    ch.answer(None if m.nowait else E.BindOk(), d)


def exchange_unbind(ch: MethodHost, m: Any) -> None:
    check_bind(ch.connection, m.destination, True, m.source, m.routing_key)
    d = ch.exchanges.unbind_exchange(m.destination, m.source, m.routing_key, m.arguments)
    ch.answer(None if m.nowait else E.UnbindOk(), d)


def queue_declare(ch: MethodHost, m: Any) -> None:
    if m.queue and not m.passive:   # (a server-named queue is nobody else's)
        check_queue(ch.connection, CONFIGURE, m.queue)
    if not m.passive:
        check_routes_to(ch.connection, m.arguments, m.queue)
    declared, d = ch.exchanges.declare_queue(
        m.queue, ch.connection.key, m.durable, m.exclusive, m.auto_delete, m.arguments,
        m.passive)
    ch.answer(None if m.nowait else Q.DeclareOk(declared.name, declared.message_count,
                                                declared.consumer_count), d)


def queue_bind(ch: MethodHost, m: Any) -> None:
    check_bind(ch.connection, m.queue, False, m.exchange, m.routing_key)
    d = ch.exchanges.bind_queue(m.queue, m.exchange, m.routing_key, m.arguments,
                                ch.connection.key)
    ch.answer(None if m.nowait else Q.BindOk(), d)


def queue_unbind(ch: MethodHost, m: Any) -> None:
    check_bind(ch.connection, m.queue, False, m.exchange, m.routing_key)
    d = ch.exchanges.unbind_queue(m.queue, m.exchange, m.routing_key, m.arguments,
                                  ch.connection.key)
    ch.answer(Q.UnbindOk(), d)


def queue_purge(ch: MethodHost, m: Any) -> None:
    check_queue(ch.connection, READ, m.queue)
    count, d = ch.exchanges.purge_queue(m.queue, ch.connection.key)
    ch.answer(None if m.nowait else Q.PurgeOk(count), d)


def queue_delete(ch: MethodHost, m: Any) -> None:
    check_queue(ch.connection, CONFIGURE, m.queue)
    count, d = ch.exchanges.delete_queue(m.queue, ch.connection.key, m.if_unused,
                                         m.if_empty)
    ch.answer(None if m.nowait else Q.DeleteOk(count), d)


MODEL_METHODS: dict[str, Callable[[MethodHost, Any], None]] = {
    "Exchange.Declare": exchange_declare,
    "Exchange.Delete": exchange_delete,
    "Exchange.Bind": exchange_bind,
    "Exchange.Unbind": exchange_unbind,
    "Queue.Declare": queue_declare,
    "Queue.Bind": queue_bind,
    "Queue.Unbind": queue_unbind,
    "Queue.Purge": queue_purge,
    "Queue.Delete": queue_delete,
}
