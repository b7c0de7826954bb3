"""Links that deliver a core ``Session`` to the peer (the core's ``ClientLink``).

What it owns: ``TopicSubscription`` (source = a topic filter: a session of its
own, in the trie, not keyed by a client id) and ``SessionOutlet``
(``$mqtt.to.<id>.publish``: the client id's session, claimed like an MQTT
connection claims it): QoS 0 goes pre-settled, QoS 1/2 unsettled with the packet
id as delivery tag, and the receiver's outcome drives the session (Accepted done,
Released redelivered unchanged, Modified redelivered with delivery-count + 1 if
delivery-failed, Rejected dropped and counted; settled without an outcome is
consumed on a topic or queue receiver, Modified(delivery-failed) on ``.publish``
(``links.DEFAULT_OUTCOME``, the gateway contract), dropped as rejected past
``--amqp-max-default-outcomes``); each delivery's
delivery-count and first-acquirer (its own failed attempts, never the publisher's
DUP); how each message is encoded for its receiver (the contract's AMQP_PUBLISH,
the sender's own sections, a durable queue's metadata as annotations).

What it must not do: decide which session a ``.publish`` receiver claims
(``services.SessionRequests``), or hold routing rules (the core does).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, cast

from twisted.python.failure import Failure

from mqttamqp.amqp.codec.contract import Mqtt5Props
from mqttamqp.amqp.codec.encode import (
    encode_annotations,
    encode_control,
    encode_native,
    encode_publish,
    encode_publish5,
)
from mqttamqp.amqp.links import (
    ACCEPTED,
    DEFAULT_OUTCOME,
    MODIFIED,
    NO_OUTCOME,
    REJECTED,
    RELEASED,
    LinkHost,
    OutgoingLink,
)
from mqttamqp.core.broker import Outcome
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.metadata import METADATA_KEYS
from mqttamqp.core.sessions.entries import NativeLink
from mqttamqp.core.sessions.session import Session
from mqttamqp.net.rawproton import SETTLED_TAG, delivery_remote_state, delivery_settle

__all__ = ["PublishRequests", "OutletHost", "TopicSubscription", "SessionOutlet"]


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
    # (an AMQP 0.9.1 publisher's correlation-id, a short string, goes as a string)
    return encode_publish5(message.topic, message.payload, qos if packet_id is not None else 0,
                           retain, count, message.publisher, packet_id, wire, first_acquirer,
                           correlation_text=message.amqp091 is not None,
                           priority=message.priority)


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
                           retain, count, message.publisher, None, wire, first, annotations,
                           correlation_text=message.amqp091 is not None,
                           priority=message.priority)


_link_serials = itertools.count(1)


class PublishRequests(Protocol):
    """Who decides which session a ``$mqtt.to.<id>.publish`` receiver claims
    (``services.SessionRequests``: AMQP_LIST / AMQP_CLOSE of the same connection)."""

    def publish_attached(self, outlet: SessionOutlet) -> None: ...

    def publish_detached(self, outlet: SessionOutlet) -> None: ...


class OutletHost(LinkHost, Protocol):
    """What a ``SessionOutlet`` needs from its connection besides a ``LinkHost``."""

    @property
    def requests(self) -> PublishRequests: ...


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


class _SessionLink(OutgoingLink, NativeLink):
    """Delivers a core ``Session`` to the peer (the ``ClientLink`` of the core; a
    ``NativeLink``: in the compiled build ``Session.deliver`` calls its
    ``send_publish`` natively, as MQTT's)."""

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
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        # (``subscription_ids``: MQTT 5's, no AMQP field carries them)
        if self.closed:
            return
        session = self.session
        # The publisher's DUP is not this delivery's (MQTT 3.1.1 §3.3.1.1: set only by
        # whether this send is a retransmission): a topic or ``.publish`` delivery
        # counts its own failed attempts only.  A durable queue's copy is ``dup`` when
        # the queue delivered it before (the publisher's was cleared on the way in).
        redelivered = message.dup and self.queue
        count = 1 if redelivered else 0
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
        # First-acquirer: no delivery of this message came before this one, on this
        # session or (a queue's) to another member.
        first = not (dup or redelivered)
        if props is None:
            if native is not None:
                data = encode_native(native, qos, retain, count, message.publisher, None,
                                     first)
            elif packet_id is not None:
                data = encode_publish(message.topic, message.payload, qos, retain, count,
                                      message.publisher, packet_id, first, message.priority)
            else:
                cache = _encode_cache
                if cache[0] is message and cache[1] == retain:
                    data = cache[2]  # fan-out of one QoS 0 message: encoded once
                else:
                    data = encode_publish(message.topic, message.payload, 0, retain, count,
                                          message.publisher, None, first, message.priority)
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
            self.transfer(SETTLED_TAG if settled else b"z%d" % self.next_tag(), data, settled,
                          None, message.timestamp)
            return
        self.transfer(packet_id, data, self.presettled,
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

    def delivery_of(self, key: int) -> tuple[Session, int] | None:
        session = self.session
        if session is None or self.closed or key < 0:
            return None
        return session, key & _PACKET_ID

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

    __slots__ = ("key", "reserved", "selector")
    native = True

    def __init__(self, host: LinkHost, plink: Any, topic_filter: str,
                 reserved: bool = False,
                 selector: Callable[[Message], bool] | None = None) -> None:
        super().__init__(host, plink, topic_filter)
        self.reserved = reserved   # the address of its own dynamic node
        self.selector = selector   # its source's selector (``selection``): None, all
        # Unique per link: two sessions of one connection may reuse a link name.
        self.key = f"amqp:{host.container_id}:{self.name}#{host.serial}.{next(_link_serials)}"

    def subscribe(self) -> str | None:
        """Route the filter to a session of this link; returns why it failed, or None."""
        granted = 0 if self.presettled else 2
        session = self.broker.add_topic_receiver(
            self.key, self.address, self.host.identity, granted, self.reserved,
            selector=self.selector)
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

    __slots__ = ("_pubrel_retries", "active", "client_id", "opening")
    # The gateway contract (issue #29): an FE that settles without an outcome has not
    # delivered the message to its client, so it is sent again (bounded, ``outcome``).
    default_outcome: ClassVar[int] = DEFAULT_OUTCOME

    def __init__(self, host: OutletHost, plink: Any, address: str, client_id: str) -> None:
        super().__init__(host, plink, address)
        self.client_id = client_id
        self.active = False
        self.opening = False
        # AMQP_PUBRELs resent after a settlement without an outcome, by packet id
        # (made on the first; at most one per packet id in flight).
        self._pubrel_retries: dict[int, int] | None = None

    def outcome(self, key: int, state: int, failed: bool, reason: str | None = None) -> None:
        if reason is NO_OUTCOME and key < 0:
            retries = self._pubrel_retries
            if retries is None:
                retries = self._pubrel_retries = {}
            n = retries.get(-key, 0) + 1
            if n <= self.host.limits.amqp_max_default_outcomes:
                retries[-key] = n
            else:
                retries.pop(-key, None)
                self._given_up(-key, "AMQP_PUBREL")
                return
        elif reason is NO_OUTCOME and key >= 0:
            session = self.session
            packet_id = key & _PACKET_ID
            if (session is not None and not self.closed
                    and session.delivery_failures(packet_id)
                    >= self.host.limits.amqp_max_default_outcomes
                    and session.awaiting_release(packet_id) is False):
                self._given_up(key, "message")
                return
        super().outcome(key, state, failed, reason)

    def _pubrel_outcome(self, packet_id: int, state: int) -> None:
        retries = self._pubrel_retries
        if retries and state != RELEASED and state != MODIFIED:
            retries.pop(packet_id, None)   # (done: the id may be reused)
        super()._pubrel_outcome(packet_id, state)

    def _given_up(self, key: int, what: str) -> None:
        """Drop the delivery of ``key`` settled without an outcome once too often:
        counted as rejected, one log line a minute at most."""
        session = self.session
        if session is None or self.closed:
            return
        limit = self.host.limits.amqp_max_default_outcomes
        reason = f"settled without an outcome more than {limit} times"
        held = self.host.log_limit.allow("amqp-max-default-outcomes")
        if held is not None:
            self.log.warn("{c}: a {what} to {id} dropped as rejected: {r} "
                          "(--amqp-max-default-outcomes; {h} more not logged)",
                          c=self.host.container_id, what=what, id=self.client_id,
                          r=reason, h=held)
        if what == "message":
            self._finished(key & _PACKET_ID, REJECTED, False, reason)
        else:
            self.broker.rejected(session, key, reason)

    def start(self) -> None:
        cast(OutletHost, self.host).requests.publish_attached(self)

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
        self._pubrel_retries = None
        # Its unsettled deliveries belong to the old session: an outcome for one of
        # them must not name a packet id of the next session (ids start again).
        self._awaiting = None

    def ended(self, brute: bool, reason: str) -> None:
        cast(OutletHost, self.host).requests.publish_detached(self)
        session, self.session = self.session, None
        if session is not None:
            self.broker.end_session(self, session, clean=False, reason=reason)
