"""One MQTT client's half of the MQTT-over-AMQP contract (docs/gateway.md,
``shared/AMQP-CONTRACT.md``): a proton session on a shared upstream connection and
the links seed 000 names, and what is sent and received on them.

What it owns, per client:

* the links: the will sender (``$mqtt.willservice``, named by the client id: its
  detach is the disconnect signal), the subscription-service sender, the
  ``$mqtt.to.<id>.control`` receiver (AMQP_SUBSCRIPTIONS), the
  ``$mqtt.to.<id>.publish`` receiver (the session's messages; its credit is the
  client's flow control), an anonymous-relay sender for PUBLISH (``to`` = topic) and,
  once needed, ``$mqtt.<id>.pubrel`` (QoS 2 toward the client);
* the connection flow (``open``): AMQP_WILL, then AMQP_CLOSE (clean session) or
  AMQP_LIST and its AMQP_SUBSCRIPTIONS reply (session present = a non-empty map),
  then the ``.publish`` attach; every control message is sent unsettled and its
  disposition is the answer;
* SUBSCRIBE / UNSUBSCRIBE as AMQP_SUBSCRIBE / AMQP_UNSUBSCRIBE, PUBLISH as
  AMQP_PUBLISH (QoS 0 pre-settled, QoS 1 and 2 unsettled: the answer comes with the
  core's Accepted), and deliveries from ``.publish`` settled when the client
  acknowledges them;
* the end (``close``): the will link detached without error (clean: DISCONNECT) or
  with ``amqp:link:detach-forced`` (brute: the core publishes the will), AMQP_CLOSE
  for a clean session, then the session ended.

The messages themselves (control messages, AMQP_WILL, outcomes, what a ``.publish``
delivery is) are ``wire``'s.

What it must not do: read or write MQTT (``frontend`` does, through ``ChannelOwner``),
hold session state beyond the one connection (the core keeps every session: a client
may come back through any gateway), or touch sockets (``engine``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar, Protocol

from proton import Condition, Message, symbol, ulong
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.amqp.codec.contract import (
    ANNOTATION_CLIENT_ID,
    ANNOTATION_SUBSCRIPTION_OPTIONS,
    Mqtt5Props,
)
from mqttamqp.amqp.codec.encode import encode_publish, encode_publish5
from mqttamqp.amqp.codec.sections import decode_message
from mqttamqp.amqp.codec.values import DecodeError
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.gateway.engine import UpstreamConnection
from mqttamqp.gateway.wire import (
    Outcome,
    Refused,
    control_message,
    outcome_of,
    session_delivery,
    subscriptions,
    will_message,
)
from mqttamqp.net.rawproton import (
    SETTLED_TAG,
    delivery_link,
    delivery_partial,
    delivery_readable,
    delivery_remote_state,
    delivery_settle,
    delivery_settled,
    delivery_update,
    lib,
    link_advance,
    link_credit,
    link_flow,
    link_send,
    new_delivery,
    packet_id_tag,
    recv,
)

__all__ = ["ChannelOwner", "ClientChannel", "ChannelState", "Refused", "Outcome",
           "WILL_SERVICE", "SUBSCRIPTION_SERVICE", "DETACH_FORCED"]

WILL_SERVICE = "$mqtt.willservice"
SUBSCRIPTION_SERVICE = "$mqtt.subscriptionservice"
DETACH_FORCED = "amqp:link:detach-forced"
UNAUTHORIZED = "amqp:unauthorized-access"

ACCEPTED: int = lib.PN_ACCEPTED
REJECTED: int = lib.PN_REJECTED
RELEASED: int = lib.PN_RELEASED
MODIFIED: int = lib.PN_MODIFIED
_TERMINAL = (ACCEPTED, REJECTED, RELEASED, MODIFIED)


class ChannelState(Enum):
    OPENING = "opening"   # the connect flow runs
    READY = "ready"       # CONNACK may go / went out
    CLOSING = "closing"   # our detach and end are on their way
    CLOSED = "closed"


class ChannelOwner(Protocol):
    """The MQTT side of one client, as its channel sees it."""

    def deliver(self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                dlv: Any, props: Mqtt5Props | None = None, packet_id: int | None = None
                ) -> None:
        """A message of the session for the client, with the core's packet id
        (QoS 1 and 2: the ``.publish`` delivery's message-id); ``dlv`` comes back to
        ``finished`` (QoS 0: once written; QoS 1: on PUBACK; QoS 2: on PUBCOMP)."""

    def release(self, packet_id: int, dlv: Any) -> None:
        """AMQP_PUBREL on ``.publish``: send PUBREL ``packet_id``; ``dlv`` to
        ``finished`` on PUBCOMP."""

    def upstream_gone(self, reason: str, cause: str = "upstream-gone") -> None:
        """The channel cannot serve the client any more: close it (one line per
        ``cause``, rate-limited)."""

    def writable(self) -> None:
        """The core gave credit again: the client may be read."""


def _consumed(_failure: Failure) -> None:
    """The end of a waiter's failure nobody awaits any more (the connect flow awaits
    one attach at a time): else an "Unhandled error in Deferred" each."""


def _refused(link: Any) -> bool:
    """The core's attach of ``link`` is a refusal: it attaches with no terminus, then
    detaches (proton shows a receiver's missing source as a terminus without an
    address, never None), where ours named an address."""
    terminus, local = ((link.remote_target, link.target) if link.is_sender
                       else (link.remote_source, link.source))
    return terminus is None or (terminus.address is None and local.address is not None)


class ClientChannel:
    """One client's session and links on an upstream connection."""

    log: ClassVar[Logger] = Logger()

    def __init__(self, conn: UpstreamConnection, client_id: str, owner: ChannelOwner,
                 clock: Clock, credit: int, timeout: float) -> None:
        self.conn = conn
        self.client_id = client_id
        self.owner = owner
        self.clock = clock
        self.credit = max(1, credit)
        self.timeout = timeout
        self.state = ChannelState.OPENING
        self.session: Any = None
        self.links: list[Any] = []
        self.will: Any = None
        self.service: Any = None
        self.control: Any = None
        self.publish: Any = None
        self.topics: Any = None
        self.pubrel: Any = None
        # Raw pointers of the per-message links (``rawproton``: no wrapper per message).
        self._senders: set[Any] = set()
        self._topics_impl: Any = None
        self._publish_impl: Any = None
        self.paused = False        # the client's socket is full: no credit given back
        self._owed = 0             # credit held back while paused
        # 16 bits: unique under 65,536 unsettled (a read's QoS 1 can pass credit by thousands)
        self._tag = 0   # the last tag number
        # Our unsettled transfers by delivery tag: what to call with the outcome.
        # (by the delivery's raw pointer: popped before it is settled)
        self._waiting: dict[Any, Callable[[Outcome], None]] = {}
        self._opened: dict[Any, Deferred[Any]] = {}   # links awaiting the core's attach
        self._reply: Deferred[dict[str, int]] | None = None
        self._end_call: DelayedCall | None = None
        self.ended_by_core = False   # the core detached a link of ours / ended the session
        self._deadline = 0.0         # when the connect flow must be done
        self.max_message = 0         # the core's max-message-size for PUBLISH (0: none)

    # -- the connect flow -------------------------------------------------------------

    async def open(self, clean: bool,
                   will: tuple[str, bytes, int, bool, Mqtt5Props | None] | None,
                   persistent: bool | None = None) -> bool:
        """Seed 000's flow for CONNECT; True if the core had a session with
        subscriptions (CONNACK's session present).  ``will``: topic, payload, QoS,
        retain and MQTT 5 properties (AMQP_WILL).  ``clean``: clean session / clean
        start (AMQP_CLOSE removes what the core had); ``persistent`` (default: not
        ``clean``): the session outlives the connection (AMQP_LIST opens it at the
        core: MQTT 5 clean start with a session expiry is AMQP_CLOSE, then AMQP_LIST,
        and no session present).  Raises ``Refused``."""
        conn = self.conn
        cid = self.client_id
        self._deadline = self.clock.seconds() + self.timeout   # (the whole flow's)
        self.session = conn.begin(self)
        prefix = f"gw{conn.serial}:"
        self.will = self._sender(cid, WILL_SERVICE)
        self.service = self._sender(prefix + "ss", SUBSCRIPTION_SERVICE)
        self.control = self._receiver(prefix + "control", f"$mqtt.to.{cid}.control", 8)
        # (named the client it publishes for: the core's publisher, for no local)
        self.topics = self._sender(prefix + "publish", None,
                                   {symbol(ANNOTATION_CLIENT_ID): cid})
        self._topics_impl = self.topics._impl
        await self._attached(self.will, self.service, self.control, self.topics)
        self.max_message = int(self.topics.remote_max_message_size or 0)
        if will is not None:
            await self._expect(self.will, will_message(cid, *will), "AMQP_WILL")
        present = False
        if clean:
            await self._expect(self.service, control_message("close", cid), "AMQP_CLOSE")
        if not clean or persistent:
            self._reply = Deferred()
            reply = self._reply
            await self._expect(self.service, control_message(
                "list", cid, reply_to=f"$mqtt.to.{cid}.control"), "AMQP_LIST")
            present = bool(await self._within(reply, "AMQP_SUBSCRIPTIONS")) and not clean
        self.publish = self._receiver(prefix + "session", f"$mqtt.to.{cid}.publish",
                                      self.credit, mixed=True)
        self._publish_impl = self.publish._impl
        await self._attached(self.publish)
        self.state = ChannelState.READY
        return present

    def _sender(self, name: str, address: str | None,
                properties: dict[symbol, Any] | None = None) -> Any:
        link = self.session.sender(name)
        link.target.address = address
        if properties is not None:
            link.properties = properties
        link.snd_settle_mode = link.SND_MIXED if address is None else link.SND_UNSETTLED
        link.rcv_settle_mode = link.RCV_FIRST
        self._senders.add(link._impl)
        return self._attach(link)

    def _receiver(self, name: str, address: str, credit: int, mixed: bool = False) -> Any:
        link = self.session.receiver(name)
        link.source.address = address
        link.snd_settle_mode = link.SND_MIXED if mixed else link.SND_UNSETTLED
        link.rcv_settle_mode = link.RCV_FIRST
        self._attach(link)
        link.flow(credit)
        return link

    def _attach(self, link: Any) -> Any:
        self.conn.register(link, self)
        self.links.append(link)
        self._opened[link._impl] = Deferred()
        link.open()
        self.conn.flush()
        return link

    async def _attached(self, *links: Any) -> None:
        for link in links:
            d = self._opened.get(link._impl)
            if d is not None:
                await self._within(d, f"the attach of {link.name}")

    async def _expect(self, link: Any, body: bytes, what: str) -> None:
        outcome = await self._within(self.send(link, body), what)
        if not outcome.accepted:
            raise Refused(f"{what} was refused: {outcome.reason}",
                          outcome.condition == UNAUTHORIZED)

    async def _within(self, d: Deferred[Any], what: str) -> Any:
        """``d``'s result, or ``Refused`` once the connect flow's one deadline passed."""
        wait = max(0.0, self._deadline - self.clock.seconds())
        timer = self.clock.callLater(wait, self._timed_out, d, what)
        try:
            return await d
        finally:
            if timer.active():
                timer.cancel()

    def _timed_out(self, d: Deferred[Any], what: str) -> None:
        if not d.called:
            d.errback(Refused(f"no answer to {what} from the core within the connect "
                              f"timeout ({self.timeout:g} s)"))

    # -- sending ------------------------------------------------------------------------

    def send(self, link: Any, body: bytes) -> Deferred[Outcome]:
        """``body`` sent unsettled on ``link``; fires with the core's outcome."""
        d: Deferred[Outcome] = Deferred()
        self.send_then(link, body, d.callback)
        return d

    def send_then(self, link: Any, body: bytes, then: Callable[[Outcome], None] | None
                  ) -> None:
        """``body`` on ``link``: pre-settled when ``then`` is None, else unsettled and
        ``then`` called with the core's outcome."""
        # (raw proton calls: this is every PUBLISH's path)
        impl = link._impl   # (ready tags, ``rawproton``; an unsettled one a count's)
        self._tag = tag = (self._tag + 1) & 0xFFFF
        dlv = new_delivery(impl, SETTLED_TAG if then is None else packet_id_tag(tag))
        link_send(impl, body, len(body))
        link_advance(impl)
        if then is None:
            delivery_settle(dlv)
        else:
            self._waiting[dlv] = then
        self.conn.flush()

    def publish_message(self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                        then: Callable[[Outcome], None] | None,
                        props: Mqtt5Props | None = None) -> None:
        """AMQP_PUBLISH of a client's PUBLISH (``then`` None for QoS 0), with its MQTT 5
        properties in their AMQP places."""
        body = (encode_publish(topic, payload, qos, retain, int(dup), self.client_id)
                if props is None else encode_publish5(topic, payload, qos, retain, int(dup),
                                                      self.client_id, None, props))
        if self.max_message and len(body) > self.max_message:   # (else the core detaches:
            self._gone(f"a PUBLISH of {len(body)} bytes as AMQP is over the core's "  # no will)
                       f"max-message-size {self.max_message}", False, "publish-over-core-max")
            return
        self.send_then(self.topics, body, then)

    def subscribe(self, packet_id: int, requests: dict[str, int],
                  options: dict[str, int] | None = None) -> Deferred[Outcome]:
        """AMQP_SUBSCRIBE; ``options``: its filters' options (a bridge's no local)."""
        extra = {"annotations": {symbol(ANNOTATION_SUBSCRIPTION_OPTIONS): options}
                 } if options else {}
        return self.send(self.service, control_message(
            "subscribe", self.client_id, id=ulong(packet_id), body=requests, **extra))

    def unsubscribe(self, packet_id: int, filters: list[str]) -> Deferred[Outcome]:
        return self.send(self.service, control_message(
            "unsubscribe", self.client_id, id=ulong(packet_id), body=filters))

    def released(self, packet_id: int, dlv: Any) -> None:
        """The client's PUBREC for a QoS 2 delivery: AMQP_PUBREL to
        ``$mqtt.<id>.pubrel``; the delivery is settled once the core accepts it."""
        if self.pubrel is None:
            self.pubrel = self._sender(f"gw{self.conn.serial}:pubrel",
                                       f"$mqtt.{self.client_id}.pubrel")
            # Not awaited: a refusal ends the client (``on_link_closed``).
            self._opened[self.pubrel._impl].addErrback(lambda _f: None)

        def done(outcome: Outcome) -> None:
            if outcome.accepted:
                self.finished(dlv)

        msg = Message(subject="pubrel", id=ulong(packet_id))
        self.send_then(self.pubrel, bytes(msg.encode()), done)

    # -- what the client finished ---------------------------------------------------------

    def finished(self, dlv: Any) -> None:
        """The client is done with ``dlv``: settle it Accepted, and give its credit
        back (unless the client's socket is full)."""
        if self.state is ChannelState.CLOSED:
            return
        if not delivery_settled(dlv):
            delivery_update(dlv, ACCEPTED)
        delivery_settle(dlv)   # (pre-settled too: proton frees it once we settle)
        self._credit_back()

    def _credit_back(self) -> None:
        if self.paused:
            self._owed += 1
        elif self._publish_impl is not None:
            link_flow(self._publish_impl, 1)
        self.conn.flush()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        owed, self._owed = self._owed, 0
        if owed and self.publish is not None and self.state is not ChannelState.CLOSED:
            self.publish.flow(owed)
            self.conn.flush()

    # -- the engine's events ------------------------------------------------------------

    def on_link_open(self, link: Any) -> None:
        d = self._opened.pop(link._impl, None)
        if d is None:
            return
        if _refused(link):
            self._opened[link._impl] = d   # (its detach says why: ``Refused``)
            return
        d.callback(None)

    def on_link_closed(self, link: Any, reason: str | None) -> None:
        why = f"the core detached {link.name}" + (f": {reason}" if reason else "")
        d = self._opened.pop(link._impl, None)
        if self.state is ChannelState.READY:
            # A link of ours taken (a takeover) or refused (the lazy ``.pubrel``): the
            # client is ended; a refusal is not the core's end of the session.
            self._gone(why, by_core=d is None)
        elif d is not None and not d.called:
            d.errback(Refused(why, reason is not None and UNAUTHORIZED in reason))
            self._opened[link._impl] = d   # (``_attached`` may not be at it yet)

    def on_session_closed(self) -> None:
        if self.state is not ChannelState.CLOSED:
            self._gone("the core ended the client's session")

    @property
    def blocked(self) -> bool:
        """The core gave no credit left on the PUBLISH sender: the client is not read
        until it gives more (credit is the publisher's flow control)."""
        impl = self._topics_impl
        return impl is not None and link_credit(impl) <= 0

    def on_flow(self, impl: Any) -> None:
        """The core's flow on the link ``impl`` (a raw pointer)."""
        if (impl == self._topics_impl and link_credit(impl) > 0
                and self.state is ChannelState.READY):
            self.owner.writable()

    def on_delivery(self, dlv: Any) -> None:
        """A raw delivery of one of our links: the core's outcome of ours, or a
        message (whole: read at once)."""
        impl = delivery_link(dlv)
        if impl in self._senders:
            state = delivery_remote_state(dlv)
            if state not in _TERMINAL and not delivery_settled(dlv):
                return   # (non-terminal: wait for the outcome)
            then = self._waiting.pop(dlv, None)
            outcome = outcome_of(dlv, state)
            delivery_settle(dlv)   # (its pointer may be reused from here on)
            if then is not None:
                then(outcome)
            return
        if not delivery_readable(dlv) or delivery_partial(dlv):
            return
        data = recv(impl, dlv)
        link_advance(impl)
        if data is None:
            self._refuse(dlv, "an aborted delivery")
        elif impl == self._publish_impl:
            self._on_session_message(dlv, data)
        else:
            self._on_control(dlv, data)

    def _on_session_message(self, dlv: Any, data: bytes) -> None:
        got = session_delivery(data, delivery_settled(dlv))
        if isinstance(got, str):
            self._refuse(dlv, got)
        elif isinstance(got, int):
            self.owner.release(got, dlv)
        else:
            fields, packet_id = got
            self.owner.deliver(fields.to, fields.payload, fields.qos,  # type: ignore[arg-type]
                               fields.retain, fields.redelivered, dlv, fields.props, packet_id)

    def _refuse(self, dlv: Any, reason: str) -> None:
        self.log.warn("{c}: rejected {r}", c=self.client_id, r=reason)
        _reject(dlv, reason)
        self._credit_back()

    def _on_control(self, dlv: Any, data: bytes) -> None:
        try:
            msg: Any = decode_message(data)
        except DecodeError:
            msg = None
        if not delivery_settled(dlv):
            delivery_update(dlv, REJECTED if msg is None else ACCEPTED)
        delivery_settle(dlv)
        self.control.flow(1)
        reply = self._reply
        if (msg is not None and msg.subject == "subscriptions" and reply is not None
                and not reply.called):
            self._reply = None
            reply.callback(subscriptions(msg.value))
        self.conn.flush()

    # -- the end --------------------------------------------------------------------------

    def _gone(self, reason: str, by_core: bool = True, cause: str = "upstream-gone") -> None:
        """The core ended something of ours: the client is closed (it closes us).
        ``by_core``: the core ended the channel (a link detached, the session ended:
        a takeover, maybe through another gateway), so the close sends neither
        AMQP_CLOSE nor a forced detach: the session and its will are the core's."""
        if by_core:
            self.ended_by_core = True
        if self.state is ChannelState.READY or self.state is ChannelState.OPENING:
            self.owner.upstream_gone(reason, cause)

    def lost(self, reason: str) -> None:
        """The upstream connection is gone: nothing can be sent any more."""
        was = self.state
        self.state = ChannelState.CLOSED
        self._fail_waiters(reason)
        if was is not ChannelState.CLOSED:
            self.owner.upstream_gone(reason)

    def _fail_waiters(self, reason: str) -> None:
        opened, self._opened = self._opened, {}
        for d in opened.values():
            if not d.called:
                d.errback(Refused(reason))
            d.addErrback(_consumed)
        reply, self._reply = self._reply, None
        if reply is not None and not reply.called:
            reply.errback(Refused(reason))
            reply.addErrback(_consumed)
        waiting, self._waiting = self._waiting, {}
        for then in waiting.values():
            then(Outcome(False, reason))

    def close(self, brute: bool, clean_session: bool, reason: str) -> None:
        """The client is gone (``brute``: without DISCONNECT, its will is published by
        the core) or said DISCONNECT; a clean session is removed (AMQP_CLOSE)."""
        if self.state is ChannelState.CLOSING or self.state is ChannelState.CLOSED:
            return
        self.state = ChannelState.CLOSING
        self._fail_waiters(reason)
        if self.ended_by_core:
            brute = clean_session = False
        will = self.will
        if will is not None:
            if brute:
                will.condition = Condition(DETACH_FORCED, reason[:200])
            will.close()
        if clean_session and self.service is not None:
            self.send_then(self.service, control_message("close", self.client_id),
                           lambda _outcome: self._end())
            self._end_call = self.clock.callLater(self.timeout, self._end)
            self.conn.flush_now()
        else:
            self._end()

    def _end(self) -> None:
        if self.state is ChannelState.CLOSED:
            return
        self.state = ChannelState.CLOSED
        if self._end_call is not None and self._end_call.active():
            self._end_call.cancel()
        self._end_call = None
        for link in self.links:
            if not link.state & link.LOCAL_CLOSED:
                link.close()
        if self.session is not None:
            self.session.close()
            self.conn.forget(self, self.links)
        self.conn.flush_now()


def _reject(dlv: Any, reason: str) -> None:
    """Settle ``dlv`` (rejected with ``amqp:decode-error`` and ``reason`` unless the
    core settled it already)."""
    if not delivery_settled(dlv):
        cond = lib.pn_disposition_condition(lib.pn_delivery_local(dlv))
        lib.pn_condition_set_name(cond, b"amqp:decode-error")
        lib.pn_condition_set_description(cond, reason[:200].encode())
        delivery_update(dlv, REJECTED)
    delivery_settle(dlv)
