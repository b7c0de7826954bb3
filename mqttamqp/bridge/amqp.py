"""AMQP 1.0 bridges: a ``[[bridge]]`` whose address is ``amqp://`` or ``amqps://``.

What it owns: the AMQP side of a bridge (``base.BridgeBase`` has the rest: the out
session ``$bridge/<name>`` and its backlog bound, the connect loop, the status): the
connection to the remote (the gateway's ``UpstreamConnection``: a proton client
engine, SASL PLAIN with ``username``/``password`` or ANONYMOUS, TLS below it checked
as for ``mqtts://``), one session on it with

* ``out``: one sender to the null address (the anonymous relay), each message with
  ``to`` = its remote address (``remote-prefix`` + the topic past ``local-prefix``,
  as an MQTT bridge maps topics), the MQTT fields as the contract's annotations and
  the ``bridge-hops`` count in application-properties.  QoS 0 goes pre-settled,
  QoS 1 and 2 unsettled, tagged by the session's packet id, and the session's entry
  is done only on the remote's outcome (``amqpterms``): accepted (done), rejected
  for good (dropped, counted, logged once a minute per condition), rejected for
  now (``amqp:resource-limit-exceeded``: counted as released, logged once a minute,
  sent again as below, until ``max-full-wait`` seconds of such refusals in a row:
  then dropped, counted as ``full_dropped`` and as rejected; ``amqp.refusals`` is
  the one table), released, modified or
  settled without an outcome (sent again, with credit, ``reconnect-min`` seconds
  later doubling up to ``reconnect-max`` until the remote accepts one on the same
  address: the back-off is per address, ``amqplink.Resends``; never dropped),
  modified with delivery-failed (the same, ``max-resends`` times at most, then
  dropped as a poison message, counted and logged as rejected).  One above the
  remote's max-message-size is dropped (``too_large``).  The sender's credit is
  the window: while the remote grants none, the session sends nothing more (QoS 0
  still goes, to the session's bound of a congested link's QoS 0 bytes);
* ``in``: a receiver per ``in`` rule, its source address the rule's remote filter,
  each message published here with the bridge as publisher at min(its QoS, the
  rule's) and accepted only once durable here (``base.take_in``); ``credit``
  (the table's key) unsettled messages at most are outstanding per receiver, and
  while ``take_in`` holds the remote none is given back (the socket is still read:
  heartbeats go on); a message with no MQTT form (no topic, a body that is not
  bytes), a topic that is no valid topic name here or a control address
  (amqp:invalid-field, as the core's AMQP ingress), a queue acknowledgement
  (amqp:not-allowed), one a durable queue refuses for good (a ``$dlq/`` topic: its
  condition, ``amqp.refusals``; one refused for now, a full queue, drops the
  connection), or larger
  than ``--max-packet-size`` (announced as each receiver's max-message-size), is
  rejected, counted and logged once a minute at most.  Loops: the out session is
  no-local here, and on a ``both`` rule a message the remote delivers with our
  container id as its publisher (``x-opt-mqtt-client-id``, as mqttamqp annotates) is
  accepted and not published again here (counted as an echo).

What it must not do: speak MQTT, store anything itself, copy the gateway's engine
(it is used as it is), or keep a pointer proton may free: an incoming delivery waiting
for the store is held with ``incref``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from twisted.logger import Logger

from mqttamqp.amqp.codec.contract import ANNOTATION_CLIENT_ID, Mqtt5Props
from mqttamqp.amqp.codec.encode import encode_publish5
from mqttamqp.amqp.codec.publish import decode_publish
from mqttamqp.amqp.codec.sections import decode_message
from mqttamqp.amqp.codec.values import DecodeError
from mqttamqp.amqp.links import INVALID_FIELD, NOT_ALLOWED
from mqttamqp.amqp.publisher import to_problem
from mqttamqp.amqp.refusals import condition_of, for_good
from mqttamqp.bridge.amqplink import AmqpLink
from mqttamqp.bridge.amqpterms import (
    ACCEPTED,
    FAILED,
    FULL,
    REJECTED,
    RELEASED,
    TERMINAL,
    outcome_of,
    refused,
    upstream_of,
)
from mqttamqp.bridge.base import PROTOCOL, BridgeBase
from mqttamqp.bridge.config import TopicRule
from mqttamqp.bridge.link import HOPS, BridgeLink, RemoteLimits
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.addresses import QUEUE_COMMAND, Refusal
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.topics import topic_matches
from mqttamqp.gateway.engine import UpstreamConnection
from mqttamqp.net.rawproton import (
    SETTLED_TAG,
    decref,
    delivery_link,
    delivery_partial,
    delivery_readable,
    delivery_remote_state,
    delivery_settle,
    delivery_settled,
    delivery_update,
    incref,
    lib,
    link_advance,
    link_credit,
    link_flow,
    link_send,
    new_delivery,
    packet_id_tag,
    recv,
)

__all__ = ["ACCEPTED", "REJECTED", "RELEASED", "AmqpBridge", "AmqpLink", "AmqpRemote",
           "refused"]

class AmqpRemote:
    """One AMQP connection to the remote: the owner of a gateway ``UpstreamConnection``
    and the channel of its one session (``gateway.engine.ChannelEvents``)."""

    log = Logger()

    def __init__(self, bridge: AmqpBridge, max_frame: int) -> None:
        s = bridge.settings
        self.bridge = bridge
        self.conn = UpstreamConnection(self, bridge.clock, upstream_of(bridge),
                                       s.remote_client_id, float(s.keepalive), max_frame, 1)
        self.paused_for: set[str] = set()
        self.session: Any = None
        self.sender: Any = None
        self.sender_impl: Any = None
        self.rules: dict[Any, TopicRule] = {}   # receiver (raw) → its rule
        self.waiting: dict[Any, int] = {}       # our unsettled deliveries → packet id
        self.held: set[Any] = set()   # incoming deliveries waiting for the store (incref'd)
        self.owed: dict[Any, int] = {}   # receiver (raw) → credit withheld while paused
        self.ready = False      # every link attached (the open timer stops)
        self.detached = False   # dropped, or a link detached: nothing more is answered
        self.closed = False
        self.max_message = 0   # the remote's max-message-size on the sender (0: none)
        self.unsent = 0        # bytes sent without credit, still queued in proton ...
        self._unsent: deque[int] = deque()   # ... and their sizes, in order
        self._attaching = 0
        self._timer: Any = bridge.clock.callLater(s.connect_timeout * 2, self._no_open)

    # -- what the bridge uses (base.Remote) ----------------------------------

    @property
    def container(self) -> str:
        """The remote's container id (from its open), for the log."""
        pconn = self.conn.pconn
        return str(pconn.remote_container or "?") if pconn is not None else "?"

    @property
    def no_credit(self) -> bool:
        impl = self.sender_impl
        return impl is None or link_credit(impl) <= 0

    def backlog(self) -> int:
        """The bytes sent without credit still queued in proton: those it has put on
        the wire since are out of it (read when asked: proton counts a delivery
        queued until its output is written, after the flow that lets it go)."""
        queued = self._unsent
        if queued:
            left = lib.pn_link_queued(self.sender_impl)
            while len(queued) > left:
                self.unsent -= queued.popleft()
        return self.unsent

    def send(self, address: str, message: Message, qos: int, retain: bool, dup: bool,
             hops: int, packet_id: int | None, now: float) -> int:
        """Send one message; its encoded size instead if that is above the remote's
        max-message-size (not sent: the caller drops it), else 0."""
        props = message.props
        users = ((*(p for p in props.user_properties if p[0] != HOPS), (HOPS, str(hops)))
                 if props is not None else ((HOPS, str(hops)),))
        wire = (Mqtt5Props(None, None, None, None, None, users) if props is None else
                Mqtt5Props(props.payload_format, message.remaining_expiry(now),
                           props.content_type, props.response_topic, props.correlation_data,
                           users))
        body = encode_publish5(address, message.payload, qos, retain, int(dup),
                               message.publisher, None, wire)
        if self.max_message and len(body) > self.max_message:
            return len(body)
        # (ready tags, ``rawproton``: the packet id's digits, unique among the session's
        # deliveries in flight; one tag for all the pre-settled)
        ctag = SETTLED_TAG if packet_id is None else packet_id_tag(packet_id)
        impl = self.sender_impl
        if link_credit(impl) <= 0:   # (queued in proton until the remote's flow)
            self.unsent += len(body)
            self._unsent.append(len(body))
        dlv = new_delivery(impl, ctag)
        link_send(impl, body, len(body))
        link_advance(impl)
        if packet_id is None:
            delivery_settle(dlv)
        else:
            self.waiting[dlv] = packet_id
        self.conn.flush()
        return 0

    def pause_reading(self, why: str) -> None:
        """Hold the remote: no credit is given back while paused (what it sends waits
        in its keeping; at most the credit it still has comes).  The socket is still
        read, so that the heartbeats flow and proton's idle time-out does not end
        the connection."""
        self.paused_for.add(why)

    def resume_reading(self, why: str) -> None:
        if why not in self.paused_for:
            return
        self.paused_for.discard(why)
        if not self.paused_for and self.owed:
            owed, self.owed = self.owed, {}
            if self.conn.ptrans is not None and not self.detached:
                for impl, n in owed.items():
                    link_flow(impl, n)
                self.conn.flush()

    def drop(self, reason: str) -> None:
        """Close the connection (the bridge reconnects) saying why."""
        self.detached = True
        if self.conn.reason == "connection lost":
            self.conn.reason = reason
        if self.conn.transport is not None:
            self.conn.transport.abortConnection()

    def disconnect(self) -> None:
        """A clean end (the bridge stops): close frame, then the socket, cut if it has
        not closed ``--close-grace`` seconds later (a TLS close may hang)."""
        self._cancel()
        self.conn.close("bridge stopped")
        if not self.closed and self.conn.transport is not None:
            self._timer = self.bridge.close_grace.arm(self.conn.transport, "the remote")

    def _no_open(self) -> None:
        self._timer = None
        if not self.ready and self.conn.transport is not None:
            self.drop("no AMQP open and attach from the remote within twice the "
                      "connect-timeout")

    def cancel(self) -> None:
        """No timer left (the connect failed, or the bridge stops)."""
        self._cancel()

    def _cancel(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    # -- the connection's owner (gateway.engine.ConnectionOwner) ------------

    def upstream_open(self, conn: UpstreamConnection) -> None:
        bridge = self.bridge
        self.session = conn.begin(self)
        name = bridge.settings.remote_client_id
        if bridge.out_rules:
            link = self.session.sender(f"{name}:out")
            link.target.address = None   # (the anonymous relay: ``to`` on each message)
            link.snd_settle_mode = link.SND_MIXED
            link.rcv_settle_mode = link.RCV_FIRST
            self.sender, self.sender_impl = link, link._impl
            self._open(link)
        for i, rule in enumerate(bridge.in_rules):
            link = self.session.receiver(f"{name}:in:{i}")
            link.source.address = rule.remote_filter
            link.max_message_size = bridge.broker.limits.max_packet_size
            link.snd_settle_mode = link.SND_MIXED
            link.rcv_settle_mode = link.RCV_FIRST
            self.rules[link._impl] = rule
            self._open(link)
            link.flow(bridge.settings.credit)
        bridge.remote_open(self)
        conn.flush()

    def _open(self, link: Any) -> None:
        self.conn.register(link, self)
        self._attaching += 1
        link.open()

    def upstream_lost(self, conn: UpstreamConnection, reason: str) -> None:
        self.closed = True
        self._cancel()
        self.waiting.clear()
        held, self.held = self.held, set()
        for dlv in held:   # (not acknowledged: the remote sends them again)
            decref(dlv)
        self.bridge.remote_lost(self, reason)

    # -- the session's events (gateway.engine.ChannelEvents) ------------------

    def on_link_open(self, link: Any) -> None:
        if refused(link):
            return   # (still connecting: its detach, a failed attempt, says why)
        self._attaching -= 1
        if self._attaching == 0:
            self.ready = True
            self._cancel()
            if self.sender is not None:
                self.max_message = int(self.sender.remote_max_message_size or 0)
            self.bridge.links_ready(self)

    def on_link_closed(self, link: Any, reason: str | None) -> None:
        self.drop(f"the remote detached {link.name}" + (f": {reason}" if reason else ""))

    def on_session_closed(self) -> None:
        self.drop("the remote ended the session")

    def on_flow(self, impl: Any) -> None:
        if impl == self.sender_impl:
            if link_credit(impl) > 0:
                self.bridge.client_drained(self)

    def lost(self, reason: str) -> None:
        """(The connection ended: ``upstream_lost`` tells the bridge.)"""

    def on_delivery(self, dlv: Any) -> None:
        impl = delivery_link(dlv)
        if impl == self.sender_impl:
            if delivery_remote_state(dlv) not in TERMINAL and not delivery_settled(dlv):
                return   # (non-terminal: wait for the outcome)
            state, reason = outcome_of(dlv)
            packet_id = self.waiting.pop(dlv, None)
            delivery_settle(dlv)   # (its pointer may be reused from here on)
            if packet_id is not None:
                self.bridge.outcome(self, packet_id, state, reason)
            return
        if not delivery_readable(dlv) or delivery_partial(dlv):
            return
        data = recv(impl, dlv)
        link_advance(impl)
        rule = self.rules.get(impl)
        if data is None or rule is None:
            self.answer(dlv, impl, REJECTED)
        else:
            self.bridge.remote_message(self, rule, dlv, impl, data)

    def answer(self, dlv: Any, impl: Any, state: int, invalid: str | None = None,
               condition: str = INVALID_FIELD) -> None:
        """Settle an incoming delivery with ``state`` (rejected with ``invalid``: its
        ``condition`` saying so) and give its credit back (nothing once the
        connection is gone: the remote keeps it)."""
        if self.conn.ptrans is None or self.detached:
            return
        if not delivery_settled(dlv):
            if invalid is not None:
                cond = lib.pn_disposition_condition(lib.pn_delivery_local(dlv))
                lib.pn_condition_set_name(cond, condition.encode())
                lib.pn_condition_set_description(cond, invalid[:200].encode())
            delivery_update(dlv, state)
        delivery_settle(dlv)
        if self.paused_for:   # (held: given back on ``resume_reading``)
            self.owed[impl] = self.owed.get(impl, 0) + 1
        else:
            link_flow(impl, 1)
        self.conn.flush()

    def answer_later(self, dlv: Any, impl: Any) -> Any:
        """The acknowledgement of ``dlv`` for once it is durable here."""
        incref(dlv)
        self.held.add(dlv)

        def ack() -> None:
            if dlv in self.held:   # (else the connection ended: released there)
                self.held.discard(dlv)
                try:
                    self.answer(dlv, impl, ACCEPTED)
                finally:
                    decref(dlv)
        return ack

    def reject_held(self, dlv: Any, impl: Any, refusal: Refusal) -> bool:
        """Reject ``dlv`` (held by ``answer_later``) if ``refusal`` is for good, with
        the condition the broker's own AMQP ingress gives it (``amqp.refusals``); not
        one refused for now (False: the caller drops the connection, the remote
        keeps it)."""
        if not for_good(refusal):
            return False
        if dlv in self.held:
            self.held.discard(dlv)
            try:
                self.answer(dlv, impl, REJECTED, refusal.reason, condition_of(refusal))
            finally:
                decref(dlv)
        return True


class AmqpBridge(BridgeBase):
    """One configured bridge to an AMQP 1.0 remote."""

    log = Logger()

    holding = "giving the remote no more credit (its socket still read)"
    resuming = "crediting the remote again"
    told = "rejected to the remote"
    echoes = 0   # in messages that were ours (a ``both`` rule): accepted, not published
    refused_for_now = 0   # out messages the remote rejected for now: sent again
    full_dropped = 0   # ... and dropped, refused for now past max-full-wait

    def new_link(self) -> BridgeLink:
        return AmqpLink(self)

    def _echo(self, data: bytes) -> bool:
        """Whether the remote names us as the publisher (its ``x-opt-mqtt-client-id``,
        as mqttamqp annotates what it delivers): a message this bridge sent there,
        back through a ``both`` rule's receiver.  (Read only for ``both`` rules.)"""
        try:
            publisher = decode_message(data).annotations.get(ANNOTATION_CLIENT_ID)
        except DecodeError:
            return False
        return bool(publisher == self.settings.remote_client_id)

    def _connect_failed(self, failure: Any, client: Any) -> None:
        client.cancel()   # (its open timer: no connection to time)
        super()._connect_failed(failure, client)

    def new_client(self) -> AmqpRemote:
        limits = self.broker.limits
        return AmqpRemote(self, max(512, min(limits.max_packet_size + 1024, 1 << 20)))

    def remote_open(self, remote: AmqpRemote) -> None:
        """The remote's open came (SASL done): the links are being attached."""
        if not self._running or self._client is not remote:   # (stopped meanwhile)
            remote.disconnect()

    def links_ready(self, remote: AmqpRemote) -> None:
        """Every link is attached: connected (a link the remote refuses ends the
        attempt before, with its reason); the out session goes out on the sender."""
        if not self._running or self._client is not remote:
            return
        self.up(f"container {remote.container}")
        if self.in_rules:
            self.log.info("bridge {n}: receiving from the remote's {f}", n=self.settings.name,
                          f=", ".join(r.remote_filter for r in self.in_rules))
        if self.out_rules:
            self.claim_out(remote, self.broker.limits.max_inflight,
                           lambda session: self._activate(remote, session))

    def _activate(self, remote: AmqpRemote, session: Session) -> None:
        if self._client is not remote or self.session is not session:
            return
        self.link.attach(remote, RemoteLimits(None))
        self.broker.activate(session, self.link, PROTOCOL)

    def outcome(self, remote: AmqpRemote, packet_id: int, state: int, reason: str) -> None:
        """The remote's outcome of an out message (see the module)."""
        session = self.session
        if self._client is not remote or session is None:
            return
        entry = session.inflight.get(packet_id)
        if entry is None:
            return
        broker = self.broker
        link = self.link
        assert isinstance(link, AmqpLink)
        if link.full and state != FULL:   # (another outcome: no longer held by a full queue)
            link.full.pop(packet_id, None)
        if state == ACCEPTED:
            if link.resends:   # (the remote takes messages there: resends start over)
                link.accepted(self.remote_topic(entry.message.topic))
            if entry.qos == 1:
                broker.acknowledged(session, packet_id)
            else:
                broker.received(session, packet_id)   # (then completed: ``send_pubrel``)
        else:
            if state == FAILED:   # (only a failed delivery counts toward the cap)
                entry.failures += 1
            elif state == FULL:   # (rejected for now: sent again, up to max-full-wait)
                state, reason = self._refused_for_now(link, packet_id, entry, reason)
            if state == RELEASED or state == FULL or (
                    state == FAILED and entry.failures <= self.settings.max_resends):
                link.retry(packet_id, self.remote_topic(entry.message.topic))
                return
            if state == FAILED:   # (a poison message: the remote fails it each time)
                reason = f"max-resends: {reason} {entry.failures} times"
            self.refused += 1
            cause = reason.split(": ", 1)[0] or "rejected"
            self.warn(f"rejected {cause}", "bridge {n}: the remote rejected a message on "
                      "{t} ({r}); it is dropped; {c} rejected so far",
                      t=entry.message.topic, r=reason or "no condition", c=self.refused)
            broker.rejected(session, packet_id, f"the remote rejected it: {reason}")

    def _refused_for_now(self, link: AmqpLink, packet_id: int, entry: Any, reason: str
                         ) -> tuple[int, str]:
        """The remote refused ``entry`` for now: FULL (sent again), or REJECTED (to
        be dropped) once it has refused it so for max-full-wait seconds."""
        waited = link.refused_for(packet_id, entry, self.clock.seconds())
        wait = self.settings.max_full_wait
        if waited >= wait:
            del link.full[packet_id]
            self.full_dropped += 1
            return REJECTED, (f"max-full-wait: {reason}, for {waited:.0f} s (max-full-wait "
                              f"{wait:g}); {self.full_dropped} dropped so")
        self.refused_for_now += 1
        cause = reason.split(": ", 1)[0]
        self.warn(f"for now {cause}", "bridge {n}: the remote refused a message on {t} "
                  "for now ({r}); it is sent again later, for max-full-wait {w:g} s at "
                  "most; {c} so far", t=entry.message.topic, r=reason, w=wait,
                  c=self.refused_for_now)
        return FULL, reason

    def remote_message(self, remote: AmqpRemote, rule: TopicRule, dlv: Any, impl: Any,
                       data: bytes) -> None:
        """A message of an ``in`` rule's receiver: published here, accepted once durable
        (pre-settled, or QoS 0 by the rule: accepted at once)."""
        if self._client is not remote:
            return
        maximum = self.broker.limits.max_packet_size
        if len(data) > maximum:   # (announced as the receiver's max-message-size)
            self.too_large_in += 1
            self.warn("too-large-in", "bridge {n}: rejected a message from the remote's "
                      "{a}: {s} bytes, above --max-packet-size {m}; {c} so far",
                      a=rule.remote_filter, s=len(data), m=maximum, c=self.too_large_in)
            remote.answer(dlv, impl, REJECTED)
            return
        presettled = bool(delivery_settled(dlv))
        try:
            fields = decode_publish(data, presettled)
            to = fields.to
            if to is None or not topic_matches(rule.remote_filter, to):
                if "+" in rule.remote_filter or "#" in rule.remote_filter:
                    raise DecodeError("no 'to' the rule's remote filter matches")
                to = rule.remote_filter
            if fields.payload is None:
                raise DecodeError("a body with no MQTT payload (not one Data section)")
            props = None if fields.props is None else MessageProperties(*fields.props)
        except DecodeError as e:
            self.refused_here += 1
            self.warn("in-undecodable", "bridge {n}: rejected a message from the remote's "
                      "{a}: {e}", a=rule.remote_filter, e=e)
            remote.answer(dlv, impl, REJECTED)
            return
        if rule.outbound and self._echo(data):
            self.echoes += 1   # (ours, back from the remote: a ``both`` rule)
            remote.answer(dlv, impl, ACCEPTED)
            return
        topic = self.local_topic(to)
        problem = to_problem(topic, self.broker.limits)   # (as the core's AMQP ingress)
        condition = INVALID_FIELD
        if problem is None and self.broker.queues.kind(topic) == QUEUE_COMMAND:
            problem, condition = "a queue acknowledgement, no message", NOT_ALLOWED
        if problem is not None:
            self.refused_here += 1
            self.warn("in-bad-topic", "bridge {n}: rejected a message from the remote's "
                      "{a}: bad topic {t!r}: {p}", t=topic, p=problem, a=rule.remote_filter)
            remote.answer(dlv, impl, REJECTED, f"bad topic {topic!r}: {problem}", condition)
            return
        qos = min(fields.qos, rule.qos)
        message = Message(topic, fields.payload, qos, fields.retain,
                          self.settings.session_id, self.clock.seconds(), props=props)
        if qos == 0:
            self.take_in(remote, message, None)
            remote.answer(dlv, impl, ACCEPTED)
        else:
            self.take_in(remote, message, remote.answer_later(dlv, impl),
                         lambda refusal: remote.reject_held(dlv, impl, refusal))
