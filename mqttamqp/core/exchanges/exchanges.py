"""``Exchanges`` (``Broker.exchanges``): AMQP 0.9.1's exchanges and bindings over
the queue manager, and the one entry point of the 0.9.1 adapter into the core.

What it owns: the exchanges (the default one, ``amq.*``, declared ones), their
bindings (to queues and to other exchanges), the declare / delete / bind rules
with the spec's errors, and routing a published message to the queues its
exchange and bindings name (``publish``: whether it was routed, for
``mandatory``, and the Deferred a publisher confirm waits for).  The queue
methods are ``QueueDeclarations``'; ``amq.topic`` as the MQTT topic space is
``TopicSpace``'s.

What it must not do: know the wire (pamqp, frames, channels: ``mqttamqp.amqp091``),
look inside a message's 0.9.1 properties, or change a queue other than through
the queue manager's commands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.auth import Identity
from mqttamqp.core.commits import Durable, all_done
from mqttamqp.core.exchanges.arguments import QueueArguments
from mqttamqp.core.exchanges.errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    ChannelError,
)
from mqttamqp.core.exchanges.queuedecl import Arguments, freeze
from mqttamqp.core.exchanges.routes import (
    DIRECT,
    FANOUT,
    HEADERS,
    KINDS,
    TOPIC,
    X_MATCH_VALUES,
    Binding,
    Exchange,
    MatchBudget,
)
from mqttamqp.core.exchanges.topicspace import AMQ_TOPIC, PublishRefused, TopicSpace, queue_topic
from mqttamqp.core.exchanges.views import (
    BindingView,
    DeclaredQueueView,
    ExchangeView,
    binding_view,
    declared_view,
    exchange_view,
)
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import (
    DeleteBinding,
    DeleteExchange,
    Op,
    PutBinding,
    PutExchange,
    Snapshot,
)
from mqttamqp.core.queues.addresses import QUEUE_PREFIX
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.queues.model import DeadLetterRoute
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.stats import BrokerStats

__all__ = ["Exchanges", "PublishRefused", "STANDARD", "queue_topic", "Envelope"]

# (message) -> the (exchange, routing key) a 0.9.1 publisher sent it with, or None.
Envelope = Callable[[Message], "tuple[str, str] | None"]

# The exchanges every vhost has (RabbitMQ's), all durable.
STANDARD = (("amq.direct", DIRECT), ("amq.fanout", FANOUT), (AMQ_TOPIC, TOPIC),
            ("amq.headers", HEADERS), ("amq.match", HEADERS))
# Exchanges one publish may pass through (exchange-to-exchange bindings).
MAX_HOPS = 32


class Exchanges(TopicSpace):
    """The 0.9.1 model: exchanges, bindings, declared queues, publishing."""

    log = Logger(namespace="mqttamqp.core.exchanges")

    def __init__(self, queues: QueueManager, log_limit: LogLimiter | None = None,
                 stats: BrokerStats | None = None) -> None:
        super().__init__(queues)
        self._stats = stats if stats is not None else BrokerStats()
        self._log_limit = log_limit if log_limit is not None else LogLimiter(
            queues.clock.seconds)
        self._match_budget = MatchBudget()   # (every topic exchange's cache together)
        self.exchanges: dict[str, Exchange] = {
            name: Exchange(name, kind, True, budget=self._match_budget)
            for name, kind in STANDARD}
        self.bound_to: dict[str, dict[Binding, None]] = {}   # destination -> bindings
        self.binding_count = 0
        self.refused = 0          # declares and binds refused at a bound (counted)
        # How the 0.9.1 adapter reads the exchange and routing key a 0.9.1 publisher
        # sent a message with (``Message.amqp091``, which the core does not open):
        # the key its dead letters take (``attach_envelope``).
        self._envelope: Envelope | None = None

    def attach_envelope(self, read: Envelope) -> None:
        """``read(message)``: the (exchange, routing key) a 0.9.1 publisher sent
        ``message`` with, or None (not from a 0.9.1 publisher).  Dead letters go
        with that key, as RabbitMQ's keep the key they were published with."""
        self._envelope = read

    # -- exchange.declare / delete ---------------------------------------------------

    def declare_exchange(self, name: str, kind: str = DIRECT, durable: bool = False,
                         auto_delete: bool = False, internal: bool = False,
                         arguments: Arguments | None = None, passive: bool = False
                         ) -> Deferred[None] | None:
        """``exchange.declare``: the commit that stores a new durable exchange."""
        if not name:
            raise ChannelError(ACCESS_REFUSED,
                               "operation not permitted on the default exchange")
        known = self.exchanges.get(name)
        if passive:
            if known is None:
                raise ChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '/'")
            return None
        if kind not in KINDS:
            raise ChannelError(COMMAND_INVALID, f"unknown exchange type '{kind}'")
        frozen = freeze(arguments)
        if known is not None:
            # (as RabbitMQ: of the arguments only alternate-exchange is compared)
            for what, mine, theirs in (("type", known.kind, kind),
                                       ("durable", known.durable, durable),
                                       ("auto_delete", known.auto_delete, auto_delete),
                                       ("internal", known.internal, internal),
                                       ("alternate-exchange",
                                        dict(known.arguments).get("alternate-exchange"),
                                        dict(frozen).get("alternate-exchange"))):
                if mine != theirs:
                    raise ChannelError(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{what}' for exchange '{name}' in vhost '/': "
                        f"received {_shown(theirs)} but current is {_shown(mine)}")
            return None
        if name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED,
                               f"exchange name '{name}' contains reserved prefix 'amq.*'")
        limit = self.queues.limits.max_exchanges
        if len(self.exchanges) - len(STANDARD) >= limit:
            raise self._at_bound("exchanges", "max-exchanges", limit)
        alternate = dict(frozen).get("alternate-exchange")
        if alternate is not None and not isinstance(alternate, str):
            raise ChannelError(PRECONDITION_FAILED,
                               "invalid arg 'alternate-exchange': not a string")
        self.exchanges[name] = Exchange(name, kind, durable, auto_delete, internal, frozen,
                                        self._match_budget)
        if not durable:
            return None
        return self._persist([PutExchange(name, kind, auto_delete, internal, frozen)])

    def delete_exchange(self, name: str, if_unused: bool = False) -> Deferred[None] | None:
        """``exchange.delete``: its bindings (either way) go with it."""
        if not name or name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED,
                               f"operation not permitted on exchange '{name or '(default)'}'")
        exchange = self.exchanges.get(name)
        if exchange is None:
            return None   # (as RabbitMQ: deleting a missing exchange is not an error)
        if if_unused and exchange.bindings:
            raise ChannelError(PRECONDITION_FAILED, f"exchange '{name}' in vhost '/' in use")
        ops: list[Op] = []
        self._unbind_all(name, True, ops)
        for binding in list(exchange.bindings):
            self._remove_binding(binding, ops, cascade=False)
        del self.exchanges[name]
        if exchange.matched:
            exchange.budget.clear(exchange.matched)
        if exchange.durable:
            ops.append(DeleteExchange(name))
        return self._persist(ops)

    def exchange(self, name: str) -> Exchange:
        """Exchange ``name`` (404 if there is none)."""
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise ChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '/'")
        return exchange

    # -- queue.bind / exchange.bind --------------------------------------------------

    def bind_queue(self, queue: str, exchange: str, routing_key: str = "",
                   arguments: Arguments | None = None, owner: str | None = None
                   ) -> Deferred[None] | None:
        """``queue.bind``: the commit that stores a binding of two durable ends."""
        self._existing(queue, owner)
        if queue[:1] == "$":
            raise ChannelError(ACCESS_REFUSED,
                               f"queue '{queue}' is reached by dead-lettering only")
        return self._bind(self._source(exchange), queue, False, routing_key, arguments)

    def unbind_queue(self, queue: str, exchange: str, routing_key: str = "",
                     arguments: Arguments | None = None, owner: str | None = None
                     ) -> Deferred[None] | None:
        self._existing(queue, owner)
        return self._unbind(self._source(exchange), queue, False, routing_key, arguments)

    def bind_exchange(self, destination: str, source: str, routing_key: str = "",
                      arguments: Arguments | None = None) -> Deferred[None] | None:
        """``exchange.bind``: ``source`` routes to ``destination`` too."""
        self._source(destination)
        return self._bind(self._source(source), destination, True, routing_key, arguments)

    def unbind_exchange(self, destination: str, source: str, routing_key: str = "",
                        arguments: Arguments | None = None) -> Deferred[None] | None:
        self._source(destination)
        return self._unbind(self._source(source), destination, True, routing_key,
                            arguments)

    def _source(self, name: str) -> Exchange:
        if not name:
            raise ChannelError(ACCESS_REFUSED,
                               "operation not permitted on the default exchange")
        return self.exchange(name)

    def _bind(self, source: Exchange, destination: str, to_exchange: bool,
              routing_key: str, arguments: Arguments | None) -> Deferred[None] | None:
        frozen = freeze(arguments)
        if source.kind == HEADERS:
            x_match = dict(frozen).get("x-match", "all")
            if x_match not in X_MATCH_VALUES:
                raise ChannelError(PRECONDITION_FAILED,
                                   f"invalid arg 'x-match' for binding: {x_match!r} "
                                   "(all, any, all-with-x or any-with-x)")
        binding = Binding(source.name, destination, to_exchange, routing_key, frozen)
        if binding in source.bindings:
            return None
        limit = self.queues.limits.max_bindings
        if self.binding_count >= limit:
            raise self._at_bound("bindings", "max-bindings", limit)
        source.add(binding)
        self.bound_to.setdefault(destination, {})[binding] = None
        self.binding_count += 1
        self._bindings_changed(source)
        if not self._durable(binding):
            return None
        return self._persist([PutBinding(source.name, destination, to_exchange,
                                         routing_key, frozen)])

    def _unbind(self, source: Exchange, destination: str, to_exchange: bool,
                routing_key: str, arguments: Arguments | None) -> Deferred[None] | None:
        binding = Binding(source.name, destination, to_exchange, routing_key,
                          freeze(arguments))
        ops: list[Op] = []
        self._remove_binding(binding, ops)
        return self._persist(ops)

    def _durable(self, binding: Binding) -> bool:
        source = self.exchanges.get(binding.source)
        if source is None or not source.durable:
            return False
        if binding.to_exchange:
            destination = self.exchanges.get(binding.destination)
            return destination is not None and destination.durable
        declared = self.declared.get(binding.destination)
        return declared is None or not declared.transient

    def _remove_binding(self, binding: Binding, ops: list[Op], cascade: bool = True) -> None:
        source = self.exchanges.get(binding.source)
        if source is None or not source.remove(binding):
            return
        self.binding_count -= 1
        bound = self.bound_to.get(binding.destination)
        if bound is not None:
            bound.pop(binding, None)
            if not bound:
                del self.bound_to[binding.destination]
        if self._durable(binding):
            ops.append(DeleteBinding(binding.source, binding.destination,
                                     binding.to_exchange, binding.routing_key,
                                     binding.arguments))
        self._bindings_changed(source)
        if cascade and source.auto_delete and not source.bindings:
            # (an auto-delete exchange goes with its last binding)
            self._unbind_all(source.name, True, ops)
            if source.matched:
                source.budget.clear(source.matched)
            if self.exchanges.pop(source.name, None) is source and source.durable:
                ops.append(DeleteExchange(source.name))

    def _unbind_all(self, destination: str, to_exchange: bool, ops: list[Op]) -> None:
        """Every binding to ``destination`` goes (it is being deleted)."""
        for binding in list(self.bound_to.get(destination, ())):
            if binding.to_exchange == to_exchange:
                self._remove_binding(binding, ops)

    def _dropped_queue(self, name: str, ops: list[Op]) -> None:
        self._unbind_all(name, False, ops)

    # -- basic.publish ---------------------------------------------------------------

    def publish(self, message: Message, exchange: str, routing_key: str,
                headers: Mapping[str, object] | None = None, publisher: str = "",
                mandatory: bool = False, identity: Identity | None = None,
                in_round: bool = False) -> tuple[bool, Durable]:
        """Route ``message`` published to ``exchange`` with ``routing_key``: whether
        any queue took it (False: ``basic.return`` when ``mandatory``) and the
        Deferred that fires once every durable copy is committed (None: nothing to
        wait for); it fails (``PublishRefused``) when a queue refused it.
        ``in_round``: a copy to one queue may be waited on as the batch's
        ``CommitRound`` instead (``QueueManager.publish``).  Through
        ``amq.topic`` it is also an MQTT publish (``identity``'s permission), and
        ``congested`` then holds the subscribers it left past their high-water
        mark (empty otherwise)."""
        publisher = publisher or message.publisher or ""
        if self.congested:
            self.congested = ()
        # Counted as received, as the router counts an MQTT publish (``$SYS``
        # messages/received; AMQP 0.9.1's share for the protocol label).
        stats = self._stats
        if exchange == "":
            stats.messages_received += 1
            stats.messages_received_amqp091 += 1
            # ($dlq/ queues are reached by dead-lettering only, as from MQTT)
            if routing_key[:1] == "$" or routing_key not in self.queues.queues:
                return False, None
            return True, self._enqueue_one(message, routing_key, routing_key, publisher,
                                           in_round)
        source = self.exchange(exchange)
        if source.internal:
            raise ChannelError(ACCESS_REFUSED,
                               f"cannot publish to internal exchange '{exchange}'")
        if source.kind == DIRECT:
            # (a direct exchange's key bound to one queue, the usual case: ``route``'s
            # answer without its walk; a binding to an exchange, several, or none
            # (an alternate exchange's turn) take ``route``)
            bound = source.by_key.get(routing_key)
            if (bound is not None and len(bound) == 1 and not bound[0].to_exchange
                    and (name := bound[0].destination) in self.queues.queues):
                d = self._enqueue_one(message, name, routing_key, publisher, in_round)
                stats.messages_received += 1
                stats.messages_received_amqp091 += 1
                return True, d
        counted = stats.messages_received
        queues, topic = self.route(source, routing_key, headers, True)
        waits: list[Durable] = []
        routed = bool(queues)
        if topic:
            into, d = self.to_topic_space(message, routing_key, identity, queues)
            routed = routed or into
            waits.append(d)
        if queues:
            waits.append(self._enqueue(message, queues, routing_key, publisher,
                                       in_round=in_round))
        if stats.messages_received == counted:   # (the router counted it if it went there)
            stats.messages_received += 1
        # (counted with messages_received, never before a refusal: the MQTT figure
        # is received less the other protocols', and must not go down)
        stats.messages_received_amqp091 += 1
        return routed, all_done(waits)

    def route(self, source: Exchange, routing_key: str,
              headers: Mapping[str, object] | None, into_topic: bool = False
              ) -> tuple[dict[str, None], bool]:
        """The queues ``source`` routes to (in order, once each) through its bindings
        and exchange-to-exchange ones (each exchange once, at most ``MAX_HOPS``),
        then alternate exchanges; and, ``into_topic``, whether the message reaches
        ``amq.topic`` (the MQTT topic space: its own bindings are then routed by
        ``TopicSpace.from_topic``, as for any MQTT publish)."""
        queues: dict[str, None] = {}
        seen = {source.name}
        todo = [source]
        topic = False
        while todo:
            exchange = todo.pop()
            if into_topic and exchange.name == AMQ_TOPIC:
                topic = True
                continue
            matched = False
            for binding in exchange.matches(routing_key, headers):
                matched = True
                if not binding.to_exchange:
                    queues[binding.destination] = None
                elif binding.destination not in seen and len(seen) < MAX_HOPS:
                    following = self.exchanges.get(binding.destination)
                    if following is not None:
                        seen.add(following.name)
                        todo.append(following)
            if not matched and exchange.arguments:
                alternate = dict(exchange.arguments).get("alternate-exchange")
                following = self.exchanges.get(str(alternate)) if alternate else None
                if following is not None and following.name not in seen:
                    seen.add(following.name)
                    todo.append(following)
        return queues, topic

    # -- dead letters ----------------------------------------------------------------

    def _dead_letter_route(self, name: str, parsed: QueueArguments) -> DeadLetterRoute:
        """Where queue ``name``'s dead letters go (x-dead-letter-exchange): the queues
        its exchange routes them to, with x-dead-letter-routing-key or the key they
        were published with (headers exchanges see no headers here).  A dead-letter
        exchange that does not exist drops them, as RabbitMQ does."""
        exchange_name = parsed.dead_letter_exchange or ""
        fixed_key = parsed.dead_letter_routing_key

        def route(message: Message, reason: str) -> tuple[str, str, list[str]]:
            key = fixed_key
            if key is None:
                key = _published_key(name, message, self._envelope)
            if not exchange_name:
                return "", key, [key] if key in self.queues.queues else []
            exchange = self.exchanges.get(exchange_name)
            if exchange is None:
                return exchange_name, key, []
            return exchange_name, key, list(self.route(exchange, key, None)[0])

        return route

    # -- views -----------------------------------------------------------------------

    def views(self) -> tuple[list[ExchangeView], list[BindingView], list[DeclaredQueueView]]:
        """The exchanges (the default one not listed), bindings and declared queues,
        by name, as frozen values for the console."""
        exchanges = [self.exchanges[n] for n in sorted(self.exchanges)]
        return ([exchange_view(e) for e in exchanges],
                [binding_view(b) for e in exchanges for b in e.bindings],
                [declared_view(self.declared[n]) for n in sorted(self.declared)])

    def default_reach(self) -> int:
        """How many queues the default exchange reaches by name: every queue of the
        queue manager a routing key can name (``$queue/`` ones made by MQTT or AMQP
        1.0 too, not only 0.9.1-declared ones; ``$dlq/`` queues are not reached)."""
        return sum(1 for name in self.queues.queues if name[:1] != "$")

    # -- restart ---------------------------------------------------------------------

    def restore(self, snapshot: Snapshot) -> None:
        """Durable exchanges, bindings and declared queues as stored, after the
        queue manager's restore (bindings whose ends are gone are left out)."""
        self.restore_queues(snapshot.queues)
        for e in snapshot.exchanges:
            if e.name not in self.exchanges:
                self.exchanges[e.name] = Exchange(e.name, e.kind, True, e.auto_delete,
                                                  e.internal, tuple(e.arguments),
                                                  self._match_budget)
        for b in snapshot.bindings:
            source = self.exchanges.get(b.source)
            ends = self.exchanges if b.to_exchange else self.queues.queues
            if source is None or b.destination not in ends:
                continue
            binding = Binding(b.source, b.destination, b.to_exchange, b.routing_key,
                              tuple(b.arguments))
            if source.add(binding):
                self.bound_to.setdefault(b.destination, {})[binding] = None
                self.binding_count += 1
                self._bindings_changed(source)

    # -- helpers ---------------------------------------------------------------------

    def _persist(self, ops: list[Op]) -> Deferred[None] | None:
        return self.queues.commits.persist(ops)

    def _at_bound(self, what: str, option: str, bound: int) -> ChannelError:
        """A declare or bind past a bound: counted (also as ``$SYS/broker/limits/
        max_exchanges`` / ``max_bindings``), one log line a minute, 406."""
        self.refused += 1
        self._stats.limit_hit(option.replace("-", "_"))
        option = "--" + option
        suppressed = self._log_limit.allow("exchanges:" + what)
        if suppressed is not None:
            self.log.warn("AMQP 0.9.1: too many {w} ({o} {b}): declare refused ({h} more "
                          "refusals like it since the last line)",
                          w=what, o=option, b=bound, h=suppressed)
        return ChannelError(PRECONDITION_FAILED, f"too many {what} ({option} {bound})")


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return f"'{str(value).lower()}'"
    if value is None:
        return "none"
    return f"'{value}'"


def _published_key(name: str, message: Message, envelope: Envelope | None) -> str:
    """The routing key message of queue ``name`` was published with, as RabbitMQ
    dead-letters it: the key an earlier dead-lettering gave it; a 0.9.1 publisher's
    key (``envelope``, the one ``Exchanges.attach_envelope`` took); else the key its
    topic in the queue says, as a 0.9.1 consumer sees it (through ``amq.topic`` that
    is the MQTT topic: ``a/b`` is ``a.b``), or the queue's name for none."""
    props = message.props
    if props is not None and props.user_properties:
        for k, v in props.user_properties:
            if k == "dead-letter-routing-key":
                return v
    if message.amqp091 is not None and envelope is not None:
        sent = envelope(message)
        if sent is not None:
            return sent[1]
    rest = message.topic[len(QUEUE_PREFIX) + len(name) + 1:]
    return rest.replace("/", ".") if rest else name
