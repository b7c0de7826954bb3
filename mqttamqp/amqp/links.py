"""AMQP links as the broker sees them: what each attached link is for and how its
deliveries map onto the core.

What it owns:

* ``OutgoingLink`` (a proton sender: the peer receives).  ``TopicSubscription``
  (source = a topic filter: a session of its own, in the trie, not keyed by a
  client id) and ``SessionOutlet`` (``$mqtt.to.<id>.publish``: the client id's
  session, claimed like an MQTT connection claims it) implement the core's
  ``ClientLink``: QoS 0 goes pre-settled, QoS 1/2 unsettled with the packet id as
  delivery tag, and the receiver's outcome drives the session (Accepted done,
  Released redelivered unchanged, Modified redelivered with delivery-count + 1 if
  delivery-failed, Rejected dropped and counted).  ``ControlOutlet``
  (``$mqtt.to.<id>.control``) carries the subscription service's replies.
* ``IncomingLink`` (a proton receiver: the peer sends): reading and decoding
  transfers, credit (a window topped up as deliveries are answered, withheld
  while the subscribers fed are past their high-water mark), answering with a
  disposition after the durable commit, and the exactly-once path of
  rcv-settle-mode second.  ``TopicPublisher`` publishes; the control services
  are in ``services``.

What it must not do: pump the engine or write to the socket (``LinkHost`` does),
or hold routing rules (the core does).  Proton never sends without credit: a
delivery made while the peer gave none waits inside the engine, and the bounds
here keep that wait finite.

A link is held for as long as the peer keeps it attached, thousands per broker
(``--amqp-max-links-total``), so it is small: slotted classes, no per-link
closures, and what only some links use (unsettled deliveries, packet ids sent)
made on first use (``bench/linkmem.py`` measures it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from proton import Condition, Delivery, Link
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.adapter.throttle import PublishThrottle
from mqttamqp.amqp.addresses import queue_topic
from mqttamqp.amqp.codec import (
    DecodeError,
    InboundMessage,
    Mqtt5Props,
    PublishFields,
    PublishMemo,
    decode_message,
    decode_publish,
    encode_annotations,
    encode_control,
    encode_native,
    encode_publish,
    encode_publish5,
    native_parts,
    recall_publish,
)
from mqttamqp.core.auth import Identity, PublishLimiter
from mqttamqp.core.broker import Broker, Outcome
from mqttamqp.core.clients.connections import LinkInfo
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.addresses import (
    QUOTA_EXCEEDED,
    TOPIC_NAME_INVALID,
    Refusal,
    is_queue_command,
    is_queue_topic,
)
from mqttamqp.core.queues.metadata import METADATA_KEYS
from mqttamqp.core.sessions.flow import Congestible
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.topics import topic_size_problem, validate_topic_name
from mqttamqp.net.rawproton import (
    close_with,
    condition,
    decref,
    delivery_aborted,
    delivery_partial,
    delivery_pending,
    delivery_readable,
    delivery_remote,
    delivery_remote_state,
    delivery_settle,
    delivery_settled,
    delivery_update,
    disposition_is_failed,
    from_buffer,
    incref,
    lib,
    link_advance,
    link_credit,
    link_flow,
    link_queued,
    link_send,
    new_delivery,
    recv,
)

__all__ = [
    "LinkHost", "PublishRequests", "BrokerLink", "OutgoingLink", "TopicSubscription",
    "SessionOutlet", "ControlOutlet", "IncomingLink", "TopicPublisher", "settle_mode_name",
    "rcv_mode_name", "ACCEPTED", "REJECTED", "RELEASED", "MODIFIED", "message_properties",
]

ACCEPTED = Delivery.ACCEPTED
REJECTED = Delivery.REJECTED
RELEASED = Delivery.RELEASED
MODIFIED = Delivery.MODIFIED
_TERMINAL = (ACCEPTED, REJECTED, RELEASED, MODIFIED)

DECODE_ERROR = "amqp:decode-error"
INVALID_FIELD = "amqp:invalid-field"
UNAUTHORIZED = "amqp:unauthorized-access"
PRECONDITION_FAILED = "amqp:precondition-failed"
NOT_ALLOWED = "amqp:not-allowed"
# A durable queue's refusal (MQTT 5 reason code) as Rejected's error condition.
_REFUSAL_CONDITIONS = {TOPIC_NAME_INVALID: INVALID_FIELD,
                       QUOTA_EXCEEDED: "amqp:resource-limit-exceeded"}



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


def _encode_with_props(message: Message, props: MessageProperties, qos: int, retain: bool,
                       count: int, packet_id: int | None, native: bytes | None,
                       now: float, first_acquirer: bool) -> bytes:
    """A message with MQTT 5 properties, for a receiver (the slower path): what is
    left of its expiry interval goes out as header.ttl."""
    wire = Mqtt5Props(props.payload_format, message.remaining_expiry(now), props.content_type,
                      props.response_topic, props.correlation_data, props.user_properties)
    if native is not None:
        return encode_native(native, qos, retain, count, message.publisher, wire,
                             first_acquirer)
    return encode_publish5(message.topic, message.payload, qos if packet_id is not None else 0,
                           retain, count, message.publisher, packet_id, wire, first_acquirer)


# A durable queue's metadata (the user properties an MQTT 5 member gets: the seed's
# contract) and the message annotations an AMQP receiver gets them as instead, so
# that the bare message stays as it was sent (AMQP 1.0 §3.2).  An int value is a
# ulong there.  ``delivery-count`` goes in the header.
_QUEUE_ANNOTATIONS = (("message-id", "x-opt-message-id", False), ("queue", "x-opt-queue", False),
                      ("offset", "x-opt-offset", True), ("group-id", "x-opt-group", False))
_DEAD_LETTER_ANNOTATIONS = (("origin-queue", "x-opt-origin-queue", False),
                            ("origin-offset", "x-opt-origin-offset", True),
                            ("origin-group", "x-opt-origin-group", False),
                            ("reason", "x-opt-reason", False))
_DEAD_LETTER_KEYS = frozenset(key for key, _, _ in _DEAD_LETTER_ANNOTATIONS)


def _encode_queue_delivery(message: Message, props: MessageProperties, qos: int,
                           retain: bool, packet_id: int | None, native: bytes | None,
                           now: float) -> bytes:
    """A durable queue's delivery: the message as it was sent (an AMQP sender's bare
    message untouched; an MQTT publisher's as AMQP_PUBLISH, without a message-id),
    with the queue's metadata as message annotations (``x-opt-message-id`` is
    ``<queue>:<offset>``, what names the message; ``x-opt-topic`` the topic it was
    published to), header.delivery-count the deliveries the queue counted before
    this one (a Released one is not counted, a Modified(delivery-failed) one is) and
    first-acquirer true on its first delivery only (the core's copy is ``dup``
    after that)."""
    dead = message.topic.startswith("$dlq/")
    meta: dict[str, str] = {}
    users: list[tuple[str, str]] = []
    for key, value in props.user_properties:
        if key in METADATA_KEYS or (dead and key in _DEAD_LETTER_KEYS):
            meta[key] = value     # (the queue appends its own last: they win)
        else:
            users.append((key, value))
    count_text = meta.get("delivery-count", "1")
    count = max(0, int(count_text) - 1) if count_text.isdigit() else 0
    pairs: list[tuple[str, str | int]] = []
    for key, name, number in (_QUEUE_ANNOTATIONS + _DEAD_LETTER_ANNOTATIONS if dead
                              else _QUEUE_ANNOTATIONS):
        text = meta.get(key)
        if text is not None:
            whole = number and text.isascii() and text.isdigit()
            pairs.append((name, int(text) if whole else text))
    pairs.append(("x-opt-topic", message.topic))
    annotations = encode_annotations(pairs)
    first = not message.dup
    wire = Mqtt5Props(props.payload_format, message.remaining_expiry(now), props.content_type,
                      props.response_topic, props.correlation_data, tuple(users))
    if native is not None:
        return encode_native(native, qos, retain, count, message.publisher, wire, first,
                             annotations)
    return encode_publish5(message.topic, message.payload, qos if packet_id is not None else 0,
                           retain, count, message.publisher, None, wire, first, annotations)


def settle_mode_name(mode: int) -> str:
    return {Link.SND_UNSETTLED: "unsettled", Link.SND_SETTLED: "settled"}.get(mode, "mixed")


def rcv_mode_name(mode: int) -> str:
    return "second" if mode == Link.RCV_SECOND else "first"


_link_serials = itertools.count(1)

class PublishRequests(Protocol):
    """Who decides which session a ``$mqtt.to.<id>.publish`` receiver claims
    (``services.SessionRequests``: AMQP_LIST / AMQP_CLOSE of the same connection)."""

    def publish_attached(self, outlet: SessionOutlet) -> None: ...

    def publish_detached(self, outlet: SessionOutlet) -> None: ...


class LinkHost(Protocol):
    """What a link needs from its AMQP connection (``listener.AMQPConnection``)."""

    broker: Broker
    limits: Limits
    identity: Identity
    container_id: str
    serial: int
    peer: str
    publish_rate: PublishLimiter | None
    meter: DeliveryMeter     # the core's counters, written the adapters' way
    write_blocked: bool      # the socket's buffer is full (until it drains)

    @property
    def requests(self) -> PublishRequests: ...

    def schedule_flush(self) -> None: ...

    def after(self, fn: Callable[[], None]) -> None: ...

    def forget_link(self, link: BrokerLink) -> None: ...

    def send_control(self, client_id: str, data: bytes) -> bool: ...

    def register_control(self, outlet: ControlOutlet) -> None: ...

    def unregister_control(self, outlet: ControlOutlet) -> None: ...

    def claim_will(self, link: BrokerLink) -> None: ...

    def hold(self, delta: int) -> None:
        """Bytes of unfinished incoming messages changed by ``delta``."""

    def release_will(self, link: BrokerLink) -> bool: ...


class BrokerLink:
    """One attached link and what it is for."""

    __slots__ = (
        "_partial",
        "address",
        "broker",
        "closed",
        "delivered",
        "host",
        "impl",
        "name",
        "plink",
    )
    log = Logger()
    role = ""                            # "sender" or "receiver", from the broker's side

    def __init__(self, host: LinkHost, plink: Any, address: str) -> None:
        self.host = host
        self.plink = plink
        self.impl: Any = plink._impl     # raw pointer for the per-message path (rawproton)
        self.address = address
        self.name: str = plink.name
        self.broker = host.broker
        self.closed = False
        self.delivered = 0
        self._partial = 0   # bytes of an unfinished incoming message (IncomingLink)

    def start(self) -> None:
        """Called once the attach has been answered."""

    def on_delivery(self, dlv: Any) -> None:
        """A delivery event on this link: the per-message path (a raw pointer)."""

    def on_flow(self) -> None:
        """The peer's flow frame on this link."""

    def end(self, brute: bool, reason: str) -> None:
        """The link is gone (detach, end, close or lost connection); idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._partial:
            self.host.hold(-self._partial)
            self._partial = 0
        self.ended(brute, reason)

    def ended(self, brute: bool, reason: str) -> None:
        pass

    def detach(self, condition: str, description: str) -> None:
        """Broker-initiated detach with an error condition."""
        self.end(True, description)
        self.host.forget_link(self)
        try:
            impl = self.impl
            close_with(impl, lib.pn_link_condition(impl), lib.pn_link_close, condition,
                       description)
        finally:
            self.host.schedule_flush()

    def info(self) -> LinkInfo:
        plink = self.plink
        credit = unsettled = 0
        try:
            credit, unsettled = plink.credit, plink.unsettled
        except Exception:  # a freed link: report zeros rather than fail the console
            pass
        return LinkInfo(
            name=self.name, role=self.role, address=self.address,
            snd_settle_mode=settle_mode_name(plink.snd_settle_mode),
            rcv_settle_mode=rcv_mode_name(plink.rcv_settle_mode),
            credit=credit, unsettled=unsettled, delivered=self.delivered)


# -- broker → peer ---------------------------------------------------------------------

class OutgoingLink(BrokerLink):
    __slots__ = ("_awaiting", "_over_credit_bytes", "_tag", "mixed", "presettled")
    role = "sender"

    def __init__(self, host: LinkHost, plink: Any, address: str) -> None:
        super().__init__(host, plink, address)
        mode = plink.snd_settle_mode
        self.presettled = mode == Link.SND_SETTLED
        self.mixed = mode == Link.SND_MIXED
        self._tag = 0             # the last delivery tag number made (``next_tag``)
        self._over_credit_bytes = 0
        # Unsettled deliveries whose outcome matters, by their (live) pointer: a packet
        # id, or its complement (< 0) for a PUBREL.  Cheaper than reading tags back.
        # Made on the first (a receiver of QoS 0 or pre-settled only never needs it).
        self._awaiting: dict[Any, int] | None = None

    def next_tag(self) -> int:
        self._tag += 1
        return self._tag

    def transfer(self, tag: bytes, data: bytes, settled: bool, key: int | None = None,
                 published_at: float = 0.0) -> None:
        """Hand one delivery to the engine; ``published_at``: a message's receipt
        time (sampled by the meter), 0 for a pubrel or a control reply."""
        impl = self.impl
        if link_credit(impl) <= 0:
            # Waits inside the engine until the peer grants credit.
            if link_queued(impl) == 0:
                self._over_credit_bytes = 0
            self._over_credit_bytes += len(data)
        # (``rawproton``, inline: this is every message's path)
        dlv = new_delivery(impl, (len(tag), from_buffer(tag)))
        link_send(impl, data, len(data))
        link_advance(impl)
        if settled:
            delivery_settle(dlv)
        elif key is not None:
            awaiting = self._awaiting
            if awaiting is None:
                awaiting = self._awaiting = {}
            awaiting[dlv] = key
        self.delivered += 1
        host = self.host
        host.meter.transferred(published_at)   # (bytes are counted per socket write)
        host.schedule_flush()

    @property
    def credit_room(self) -> bool:
        """The peer's credit covers one more message (beyond those waiting for it):
        the core feeds retained messages, and shared groups their QoS 0 ones, only
        then (``Session.has_room``)."""
        impl = self.impl
        return bool(link_credit(impl) > link_queued(impl))

    def over_credit_full(self) -> bool:
        """Too much is already waiting for credit: a QoS 0 message is dropped."""
        impl = self.impl
        return (link_credit(impl) <= 0 and link_queued(impl) > 0
                and self._over_credit_bytes > self.host.limits.congested_qos0_bytes)

    def on_flow(self) -> None:
        plink = self.plink
        if plink.drain_mode and plink.credit > 0 and plink.queued == 0 and self.idle():
            plink.drained()
            self.host.schedule_flush()

    def idle(self) -> bool:
        """Nothing more to send right now (used to answer a drain)."""
        return True

    def on_writable(self) -> None:
        """The socket buffer drained."""

    def on_blocked(self) -> None:
        """The socket's buffer filled or drained (``host.write_blocked`` changed)."""

    def on_delivery(self, dlv: Any) -> None:
        """A raw delivery of ours was updated by the peer (its outcome)."""
        state = delivery_remote_state(dlv)
        if state not in _TERMINAL and not delivery_settled(dlv):
            return  # non-terminal (e.g. Received): wait for the outcome
        failed = state == MODIFIED and bool(
            disposition_is_failed(delivery_remote(dlv)))
        reason = _rejected_reason(dlv) if state == REJECTED else None
        awaiting = self._awaiting
        key = awaiting.pop(dlv, None) if awaiting else None
        delivery_settle(dlv)  # its address may be reused from here on
        if key is not None:
            self.outcome(key, state, failed, reason)

    def outcome(self, key: int, state: int, failed: bool, reason: str | None = None) -> None:
        """The outcome of the delivery sent with ``key`` (``reason``: Rejected's
        error description, if it gave one)."""


