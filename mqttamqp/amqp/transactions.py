"""AMQP 1.0 local transactions (part 4 of the specification) on the core's
``Broker.transactions``: the coordinator link and what a transactional transfer or
disposition does.

What it owns: ``Coordinator``, the link a peer attaches to a target of type
coordinator (capability ``amqp:local-transactions``): ``declare`` answers
``declared`` with a new txn-id (or Rejected with amqp:resource-limit-exceeded over
``--max-transactions-per-connection``), ``discharge`` commits (Accepted once all
of the transaction is durable; Rejected with amqp:transaction:rollback when it
cannot commit, nothing of it applied, or with amqp:internal-error "partially
applied" when it failed once its work ran) or rolls back (fail=true), an unknown
txn-id gets
amqp:transaction:unknown-id; the link's end rolls back its open transactions (and
so does the connection's, which ends its links).  ``hold_transfer``: a transfer
whose state is transactional-state is held in its transaction (answered at once
with transactional-state(Accepted)) and routed at commit, after a check that it
may still be (permission, queue room).  ``hold_outcome``: a disposition with
transactional-state on a delivery the broker sent is applied at commit (the
delivery stays claimed until then, also past its link's end for a queue's, and
is checked to be the same delivery first), and a rollback releases it.
One log line per cause (``Transactions.warn``).

What it must not do: hold transaction rules (the core's ``transactions`` does),
decide what a message means (``publisher`` builds it) or pump the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from proton import Condition, Delivery, Described, Message, symbol, ulong
from twisted.internet.defer import Deferred, fail
from twisted.python.failure import Failure

from mqttamqp.amqp.incoming import IncomingLink
from mqttamqp.amqp.links import (
    ACCEPTED,
    DECODE_ERROR,
    MODIFIED,
    NO_OUTCOME,
    REJECTED,
    RELEASED,
    TRANSACTIONAL,
    UNAUTHORIZED,
    LinkHost,
    OutgoingLink,
)
from mqttamqp.core.broker import Broker
from mqttamqp.core.message import Message as CoreMessage
from mqttamqp.core.queues.addresses import QUEUED
from mqttamqp.core.routing.published import Published
from mqttamqp.core.routing.settlement import Outcome
from mqttamqp.core.transactions import PartiallyApplied, Transaction, TransactionRefused
from mqttamqp.net.rawproton import decref, delivery_settle, delivery_settled, incref


class HoldingLink(Protocol):
    """What ``hold_transfer`` needs of the sender link (``publisher.TopicPublisher``)."""

    host: LinkHost
    broker: Broker
    address: str
    closed: bool

    def reject(self, dlv: Any, condition: str, description: str) -> None: ...

    def routed(self, result: Published, routed: CoreMessage) -> None: ...

    outstanding: int
    second: bool
    rejected: int

    def answer(self, dlv: Any, state: int, condition: tuple[str, str] | None = None
               ) -> None: ...

    def answered(self) -> None: ...

__all__ = ["Coordinator", "LOCAL_TRANSACTIONS", "hold_outcome", "hold_transfer",
           "transactional_state"]

LOCAL_TRANSACTIONS = "amqp:local-transactions"
DECLARED = 0x33
_DECLARE = (symbol("amqp:declare:list"), 0x31)
_DISCHARGE = (symbol("amqp:discharge:list"), 0x32)
UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"
INTERNAL_ERROR = "amqp:internal-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
_OUTCOMES = (ACCEPTED, REJECTED, RELEASED, MODIFIED)
_CORE_OUTCOMES: dict[int, Outcome] = {ACCEPTED: Outcome.ACCEPTED, REJECTED: Outcome.REJECTED,
                  RELEASED: Outcome.RELEASED, MODIFIED: Outcome.MODIFIED}
_OUTCOME_NAMES = {"amqp:accepted:list": ACCEPTED, "amqp:rejected:list": REJECTED,
                  "amqp:released:list": RELEASED, "amqp:modified:list": MODIFIED}


def _discharge_fields(message: Any) -> tuple[bytes | None, bool]:
    """A discharge's txn-id (copied: None if it is not binary) and its fail flag.
    proton gives a binary as a memoryview into the decoded message's own memory, so
    it is copied here, while ``message`` is certainly alive: compiled, the caller's
    last reference to it could go before the copy if the caller made it."""
    fields = message.body.value
    txn: Any = fields[0] if fields else None   # (Any: proton's annotation says bytes)
    return (bytes(txn) if isinstance(txn, (bytes, memoryview)) else None,
            bool(fields[1]) if len(fields) > 1 else False)


def transactional_state(dlv: Any) -> tuple[bytes, int | None, list[Any]] | None:
    """The peer's transactional-state on ``dlv``: its txn-id, the outcome's code
    (None: no outcome) and the outcome's fields; None if it does not decode."""
    try:
        data = Delivery.wrap(dlv).remote.data  # type: ignore[no-untyped-call]
    except (UnicodeDecodeError, KeyError, TypeError, ValueError):
        return None
    if not data:
        return None
    txn = data[0]
    if not isinstance(txn, (bytes, memoryview)):
        return None
    outcome = data[1] if len(data) > 1 else None
    if outcome is None:
        return bytes(txn), None, []
    if not isinstance(outcome, Described):
        return None
    fields = outcome.value if isinstance(outcome.value, list) else []
    descriptor = outcome.descriptor
    code = (_OUTCOME_NAMES.get(str(descriptor)) if isinstance(descriptor, str)
            else descriptor if isinstance(descriptor, int) else None)
    if code is None:
        return None
    return bytes(txn), code, fields


