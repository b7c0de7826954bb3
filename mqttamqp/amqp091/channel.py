"""One AMQP 0.9.1 channel: its methods carried out against the broker.

What it owns: the channel's states (open, closing after a channel error, closed),
its consumers and their delivery tags, prefetch (``basic.qos``), acknowledgements
(``basic.ack``/``nack``/``reject``/``recover``: the core's settlement: ack is
Accepted, a requeue Modified with delivery-failed, counted as RabbitMQ counts it,
no requeue Rejected, which dead-letters), publishing (``basic.publish`` with its
content, ``mandatory`` returns, ``immediate`` refused with 540, ``user-id`` checked)
and publisher confirms (``confirm.select``; which publishes are kept, and the
``basic.ack``/``nack`` that say so, are ``confirms``'s).
In tx mode (``tx``: ``transactions``) publishes and acknowledgements are held
until ``tx.commit`` rather than carried out.
Queue and exchange methods go to the 0.9.1 model (``Broker.exchanges``:
``methods``); its ``ChannelError`` becomes ``channel.close`` (or
``connection.close``) in the connection; what each needs is ``permissions``'s
to check.  ``basic.get`` hands the next message
to the channel's own session, in no consumer group (``Exchanges.get``).

What it must not do: parse frames (``frames``), hold routing or queue rules, or
write to the socket (the connection does).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import replace
from typing import Any

from pamqp import commands
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqttamqp.amqp091.confirms import PublisherConfirms
from mqttamqp.amqp091.consumers import QueueConsumer
from mqttamqp.amqp091.frames import Content, deliver_frames
from mqttamqp.amqp091.hosts import ChannelHost
from mqttamqp.amqp091.methods import MODEL_METHODS
from mqttamqp.amqp091.permissions import (
    READ,
    check_publish,
    check_queue,
    consumer_identity,
)
from mqttamqp.amqp091.properties import PropertyError, for_consumer, opened, published_form
from mqttamqp.amqp091.transactions import TX_METHODS, ChannelTransactions
from mqttamqp.core.commits import CommitRound, Durable
from mqttamqp.core.exchanges.errors import (
    ACCESS_REFUSED,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    ChannelError,
)
from mqttamqp.core.exchanges.exchanges import Exchanges
from mqttamqp.core.message import Message
from mqttamqp.core.routing.settlement import Outcome

__all__ = ["Channel"]

B, C = commands.Basic, commands.Confirm
_NO_PROPS = b"\x00\x00"


class Channel(PublisherConfirms):
    """An open channel of a connection."""

    def __init__(self, connection: ChannelHost, number: int) -> None:
        self.connection = connection
        self.number = number
        self.closing = False           # ended: nothing more is sent on it
        self.flow_active = True
        self.consumers: dict[str, QueueConsumer] = {}
        # delivery tag -> (consumer, packet id of its session); insertion order is
        # tag order (``multiple``)
        self.unacked: OrderedDict[int, tuple[QueueConsumer, int]] = OrderedDict()
        self.next_tag = 1
        self.prefetch = 0              # basic.qos global=false: for new consumers
        self.global_prefetch = 0       # basic.qos global=true: the channel's
        self.confirming = False
        self.tx: ChannelTransactions | None = None   # tx.select: ``transactions``
        self.publish_seq = 0
        self.confirms: OrderedDict[int, bool | None] = OrderedDict()
        self._ack_due = 0              # the confirm ack not yet sent (``_confirmed``)
        # The commit round the last publishes wait on, and their numbers.
        self._round: CommitRound | None = None
        self._round_seqs: list[int] = []
        self._tags = 0
        # answers waiting for a commit, and those behind them (in method order)
        self._answers: deque[list[Any]] = deque()
        # basic.get's own session, and what the model handed it (``basic_get``)
        self.getter: QueueConsumer | None = None
        self._got: tuple[int, bool, str, str, bytes, bytes] | None = None

    # -- limits ----------------------------------------------------------------------

    def at_limit(self) -> bool:
        held = len(self.unacked) + (self.tx.held if self.tx is not None else 0)
        limit = self.global_prefetch
        return (limit and held >= limit) or held >= self.connection.max_unacked

    # -- methods ---------------------------------------------------------------------

    def handle(self, method: Any) -> None:
        name = method.name
        handler = _HANDLERS.get(name) or MODEL_METHODS.get(name) or TX_METHODS.get(name)
        if handler is None:
            raise ChannelError(503, f"{name} is not a method a client sends")
        handler(self, method)

    def _send(self, method: Any) -> None:
        self.connection.send_method(self.number, method)

    @property
    def exchanges(self) -> Exchanges:
        return self.connection.broker.exchanges

    def answer(self, method: Any, durable: Deferred[None] | None) -> None:
        """Send ``method`` (None: nothing, a nowait method) once ``durable`` has
        fired and every answer before it has gone."""
        answers = self._answers
        if durable is None and not answers:
            if method is not None:
                self._send(method)
            return
        entry = [durable is None, method]
        answers.append(entry)
        if durable is not None:
            durable.addCallbacks(self._answered, self._answer_failed,
                                 callbackArgs=(entry,))

    def _answered(self, _: object, entry: list[Any]) -> None:
        entry[0] = True
        answers = self._answers
        while answers and answers[0][0]:
            method = answers.popleft()[1]
            if method is not None and not self.closing:
                self._send(method)

    def _answer_failed(self, failure: Failure) -> None:
        self.connection.log.failure("storing a 0.9.1 declaration failed", failure)
        self._answers.clear()
        self.connection.fail(541, "INTERNAL_ERROR - storage failure")

    def basic_qos(self, m: Any) -> None:
        if m.prefetch_size:
            raise ChannelError(NOT_IMPLEMENTED, "prefetch_size other than 0")
        if m.global_:
            self.global_prefetch = m.prefetch_count
            for member in self.consumers.values():   # (their queue-side caps follow)
                member.apply_prefetch()
        else:
            self.prefetch = m.prefetch_count
        self._send(B.QosOk())
        self._wake_all()

    def basic_consume(self, m: Any) -> None:
        tag = m.consumer_tag
        if not tag:
            self._tags += 1
            tag = f"amq.ctag-{self.connection.serial}.{self.number}.{self._tags}"
        if tag in self.consumers:
            raise ChannelError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        topic_filter, consumer = self.exchanges.consumer_filter(
            m.queue, self.connection.key, m.arguments)
        # (its unacknowledged deliveries stay with the channel, as RabbitMQ's)
        consumer = replace(consumer, held=True)
        self._may_read(m.queue)
        factory = self.connection.factory
        holder = factory.exclusive.get(m.queue)
        if holder is not None and not holder.closed:
            raise ChannelError(ACCESS_REFUSED, f"queue '{m.queue}' in vhost '/' in "
                               "exclusive use")
        if m.exclusive and factory.consumers_of(m.queue):
            raise ChannelError(ACCESS_REFUSED, f"cannot obtain exclusive access to queue "
                               f"'{m.queue}' in vhost '/'")
        member = QueueConsumer(self, tag, m.queue, m.no_ack, self.prefetch)
        # Joined first: a refusal (read was checked above, so the queue's own rules:
        # a bad x-stream-offset, say) leaves no consumer and no exclusive lock.
        if not member.join(topic_filter, consumer, consumer_identity(self.connection,
                                                                     m.queue)):
            raise ChannelError(PRECONDITION_FAILED, f"cannot consume from queue "
                               f"'{m.queue}' in vhost '/' with these arguments")
        self.consumers[tag] = member
        if m.exclusive:
            factory.exclusive[m.queue] = member
        if not m.nowait:
            self._send(B.ConsumeOk(tag))
        member.start()   # (deliveries after consume-ok)
        self.exchanges.consumer_added(m.queue)

    def _may_read(self, queue: str) -> None:
        """Consuming and getting need read permission on the queue (``permissions``)."""
        check_queue(self.connection, READ, queue)

    def basic_get(self, m: Any) -> None:
        """``basic.get``: the model hands the next message to the channel's own
        session (``getter``, subscribed to nothing) at once: get-ok with the count
        left, or get-empty.  Reading needs read permission on ``$queue/<name>``."""
        connection = self.connection
        self._may_read(m.queue)
        member = self.getter
        if member is None:
            member = self.getter = QueueConsumer(self, "", m.queue, False, 0, getter=True)
            member.open_alone()
        member.queue = m.queue
        session = member.session
        assert session is not None   # (a getter's ends with its channel)
        self._got = None
        member.answering = True
        try:
            _, left = self.exchanges.get(m.queue, session, connection.key, m.no_ack)
        finally:
            member.answering = False
        got, self._got = self._got, None
        if got is None:
            self._send(B.GetEmpty())
            return
        tag, redelivered, exchange, key, props, payload = got
        connection.send_content(self.number, B.GetOk(tag, redelivered, exchange, key, left),
                                props, payload)

    def basic_cancel(self, m: Any) -> None:
        member = self.consumers.pop(m.consumer_tag, None)
        if member is not None:
            self._cancel(member, keep_unacked=True)
        if not m.nowait:
            self._send(B.CancelOk(m.consumer_tag))

    def _cancel(self, member: QueueConsumer, keep_unacked: bool = False) -> None:
        member.cancel(keep_unacked)
        exclusive = self.connection.factory.exclusive
        if exclusive.get(member.queue) is member:
            del exclusive[member.queue]
        if not member.getter:
            d = self.exchanges.consumer_cancelled(member.queue)
            if d is not None:
                log = self.connection.log
                d.addErrback(lambda f: log.failure("deleting an auto-delete queue", f))

    def cancelled_by_broker(self, member: QueueConsumer) -> None:
        exclusive = self.connection.factory.exclusive
        if exclusive.get(member.queue) is member:
            del exclusive[member.queue]
        if self.consumers.get(member.tag) is member:
            del self.consumers[member.tag]
            if self.connection.cancel_notify and not self.closing:
                self._send(B.Cancel(member.tag, nowait=True))

    def basic_publish(self, m: Any) -> None:
        if m.immediate:
            raise ChannelError(NOT_IMPLEMENTED, "immediate=true")
        self.connection.assembler(self).start(m)

    def published(self, content: Content) -> None:
        """A ``basic.publish`` with its content, assembled."""
        m, props = content.method, content.properties
        connection = self.connection
        if props.user_id is not None and props.user_id != (connection.username or ""):
            raise ChannelError(PRECONDITION_FAILED, f"user_id property set to "
                               f"'{props.user_id}' but authenticated user was "
                               f"'{connection.username or ''}'")
        exchange, key = m.exchange, m.routing_key
        try:   # (the default exchange's: the topic it has in its queue, no copy there)
            core_props, qos, sent, priority, topic = published_form(
                props, exchange, key, content.raw_properties)
        except PropertyError as exc:
            raise ChannelError(PRECONDITION_FAILED, str(exc)) from None
        check_publish(connection, exchange, key)
        message = Message(topic, content.body, qos, False, connection.client_id,
                          connection.clock.seconds(), False, None, False, core_props, sent,
                          priority)
        if self.tx is not None:
            self.tx.publish(message, content)    # (routed at tx.commit)
            return
        seq = 0
        if self.confirming:
            self.publish_seq = seq = self.publish_seq + 1
            self.confirms[seq] = None
        durable = self._routed(message, content, bool(seq))
        if seq:
            if durable is None:
                self._confirmed(None, seq, True)
            elif isinstance(durable, CommitRound):
                self._confirm_in_round(durable, seq)
            else:
                durable.addCallbacks(self._confirmed, self._confirm_failed,
                                     callbackArgs=(seq, True), errbackArgs=(seq,))

    def route(self, message: Message, content: Content) -> Deferred[None] | None:
        """Route a publish now (a ``mandatory`` one no queue took comes back): the
        Deferred of its durable copies."""
        durable = self._routed(message, content, False)
        assert not isinstance(durable, CommitRound)
        return durable

    def _routed(self, message: Message, content: Content, in_round: bool) -> Durable:
        """``route``; ``in_round``: a copy to one queue may be waited on as the
        batch's ``CommitRound`` (``Exchanges.publish``)."""
        m, props, connection = content.method, content.properties, self.connection
        exchanges = connection.broker.exchanges
        routed, durable = exchanges.publish(
            message, m.exchange, m.routing_key, props.headers, connection.client_id,
            m.mandatory, connection.identity, in_round)
        congested = exchanges.congested
        if congested:
            connection.fed_congested(congested)
        if connection.broker.queues.alarm.paused:
            connection.factory.watch_alarm(connection)
        if not routed and m.mandatory:
            connection.send_content(self.number, B.Return(312, "NO_ROUTE", m.exchange,
                                                          m.routing_key),
                                    content.raw_properties or props.marshal(),
                                    content.body)
        return durable

    def confirm_select(self, m: Any) -> None:
        if self.tx is not None:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirming = True
        if not m.nowait:
            self._send(C.SelectOk())

    # -- deliveries ------------------------------------------------------------------

    def deliver(self, member: QueueConsumer, message: Message, packet_id: int | None,
                dup: bool) -> None:
        connection = self.connection
        if member.getter and not member.answering:
            # (never: a getter is congested unless a basic.get is answered)
            _undeliverable(self, member, packet_id, Failure(RuntimeError(
                "a delivery to basic.get's session outside basic.get")), Outcome.RELEASED)
            return
        tag = self.next_tag
        dropped: list[str] | None = None
        try:
            # (built before the tag is taken: what cannot be encoded takes none)
            sent = message.amqp091
            if sent is not None and message.props is None:
                # (no core properties: as sent, ``for_consumer``'s answer without it)
                exchange, key, props = opened(sent)
                redelivered = bool(message.dup)
            else:
                dropped = []
                props, redelivered, exchange, key = for_consumer(
                    message, member.queue, connection.clock.seconds(), dropped)
            frames = None if member.getter else deliver_frames(
                self.number, member.tag, tag, redelivered or dup, exchange, key, props,
                message.payload, connection.frame_max)
        except Exception:
            _undeliverable(self, member, packet_id, Failure())
            return
        if dropped:
            _note_dropped(connection, dropped)
        self.next_tag = tag + 1
        if packet_id is not None:
            unacked = self.unacked
            unacked[tag] = (member, packet_id)
            if len(unacked) == connection.max_unacked:
                connection.unacked_bound()
        if frames is None:
            self._got = (tag, redelivered or dup, exchange, key, props, message.payload)
        else:
            connection.send_frames(frames)
        connection.messages_out += 1
        connection.meter.delivered_amqp091(message.timestamp)

    def _settle(self, tag: int, multiple: bool, outcome: Outcome, failed: bool,
                held: bool = True) -> None:
        # (as RabbitMQ's collect_acks: the tag must be outstanding, multiple or not;
        # tag 0 with multiple is every outstanding one.  Checked before anything is
        # settled: the error closes the channel, which requeues the rest)
        unacked = self.unacked
        if tag in unacked:
            tags = [t for t in unacked if t <= tag] if multiple else [tag]
        elif multiple and not tag:
            tags = list(unacked)
        else:
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        if held and self.tx is not None:   # (applied at tx.commit)
            self.tx.settle([(t, unacked.pop(t)) for t in tags], outcome, failed)
        else:
            self.settle_taken([unacked.pop(t) for t in tags], outcome, failed)

    def settle_taken(self, taken: list[tuple[QueueConsumer, int]], outcome: Outcome,
                     failed: bool) -> None:
        """Settle deliveries taken off ``unacked`` with the core."""
        broker = self.connection.broker
        woken: set[QueueConsumer] = set()
        if outcome is Outcome.ACCEPTED:
            # (one call for the lot: the core pumps once a basic.ack, not once a tag)
            broker.settlement.accept_many([(session, packet_id) for member, packet_id in taken
                                if (session := member.session) is not None])
            for member, _ in taken:
                # (``QueueConsumer.settled``, inline: after the core heard it, a
                # cancelled consumer may leave with its last)
                member.unacked -= 1
                if member.closed and member.unacked <= 0:
                    member.leave()
                woken.add(member)
            taken = []
        for member, packet_id in taken:
            session = member.session
            if session is not None:
                broker.settle(session, packet_id, outcome, failed,
                              "rejected by the consumer" if outcome is Outcome.REJECTED
                              else None)
            member.settled()   # (after: a cancelled consumer may leave with its last)
            woken.add(member)
        if self.global_prefetch:
            self._wake_all()
        else:
            for member in woken:
                member.wake()

    def basic_ack(self, m: Any) -> None:
        self._settle(m.delivery_tag, m.multiple, Outcome.ACCEPTED, False)

    def basic_nack(self, m: Any) -> None:
        self._settle(m.delivery_tag, m.multiple,
                     Outcome.MODIFIED if m.requeue else Outcome.REJECTED, True)

    def basic_reject(self, m: Any) -> None:
        self._settle(m.delivery_tag, False,
                     Outcome.MODIFIED if m.requeue else Outcome.REJECTED, True)

    def basic_recover(self, m: Any) -> None:
        if self.unacked:
            self._settle(0, True, Outcome.RELEASED, False, held=False)
        if isinstance(m, B.Recover):
            self._send(B.RecoverOk())

    def channel_flow(self, m: Any) -> None:
        self.flow_active = bool(m.active)
        self._send(commands.Channel.FlowOk(self.flow_active))
        self._wake_all()

    def _wake_all(self) -> None:
        for member in list(self.consumers.values()):
            member.wake()

    # -- the end ---------------------------------------------------------------------

    def end(self) -> None:
        """The channel is gone (close, close-ok, the connection's end): its
        consumers leave their groups; what they held unacknowledged the queue
        gives to others (redelivered)."""
        self.closing = True    # (a commit firing later answers nothing on it)
        if self.tx is not None:
            self.tx.end()      # (an open transaction rolls back)
        for member in list(self.consumers.values()):
            self._cancel(member)
        if self.getter is not None:
            self.getter.cancel()
            self.getter = None
        self.consumers.clear()
        self._answers.clear()
        _release(self.unacked)
        self.confirms.clear()

    def info(self) -> dict[str, Any]:
        return {"number": self.number, "consumers": [c.info() for c in self.consumers.values()],
                "unacked": len(self.unacked), "prefetch": self.prefetch,
                "global_prefetch": self.global_prefetch, "confirming": self.confirming}