def _rejected_reason(dlv: Any) -> str | None:
    """The error description of the peer's Rejected outcome on ``dlv`` (a durable
    queue dead-letters with it), bytes that are not UTF-8 escaped; None if it gave
    none."""
    both = condition(lib.pn_disposition_condition(delivery_remote(dlv)))
    if both is None:
        return None
    name, description = both
    return description or name or None


# The key of an unsettled QoS 1/2 delivery (``OutgoingLink._awaiting``): its packet
# id, with this bit set for QoS 2 (whose Accepted has the settlement rules of
# ``Broker.settle``); a PUBREL's is the complement.
_QOS2 = 1 << 16
_PACKET_ID = _QOS2 - 1

_encode_cache: list[Any] = [None, False, b""]
_ACCEPTED_OUTCOME = Outcome.ACCEPTED   # (an Enum's attribute costs a lookup each time)
_OUTCOMES: dict[int, Outcome] = {
    int(ACCEPTED): Outcome.ACCEPTED, int(REJECTED): Outcome.REJECTED,
    int(RELEASED): Outcome.RELEASED, int(MODIFIED): Outcome.MODIFIED}


class _SessionLink(OutgoingLink):
    """Delivers a core ``Session`` to the peer (the ``ClientLink`` of the core)."""

    __slots__ = ("_backlog", "_sent", "congested", "session")
    # Messages from AMQP senders go out as they were sent (a native receiver), not
    # as the contract's AMQP_PUBLISH with the MQTT payload (an FE).
    native = False
    # Deliveries of a durable queue (``queuelinks``): the queue's metadata in the
    # message annotations (``_encode_queue_delivery``).
    queue = False

    def __init__(self, host: LinkHost, plink: Any, address: str) -> None:
        super().__init__(host, plink, address)
        self.session: Session | None = None
        # Packet ids transmitted on this link, unsettled; made on the first (QoS 0
        # and pre-settled receivers never need it).
        self._sent: set[int] | None = None
        self._backlog = 0
        # ClientLink.congested: closed, or the socket's buffer is full.  Credit is
        # not congestion: a receiver without credit gets nothing (the engine holds at
        # most the in-flight window) and its queue is bounded; only a full socket
        # buffer makes publishers wait.  An attribute, not a property: the core
        # reads it for every message sent and routed (a property is a call each);
        # ``end`` and ``on_blocked`` keep it.
        self.congested = host.write_blocked

    def on_blocked(self) -> None:
        self.congested = self.closed or self.host.write_blocked

    def end(self, brute: bool, reason: str) -> None:
        self.congested = True
        super().end(brute, reason)

    # ClientLink -------------------------------------------------------------------

    @property
    def backlog_bytes(self) -> int:
        return self._backlog if self.host.write_blocked else 0

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool) -> None:
        if self.closed:
            return
        session = self.session
        count = 1 if message.dup else 0
        if packet_id is not None:
            if dup and session is not None:
                # (a failed attempt marks the entry dup: a first send has none)
                count += session.delivery_failures(packet_id)
            sent = self._sent
            if sent is None:
                sent = self._sent = set()
            if dup and packet_id not in sent:
                count += 1  # sent on an earlier connection: a failed attempt
            sent.add(packet_id)
        elif self.over_credit_full():
            if session is not None:
                session.drop_congested(message.topic)
            return
        native = message.native if self.native else None
        props = message.props
        # First-acquirer: no delivery of this message came before this one, here or
        # (a publisher's redelivery) upstream.
        first = not (dup or message.dup)
        if props is None:
            if native is not None:
                data = encode_native(native, qos, retain, count, message.publisher, None,
                                     first)
            elif packet_id is not None:
                data = encode_publish(message.topic, message.payload, qos, retain, count,
                                      message.publisher, packet_id, first)
            else:
                cache = _encode_cache
                if cache[0] is message and cache[1] == retain:
                    data = cache[2]  # fan-out of one QoS 0 message: encoded once
                else:
                    data = encode_publish(message.topic, message.payload, 0, retain, count,
                                          message.publisher, None, first)
                    cache[0], cache[1], cache[2] = message, retain, data
        elif self.queue:
            data = _encode_queue_delivery(message, props, qos, retain, packet_id, native,
                                          self.broker.clock.seconds())
        else:
            data = _encode_with_props(message, props, qos, retain, count, packet_id, native,
                                      self.broker.clock.seconds(), first)
        if self.host.write_blocked:
            self._backlog += len(data)
        if packet_id is None:
            settled = self.presettled or self.mixed
            self.transfer(b"s" if settled else b"z%d" % self.next_tag(), data, settled,
                          None, message.timestamp)
            return
        self.transfer(b"%d" % packet_id, data, self.presettled,
                      packet_id if qos == 1 else packet_id | _QOS2, message.timestamp)
        if self.presettled:
            # The receiver asked for everything settled: at most once, done now.
            self.host.after(lambda: self._finished(packet_id, ACCEPTED))

    def send_pubrel(self, packet_id: int) -> None:
        if self.closed:
            return
        from proton import ulong

        data = encode_control("pubrel", message_id=ulong(packet_id))
        self.transfer(b"r%d" % packet_id, data, self.presettled, -packet_id)
        if self.presettled:
            self.host.after(lambda: self._released_done(packet_id))

    def close(self, reason: str) -> None:
        """Broker-initiated (takeover, console): the session was already ended."""
        if self.closed:
            return
        self.session = None
        condition = "amqp:link:stolen" if "taken over" in reason else "amqp:link:detach-forced"
        self.log.info("detaching {a} of {c} ({peer}): {r}", a=self.address,
                      c=self.host.container_id, peer=self.host.peer, r=reason)
        self.detach(condition, reason)

    # outcomes ------------------------------------------------------------------------

    def on_delivery(self, dlv: Any) -> None:
        if delivery_remote_state(dlv) != ACCEPTED:
            super().on_delivery(dlv)
            return
        # Accepted, the usual outcome: ``on_delivery``, ``outcome`` and ``_finished``
        # of that case in one.
        awaiting = self._awaiting
        key = awaiting.pop(dlv, None) if awaiting else None
        delivery_settle(dlv)  # its address may be reused from here on
        if key is None:
            return
        if key < 0:
            self._pubrel_outcome(-key, ACCEPTED)
            return
        session = self.session
        if session is None or self.closed:
            return
        sent = self._sent
        if key & _QOS2:
            key ^= _QOS2
            if sent is not None:
                sent.discard(key)
            self.broker.settle(session, key, _ACCEPTED_OUTCOME)
            return
        # QoS 1: what ``Broker.settle`` does with Accepted on one, without asking
        # the session again (``Session.acknowledge`` checks the id is QoS 1 in flight).
        if sent is not None:
            sent.discard(key)
        self.broker.acknowledged(session, key)

    def outcome(self, key: int, state: int, failed: bool, reason: str | None = None) -> None:
        if key < 0:
            self._pubrel_outcome(-key, state)
        else:
            self._finished(key & _PACKET_ID, state, failed, reason)

    def _finished(self, packet_id: int, state: int, failed: bool = False,
                  reason: str | None = None) -> None:
        session = self.session
        if session is None or self.closed:
            return
        sent = self._sent
        if sent is not None and (self.queue or (state != RELEASED and state != MODIFIED)):
            # (a queue's redelivery is a new delivery: its packet id is free again)
            sent.discard(packet_id)
        self.broker.settle(session, packet_id, _OUTCOMES.get(state, Outcome.ACCEPTED), failed,
                           reason)

    def _pubrel_outcome(self, packet_id: int, state: int) -> None:
        session = self.session
        if session is None or self.closed:
            return
        if state == RELEASED or state == MODIFIED:
            self.send_pubrel(packet_id)
            return
        self.broker.completed(session, packet_id)

    def _released_done(self, packet_id: int) -> None:
        if self.session is not None and not self.closed:
            self.broker.completed(self.session, packet_id)

    def on_flow(self) -> None:
        super().on_flow()
        if self.session is not None and not self.closed:
            self.broker.link_drained(self.session)

    def on_writable(self) -> None:
        self._backlog = 0
        if self.session is not None and not self.closed:
            self.broker.link_drained(self.session)

    def idle(self) -> bool:
        session = self.session
        return session is None or not session.has_queued