def _txn_label(txn: bytes) -> str:
    return txn.hex() if len(txn) <= 32 else txn[:32].hex() + "..."


def _lookup(host: LinkHost, txn: bytes) -> Transaction | None:
    txns = host.txns
    return txns.get(txn) if txns else None


# -- transfers the peer sends under a transaction ---------------------------------------


def hold_transfer(link: HoldingLink, dlv: Any, routed: CoreMessage,
                  presettled: bool) -> None:
    """A transfer with transactional-state: held in its transaction (routed at
    commit), answered now with transactional-state(Accepted), or Rejected (an
    unknown txn-id, not allowed, over --max-transaction-bytes)."""
    host = link.host
    state = transactional_state(dlv)
    tx = _lookup(host, state[0]) if state is not None else None
    if state is None or tx is None:
        txns = host.broker.transactions
        what = "undecodable" if state is None else _txn_label(state[0])
        txns.warn("unknown-id", f"a transfer on {link.address or '(anonymous)'} from "
                  f"{host.container_id} names unknown transaction {what}")
        _refuse(link, dlv, UNKNOWN_ID, f"unknown transaction {what}")
        return
    broker = link.broker
    identity = host.identity
    if not broker.may_publish(identity, routed.topic, routed.retain):   # (logs it)
        _refuse(link, dlv, UNAUTHORIZED, f"publishing to {routed.topic!r} is not allowed")
        return
    try:
        # (all of the message as stored: its MQTT form and its native form, the
        # transfer's sections, where application properties and a map body count)
        native = routed.native
        tx.add_publish(len(routed.payload) + (len(native) if native is not None else 0),
                       _publisher(link, routed), _publish_check(link, routed, tx))
    except TransactionRefused as refused:   # (logged once per cause by the core)
        _refuse(link, dlv, RESOURCE_LIMIT, refused.reason)
        return
    _answer_transactional(link, dlv, state[0], presettled)


def _refuse(link: HoldingLink, dlv: Any, condition: str, description: str) -> None:
    """Rejected, without ``reject``'s log line per message: the cause was logged,
    rate-limited, where it was found."""
    link.rejected += 1
    link.answer(dlv, REJECTED, (condition, description))


def _publisher(link: HoldingLink, routed: CoreMessage
               ) -> Callable[[], Deferred[None] | None]:
    identity = link.host.identity

    def publish() -> Deferred[None] | None:
        result = link.broker.publish(routed, identity, wait=True)
        if result.denied:
            return fail(TransactionRefused(f"publishing to {routed.topic!r} is not allowed"))
        if result.refusal is not None:
            return fail(TransactionRefused(result.refusal.reason))
        if link.closed:
            link.host.meter.received_amqp()
        else:
            link.routed(result, routed)
        return result.durable

    return publish


def _publish_check(link: HoldingLink, routed: CoreMessage, tx: Transaction
                   ) -> Callable[[], str | None]:
    """Asked before the commit runs anything: the publish is still allowed and its
    queue (a ``$queue/`` topic) still takes it, with the transaction's earlier
    publishes counted (``Transaction.planned``)."""
    identity = link.host.identity

    def check() -> str | None:
        broker = link.broker
        topic = routed.topic
        if not broker.may_publish(identity, topic, routed.retain):   # (logs it)
            return f"publishing to {topic!r} is no longer allowed"
        if topic[:1] == "$" and broker.queues.kind(topic) == QUEUED:
            address = broker.queues.address(topic)
            if isinstance(address, str):
                return address
            if address is not None:
                return broker.queues.room_problem(address.queue, routed, tx.planned)
        return None

    return check


