"""The Will service and the Subscription service of the MQTT-over-AMQP contract
(docs/amqp.md, "The MQTT-over-AMQP contract"), and the per-connection record of what an FE asked
for each client id.

What it owns:

* ``WillServiceLink`` (``$mqtt.willservice``, ``$mqtt.lwtservice``, ``$lwt``):
  AMQP_WILL / AMQP_WILL_CLEAR keyed by link name, and what its end means —
  detach without error deletes the will; detach with an error, a lost connection
  or an idle time-out publishes it.
* ``SubscriptionServiceLink`` (``$mqtt.subscriptionservice``, ``$subctrl``):
  AMQP_LIST (reply AMQP_SUBSCRIPTIONS to ``reply-to``), AMQP_CLOSE,
  AMQP_SUBSCRIBE, AMQP_UNSUBSCRIBE.
* ``PubrelLink`` (``$mqtt.<id>.pubrel``): the FE's half of the QoS 2 release loop.
* ``SessionRequests``: AMQP_LIST / AMQP_CLOSE decide whether the ``.publish``
  receiver of a client id claims a persistent or a clean session; a ``.publish``
  receiver attached on a connection that also has a subscription-service link
  waits for that decision, so AMQP_SUBSCRIPTIONS goes out before any queued
  message.

Every answer is a disposition sent after the durable commit; a malformed control
message is Rejected with ``amqp:decode-error`` and the link stays attached.

What it must not do: route or store anything itself (the core does), or touch
the engine beyond the deliveries it answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from proton import int32
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.amqp.addresses import AddressKind, classify
from mqttamqp.amqp.codec.contract import (
    message_payload,
    message_qos,
    message_retain,
    mqtt5_props,
    parse_qos,
    retained_for,
    subscription_options,
)
from mqttamqp.amqp.codec.encode import encode_control
from mqttamqp.amqp.codec.sections import InboundMessage
from mqttamqp.amqp.codec.values import DecodeError
from mqttamqp.amqp.incoming import IncomingLink, message_properties
from mqttamqp.amqp.links import (
    DECODE_ERROR,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    REJECTED,
    TRANSACTIONAL,
    UNAUTHORIZED,
    LinkHost,
)
from mqttamqp.amqp.subscribers import SessionOutlet
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import SUBSCRIBE_FAILURE
from mqttamqp.core.clock import DelayedCall
from mqttamqp.core.message import WillMessage
from mqttamqp.core.topics import topic_size_problem, validate_topic_name
from mqttamqp.net.rawproton import delivery_remote_state

__all__ = ["WillServiceLink", "SubscriptionServiceLink", "PubrelLink", "SessionRequests"]


def _client_of(value: Any, kind: AddressKind) -> str | None:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or not value:
        return None
    address = classify(value)
    return address.value if address.kind is kind else None


NOT_IMPLEMENTED = "amqp:not-implemented"


class _ServiceLink(IncomingLink):
    __slots__ = ()
    max_window = 20

    def on_transfer(self, dlv: Any, data: bytes, presettled: bool) -> None:
        # A service's request takes effect at once: it cannot wait for a commit, so
        # one under a transaction is refused, never carried out before it.
        if delivery_remote_state(dlv) == TRANSACTIONAL:
            host = self.host
            host.broker.transactions.warn(
                "service", f"a transactional transfer on {self.address} from "
                f"{host.container_id} was refused (the service links take none)")
            self.rejected += 1
            self.answer(dlv, REJECTED, (
                NOT_IMPLEMENTED, f"{self.address} does not take transactional transfers"))
            return
        super().on_transfer(dlv, data, presettled)


class WillServiceLink(_ServiceLink):
    """AMQP_WILL and AMQP_WILL_CLEAR; the link name is the will's key."""

    __slots__ = ()

    def start(self) -> None:
        self.broker.will_owner_returned(self.name)
        self.host.claim_will(self)
        super().start()

    def on_message(self, dlv: Any, message: InboundMessage, presettled: bool) -> None:
        subject = message.subject
        broker = self.broker
        if subject == "will":
            topic = message.to
            limits = self.host.limits
            problem = "AMQP_WILL needs 'to' = the will topic" if not topic else (
                validate_topic_name(topic) or topic_size_problem(
                    topic, limits.max_topic_levels, limits.max_topic_length))
            if problem is not None:
                self.reject(dlv, DECODE_ERROR, f"bad will topic {topic!r}: {problem}")
                return
            assert topic is not None
            try:
                payload = message_payload(message)
                qos = message_qos(message)
                retain = message_retain(message)
                props = message_properties(mqtt5_props(message), payload)
            except DecodeError as exc:
                self.reject(dlv, DECODE_ERROR, exc.reason)
                return
            will = WillMessage(self.name, topic, payload, qos, retain, "amqp",
                               broker.clock.seconds(), props)
            if not broker.may_set_will(will, self.host.identity):
                self.reject(dlv, UNAUTHORIZED, f"a will on {topic!r} is not allowed")
                return
            self.host.claim_will(self)
            self.answer_after(broker.set_will(will), dlv)
        elif subject == "will-clear":
            self.answer_after(broker.clear_will(self.name, "amqp"), dlv)
        else:
            self.reject(dlv, DECODE_ERROR, f"the will service does not know subject "
                        f"{subject!r} (expected 'will' or 'will-clear')")

    def ended(self, brute: bool, reason: str) -> None:
        super().ended(brute, reason)
        if not self.host.release_will(self):
            return  # a newer will link of this name owns the will now
        self.broker.will_link_ended(self.name, brute, reason)


