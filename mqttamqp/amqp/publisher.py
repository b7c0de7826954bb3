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

from mqttamqp.adapter.throttle import PublishThrottle
from mqttamqp.amqp.addresses import queue_topic
from mqttamqp.amqp.codec.contract import ANNOTATION_CLIENT_ID, Mqtt5Props
from mqttamqp.amqp.codec.native import native_parts
from mqttamqp.amqp.codec.publish import PublishFields, PublishMemo, decode_publish, recall_publish
from mqttamqp.amqp.codec.values import DecodeError
from mqttamqp.amqp.incoming import IncomingLink, message_properties
from mqttamqp.amqp.links import (
    ACCEPTED,
    DECODE_ERROR,
    INVALID_FIELD,
    NOT_ALLOWED,
    REJECTED,
    TRANSACTIONAL,
    UNAUTHORIZED,
    LinkHost,
)
from mqttamqp.amqp.refusals import condition_of
from mqttamqp.amqp.transactions import hold_transfer
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.addresses import (
    NOT_QUEUED,
    QUEUE_COMMAND,
    Refusal,
)
from mqttamqp.core.routing.published import Published
from mqttamqp.core.topics import topic_size_problem, validate_topic_name
from mqttamqp.net.rawproton import delivery_remote_state, delivery_settle, delivery_update

__all__ = ["TopicPublisher", "to_problem"]

# Where a sender's message goes (``TopicPublisher._route_of``): the fields it was
# worked out from (the memo's, by identity), the topic, whether a durable queue's,
# and the head and cut of the message's native form (``native_parts``).
_Route = tuple[PublishFields, str, bool, bytes, int]


def acting_for(host: LinkHost, plink: Any) -> str | None:
    """The MQTT client a sender publishes for: its attach property
    ``x-opt-mqtt-client-id`` (a gateway's, docs/gateway.md), when the same connection
    holds that client's will-service link (a gateway attaches it first; its attach
    checked the connection may act for the client); else None, quietly (the sender
    then publishes as its container)."""
    try:
        props = plink.remote_properties
    except (UnicodeDecodeError, KeyError, TypeError, ValueError):
        return None   # (undecodable, as attach._capabilities: NOTES) -> no claim
    claimed = props.get(ANNOTATION_CLIENT_ID) if isinstance(props, dict) else None
    if not isinstance(claimed, str) or not claimed:
        return None
    return claimed if host.holds_will(claimed) else None


def to_problem(topic: str, limits: Any) -> str | None:
    """Why ``topic`` (a relayed message's ``to``) is no topic to publish to, or None:
    an invalid or too long topic name, a control address.  (Pure: the AMQP 1.0
    bridge's ``in`` direction checks the same.)"""
    problem = validate_topic_name(topic) or topic_size_problem(
        topic, limits.max_topic_levels, limits.max_topic_length)
    if problem is None and topic.startswith("$mqtt."):
        problem = "control addresses need a link of their own"
    return problem


