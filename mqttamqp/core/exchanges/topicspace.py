"""``amq.topic`` is the MQTT topic space, as RabbitMQ's MQTT plugin maps it: routing
key ``plant.line1.temp`` <-> topic ``plant/line1/temp`` (``.`` and ``/`` swap),
binding key ``*`` <-> ``+``, ``#`` <-> ``#``.

Both ways: a 0.9.1 publish to ``amq.topic`` is an MQTT publish of the topic
(``to_topic_space``: MQTT and AMQP 1.0 subscribers get it, it is archived and
counted like any), and every publish of a topic (MQTT, AMQP 1.0, 0.9.1, wills)
reaches the queues bound to ``amq.topic`` with a matching key (``from_topic``, the
hook ``Publishing`` calls only while something is bound there: one attribute test
per publish otherwise).  Also the appends to queues that every route ends in
(``_enqueue``).

What this module must not do: import the router or ``Publishing`` (they are
handed in as callables, ``attach_topic_space``), or route anything but what is
bound to ``amq.topic``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, overload

from twisted.internet.defer import Deferred, fail

from mqttamqp.core.auth import Identity
from mqttamqp.core.commits import Durable, all_durable
from mqttamqp.core.exchanges.errors import ACCESS_REFUSED, ChannelError
from mqttamqp.core.exchanges.queuedecl import QueueDeclarations
from mqttamqp.core.exchanges.routes import Exchange
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import QUEUE_PREFIX, QueueAddress
from mqttamqp.core.queues.manager import QueueManager

__all__ = ["AMQ_TOPIC", "TopicSpace", "PublishRefused", "queue_topic", "topic_to_key",
           "key_to_topic"]

AMQ_TOPIC = "amq.topic"

_SWAP = str.maketrans("./", "/.")


# A queue's topic for the routing key that is its name, and its address, by name:
# a pure memo of ``TopicSpace._enqueue_one`` (a value is a function of its key), so
# one for the process, bounded as the 0.9.1 frame decode caches are (``amqp091.frames``
# says why no option, counter or log line): at most ROUTE_CACHE_MAX names of at most
# ROUTE_CACHE_ITEM characters, cleared when full.
_ROUTES: dict[str, tuple[str, QueueAddress]] = {}
ROUTE_CACHE_MAX = 1024
ROUTE_CACHE_ITEM = 256


class PublishRefused(Exception):
    """A queue refused a routed message (a publisher confirm is a ``basic.nack``)."""


def key_to_topic(routing_key: str) -> str:
    """Routing key ``a.b.c`` -> MQTT topic ``a/b/c`` (a ``/`` in a key becomes ``.``)."""
    return routing_key.translate(_SWAP)


def topic_to_key(topic: str) -> str:
    """MQTT topic ``a/b/c`` -> routing key ``a.b.c`` (a ``.`` becomes ``/``)."""
    return topic.translate(_SWAP)


def queue_topic(name: str, key: str) -> str:
    """The topic a message routed to queue ``name`` has there:
    ``$queue/<name>/<key>`` (what MQTT and AMQP 1.0 consumers see; ``key`` is the
    routing key, or the MQTT topic through ``amq.topic``), or ``$queue/<name>``
    when the key is empty, the queue's name (the default exchange) or no valid
    topic name."""
    if not key or key == name or "+" in key or "#" in key or "\x00" in key:
        return QUEUE_PREFIX + name
    return QUEUE_PREFIX + name + "/" + key


# What ``Publishing.publish`` is to this module: (message, identity) -> Published.
TopicPublish = Callable[[Message, Identity | None], Any]
# The permission check of a publish (``Router.may_publish``: counted and logged).
MayPublish = Callable[[Identity, str, bool], bool]


class TopicSpace(QueueDeclarations):
    """``amq.topic`` <-> the MQTT topic space, and appends to routed queues."""

    exchanges: dict[str, Exchange]

    def __init__(self, queues: QueueManager) -> None:
        super().__init__(queues)
        self._topic_publish: TopicPublish | None = None
        self._subscribed: Callable[[str], bool] | None = None
        self._hook: Callable[[TopicSpace | None], None] | None = None
        self._may_publish: MayPublish | None = None
        self.topic_routed = 0     # queues the last ``from_topic`` appended to
        # The online subscribers past their high-water mark that the last publish
        # into the topic space fed (``Published.congested``): a 0.9.1 adapter stops
        # reading its publisher until they drain (``Broker.pause_until_drained``).
        self.congested: Sequence[Any] = ()
        # Queues a 0.9.1 publish appends to itself while it is published to the
        # topic space (not twice through ``from_topic``).
        self._skip: Mapping[str, None] = {}
        self._confirming = False   # (a 0.9.1 publish: a refused append fails it)

    def attach_topic_space(self, publish: TopicPublish, subscribed: Callable[[str], bool],
                           hook: Callable[[TopicSpace | None], None],
                           may_publish: MayPublish | None = None) -> None:
        """How a topic is published (``Publishing.publish``), whether a topic has
        subscribers (``mandatory``), how ``Publishing`` is told to call
        ``from_topic`` (``hook(self)``) or not (``hook(None)``), and the permission
        check of a key that is no MQTT topic (``publish`` checks the others)."""
        self._topic_publish = publish
        self._subscribed = subscribed
        self._hook = hook
        self._may_publish = may_publish

    def _bindings_changed(self, source: Exchange) -> None:
        if source.name == AMQ_TOPIC and self._hook is not None:
            self._hook(self if source.bindings else None)

    def to_topic_space(self, message: Message, routing_key: str, identity: Identity | None,
                       queues: Mapping[str, None]) -> tuple[bool, Deferred[None] | None]:
        """A 0.9.1 publish reaching ``amq.topic``: an MQTT publish of the topic its
        key names (checked against ``identity``'s permission: 403 when denied).
        Whether anything took it (subscribers, queues bound to ``amq.topic``) and
        what to wait for."""
        topic = key_to_topic(routing_key)
        publish = self._topic_publish
        self.congested = ()
        if (publish is None or not topic or topic[0] == "$" or "+" in topic
                or "#" in topic or "\x00" in topic):
            # (no MQTT topic: only what is bound to amq.topic takes it, once the
            # publisher may write there, as ``publish`` would have checked)
            may = self._may_publish
            if identity is not None and may is not None and not may(identity, topic, False):
                raise ChannelError(ACCESS_REFUSED,
                                   f"write access to topic '{routing_key}' in exchange "
                                   f"'amq.topic' refused")
            self.topic_routed = 0
            self._confirming = True   # (a refusal nacks a 0.9.1 publish here too)
            try:
                d = self.from_topic(replace(message, topic=topic), skip=queues)
            finally:
                self._confirming = False
            return self.topic_routed > 0, d
        self.topic_routed = 0
        self._skip = queues
        self._confirming = True
        try:
            result = publish(replace(message, topic=topic), identity)
        finally:
            self._skip = {}
            self._confirming = False
        self.congested = result.congested
        if result.denied:
            raise ChannelError(ACCESS_REFUSED,
                               f"write access to topic '{routing_key}' in exchange "
                               f"'amq.topic' refused")
        routed = self.topic_routed > 0 or (
            self._subscribed is not None and self._subscribed(topic))
        durable: Deferred[None] | None = result.durable
        if result.refusal is not None:
            durable = fail(PublishRefused(result.refusal.reason))
        return routed, durable

    def from_topic(self, message: Message, skip: Mapping[str, None] | None = None
                   ) -> Deferred[None] | None:
        """A publish of ``message.topic`` (any protocol): append it to the queues
        bound to ``amq.topic`` whose key matches (not those in ``skip``, which the
        caller appends to itself).  The Deferred fires once those appends are
        durable (the publisher's acknowledgement waits for it).  A queue that
        refuses it (x-overflow reject-publish) fails only a 0.9.1 publisher's
        confirm: an MQTT or AMQP 1.0 publisher is not told (the refusal is counted
        and logged by the queue manager), as it would only send it again."""
        source = self.exchanges.get(AMQ_TOPIC)
        if source is None or not source.bindings or message.topic[:1] == "$":
            return None
        queues, _ = self.route(source, topic_to_key(message.topic), None)
        skip = self._skip if skip is None else skip
        names = [q for q in queues if q not in skip]
        self.topic_routed = len(names)
        if not names:
            return None
        return self._enqueue(message, names, message.topic,
                             message.publisher or "", self._confirming)

    def route(self, source: Exchange, routing_key: str,
              headers: Mapping[str, object] | None, into_topic: bool = False
              ) -> tuple[dict[str, None], bool]:
        raise NotImplementedError   # (``Exchanges.route``)

    def _enqueue_one(self, message: Message, name: str, key: str, publisher: str,
                     in_round: bool, refusals: bool = True) -> Durable:
        """``_enqueue`` to the one queue ``name``, which exists: the default
        exchange's publish comes straight here.  The queue's address and its topic
        for the key ``name`` are memoized by name (``_ROUTES``)."""
        route = _ROUTES.get(name)
        if route is None:
            route = (queue_topic(name, name), QueueAddress(name, ""))
            if len(name) <= ROUTE_CACHE_ITEM:
                if len(_ROUTES) >= ROUTE_CACHE_MAX:
                    _ROUTES.clear()
                _ROUTES[name] = route
        topic, address = route
        if key and key != name:
            topic = queue_topic(name, key)
        m = message
        copy = m if m.topic == topic else Message(
            topic, m.payload, m.qos, m.retain, m.publisher, m.timestamp, m.dup,
            m.native, m.amqp_only, m.props, m.amqp091, m.priority)
        d, refusal = self.queues.publish(copy, address, publisher, in_round=in_round)
        if refusal is None:
            return d
        return fail(PublishRefused(f"queue '{name}': {refusal.reason}")) if refusals else None

    @overload
    def _enqueue(self, message: Message, names: tuple[str, ...] | list[str]
                 | dict[str, None], key: str, publisher: str, refusals: bool = True,
                 in_round: Literal[False] = False) -> Deferred[None] | None: ...

    @overload
    def _enqueue(self, message: Message, names: tuple[str, ...] | list[str]
                 | dict[str, None], key: str, publisher: str, refusals: bool = True,
                 in_round: bool = False) -> Durable: ...

    def _enqueue(self, message: Message, names: tuple[str, ...] | list[str]
                 | dict[str, None], key: str, publisher: str, refusals: bool = True,
                 in_round: bool = False) -> Durable:
        """Append ``message`` to each existing queue of ``names`` (a refusal fails
        the Deferred, with ``refusals``): one queue by ``QueueManager.publish``
        (``in_round``: on the batch's ``CommitRound``), several in one commit
        (``QueueManager.publish_copies``)."""
        queues = self.queues
        m = message
        # (copies built field by field, as ``queues.metadata.with_metadata`` does:
        # ``dataclasses.replace`` was ~4 us a queue copy; none when the message has
        # its queue topic already: a 0.9.1 publish through the default exchange)
        if len(names) == 1:
            name = next(iter(names))
            if name not in queues.queues:
                return None
            return self._enqueue_one(message, name, key, publisher, in_round, refusals)
        copies = [(name, Message(queue_topic(name, key), m.payload, m.qos, m.retain,
                                 m.publisher, m.timestamp, m.dup, m.native, m.amqp_only,
                                 m.props, m.amqp091, m.priority))
                  for name in names if name in queues.queues]
        if not copies:
            return None
        d, refused = queues.publish_copies(copies, publisher)
        if not refused or not refusals:
            return d
        waits: list[Deferred[None] | None] = [d]
        waits.extend(fail(PublishRefused(f"queue '{name}': {refusal.reason}"))
                     for name, refusal in refused)
        return all_durable(waits)
