"""Who may do what to AMQP 0.9.1 queues and exchanges: the checks the channel and
its model methods ask before acting, refused with 403 (``ChannelError``).

What it owns: which permission each method needs, as RabbitMQ's table has them
(``configure``: a non-passive declare, delete; ``write``: publish to an exchange,
bind into a queue or exchange (the destination); ``read``: consume, get, purge
a queue, bind from an exchange (the source)), and the defaults that mirror the
MQTT rules, granted on top of the ACL's ``queue``/``exchange`` lines
(``Authorizer.may_use_resource``):

- queue ``Q`` is MQTT's ``$queue/Q``: read with a read grant on it, write with a
  write grant, configure with either;
- ``amq.topic`` is the MQTT topic space: a publish is a write on its topic (the
  model checks each, ``Exchanges.to_topic_space``), a binding from it with key
  ``a.*.#`` a read on the filter ``a/+/#``;
- the default exchange writes to queue ``<routing key>``;
- a connection may do anything to the exclusive queues it owns, and declare a
  server-named queue (nobody else can reach either); redeclaring a standard
  ``amq.*`` exchange (which changes nothing) needs nothing; passive declares
  need nothing, as in RabbitMQ;
- a declare naming a dead-letter or alternate exchange needs write on it.

Without an ACL file every check passes (``AllowAll``).

What it must not do: hold the ACL's grammar (``security.acl``), route, or answer
the client (the channel turns the ``ChannelError`` into ``channel.close``).
"""

from __future__ import annotations

from collections.abc import Mapping

from mqttamqp.amqp091.hosts import ChannelHost
from mqttamqp.core.auth import AllowAll, Identity, LoopbackOnly
from mqttamqp.core.exchanges.errors import ACCESS_REFUSED, ChannelError
from mqttamqp.core.exchanges.exchanges import STANDARD
from mqttamqp.core.exchanges.topicspace import AMQ_TOPIC, key_to_topic
from mqttamqp.core.queues.addresses import QUEUE_PREFIX

__all__ = ["CONFIGURE", "WRITE", "READ", "check_queue", "check_exchange", "check_publish",
           "check_bind", "check_exchange_declare", "check_routes_to", "binding_filter",
           "consumer_identity"]

CONFIGURE, WRITE, READ = "configure", "write", "read"
_STANDARD = frozenset(name for name, _ in STANDARD)
# Authorizers that allow everything (they override none of ``AllowAll``'s verdicts).
_ALLOWS_ALL = frozenset((AllowAll, LoopbackOnly))


def _refused(access: str, kind: str, name: str, host: ChannelHost) -> ChannelError:
    return ChannelError(ACCESS_REFUSED, f"{access} access to {kind} '{name}' in vhost '/' "
                        f"refused for user '{host.username or ''}'")


def _owns(host: ChannelHost, queue: str) -> bool:
    known = host.broker.exchanges.declared.get(queue)
    return known is not None and known.exclusive and known.owner == host.key


def check_queue(host: ChannelHost, access: str, queue: str) -> None:
    """``access`` to queue ``queue``: a ``queue`` line, the topic rules on
    ``$queue/<name>``, or the connection's own exclusive queue."""
    broker, identity = host.broker, host.identity
    topic = QUEUE_PREFIX + queue
    # (the topic verdicts first: the ACL caches them; a publish asks every time)
    if access != WRITE and broker.authorizer.may_subscribe(identity, topic):
        return
    if access != READ and broker.gate.may_write(identity, topic):
        return
    if broker.authorizer.may_use_resource(identity, "queue", access, queue):
        return
    if _owns(host, queue):
        return
    raise _refused(access, "queue", queue, host)


def consumer_identity(host: ChannelHost, queue: str) -> Identity:
    """Who a consumer of ``queue`` joins its group as, once ``check_queue`` let it
    read: the connection's identity when the topic rules let it read
    ``$queue/<name>``; else (a ``queue`` line, or its own exclusive queue) the
    broker's own, which the core's subscription check lets through."""
    identity = host.identity
    if host.broker.authorizer.may_subscribe(identity, QUEUE_PREFIX + queue):
        return identity
    return Identity(identity.client_id, identity.username, "")


def binding_filter(key: str) -> str:
    """The MQTT topic filter a binding key of ``amq.topic`` reads: ``a.*.#`` is
    ``a/+/#``."""
    return "/".join("+" if level == "*" else level
                    for level in key_to_topic(key).split("/"))


def check_exchange(host: ChannelHost, access: str, exchange: str, key: str = "") -> None:
    """``access`` to exchange ``exchange`` (``key``: a binding's, when it is the
    source): an ``exchange`` line, or for ``amq.topic`` read the topic rules."""
    broker, identity = host.broker, host.identity
    if broker.authorizer.may_use_resource(identity, "exchange", access, exchange):
        return
    if exchange == AMQ_TOPIC and access == READ:
        if broker.authorizer.may_subscribe(identity, binding_filter(key)):
            return
        raise ChannelError(ACCESS_REFUSED, f"read access to topic '{key}' in exchange "
                           f"'amq.topic' in vhost '/' refused for user "
                           f"'{host.username or ''}'")
    raise _refused(access, "exchange", exchange, host)


def check_exchange_declare(host: ChannelHost, exchange: str, passive: bool) -> None:
    """``exchange.declare``: configure, unless passive or a standard exchange (the
    default exchange is the model's to refuse)."""
    if passive or not exchange or exchange in _STANDARD:
        return
    check_exchange(host, CONFIGURE, exchange)


def check_routes_to(host: ChannelHost, arguments: Mapping[str, object] | None,
                    queue: str = "") -> None:
    """A declare naming where messages go next (a queue's
    ``x-dead-letter-exchange``, an exchange's ``alternate-exchange``): write on
    that exchange, as a publish to it would need (the model checks the values)."""
    if not arguments:
        return
    for name in ("x-dead-letter-exchange", "alternate-exchange"):
        target = arguments.get(name)
        if not isinstance(target, str):
            continue
        if target:
            check_exchange(host, WRITE, target)
        elif queue:   # (the default exchange: the dead-letter routing key's queue)
            key = arguments.get("x-dead-letter-routing-key")
            check_queue(host, WRITE, key if isinstance(key, str) and key else queue)


def check_publish(host: ChannelHost, exchange: str, routing_key: str) -> None:
    """``basic.publish``: write on the exchange; through the default exchange a write
    on queue ``<routing key>``; to ``amq.topic`` the model checks each topic.
    Without an ACL (``AllowAll`` itself, not a subclass that may refuse; fixed for
    the broker's life) every one of these passes (a queue's topic is never
    ``$SYS``): nothing to ask, per publish."""
    if type(host.broker.authorizer) in _ALLOWS_ALL:
        return
    if exchange == "":
        check_queue(host, WRITE, routing_key)
    elif exchange != AMQ_TOPIC:
        check_exchange(host, WRITE, exchange)


def check_bind(host: ChannelHost, destination: str, to_exchange: bool, source: str,
               key: str) -> None:
    """``queue.bind``/``exchange.bind`` and their unbinds: write on the destination,
    read on the source (the default exchange is the model's to refuse)."""
    if to_exchange:
        check_exchange(host, WRITE, destination)
    else:
        check_queue(host, WRITE, destination)
    if source:
        check_exchange(host, READ, source, key)
