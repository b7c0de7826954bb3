"""Publishing to topics from AMQP: ``TopicPublisher``, a sender to a topic
address, or to the null address with ``to`` on each message.

What it owns: a message's way from transfer to ``Broker.publish``, in steps
(``on_transfer``): its fields (the sender's memo, else decoded), its topic (checked
once per run of messages with the same sections before the body), the core's
``Message``, then either the exactly-once hold (rcv-settle-mode second: routed when
the sender settles) or routing and the answer (Accepted at once, after the durable
commit, or Rejected with the reason); the connection's publish budget.

What it must not do: hold routing rules (the core does), or decode by hand (the
codec does).
"""

from __future__ import annotations

from typing import Any

from mqttamqp.amqp.addresses import queue_topic
from mqttamqp.amqp.codec.native import native_parts
from mqttamqp.amqp.codec.publish import PublishFields, PublishMemo, decode_publish, recall_publish
from mqttamqp.amqp.codec.values import DecodeError
from mqttamqp.amqp.incoming import IncomingLink, message_properties
from mqttamqp.amqp.links import (
    ACCEPTED,
    DECODE_ERROR,
    INVALID_FIELD,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    REJECTED,
    UNAUTHORIZED,
    LinkHost,
    _delivery_settle,
    _delivery_update,
)
from mqttamqp.core.message import Message
from mqttamqp.core.queues.manager import (
    QUOTA_EXCEEDED,
    TOPIC_NAME_INVALID,
    Refusal,
    is_queue_command,
    is_queue_topic,
)
from mqttamqp.core.topics import topic_size_problem, validate_topic_name

__all__ = ["TopicPublisher"]

# A durable queue's refusal (MQTT 5 reason code) as Rejected's error condition.
_REFUSAL_CONDITIONS = {TOPIC_NAME_INVALID: INVALID_FIELD,
                       QUOTA_EXCEEDED: "amqp:resource-limit-exceeded"}