def _release(unacked: OrderedDict[int, tuple[QueueConsumer, int]]) -> None:
    """The channel ended: its unacknowledged deliveries go back to their queues (a
    consumer cancelled while it held some leaves its group now)."""
    for member, _packet_id in unacked.values():
        member.leave()
    unacked.clear()


def _note_dropped(connection: ChannelHost, names: list[str]) -> None:
    """A delivery left out what 0.9.1 cannot carry (a property over 255 bytes, a
    header name over 128): counted, one log line a minute."""
    connection.meter.limit_hit("amqp091_property_dropped")
    held = connection.factory.log_limit.allow("property dropped")
    if held is not None:
        connection.log.info("AMQP 0.9.1 connection from {peer}: a delivery left out "
                            "{names}, too long for 0.9.1{more}", peer=connection.peer,
                            names=", ".join(names),
                            more=f" ({held} more since the last line)" if held else "")


def _undeliverable(channel: Channel, member: QueueConsumer, packet_id: int | None,
                   failure: Failure, outcome: Outcome = Outcome.REJECTED) -> None:
    """A message 0.9.1 cannot encode (or an internal error): never raised into the
    core's delivery; settled with ``outcome`` (rejected: as ``basic.reject``) on
    the next turn, counted, one log line a minute."""
    connection = channel.connection
    connection.meter.limit_hit("amqp091_undeliverable")
    held = connection.factory.log_limit.allow("undeliverable")
    if held is not None:
        connection.log.warn(
            "AMQP 0.9.1 connection from {peer}: a message on queue {queue} cannot "
            "be delivered ({why}); {outcome}{more}", peer=connection.peer,
            outcome=outcome.value, queue=member.queue, why=failure.getErrorMessage(),
            more=f" ({held} more since the last line)" if held else "")
    if packet_id is not None:
        member.settled()
        connection.clock.callLater(0, _settle_undelivered, connection, member, packet_id,
                                   outcome)


def _settle_undelivered(connection: ChannelHost, member: QueueConsumer, packet_id: int,
                        outcome: Outcome) -> None:
    # (a turn later: settling inside the core's delivery would re-enter it)
    session = member.session
    if session is not None and packet_id in session.inflight:
        connection.broker.settle(session, packet_id, outcome, outcome is Outcome.REJECTED,
                                 "cannot be encoded for AMQP 0.9.1")


_HANDLERS: dict[str, Any] = {
    "Basic.Get": Channel.basic_get,
    "Basic.Qos": Channel.basic_qos,
    "Basic.Consume": Channel.basic_consume,
    "Basic.Cancel": Channel.basic_cancel,
    "Basic.Publish": Channel.basic_publish,
    "Basic.Ack": Channel.basic_ack,
    "Basic.Nack": Channel.basic_nack,
    "Basic.Reject": Channel.basic_reject,
    "Basic.Recover": Channel.basic_recover,
    "Basic.RecoverAsync": Channel.basic_recover,
    "Confirm.Select": Channel.confirm_select,
    "Channel.Flow": Channel.channel_flow,
}