def _answer_transactional(link: HoldingLink, dlv: Any, txn: bytes,
                          presettled: bool) -> None:
    """transactional-state(txn, Accepted) on an incoming transfer (settled unless
    rcv-settle-mode second; a pre-settled one is just settled)."""
    if link.closed:
        return
    link.outstanding -= 1
    if presettled or delivery_settled(dlv):
        delivery_settle(dlv)
    else:
        wrapped = Delivery.wrap(dlv)  # type: ignore[no-untyped-call]
        wrapped.local.data = [txn, Described(ulong(ACCEPTED), [])]
        wrapped.update(TRANSACTIONAL)
        if not link.second:
            delivery_settle(dlv)
    link.answered()
    link.host.schedule_flush()


# -- outcomes the peer gives under a transaction ----------------------------------------


def hold_outcome(link: OutgoingLink, dlv: Any) -> None:
    """The peer's disposition with transactional-state on ``dlv``, a delivery of
    ``link``: its outcome applies at commit (the delivery stays acquired until
    then); a rollback releases it.  An unknown txn-id detaches the link
    (amqp:transaction:unknown-id: its deliveries go back)."""
    host = link.host
    state = transactional_state(dlv)
    tx = _lookup(host, state[0]) if state is not None else None
    if state is None or tx is None:
        what = "undecodable" if state is None else _txn_label(state[0])
        host.broker.transactions.warn(
            "unknown-id", f"a disposition on {link.address} from {host.container_id} "
            f"names unknown transaction {what}")
        link.detach(UNKNOWN_ID, f"unknown transaction {what}")
        return
    _, given, fields = state
    settled = bool(delivery_settled(dlv))
    no_outcome = given not in _OUTCOMES
    if no_outcome:
        # transactional-state without an outcome: the delivery is in the transaction,
        # its outcome still to come (part 4 §4.5.5: the outcome is provisional).
        # Settled so, none will come: the link's default outcome (consumed; on
        # ``.publish`` modified(delivery-failed)) applies at discharge, like a plain
        # settlement without an outcome; a rollback releases it.
        if not settled:
            return
        host.broker.stats.settled_without_outcome += 1
    code: int = (link.default_outcome or ACCEPTED) if no_outcome or given is None else given
    key = link.claim(dlv)
    if key is None:
        delivery_settle(dlv)
        return
    reason: str | None
    if no_outcome:
        failed, reason = code == MODIFIED, NO_OUTCOME
    else:
        failed = code == MODIFIED and bool(fields and fields[0])
        reason = _rejected_reason(fields) if code == REJECTED else None
    if settled:
        delivery_settle(dlv)    # (the peer settled first: nothing of ours to keep)
        ptr = None
    else:
        incref(dlv)
        ptr = dlv
    broker = host.broker
    # The session's delivery stays claimed while the transaction holds its outcome
    # (no visibility timeout, no takeover); the commit checks it is still the same
    # delivery (a packet id freed and reused by another message is not) and is
    # refused with nothing applied when it is not.
    where = link.delivery_of(key)
    token = broker.settlement.hold(*where) if where is not None else None
    label = f"delivery {key & 0xFFFF} on {link.address}"

    def check() -> str | None:
        if key < 0:     # (a PUBREL's settle: no message of a queue to hold)
            return None
        if where is None or not broker.settlement.still_held(where[0], where[1], token):
            return (f"{label} is no longer held (it was delivered again, or its "
                    "link ended)")
        return None

    def apply(outcome: int = code, is_failed: bool = failed,
              why: str | None = reason) -> None:
        valid = check() is None   # (never settle a delivery that is no longer this one)
        if ptr is not None:
            if not link.closed:
                delivery_settle(ptr)
                host.schedule_flush()
            decref(ptr)
        # (its link ended: the queue kept it claimed, settled without the link)
        if valid and not broker.settlement.settle_kept(token, _CORE_OUTCOMES[outcome], is_failed,
                                            why):
            link.outcome(key, outcome, is_failed, why)
        broker.settlement.unhold(token)

    try:
        tx.add_settle(apply, lambda: apply(RELEASED, False, None), check)
    except TransactionRefused:
        # (the transaction can only roll back: the delivery stays as it was)
        broker.settlement.unhold(token)
        if ptr is not None:
            decref(ptr)
            link.unclaim(dlv, key)
        else:
            # Settled by the peer: no outcome will come on it (and proton may reuse
            # its pointer), so it is released now, as the rollback would.
            link.outcome(key, RELEASED, False)