class TopicPublisher(IncomingLink):
    """A sender to a topic address, or to the null address with ``to`` on each message."""

    __slots__ = ("_held", "_memo", "_route", "_throttle", "_warned_amqp_only", "publisher",
                 "topic")

    def __init__(self, host: LinkHost, plink: Any, topic: str | None) -> None:
        super().__init__(host, plink, topic or "")
        self.topic = topic
        # Whom its messages are from (no-local compares it with the session's client
        # id): the MQTT client a gateway's sender publishes for, else the container.
        self.publisher = acting_for(host, plink) or host.container_id or None
        # Exactly-once messages Accepted and not yet settled by the sender (made on
        # the first: only rcv-settle-mode second has any).
        self._held: dict[Any, Message] | None = None
        self._warned_amqp_only = False
        rate = host.publish_rate   # the connection's budget, shared by its senders
        self._throttle = (None if rate is None else PublishThrottle(
            rate, host.broker.clock, self._rate_paused, self._rate_over))
        # This sender's sections before the body (made with its first message).
        self._memo: PublishMemo | None = None
        # What those sections meant for the last message (a memo hit): its fields
        # (the memo's, by identity), topic, whether a durable queue's, and the head
        # and cut of its native form (``native_parts``).
        self._route: _Route | None = None

    def on_transfer(self, dlv: Any, data: bytes, presettled: bool) -> None:
        """A whole message to publish, in steps: its fields (this sender's memo, else
        decoded), its route (the topic and native head: the memo's again, else
        checked), the core's message, then either the exactly-once hold or routing
        and the answer.  A step that refuses the message has rejected it and
        returns None.  (The usual message, a memo hit, takes no step out of line
        but ``_publish`` and its ``routed``: this is every message's path.)"""
        memo = self._memo
        if memo is None:
            memo = self._memo = PublishMemo()
        payload = recall_publish(data, presettled, memo)
        if payload is not None:
            fields: PublishFields = memo.fields  # type: ignore[assignment]
        else:
            decoded = self._decode(dlv, data, presettled, memo)
            if decoded is None:
                return
            fields, payload = decoded, decoded.payload
        route = self._route
        if route is None or route[0] is not fields:
            route = self._route_of(dlv, data, fields, memo)
            if route is None:
                return
        # (one unpacking: a NamedTuple's fields are properties, a call each)
        _, _, qos, retain, redelivered, wait, _, _, _, mqtt5, priority = fields
        _, topic, queued, head, cut = route
        if payload is None:
            self._amqp_only()
        props = None
        if mqtt5 is not None:
            props = self._properties(dlv, mqtt5, payload)
            if props is None:
                return
        routed = Message(topic, b"" if payload is None else payload, qos, retain,
                         self.publisher, self.broker.clock.seconds(),
                         redelivered, head + data[cut:], payload is None, props, None,
                         priority)
        if delivery_remote_state(dlv) == TRANSACTIONAL:
            # (routed at commit; without a coordinator: unknown-id, never routed now)
            hold_transfer(self, dlv, routed, presettled)
            return
        if self.second and not presettled:
            self._hold(dlv, routed)
            return
        # (a queue's append is always stored: Accepted waits for it)
        self._publish(dlv, routed, presettled, wait or queued)

    def _decode(self, dlv: Any, data: bytes, presettled: bool, memo: PublishMemo
                ) -> PublishFields | None:
        """The fields of a message the memo did not recognise (the memo learns its
        sections if they can be remembered)."""
        try:
            return decode_publish(data, presettled, memo)
        except DecodeError as exc:
            self.reject(dlv, DECODE_ERROR, exc.reason)
            return None

    def _route_of(self, dlv: Any, data: bytes, fields: PublishFields, memo: PublishMemo
                  ) -> _Route | None:
        """Where a message with these fields goes: its topic (checked), whether a
        durable queue's, and the head and cut of its native form.  Remembered while
        the sender's memo holds these fields: its next messages have the same."""
        checked = self._check_topic(dlv, fields.to)
        if checked is None:
            return None
        topic, queued = checked
        try:
            # (a durable queue keeps the bare message as sent: ``to`` too)
            head, cut = native_parts(data, fields.bare_start, fields.props_end, fields.to,
                                     topic, fields.durable, fields.priority, queued)
        except DecodeError as exc:   # decode_publish checked the sections
            self.reject(dlv, DECODE_ERROR, exc.reason)
            return None
        route = (fields, topic, queued, head, cut)
        if fields is memo.fields:
            self._route = route
        return route

    def _properties(self, dlv: Any, mqtt5: Mqtt5Props, payload: bytes | None
                    ) -> MessageProperties | None:
        """The core's form of the message's MQTT 5 properties; None if they make it
        unusable (a payload declared UTF-8 that is not: rejected)."""
        try:
            return message_properties(mqtt5, payload)
        except DecodeError as exc:
            self.reject(dlv, DECODE_ERROR, exc.reason)
            return None

    def _amqp_only(self) -> None:
        """A message whose body has no MQTT form: counted, logged once per link."""
        self.host.meter.amqp_only()
        if not self._warned_amqp_only:
            self._warned_amqp_only = True
            host = self.host
            self.log.info("a message on {a} from {c} ({peer}) has a body with no MQTT "
                          "form: it goes to AMQP receivers only (logged once per link)",
                          a=self.address or "(anonymous)", c=host.container_id,
                          peer=host.peer)

    def _hold(self, dlv: Any, routed: Message) -> None:
        """Exactly once: Accepted now (unsettled), routed when the sender settles.
        Until then it still counts against the credit window, so a sender that
        never settles cannot make the broker hold more than the window."""
        if not self.broker.may_publish(self.host.identity, routed.topic, routed.retain):
            self.reject(dlv, UNAUTHORIZED, f"publishing to {routed.topic!r} is not allowed")
            return
        held = self._held
        if held is None:
            held = self._held = {}
        held[dlv] = routed
        self.answer(dlv, ACCEPTED)
        self.outstanding += 1

    def _publish(self, dlv: Any, routed: Message, presettled: bool, wait: bool) -> None:
        """Route the message and answer it: a pre-settled one is settled; else
        Accepted at once, or once durable; Rejected if denied or refused."""
        # (positional, as the MQTT flows call it: a keyword costs the call its parsing)
        result = self.broker.publish(routed, self.host.identity, wait)
        if result.denied:
            self.reject(dlv, UNAUTHORIZED, f"publishing to {routed.topic!r} is not allowed")
            return
        if result.refusal is not None:
            self._refused(dlv, presettled, result.refusal)
            return
        if result.congested or result.blocked or self._throttle is not None:
            self.routed(result, routed)
        else:
            self.host.meter.received_amqp()   # (``routed`` with nothing to hold back)
        if presettled:
            self.outstanding -= 1
            delivery_settle(dlv)
            self.answered()
            return
        if result.durable is None:
            # Nothing to make durable: Accepted at once (``answer``'s common case, on
            # an unsettled delivery of a link that settles first; inside the pump,
            # which writes the disposition when it ends).
            if self.closed:
                return
            outstanding = self.outstanding - 1
            self.outstanding = outstanding
            delivery_update(dlv, ACCEPTED)
            delivery_settle(dlv)
            # (``answered``, inline: a top-up only when one may be due)
            owed = self._owed + 1
            self._owed = owed
            if owed >= self._refill or owed >= self.window - outstanding:
                self.top_up()
            return
        self.answer_after(result.durable, dlv)

    def routed(self, result: Published, routed: Message) -> None:
        """A message routed: counted, then no more credit while what it fed is
        congested, the durable queues are full, or the publish budget is spent
        (also a transaction's publish at commit: ``transactions``)."""
        self.host.meter.received_amqp()
        if result.congested:
            self.block_until_drained(result.congested)
        if result.blocked:
            self.block_until_queues_writable()
        if self._throttle is not None:
            self._throttle.charge(len(routed.payload))

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
            problem = to_problem(topic, limits)
            if problem is not None:
                self.reject(dlv, INVALID_FIELD, f"bad topic {topic!r}: {problem}")
                return None
            topic = queue_topic(topic, False, limits.amqp_queues) or topic
        # (what it is to the durable queues, the core says: one parse, cached)
        kind = self.broker.queues.kind(topic)
        if kind == QUEUE_COMMAND:
            self.reject(dlv, NOT_ALLOWED, f"{topic!r}: an AMQP consumer acknowledges queue "
                        "messages with its dispositions (Accepted, Released, Modified, "
                        "Rejected)")
            return None
        return topic, kind != NOT_QUEUED

    def _refused(self, dlv: Any, presettled: bool, refusal: Refusal) -> None:
        """A durable queue refused the message: Rejected with its reason (the core
        logged it, rate-limited; a pre-settled message can only be dropped)."""
        self.rejected += 1
        if presettled:
            self.outstanding -= 1
            delivery_settle(dlv)
            self.top_up()
            return
        self.answer(dlv, REJECTED, (condition_of(refusal), refusal.reason))

    def _rate_paused(self, wait: float) -> None:
        # No more credit until the budget is back: what the peer still holds
        # arrives meanwhile, and makes the pause longer (``PublishThrottle``).
        self.rate_blocked = True
        self.broker.gate.publish_rate_exceeded("AMQP", self.host.container_id, wait)

    def _rate_over(self) -> None:
        self.rate_blocked = False
        if not self.closed:
            self.top_up()

    def on_remote_settled(self, dlv: Any) -> None:
        held = self._held
        routed = held.pop(dlv, None) if held else None
        delivery_settle(dlv)
        if routed is None or self.closed:
            return
        self.outstanding -= 1
        self.top_up()
        self.routed(self.broker.publish(routed, None, False), routed)
        self.host.schedule_flush()

    def ended(self, brute: bool, reason: str) -> None:
        super().ended(brute, reason)
        if self._throttle is not None:
            self._throttle.stop()
        if self._held:
            self.log.info("{n} exactly-once message(s) on {a} were never settled by the "
                          "sender; not routed", n=len(self._held), a=self.address)
        self._held = None
