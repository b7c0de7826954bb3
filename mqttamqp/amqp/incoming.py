"""Links the peer sends on: reading and decoding transfers, credit (a window
topped up as deliveries are answered, withheld while the subscribers fed are past
their high-water mark, the publish rate is exceeded or the durable queues are
full), answering with a disposition, after the durable commit where there is
one, and rcv-settle-mode second (the sender settles after our answer).

What it must not do: decide what a message means (``publisher``, ``services``),
or pump the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from proton import Condition, Delivery, Link
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqttamqp.amqp.codec.contract import Mqtt5Props
from mqttamqp.amqp.codec.sections import InboundMessage, decode_message
from mqttamqp.amqp.codec.values import DecodeError
from mqttamqp.amqp.links import (
    ACCEPTED,
    DECODE_ERROR,
    REJECTED,
    RELEASED,
    BrokerLink,
    LinkHost,
)
from mqttamqp.core.message import MessageProperties
from mqttamqp.core.sessions.flow import Congestible
from mqttamqp.native import mypyc_attr
from mqttamqp.net.rawproton import (
    decref,
    delivery_aborted,
    delivery_partial,
    delivery_pending,
    delivery_readable,
    delivery_settle,
    delivery_settled,
    delivery_update,
    incref,
    link_advance,
    link_credit,
    link_flow,
    recv,
)

__all__ = ["IncomingLink", "message_properties"]


def message_properties(props: Mqtt5Props | None, payload: bytes | None
                       ) -> MessageProperties | None:
    """The core's form of the MQTT 5 properties an AMQP message carries (docs/amqp.md,
    the mapping); ``DecodeError`` when it declares its payload UTF-8 (payload
    format 1) and it is not, as an MQTT 5 publisher gets 0x99 for that."""
    if props is None:
        return None
    if props.payload_format == 1 and payload:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"payload declared UTF-8 (x-opt-mqtt-payload-format 1) is "
                              f"not ({exc.reason} at byte {exc.start})") from None
    return MessageProperties(*props)


@mypyc_attr(allow_interpreted_subclasses=True)   # (services' links are not compiled)
class IncomingLink(BrokerLink):
    """A link the peer sends on.  Subclasses implement ``on_message``."""

    __slots__ = (
        "_owed",
        "_refill",
        "blocked",
        "max_size",
        "outstanding",
        "queues_blocked",
        "rate_blocked",
        "rejected",
        "second",
        "window",
    )
    role = "receiver"
    # (ClassVar: read from the class, so that services' interpreted subclasses, which
    # set 20, are honoured compiled)
    max_window: ClassVar[int] = 100   # the most credit the peer holds at a time

    def __init__(self, host: LinkHost, plink: Any, address: str) -> None:
        super().__init__(host, plink, address)
        # Credit stops at a subscriber's high-water mark (half its queue bound), but
        # what was granted may still arrive: keep the window within the other half,
        # so one sender cannot overflow a congested subscriber's queue.
        self.window = max(1, min(self.max_window, host.limits.max_queued_messages // 2))
        self._refill = max(1, self.window // 2)   # credit is topped up in steps of this
        self.second = plink.rcv_settle_mode == Link.RCV_SECOND
        self.outstanding = 0         # received, not yet answered
        self.blocked = False         # withholding credit (subscribers past high water)
        self.rate_blocked = False    # withholding credit (over the publish rate)
        self.queues_blocked = False  # withholding credit (durable queues full on disk)
        self.rejected = 0
        self.max_size = host.limits.max_packet_size
        # The credit the window still owes the peer (window - outstanding - credit),
        # as of the last ``top_up``, plus the answers and aborted transfers since
        # (a transfer takes one credit and adds one outstanding: no change), so
        # ``answered`` reads the engine's credit only when a top-up may be due.
        # It lags the truth only by transfers the pump has not reached yet, whose
        # answers catch up; where it runs ahead (an exactly-once delivery held
        # until settled) it costs an early, exact ``top_up``.
        self._owed = 0

    def start(self) -> None:
        self.top_up()

    def top_up(self) -> None:
        if self.closed or self.blocked or self.rate_blocked or self.queues_blocked:
            return
        impl = self.impl
        want = self.window - self.outstanding
        have = link_credit(impl)
        if want - have >= self._refill or (have <= 0 < want):
            link_flow(impl, want - have)
            have = want
            self.host.schedule_flush()
        self._owed = want - have

    def answered(self) -> None:
        """One more delivery answered (``outstanding`` is down by one): top up the
        credit if ``top_up`` would now (owed a refill's worth, or the peer is out
        of credit: owed at least the window's room).  Also a transaction's answer
        (``transactions``)."""
        owed = self._owed + 1
        self._owed = owed
        if owed >= self._refill or owed >= self.window - self.outstanding:
            self.top_up()

    def on_flow(self) -> None:
        """The peer's flow frame on this link (it may have used up credit in a
        drain): read the credit again."""
        self.top_up()

    def on_delivery(self, dlv: Any) -> None:
        """A raw delivery on this link: a new transfer, more of one, or a settle."""
        if self.closed:
            delivery_settle(dlv)
            return
        if not delivery_readable(dlv):
            if delivery_settled(dlv):
                self.on_remote_settled(dlv)
            return
        impl = self.impl
        if delivery_partial(dlv):
            if delivery_aborted(dlv):
                self._aborted(dlv)
                return
            pending = delivery_pending(dlv)
            if pending > self.max_size:   # (detach releases what it held)
                self._too_large()
                return
            # Counted against the connection's --amqp-max-held-bytes, which closes
            # a peer that keeps many large messages half-sent.
            self.host.hold(pending - self._partial)
            self._partial = pending
            return
        # Whole: read at once (``recv`` says if it was aborted instead).
        if self._partial:
            self.host.hold(-self._partial)
            self._partial = 0
        data = recv(impl, dlv)
        if data is None:
            self._aborted(dlv)
            return
        if len(data) > self.max_size:
            self._too_large()
            return
        link_advance(impl)
        presettled: bool = delivery_settled(dlv)
        self.outstanding += 1
        self.delivered += 1          # (bytes are counted per socket read)
        self.on_transfer(dlv, data, presettled)

    def _aborted(self, dlv: Any) -> None:
        """The peer aborted the transfer of ``dlv``: dropped, its credit owed back."""
        if self._partial:
            self.host.hold(-self._partial)
            self._partial = 0
        link_advance(self.impl)
        delivery_settle(dlv)
        # (it took a credit and will not be answered: owed back, with the top-up an
        # answer would bring, or a sender whose last transfers were aborted could be
        # left without credit)
        self.answered()

    def _too_large(self) -> None:
        """A transfer over ``--max-packet-size``: the link is detached with
        message-size-exceeded, and one log line says so, at most one a minute for
        this cause (the held-back count in the next)."""
        host = self.host
        held = host.log_limit.allow("amqp-message-size")
        if held is not None:
            self.log.warn("a message on {a} from {c} ({peer}) is larger than {n} bytes "
                          "(--max-packet-size): the link is detached with "
                          "amqp:link:message-size-exceeded{more}",
                          a=self.address or "(anonymous)", c=host.container_id,
                          peer=host.peer, n=self.max_size,
                          more=f" ({held} more since the last such line)" if held else "")
        self.detach("amqp:link:message-size-exceeded",   # (releases what it held)
                    f"message larger than {self.max_size} bytes")

    def on_transfer(self, dlv: Any, data: bytes, presettled: bool) -> None:
        """A whole message arrived (counted against the window)."""
        try:
            message = decode_message(data)
        except DecodeError as exc:
            self.reject(dlv, DECODE_ERROR, exc.reason)
            return
        self.on_message(dlv, message, presettled)

    def on_message(self, dlv: Any, message: InboundMessage, presettled: bool) -> None:
        raise NotImplementedError

    def on_remote_settled(self, dlv: Any) -> None:
        """The sender settled a delivery we had answered (rcv-settle-mode second)."""
        delivery_settle(dlv)

    # answering ----------------------------------------------------------------------

    def answer(self, dlv: Any, state: int, condition: tuple[str, str] | None = None) -> None:
        if self.closed:
            return
        self.outstanding -= 1
        if not delivery_settled(dlv):
            if condition is not None:
                wrapped = Delivery.wrap(dlv)  # type: ignore[no-untyped-call]
                wrapped.local.condition = Condition(*condition)
                wrapped.update(state)   # copies the condition into the engine
            else:
                delivery_update(dlv, state)
            if not self.second:
                delivery_settle(dlv)
        else:
            delivery_settle(dlv)
        self.answered()
        self.host.schedule_flush()

    def reject(self, dlv: Any, condition: str, description: str) -> None:
        self.rejected += 1
        self.log.info("rejected a message on {a} from {c} ({peer}): {cond}: {d}",
                      a=self.address or "(anonymous)", c=self.host.container_id,
                      peer=self.host.peer, cond=condition, d=description)
        self.answer(dlv, REJECTED, (condition, description))

    def answer_after(self, d: Deferred[None] | None, dlv: Any,
                     then: Callable[[], None] | None = None) -> None:
        """Accepted once ``d`` (the durable commit) fired; then ``then``."""
        if d is None:
            self.answer(dlv, ACCEPTED)
            if then is not None:
                then()
            return
        incref(dlv)  # held across the commit

        def done(_: object) -> None:
            try:
                self.answer(dlv, ACCEPTED)
            finally:
                decref(dlv)
            if then is not None and not self.closed:
                then()

        def failed(failure: Failure) -> None:
            # Storage failing: logged once per spell by the core, not per message.
            self.log.debug("storage commit failed on {a}; released the message: {f}",
                           a=self.address, f=failure.value)
            try:
                self.answer(dlv, RELEASED)
            finally:
                decref(dlv)

        d.addCallbacks(done, failed)

    # credit and back-pressure --------------------------------------------------------

    def block_until_drained(self, sessions: Sequence[Congestible]) -> None:
        """``sessions`` (or shared groups) fed by this link are past their high-water
        mark: no more credit until they drain."""
        self.broker.pause_until_drained(id(self), self._unblock, sessions)
        self.blocked = True

    def _unblock(self) -> None:
        self.blocked = False
        if not self.closed:
            self.top_up()

    def block_until_queues_writable(self) -> None:
        """The durable queues are full on disk: no more credit until they have room
        (what the peer still holds may arrive meanwhile)."""
        self.queues_blocked = True
        self.broker.when_queues_writable(id(self), self._queues_writable)

    def _queues_writable(self) -> None:
        self.queues_blocked = False
        if not self.closed:
            self.top_up()

    def ended(self, brute: bool, reason: str) -> None:
        self.broker.forget_paused(id(self))
