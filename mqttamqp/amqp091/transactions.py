"""AMQP 0.9.1's ``tx`` class on the core's local transactions (issue 30).

What it owns: a channel's tx mode (``tx.select``; 406 on a confirm channel, and
``confirm.select`` on a tx channel is the channel's 406), the one open
``Transaction`` (core/transactions.py) of a transactional channel, and what
goes into it: a publish as the channel's own routing call (``Channel.route``),
run at commit, so a ``mandatory`` return comes then, before commit-ok; an
acknowledgement (``basic.ack``/``nack``/``reject``) as the settle of the
delivery tags it took off the channel, which a rollback puts back (the messages
stay unacknowledged on the channel, as RabbitMQ's).  ``tx.commit`` answers
commit-ok once all of it is durable and opens the channel's next transaction at
once; ``tx.rollback`` drops the work; ``tx.commit``/``tx.rollback`` without
``tx.select`` are 406.  A channel's end rolls its transaction back.  The bounds
are the core's: ``--max-transactions-per-connection`` (transactional channels
of a connection, at ``tx.select``) and ``--max-transaction-bytes`` (work held
until commit): over one, the channel closes with 406 and the reason.

What it must not do: route or settle anything before commit (nothing of an open
transaction touches the broker's state), or write to the socket other than
through the channel and its connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from pamqp import commands
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqttamqp.amqp091.frames import Content
from mqttamqp.amqp091.hosts import TxHost
from mqttamqp.core.exchanges.errors import ACCESS_REFUSED, PRECONDITION_FAILED, ChannelError
from mqttamqp.core.exchanges.topicspace import PublishRefused
from mqttamqp.core.message import Message
from mqttamqp.core.routing.settlement import Outcome
from mqttamqp.core.transactions import PartiallyApplied, Transaction, TransactionRefused

__all__ = ["TX_METHODS", "ChannelTransactions"]

Tx = commands.Tx
# (delivery tag, (its QueueConsumer, packet id)): what the ack took off ``unacked``
Taken = list[tuple[int, tuple[Any, int]]]
# (delivery tag, the consumer's session then, packet id, ``Settlement.hold``'s token)
Held = list[tuple[int, Any, int, Any]]


class ChannelTransactions:
    """A transactional channel's open transaction and what it holds."""

    __slots__ = ("channel", "held", "tx")

    def __init__(self, channel: TxHost) -> None:
        self.channel = channel
        self.held = 0                    # delivery tags acked in the open transaction
        self.tx = self._open()

    def _open(self) -> Transaction:
        channel = self.channel
        try:
            return channel.connection.broker.transactions.open(channel.connection)
        except TransactionRefused as exc:
            raise ChannelError(PRECONDITION_FAILED, exc.reason) from None

    # -- work held until commit ----------------------------------------------------

    def publish(self, message: Message, content: Content) -> None:
        """Hold a publish; the exchange is checked now (404, internal: 403), as an
        unheld publish would be."""
        name = content.method.exchange
        if name and self.channel.exchanges.exchange(name).internal:
            raise ChannelError(ACCESS_REFUSED, f"cannot publish to internal exchange "
                               f"'{name}'")
        try:
            # (all of what is stored: the body and the properties as sent)
            self.tx.add_publish(len(content.body) + len(content.raw_properties or b""),
                                partial(self._route, message, content),
                                partial(self._publish_check, message, content))
        except TransactionRefused as exc:
            raise ChannelError(PRECONDITION_FAILED, exc.reason) from None

    def _publish_check(self, message: Message, content: Content) -> str | None:
        """Asked before the commit runs anything: every queue the publish routes to
        still takes it (x-overflow reject-publish), the transaction's earlier
        publishes counted.  An exchange gone is no refusal: the publish is
        unroutable then (``_route``)."""
        channel = self.channel
        m = content.method
        queues = channel.connection.broker.queues
        if m.exchange == "":
            targets: Iterable[str] = (m.routing_key,)
        else:
            exchanges = channel.exchanges
            try:
                source = exchanges.exchange(m.exchange)
            except ChannelError:
                return None
            targets = exchanges.route(source, m.routing_key, content.properties.headers)[0]
        planned = self.tx.planned
        for name in targets:
            if name[:1] != "$" and name in queues.queues:
                problem = queues.room_problem(name, message, planned)
                if problem is not None:
                    return problem
        return None

    def _route(self, message: Message, content: Content) -> Deferred[None] | None:
        channel = self.channel
        try:
            return channel.route(message, content)
        except ChannelError:
            # The exchange went away before the commit: unroutable, as RabbitMQ
            # (it routes at commit what the publish named).
            m = content.method
            if m.mandatory and not channel.closing:
                channel.connection.send_content(
                    channel.number, commands.Basic.Return(312, "NO_ROUTE", m.exchange,
                                                          m.routing_key),
                    content.raw_properties or content.properties.marshal(), content.body)
            return None

    def settle(self, taken: Taken, outcome: Outcome, failed: bool) -> None:
        """Hold the settlement of deliveries ``taken`` off the channel's unacked;
        the commit checks they are still the channel's deliveries."""
        broker = self.channel.connection.broker
        held: Held = [(tag, session, packet_id, broker.settlement.hold(session, packet_id)
                       if session is not None else None)
                      for tag, (member, packet_id) in taken
                      for session in (member.session,)]
        try:
            self.tx.add_settle(partial(self._settle, taken, outcome, failed, held),
                               partial(self._undo, taken, held), partial(self._check, held))
        except TransactionRefused as exc:
            self._unhold(held)
            self._restore(taken)
            raise ChannelError(PRECONDITION_FAILED, exc.reason) from None
        self.held += len(taken)

    def _check(self, held: Held) -> str | None:
        """Why one of the deliveries held can no longer be settled (RabbitMQ's
        words for a tag that is not the channel's)."""
        delivery_held = self.channel.connection.broker.settlement.still_held
        for tag, session, packet_id, token in held:
            if session is None or not delivery_held(session, packet_id, token):
                return f"unknown delivery tag {tag}"
        return None

    def _unhold(self, held: Held) -> None:
        unhold = self.channel.connection.broker.settlement.unhold
        for _, _, _, token in held:
            unhold(token)

    def _settle(self, taken: Taken, outcome: Outcome, failed: bool, held: Held) -> None:
        self.held -= len(taken)
        self._unhold(held)
        self.channel.settle_taken([entry for _, entry in taken], outcome, failed)

    def _undo(self, taken: Taken, held: Held) -> None:
        self.held -= len(taken)
        self._unhold(held)
        self._restore(taken)

    def _restore(self, taken: Taken) -> None:
        """The deliveries are the channel's, unacknowledged, again (in tag order).
        When the channel has ended, their consumers leave instead, which gives
        them back to the queue: one cancelled before the ack is no longer among
        the channel's consumers, and is not in its ``unacked`` either, so nothing
        else would end it (its session would hold them for ever)."""
        channel = self.channel
        if channel.closing:
            for _tag, (member, _packet_id) in taken:
                member.leave()
            return
        unacked = channel.unacked
        unacked.update(taken)
        ordered = sorted(unacked.items())
        unacked.clear()
        unacked.update(ordered)

    # -- commit, rollback, the end -------------------------------------------------

    def commit(self) -> None:
        channel = self.channel
        tx = self.tx
        if tx.doomed is not None:
            raise ChannelError(PRECONDITION_FAILED, tx.doomed)
        done = tx.commit()
        self.tx = self._open()
        answered: Deferred[None] = Deferred()
        done.addCallbacks(answered.callback, self._commit_failed)
        channel.answer(Tx.CommitOk(), answered)

    def _commit_failed(self, failure: Failure) -> None:
        channel = self.channel
        connection = channel.connection
        if channel.closing:
            return
        if failure.check(TransactionRefused):
            # (refused before any of its work ran: RabbitMQ's 406 for a tag that is
            # not the channel's)
            connection.close_channel(channel, ChannelError(
                PRECONDITION_FAILED, f"tx.commit failed: {failure.getErrorMessage()} "
                "(nothing of it was applied)"))
            return
        if failure.check(PartiallyApplied, PublishRefused):
            connection.close_channel(channel, ChannelError(
                PRECONDITION_FAILED, f"tx.commit failed: {failure.getErrorMessage()} "
                "(the rest of the commit was applied)"))
            return
        connection.log.failure("committing an AMQP 0.9.1 transaction failed", failure)
        connection.fail(541, "INTERNAL_ERROR - storage failure")

    def rollback(self) -> None:
        self.tx.rollback()
        self.tx = self._open()
        self.channel.answer(Tx.RollbackOk(), None)

    def end(self) -> None:
        """The channel ended: its open transaction rolls back."""
        self.tx.rollback()

    def info(self) -> tuple[int, int, int]:
        """The open transaction's publishes, acknowledgements and bytes held."""
        tx = self.tx
        return tx.publishes, tx.settles, tx.size


def tx_select(channel: TxHost, m: Any) -> None:
    if channel.confirming:
        raise ChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
    if channel.tx is None:
        channel.tx = ChannelTransactions(channel)
    channel.answer(Tx.SelectOk(), None)


def _transactional(channel: TxHost) -> ChannelTransactions:
    tx: ChannelTransactions | None = channel.tx
    if tx is None:
        raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")
    return tx


def tx_commit(channel: TxHost, m: Any) -> None:
    _transactional(channel).commit()


def tx_rollback(channel: TxHost, m: Any) -> None:
    _transactional(channel).rollback()


TX_METHODS: dict[str, Any] = {
    "Tx.Select": tx_select,
    "Tx.Commit": tx_commit,
    "Tx.Rollback": tx_rollback,
}
