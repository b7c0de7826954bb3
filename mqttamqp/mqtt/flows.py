"""The packets of a connected MQTT client, carried out: PUBLISH and its QoS 1/2
flows, PUBACK/PUBREC/PUBREL/PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, PINGREQ and
DISCONNECT, with their acknowledgements sent in the order the packets came, each
once what it promises is durable.

``ConnectedFlows`` is the part of ``protocol.MQTTProtocol`` that asks the broker
and writes what ``decisions`` decided for each packet; the rules are there (and in
``connection``'s ``AckQueue`` for the order), the bytes, batches and back-pressure
(``_after_publish``) in ``protocol``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.recorder import CAUSE_CLEAN, CAUSE_STORAGE
from mqttamqp.core.sessions.session import Session
from mqttamqp.mqtt import decisions
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.connection import AckQueue, ConnectionState
from mqttamqp.mqtt.decisions import Answer, Close, ack_frame
from mqttamqp.mqtt.link import MQTTLink
from mqttamqp.mqtt.packets import (
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
)
from mqttamqp.mqtt.v5 import Negotiated

__all__ = ["ConnectedFlows"]

_PINGRESP = encode(Pingresp())


def _consumer(props: Properties | None) -> Consumer | None:
    """How the ``$queue/`` filters of an MQTT 5 SUBSCRIBE join their queues: the
    user properties ``consumer-group``, ``consumer-mode`` and ``stream-offset``
    (the first of each; None when there are none: the core's defaults).  The core
    judges the values (SUBACK 0x80 for a mode or offset it does not know)."""
    if props is None or not props.user_properties:
        return None
    users: dict[str, str] = {}
    for key, value in props.user_properties:
        users.setdefault(key, value)
    return Consumer(group=users.get("consumer-group") or None,
                    mode=users.get("consumer-mode") or None,
                    stream_offset=users.get("stream-offset") or None)


class ConnectedFlows(MQTTLink):
    """The packets of a connected client, for ``protocol.MQTTProtocol`` (a base
    class of it)."""

    # -- ordered acknowledgements ---------------------------------------------------

    def _ack(self, d: Deferred[None] | None, frame: bytes,
             after: Callable[[], None] | None = None, essential: bool = False) -> None:
        """Send ``frame`` once ``d`` fired and every earlier acknowledgement went out,
        then call ``after``; an ``essential`` one is called even if the connection
        closed meanwhile (though not if ``d`` failed)."""
        acks = self._acks
        if d is None and acks.empty:
            self._write(frame)
            if after is not None:
                after()
            return
        entry = acks.add(frame, after, d is None, essential)
        if acks.over_bound:
            # The client sends faster than commits finish: stop reading until they
            # catch up, rather than queue work for the writer without bound.
            self._pause_reading("storage")
        if d is None:
            self._flush_acks()
        else:
            d.addCallbacks(self._ack_ready, self._ack_failed,
                           callbackArgs=(entry,), errbackArgs=(entry,))

    def _ack_ready(self, _: object, entry: list[Any]) -> None:
        AckQueue.ready(entry)
        self._flush_acks()

    def _flush_acks(self) -> None:
        acks = self._acks
        for frame, after, essential in acks.take_flagged():
            if self.rules.closed:
                if essential and after is not None:
                    after()
                continue
            self._write(frame)
            if after is not None:
                after()
        if acks.under_resume_mark:
            self._resume_reading("storage")

    def _ack_failed(self, failure: Failure, entry: list[Any]) -> None:
        # One line for this connection, no traceback: the store logs the failure
        # itself (once when commits start failing, once when they recover).
        if self.state is not ConnectionState.CLOSED:
            self._violation(f"storage failure ({failure.getErrorMessage()}); nothing was "
                            "acknowledged, closing so the client retries", CAUSE_STORAGE)
        # Closed now: the entry's frame is never written, and its ``after`` (a QoS 2
        # gate, cancelled by the failure) does nothing; the entries behind it still
        # run theirs.
        AckQueue.ready(entry)
        self._flush_acks()

    # -- PUBLISH and its flows --------------------------------------------------------

    def _on_publish(self, packet: Publish) -> None:
        session = self.session
        assert session is not None
        if self._v5 is not None:
            self._on_publish5(self._v5, session, packet)
            return
        # A 3.1.1 PUBLISH has one rule, the topic's (``StringRules``): applied here,
        # not through ``decisions`` (the call cost 3% of a QoS 0 delivery).
        why = self.strings.topic(packet.topic, "PUBLISH topic")
        if why is not None:
            self._violation(why)
            return
        message = Message(packet.topic, packet.payload, packet.qos, packet.retain,
                          self.client_id, self.clock.seconds(), packet.dup)
        self.messages_in += 1
        broker = self.broker
        qos = packet.qos
        if qos == 0:
            result = broker.publish(message, self.identity, wait=False)
        elif qos == 1:
            assert packet.packet_id is not None
            result = broker.publish(message, self.identity)
            self._ack(result.durable, ack_frame(0x40, packet.packet_id))
        else:
            pid = packet.packet_id
            assert pid is not None
            result = broker.publish_qos2(session, message, self.identity, pid)
            # PUBREC first (after its commit), then the message goes to subscribers.
            gate = result.gate
            if gate is None:
                self._ack(result.durable, ack_frame(0x50, pid))
            else:
                self._ack(result.durable, ack_frame(0x50, pid), gate.open, True)
        self._after_publish(session, result, len(packet.payload))

    def _on_publish5(self, v5: Negotiated, session: Session, packet: Publish) -> None:
        """An MQTT 5 PUBLISH (``decisions.publish5``), then the 3.1.1 flows with
        reason codes (``decisions.publish_ack5``)."""
        message = decisions.publish5(packet, v5, self.strings, self.client_id,
                                     self.clock.seconds())
        if isinstance(message, Close):
            self._violation(message.reason, code=message.code)
            return
        if isinstance(message, Answer):   # refused at once (0x99), not routed
            release = message.release
            self._ack(None, message.frame, lambda: v5.quota_release(release))
            return
        qos = packet.qos
        pid = packet.packet_id
        broker = self.broker
        if qos == 0:
            result = broker.publish(message, self.identity, wait=False)
        elif qos == 1:
            assert pid is not None
            result = broker.publish(message, self.identity, count_drops=True)
            self._ack(result.durable, decisions.publish_ack5(Puback, pid, result, v5),
                      lambda: v5.quota_release(pid))
        else:
            assert pid is not None
            result = broker.publish_qos2(session, message, self.identity, pid,
                                         count_drops=True)
            frame = decisions.publish_ack5(Pubrec, pid, result, v5)
            gate = result.gate
            if result.denied or result.refusal is not None:
                # (the exchange ends at a failing PUBREC)
                self._ack(result.durable, frame, lambda: v5.quota_release(pid))
            elif gate is None:
                self._ack(result.durable, frame)
            else:
                self._ack(result.durable, frame, gate.open, True)
        self._after_publish(session, result, len(packet.payload))

    def _acked(self, kind: str, packet_id: int) -> Session | None:
        """The session an acknowledgement of ``kind`` applies to, or None when it is
        the wrong kind for that message in flight (the connection is closed)."""
        session = self.session
        assert session is not None
        problem = session.ack_problem(kind, packet_id)
        if problem is not None:
            self._violation(problem)
            return None
        return session

    def _on_puback(self, packet: Puback) -> None:
        session = self._acked("PUBACK", packet.packet_id)
        if session is not None:
            self.broker.acknowledged(session, packet.packet_id)

    def _on_pubrec(self, packet: Pubrec) -> None:
        session = self._acked("PUBREC", packet.packet_id)
        if session is None:
            return
        if decisions.pubrec_refused(packet.reason_code):
            self.broker.completed(session, packet.packet_id)
            return
        self.broker.received(session, packet.packet_id)

    def _on_pubrel(self, packet: Pubrel) -> None:
        assert self.session is not None
        pid = packet.packet_id
        known = self.session.inbound_seen(pid)
        d = self.broker.release_qos2(self.session, pid)
        v5 = self._v5
        frame = decisions.pubcomp(pid, known, v5)
        if v5 is None:
            self._ack(d, frame)
        else:
            self._ack(d, frame, lambda: v5.quota_release(pid))

    def _on_pubcomp(self, packet: Pubcomp) -> None:
        session = self._acked("PUBCOMP", packet.packet_id)
        if session is not None:
            self.broker.completed(session, packet.packet_id)

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------

    def _on_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        identity = self.identity
        assert session is not None and identity is not None
        broker = self.broker
        if self._v5 is not None:
            plan = decisions.subscribe5(packet, self.limits, self.strings,
                                        session.subscriptions)
            granted, d = (broker.subscribe(session, identity, plan.wanted, plan.packed,
                                           _consumer(packet.properties))
                          if plan.wanted else ([], None))
            frame, grants = decisions.suback5(packet, plan, granted)
        else:
            refused = decisions.subscribe(packet, self.strings)
            if refused is not None:
                self._violation(refused.reason)
                return
            codes, d = broker.subscribe(session, identity, packet.topics)
            frame, grants = decisions.suback(packet, codes, self.version)
        self._ack(d, frame, lambda: broker.send_retained(session, grants))

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        frame = decisions.unsubscribe(packet, self.strings, self._v5, session.subscriptions)
        if isinstance(frame, Close):
            self._violation(frame.reason)
            return
        self._ack(self.broker.unsubscribe(session, packet.topics), frame)

    # -- PING / DISCONNECT --------------------------------------------------------------

    def _on_pingreq(self, packet: Pingreq) -> None:
        self._write(_PINGRESP)

    def _on_disconnect(self, packet: Disconnect) -> None:
        goodbye = decisions.disconnect(packet, self._v5, self.limits)
        if isinstance(goodbye, Close):
            self._violation(goodbye.reason)
            return
        with_will = goodbye.with_will
        self._clean_close = True
        self._cause = CAUSE_CLEAN
        self.rules.advance("close")
        self.broker.unregister_connection(self.key, self._link, CAUSE_CLEAN)
        self._cancel_timers()
        if self.session is not None:
            why = ("client sent DISCONNECT with will" if with_will
                   else "client sent DISCONNECT")
            self.broker.end_session(self._link, self.session, not with_will, why,
                                    expiry=goodbye.expiry)
            self.session = None
        self._lose()