class SubscriptionServiceLink(_ServiceLink):
    """AMQP_LIST, AMQP_CLOSE, AMQP_SUBSCRIBE and AMQP_UNSUBSCRIBE."""

    __slots__ = ("requests",)

    def __init__(self, host: LinkHost, plink: Any, address: str,
                 requests: SessionRequests) -> None:
        super().__init__(host, plink, address)
        self.requests = requests

    def start(self) -> None:
        self.requests.service_attached(self)
        super().start()

    def ended(self, brute: bool, reason: str) -> None:
        super().ended(brute, reason)
        self.requests.service_detached(self)

    def on_message(self, dlv: Any, message: InboundMessage, presettled: bool) -> None:
        handler = self._subjects.get(message.subject or "")
        if handler is None:
            self.reject(dlv, DECODE_ERROR, f"the subscription service does not know subject "
                        f"{message.subject!r}")
            return
        client_id = _client_of(message.correlation_id, AddressKind.SESSION_PUBLISH)
        if client_id is None:
            condition = PRECONDITION_FAILED if message.subject == "list" else DECODE_ERROR
            self.reject(dlv, condition, "correlation-id must be $mqtt.to.<client-id>.publish, "
                        f"got {message.correlation_id!r}")
            return
        if not self.broker.gate.may_use_session(self.host.identity, client_id):
            self.reject(dlv, UNAUTHORIZED, f"not allowed to act on the session of {client_id!r}")
            return
        handler(self, dlv, message, client_id)

    def _on_list(self, dlv: Any, message: InboundMessage, client_id: str) -> None:
        reply_to = _client_of(message.reply_to, AddressKind.SESSION_CONTROL)
        if reply_to is None:
            self.reject(dlv, PRECONDITION_FAILED, "reply-to must be "
                        f"$mqtt.to.<client-id>.control, got {message.reply_to!r}")
            return
        subscriptions, d = self.broker.gateway.list_subscriptions(client_id, self.host.identity)
        body = {topic_filter: int32(qos) for topic_filter, qos in subscriptions.items()}
        reply = encode_control("subscriptions", correlation_id=message.correlation_id,
                               body=body)

        def reply_and_decide() -> None:
            if not self.host.send_control(reply_to, reply):
                self.log.warn("no receiver is attached to $mqtt.to.{c}.control; the "
                              "AMQP_SUBSCRIPTIONS reply for {id} was dropped", c=reply_to,
                              id=client_id)
            self.requests.decided(client_id, clean=False)

        self.answer_after(d, dlv, reply_and_decide)

    def _on_close(self, dlv: Any, message: InboundMessage, client_id: str) -> None:
        d = self.requests.close_session(client_id)
        self.answer_after(d, dlv)

    def _on_subscribe(self, dlv: Any, message: InboundMessage, client_id: str) -> None:
        body = message.value if message.body_kind == "value" else None
        if not isinstance(body, dict) or not body:
            self.reject(dlv, DECODE_ERROR, "AMQP_SUBSCRIBE body must be an AmqpValue map "
                        "of topic filter to QoS with at least one entry")
            return
        requests: list[tuple[str, int]] = []
        for topic_filter, raw in body.items():
            qos = parse_qos(raw)
            if not isinstance(topic_filter, str) or qos is None:
                self.reject(dlv, DECODE_ERROR, f"AMQP_SUBSCRIBE entry {topic_filter!r}: "
                            f"{raw!r} is not a QoS (0, 1, 2 as int or decimal string)")
                return
            limits = self.host.limits
            problem = topic_size_problem(str(topic_filter), limits.max_topic_levels,
                                         limits.max_topic_length, "topic filter")
            if problem is not None:
                self.reject(dlv, DECODE_ERROR, f"AMQP_SUBSCRIBE: {problem}")
                return
            requests.append((str(topic_filter), qos))
        options = subscription_options(message.annotations, requests)
        if isinstance(options, str):
            self.reject(dlv, DECODE_ERROR, f"AMQP_SUBSCRIBE: {options}")
            return
        # A .publish receiver waiting for AMQP_LIST claims the session now.
        self.requests.claim_waiting(client_id)
        identity = Identity(client_id, self.host.identity.username, "amqp")
        before = self.broker.sessions.get(client_id)   # (retain handling 1: new filters)
        send = retained_for(message.annotations, requests,
                            before.subscriptions if before is not None else ())
        session, codes, d = self.broker.gateway.subscribe_client(client_id, identity, requests,
                                                                 options)
        if all(code >= SUBSCRIBE_FAILURE for code in codes):
            self.reject(dlv, NOT_ALLOWED, "every topic filter was refused: "
                        + ", ".join(f for f, _ in requests))
            return
        assert session is not None
        grants = [(f, code) for (f, _), code, wanted in zip(requests, codes, send, strict=True)
                  if wanted]
        self.answer_after(d, dlv, lambda: self.broker.send_retained(session, grants))

    def _on_unsubscribe(self, dlv: Any, message: InboundMessage, client_id: str) -> None:
        body = message.value if message.body_kind == "value" else None
        if not isinstance(body, list) or not all(isinstance(f, str) for f in body):
            self.reject(dlv, DECODE_ERROR, "AMQP_UNSUBSCRIBE body must be an AmqpValue list "
                        "of topic filters")
            return
        self.answer_after(self.broker.gateway.unsubscribe_client(client_id, [str(f) for f in body]),
                          dlv)

    _subjects: ClassVar[
        dict[str, Callable[[SubscriptionServiceLink, Any, InboundMessage, str], None]]] = {
        "list": _on_list,
        "close": _on_close,
        "subscribe": _on_subscribe,
        "unsubscribe": _on_unsubscribe,
    }