class TopicSubscription(_SessionLink):
    """A receiver whose source is a topic filter: every matching message."""

    __slots__ = ("key", "reserved")
    native = True

    def __init__(self, host: LinkHost, plink: Any, topic_filter: str,
                 reserved: bool = False) -> None:
        super().__init__(host, plink, topic_filter)
        self.reserved = reserved   # the address of its own dynamic node
        # Unique per link: two sessions of one connection may reuse a link name.
        self.key = f"amqp:{host.container_id}:{self.name}#{host.serial}.{next(_link_serials)}"

    def subscribe(self) -> str | None:
        """Route the filter to a session of this link; returns why it failed, or None."""
        granted = 0 if self.presettled else 2
        session = self.broker.add_topic_receiver(
            self.key, self.address, self.host.identity, granted, self.reserved)
        if session is None:
            return "subscription to this topic filter is not allowed"
        self.session = session   # before anything is delivered: drops count against it
        self.broker.start_topic_receiver(session, self)
        return None

    def ended(self, brute: bool, reason: str) -> None:
        self.session = None
        self.broker.detach_topic_receiver(self.key)


class SessionOutlet(_SessionLink):
    """A receiver on ``$mqtt.to.<id>.publish``: the session of that client id."""

    __slots__ = ("active", "client_id", "opening")

    def __init__(self, host: LinkHost, plink: Any, address: str, client_id: str) -> None:
        super().__init__(host, plink, address)
        self.client_id = client_id
        self.active = False
        self.opening = False

    def start(self) -> None:
        self.host.requests.publish_attached(self)

    def open_session(self, clean: bool) -> None:
        """Claim the session (taking it over from whoever holds it), then deliver."""
        if self.closed:
            return
        opened = self.broker.open_session(self, self.client_id, clean, None,
                                          self.host.identity)
        session, d = opened.session, opened.durable
        self.session = session
        self.opening = True
        self.active = False
        if d is None:
            self.host.after(lambda: self._activate(session))
        else:
            d.addCallback(lambda _: self._activate(session))
            d.addErrback(self._open_failed)

    def _activate(self, session: Session) -> None:
        if self.closed or self.session is not session:
            return
        self.opening = False
        self.active = True
        self.broker.activate(session, self, "amqp")
        self.log.info("{c} attached to the session of {id} ({peer}, clean={cl})",
                      c=self.host.container_id, id=self.client_id, peer=self.host.peer,
                      cl=not session.persistent)
        self.host.schedule_flush()

    def _open_failed(self, failure: Failure) -> None:
        # A storage failure: logged once per failing spell by the core, not per link.
        self.log.debug("could not open the session of {id}: {f}", f=failure.value,
                       id=self.client_id)
        if not self.closed:
            self.detach("amqp:internal-error", "storage failure while opening the session")

    def session_closed(self) -> None:
        """The broker removed the session this receiver held (AMQP_CLOSE from its own
        FE): it stays attached, holding nothing until it opens another."""
        self.session = None
        self.active = False
        self.opening = False
        self._sent = None
        # Its unsettled deliveries belong to the old session: an outcome for one of
        # them must not name a packet id of the next session (ids start again).
        self._awaiting = None

    def ended(self, brute: bool, reason: str) -> None:
        self.host.requests.publish_detached(self)
        session, self.session = self.session, None
        if session is not None:
            self.broker.end_session(self, session, clean=False, reason=reason)