class TopicPublisher(IncomingLink):
    """A sender to a topic address, or to the null address with ``to`` on each message."""

    __slots__ = ("_held", "_memo", "_rate_timer", "_route", "_warned_amqp_only", "topic")

    def __init__(self, host: LinkHost, plink: Any, topic: str | None) -> None:
        super().__init__(host, plink, topic or "")
        self.topic = topic
        # Exactly-once messages Accepted and not yet settled by the sender (made on
        # the first: only rcv-settle-mode second has any).
        self._held: dict[Any, Message] | None = None
        self._warned_amqp_only = False
        self._rate_timer: Any = None
        # This sender's sections before the body (made with its first message).
        self._memo: PublishMemo | None = None
        # What those sections meant for the last message (a memo hit): its fields
        # (the memo's, by identity), topic, whether a durable queue's, and the head
        # and cut of its native form (``native_parts``).
        self._route: tuple[PublishFields, str, bool, bytes, int] | None = None

    def on_transfer(self, dlv: Any, data: bytes, presettled: bool) -> None:
        memo = self._memo
        if memo is None:
            memo = self._memo = PublishMemo()
        payload = recall_publish(data, presettled, memo)
        if payload is not None:
            fields: PublishFields = memo.fields  # type: ignore[assignment]
        else:
            try:
                fields = decode_publish(data, presettled, memo)
            except DecodeError as exc:
                self.reject(dlv, DECODE_ERROR, exc.reason)
                return
            payload = fields.payload
        # (one unpacking: a NamedTuple's fields are properties, a call each)
        (to, _, qos, retain, redelivered, wait, durable, bare_start, props_end, mqtt5,
         priority) = fields
        route = self._route
        if route is not None and route[0] is fields:
            # The same sections before the body as the message before (a memo hit):
            # the same topic, checked already, and the same native head.
            _, topic, queued, head, cut = route
        else:
            checked = self._check_topic(dlv, to)
            if checked is None:
                return
            topic, queued = checked
            try:
                # (a durable queue keeps the bare message as sent: ``to`` too)
                head, cut = native_parts(data, bare_start, props_end, to, topic, durable,
                                         priority, queued)
            except DecodeError as exc:   # decode_publish checked the sections
                self.reject(dlv, DECODE_ERROR, exc.reason)
                return
            if fields is memo.fields:
                self._route = (fields, topic, queued, head, cut)
        host = self.host
        broker = self.broker
        if payload is None:
            broker.stats.messages_amqp_only += 1
            if not self._warned_amqp_only:
                self._warned_amqp_only = True
                self.log.info("a message on {a} from {c} ({peer}) has a body with no MQTT "
                              "form: it goes to AMQP receivers only (logged once per link)",
                              a=self.address or "(anonymous)", c=host.container_id,
                              peer=host.peer)
        native = head + data[cut:]
        if mqtt5 is None:
            props = None
        else:
            try:
                props = message_properties(mqtt5, payload)
            except DecodeError as exc:
                self.reject(dlv, DECODE_ERROR, exc.reason)
                return
        routed = Message(topic, b"" if payload is None else payload, qos, retain,
                         host.container_id or None, broker.clock.seconds(), redelivered,
                         native, payload is None, props)
        if self.second and not presettled:
            # Exactly once: Accepted now (unsettled), routed when the sender settles.
            # Until then it still counts against the credit window, so a sender that
            # never settles cannot make the broker hold more than the window.
            if not broker.may_publish(host.identity, topic, routed.retain):
                self.reject(dlv, UNAUTHORIZED, f"publishing to {topic!r} is not allowed")
                return
            held = self._held
            if held is None:
                held = self._held = {}
            held[dlv] = routed
            self.answer(dlv, ACCEPTED)
            self.outstanding += 1
            return
        # (a queue's append is always stored: Accepted waits for it)
        result = broker.publish(routed, host.identity, wait=wait or queued)
        if result.denied:
            self.reject(dlv, UNAUTHORIZED, f"publishing to {topic!r} is not allowed")
            return
        if result.refusal is not None:
            self._refused(dlv, presettled, result.refusal)
            return
        broker.stats.messages_received_amqp += 1
        if result.congested:
            self.block_until_drained(result.congested)
        if result.blocked:
            self.block_until_queues_writable()
        if host.publish_rate is not None:
            self._charge(routed)
        if presettled:
            self.outstanding -= 1
            _delivery_settle(dlv)
            self._answered()
            return
        if result.durable is None:
            # Nothing to make durable: Accepted at once (``answer``'s common case, on
            # an unsettled delivery of a link that settles first; inside the pump,
            # which writes the disposition when it ends).
            if self.closed:
                return
            self.outstanding -= 1
            _delivery_update(dlv, ACCEPTED)
            _delivery_settle(dlv)
            self._answered()
            return
        self.answer_after(result.durable, dlv)

    def _check_topic(self, dlv: Any, to: str | None) -> tuple[str, bool] | None:
        """The topic a message with ``to`` goes to, and whether it is a durable
        queue's; None if it was rejected (no topic, a bad one, a queue command)."""
        topic = self.topic or to
        if not topic:
            self.reject(dlv, INVALID_FIELD,
                        "no topic: the link has no target address and the message no 'to'")
            return None
        if self.topic is None:  # the link's own target was checked at attach
            limits = self.host.limits
            problem = validate_topic_name(topic) or topic_size_problem(
                topic, limits.max_topic_levels, limits.max_topic_length)
            if problem is None and topic.startswith("$mqtt."):
                problem = "control addresses need a link of their own"
            if problem is not None:
                self.reject(dlv, INVALID_FIELD, f"bad topic {topic!r}: {problem}")
                return None
            topic = queue_topic(topic, False, limits.amqp_queues) or topic
        queued = topic[:1] == "$" and is_queue_topic(topic)
        if queued and is_queue_command(topic):
            self.reject(dlv, NOT_ALLOWED, f"{topic!r}: an AMQP consumer acknowledges queue "
                        "messages with its dispositions (Accepted, Released, Modified, "
                        "Rejected)")
            return None
        return topic, queued

    def _refused(self, dlv: Any, presettled: bool, refusal: Refusal) -> None:
        """A durable queue refused the message: Rejected with its reason (the core
        logged it, rate-limited; a pre-settled message can only be dropped)."""
        self.rejected += 1
        if presettled:
            self.outstanding -= 1
            _delivery_settle(dlv)
            self.top_up()
            return
        condition = _REFUSAL_CONDITIONS.get(refusal.code, PRECONDITION_FAILED)
        self.answer(dlv, REJECTED, (condition, refusal.reason))

    def _charge(self, routed: Message) -> None:
        """A message routed: charge the connection's publish budget, if it has one."""
        rate = self.host.publish_rate
        if rate is None:
            return
        wait = rate.take(len(routed.payload))
        if wait > 0:
            # No more credit until the budget is back: what the peer still holds
            # arrives meanwhile, and makes the pause longer.
            if self._rate_timer is None:
                self.rate_blocked = True
                self.broker.publish_rate_exceeded("AMQP", self.host.container_id, wait)
                self._rate_timer = self.broker.clock.callLater(wait, self._rate_over)
            else:
                self._rate_timer.reset(wait)

    def _rate_over(self) -> None:
        self._rate_timer = None
        self.rate_blocked = False
        if not self.closed:
            self.top_up()

    def on_remote_settled(self, dlv: Any) -> None:
        held = self._held
        routed = held.pop(dlv, None) if held else None
        _delivery_settle(dlv)
        if routed is None or self.closed:
            return
        self.outstanding -= 1
        self.top_up()
        result = self.broker.publish(routed, wait=False)
        self.broker.stats.messages_received_amqp += 1
        if result.congested:
            self.block_until_drained(result.congested)
        if result.blocked:
            self.block_until_queues_writable()
        self._charge(routed)
        self.host.schedule_flush()

    def ended(self, brute: bool, reason: str) -> None:
        super().ended(brute, reason)
        if self._rate_timer is not None and self._rate_timer.active():
            self._rate_timer.cancel()
        self._rate_timer = None
        if self._held:
            self.log.info("{n} exactly-once message(s) on {a} were never settled by the "
                          "sender; not routed", n=len(self._held), a=self.address)
        self._held = None