def _packet_id(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and 1 <= value <= 65535:
        return value
    return None


class PubrelLink(_ServiceLink):
    """``$mqtt.<id>.pubrel``: the FE got PUBREC; release the QoS 2 message."""

    __slots__ = ("client_id",)

    def __init__(self, host: LinkHost, plink: Any, address: str, client_id: str) -> None:
        super().__init__(host, plink, address)
        self.client_id = client_id

    def on_message(self, dlv: Any, message: InboundMessage, presettled: bool) -> None:
        if message.subject not in (None, "pubrel"):
            self.reject(dlv, DECODE_ERROR, f"expected subject 'pubrel', got {message.subject!r}")
            return
        packet_id = _packet_id(message.message_id)
        if packet_id is None:
            self.reject(dlv, DECODE_ERROR, "AMQP_PUBREL needs message-id = the packet id "
                        f"(1-65535), got {message.message_id!r}")
            return
        durable, release = self.broker.gateway.release_outbound(self.client_id, packet_id)
        self.answer_after(durable, dlv, release)


class SessionRequests:
    """Per connection: AMQP_LIST / AMQP_CLOSE decisions and waiting ``.publish`` links."""

    log = Logger()

    def __init__(self, host: LinkHost) -> None:
        self.host = host
        self.clean: dict[str, bool] = {}
        self.outlets: dict[str, SessionOutlet] = {}
        self.waiting: dict[str, DelayedCall] = {}
        self.services: set[SubscriptionServiceLink] = set()

    def service_attached(self, link: SubscriptionServiceLink) -> None:
        self.services.add(link)

    def service_detached(self, link: SubscriptionServiceLink) -> None:
        self.services.discard(link)
        if not self.services:
            for client_id in list(self.waiting):
                self._release(client_id, self.clean.get(client_id, False))

    def publish_attached(self, outlet: SessionOutlet) -> None:
        client_id = outlet.client_id
        old = self.outlets.get(client_id)
        if old is not None and old is not outlet:
            self._cancel_wait(client_id)
        self.outlets[client_id] = outlet
        if client_id in self.clean:
            outlet.open_session(self.clean[client_id])
        elif self.services:
            # An FE: AMQP_LIST or AMQP_CLOSE is on its way and decides the session;
            # its reply must precede the queued messages.
            timeout = self.host.limits.connect_timeout
            self.waiting[client_id] = self.host.broker.clock.callLater(
                timeout, self._timed_out, client_id)
        else:
            outlet.open_session(False)

    def publish_detached(self, outlet: SessionOutlet) -> None:
        if self.outlets.get(outlet.client_id) is outlet:
            del self.outlets[outlet.client_id]
            self._cancel_wait(outlet.client_id)

    def _cancel_wait(self, client_id: str) -> None:
        call = self.waiting.pop(client_id, None)
        if call is not None and call.active():
            call.cancel()

    def _timed_out(self, client_id: str) -> None:
        self.waiting.pop(client_id, None)
        self.log.info("no AMQP_LIST or AMQP_CLOSE for {c} within the connect timeout; its "
                      ".publish receiver gets the persistent session", c=client_id)
        self._release(client_id, False)
        self.host.schedule_flush()

    def _release(self, client_id: str, clean: bool) -> None:
        self._cancel_wait(client_id)
        outlet = self.outlets.get(client_id)
        if outlet is not None and not outlet.closed and outlet.session is None:
            outlet.open_session(clean)

    def decided(self, client_id: str, clean: bool) -> None:
        self.clean.pop(client_id, None)       # (re-inserted: the newest last)
        self.clean[client_id] = clean
        self._bound_decisions()
        if client_id in self.waiting:
            self._release(client_id, clean)

    def _bound_decisions(self) -> None:
        """Keep at most 4 x ``amqp_max_links`` remembered decisions (a connection holds
        at most ``amqp_max_links`` ``.publish`` links; the margin leaves room for a
        reconnect storm's AMQP_LISTs sent before their ``.publish`` attaches): the
        oldest of clients without a ``.publish`` link go first.  An FE serving many
        clients over one connection decides for each, and without a bound the dict
        grew for the connection's life."""
        excess = len(self.clean) - 4 * self.host.limits.amqp_max_links
        if excess <= 0:
            return
        for client_id in [c for c in self.clean if c not in self.outlets][:excess]:
            del self.clean[client_id]

    def claim_waiting(self, client_id: str) -> None:
        """AMQP_SUBSCRIBE for ``client_id``: a receiver waiting for AMQP_LIST claims
        the session now."""
        if client_id in self.waiting:
            self._release(client_id, self.clean.get(client_id, False))

    def close_session(self, client_id: str) -> Deferred[None] | None:
        """AMQP_CLOSE: remove the session (taking it over first), then start clean."""
        self.clean.pop(client_id, None)
        self.clean[client_id] = True
        self._bound_decisions()
        outlet = self.outlets.get(client_id)
        d = self.host.broker.gateway.close_session(client_id, outlet, "AMQP_CLOSE: session closed")
        if outlet is not None and outlet.session is not None:
            outlet.session_closed()
        if outlet is not None and not outlet.closed:
            self._cancel_wait(client_id)
            if outlet.session is None:
                outlet.open_session(True)
        return d

    def ended(self) -> None:
        for client_id in list(self.waiting):
            self._cancel_wait(client_id)
        self.outlets.clear()
        self.services.clear()