class ControlOutlet(OutgoingLink):
    """A receiver on ``$mqtt.to.<id>.control``: replies of the subscription service."""

    __slots__ = ("client_id",)

    def __init__(self, host: LinkHost, plink: Any, address: str, client_id: str) -> None:
        super().__init__(host, plink, address)
        self.client_id = client_id

    def start(self) -> None:
        self.host.register_control(self)

    def send(self, data: bytes) -> None:
        self.transfer(b"c%d" % self.next_tag(), data, self.presettled)

    def ended(self, brute: bool, reason: str) -> None:
        self.host.unregister_control(self)


# -- peer → broker -----------------------------------------------------------------------

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
    max_window = 100   # the most credit the peer holds at a time

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
        # ``_answered`` reads the engine's credit only when a top-up may be due.
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

    def _answered(self) -> None:
        """One more delivery answered (``outstanding`` is down by one): top up the
        credit if ``top_up`` would now (owed a refill's worth, or the peer is out
        of credit: owed at least the window's room)."""
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
        self._answered()

    def _too_large(self) -> None:
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
        self._answered()
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


class TopicPublisher(IncomingLink):
    """A sender to a topic address, or to the null address with ``to`` on each message."""

    __slots__ = ("_held", "_memo", "_route", "_throttle", "_warned_amqp_only", "topic")

    def __init__(self, host: LinkHost, plink: Any, topic: str | None) -> None:
        super().__init__(host, plink, topic or "")
        self.topic = topic
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
            host.meter.amqp_only()
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
        host.meter.received_amqp()
        if result.congested:
            self.block_until_drained(result.congested)
        if result.blocked:
            self.block_until_queues_writable()
        if self._throttle is not None:
            self._throttle.charge(len(routed.payload))
        if presettled:
            self.outstanding -= 1
            delivery_settle(dlv)
            self._answered()
            return
        if result.durable is None:
            # Nothing to make durable: Accepted at once (``answer``'s common case, on
            # an unsettled delivery of a link that settles first; inside the pump,
            # which writes the disposition when it ends).
            if self.closed:
                return
            self.outstanding -= 1
            delivery_update(dlv, ACCEPTED)
            delivery_settle(dlv)
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
            delivery_settle(dlv)
            self.top_up()
            return
        condition = _REFUSAL_CONDITIONS.get(refusal.code, PRECONDITION_FAILED)
        self.answer(dlv, REJECTED, (condition, refusal.reason))

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
        result = self.broker.publish(routed, wait=False)
        self.host.meter.received_amqp()
        if result.congested:
            self.block_until_drained(result.congested)
        if result.blocked:
            self.block_until_queues_writable()
        if self._throttle is not None:
            self._throttle.charge(len(routed.payload))
        self.host.schedule_flush()

    def ended(self, brute: bool, reason: str) -> None:
        super().ended(brute, reason)
        if self._throttle is not None:
            self._throttle.stop()
        if self._held:
            self.log.info("{n} exactly-once message(s) on {a} were never settled by the "
                          "sender; not routed", n=len(self._held), a=self.address)
        self._held = None