def _rejected_reason(fields: list[Any]) -> str | None:
    error = fields[0] if fields else None
    if isinstance(error, Condition):
        return error.description or error.name or None
    if isinstance(error, Described) and isinstance(error.value, list) and error.value:
        parts = [str(v) for v in error.value[:2] if v]
        return parts[-1] if parts else None
    return None


# -- the coordinator -------------------------------------------------------------------


class Coordinator(IncomingLink):
    """A peer's transaction controller: declare and discharge."""

    __slots__ = ("_mine",)

    def __init__(self, host: LinkHost, plink: Any, address: str) -> None:
        super().__init__(host, plink, address or "(coordinator)")
        self._mine: dict[bytes, Transaction] = {}

    def start(self) -> None:
        if self.host.txns is None:
            self.host.txns = {}
        super().start()

    def on_transfer(self, dlv: Any, data: bytes, presettled: bool) -> None:
        try:
            message = Message()
            message.decode(data)
            body = message.body
        except Exception as exc:   # proton raises its own errors on bad bytes
            self.reject(dlv, DECODE_ERROR, f"not a coordinator message: {exc}")
            return
        if not isinstance(body, Described) or not isinstance(body.value, list):
            self.reject(dlv, DECODE_ERROR, "a coordinator message's body is a declare or a "
                        "discharge")
            return
        if body.descriptor in _DECLARE:
            self._declare(dlv)
        elif body.descriptor in _DISCHARGE:
            txn, failed = _discharge_fields(message)
            self._discharge(dlv, txn, failed)
        else:
            self.reject(dlv, DECODE_ERROR, f"unknown coordinator message {body.descriptor!r}")

    def _declare(self, dlv: Any) -> None:
        try:
            tx = self.broker.transactions.open(self.host)
        except TransactionRefused as refused:
            self.answer(dlv, REJECTED, (RESOURCE_LIMIT, refused.reason))
            return
        txn = b"%d" % tx.id
        self._mine[txn] = tx
        txns = self.host.txns
        assert txns is not None
        txns[txn] = tx
        if self.closed:
            return
        self.outstanding -= 1
        wrapped = Delivery.wrap(dlv)  # type: ignore[no-untyped-call]
        wrapped.local.data = [txn]
        wrapped.update(DECLARED)
        if not self.second:
            delivery_settle(dlv)
        self.answered()
        self.host.schedule_flush()

    def _discharge(self, dlv: Any, txn: bytes | None, failed: bool) -> None:
        tx = self._mine.get(txn) if txn is not None else None
        if txn is None or tx is None:
            what = "none" if txn is None else _txn_label(txn)
            self.broker.transactions.warn(
                "unknown-id", f"a discharge from {self.host.container_id} names unknown "
                f"transaction {what}")
            self.answer(dlv, REJECTED, (UNKNOWN_ID, f"unknown transaction {what}"))
            return
        self._forget(txn)
        if failed:
            tx.rollback()
            self.answer(dlv, ACCEPTED)
            return
        incref(dlv)   # held across the commit
        tx.commit().addCallbacks(self._committed, self._not_committed,
                                 callbackArgs=(dlv,), errbackArgs=(dlv,))

    def _committed(self, _: object, dlv: Any) -> None:
        try:
            self.answer(dlv, ACCEPTED)
        finally:
            decref(dlv)

    def _not_committed(self, failure: Failure, dlv: Any) -> None:
        value = failure.value
        if isinstance(value, PartiallyApplied):
            # (not a rollback: some of it was applied; the core logged it)
            condition = (INTERNAL_ERROR, f"partially applied: {value.reason}")
        else:
            condition = (ROLLBACK, value.reason if isinstance(value, TransactionRefused)
                         else f"the transaction was not stored ({type(value).__name__})")
        try:
            self.answer(dlv, REJECTED, condition)
        finally:
            decref(dlv)

    def _forget(self, txn: bytes) -> None:
        self._mine.pop(txn, None)
        txns = self.host.txns
        if txns:
            txns.pop(txn, None)

    def ended(self, brute: bool, reason: str) -> None:
        super().ended(brute, reason)
        mine, self._mine = self._mine, {}
        for txn, tx in mine.items():
            self._forget(txn)
            tx.rollback()
