"""The packets of a connected MQTT client: PUBLISH and its QoS 1/2 flows,
PUBACK/PUBREC/PUBREL/PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, PINGREQ and DISCONNECT.

``ConnectedFlows`` is the part of ``protocol.MQTTProtocol`` that, per packet,
calls its decision (``decisions``) and hands the actions to the executor
(``executor.ActionExecutor``).  Where the broker's answer feeds the next decision
(routing a PUBLISH, then its acknowledgement; a SUBSCRIBE's grants, then its
SUBACK), the call on the broker's port is made here, as a thin step between the
two.  The rules are in ``decisions`` (and ``connection``'s ``AckQueue`` for the
order); the bytes, batches and back-pressure (``_after_publish``) in
``protocol``.  What it must not do: decide a reason code or an acknowledgement,
or write.
"""

from __future__ import annotations

from functools import partial

from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.routing.published import ROUTED
from mqttamqp.core.sessions.session import NO_LOCAL, Session
from mqttamqp.mqtt import decisions
from mqttamqp.mqtt.actions import PUBACK, PUBREC, PUBREC_OPENS, Close
from mqttamqp.mqtt.executor import ActionExecutor
from mqttamqp.mqtt.outbound import QOS0_FRAME
from mqttamqp.mqtt.packets import (
    Disconnect,
    Pingreq,
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
from mqttamqp.native import NO_SLOTS, mypyc_attr

__all__ = ["ConnectedFlows"]


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


@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectedFlows(ActionExecutor):
    """The packets of a connected client, for ``protocol.MQTTProtocol`` (a base
    class of it)."""

    __slots__ = NO_SLOTS   # (the connection has no __dict__: protocol.MQTTProtocol)

    # -- PUBLISH and its flows --------------------------------------------------------

    def _on_publish(self, packet: Publish) -> None:
        session = self.session
        assert session is not None
        if self._v5 is not None:
            self._on_publish5(self._v5, session, packet)
            return
        # A 3.1.1 PUBLISH has one rule, the topic's (``StringRules``): applied here,
        # not through ``decisions`` (the call cost 3% of a QoS 0 delivery).  Its
        # acknowledgement rule lives here and only here (``decisions.published`` is
        # MQTT 5's): PUBACK; PUBREC, opening the QoS 2 gate if the core made one;
        # a 3.1.1 client is told no verdict (denied, refused, dropped).
        strings = self.strings
        topic = packet.topic
        if len(topic) > strings.short_topic or not topic.isprintable():
            why = strings.topic(topic, "PUBLISH topic")   # (else it has nothing to say)
            if why is not None:
                self._carry_out(Close(why))
                return
        qos = packet.qos   # (a record's fields read once each: by name, compiled)
        message = Message(topic, packet.payload, qos, packet.retain,
                          self.client_id, self.clock.seconds(), packet.dup)
        wire = packet.wire
        if wire is not None:   # (its 3.1.1 QoS 0 frame: sent as it came, not encoded)
            frame = QOS0_FRAME
            frame[0], frame[1], frame[2] = message, False, wire
        self.messages_in += 1
        broker = self.broker
        identity = self.identity
        if identity is None:
            identity = self._identified()
        # (``Broker.publish`` is ``Publishing.publish``: called on the part, a direct
        # call in the compiled build, not a lookup of the port's attribute by name and
        # a call with its arguments checked; positionally: wait, counted, count_drops,
        # early)
        if qos == 0:
            result = broker.publishing.publish(message, identity, False)
        elif qos == 1:
            pid = packet.packet_id
            assert pid is not None
            result = broker.publishing.publish(message, identity, True, True, False, True)
            self._acknowledge(PUBACK, pid, result.waiter or result.durable)
        else:
            pid = packet.packet_id
            assert pid is not None
            result = broker.publish_qos2(session, message, identity, pid)
            # PUBREC first (after its commit), then the message goes to subscribers.
            gate = result.gate
            if gate is None:
                self._acknowledge(PUBREC, pid, result.durable)
            else:
                self._acknowledge(PUBREC_OPENS, pid, result.durable, gate.open)
        if ((result is not ROUTED and (result.blocked or result.congested))
                or self._throttle is not None):
            # (``_after_publish`` has nothing to do otherwise: no call per publish;
            # ``ROUTED``, most QoS 0 publishes, is neither, and its fields not read)
            self._after_publish(session, result, len(packet.payload))

    def _on_publish5(self, v5: Negotiated, session: Session, packet: Publish) -> None:
        """An MQTT 5 PUBLISH: ``decisions.publish5`` (the message, an answer at
        once, or a close), routed, then ``decisions.published``."""
        message = decisions.publish5(packet, v5, self.strings, self.client_id,
                                     self.clock.seconds())
        if not isinstance(message, Message):
            if not isinstance(message, Close):   # answered at once (0x99), not routed
                v5.took(packet)
            self._carry_out(message, packet.packet_id or 0)
            return
        pid = packet.packet_id
        if pid is not None or packet.properties is not None:
            v5.took(packet)
        self.messages_in += 1
        qos = packet.qos
        broker = self.broker
        identity = self.identity
        if identity is None:
            identity = self._identified()
        if qos == 0:
            result = broker.publish(message, identity, wait=False)
        else:
            assert pid is not None
            if qos == 1:
                result = broker.publish(message, identity, count_drops=True,
                                        early=True)
            else:
                result = broker.publish_qos2(session, message, identity, pid,
                                             count_drops=True)
            ack = decisions.published(qos, pid, result, v5)
            assert ack is not None
            gate = result.gate
            self._acknowledge(ack, pid, result.waiter or result.durable,
                              gate.open if ack.opens and gate is not None else None)
        self._after_publish(session, result, len(packet.payload))

    def _acked(self, kind: str, packet_id: int) -> Session | None:
        """The session an acknowledgement of ``kind`` applies to, or None when it is
        the wrong kind for that message in flight (the connection is closed)."""
        session = self.session
        assert session is not None
        problem = session.ack_problem(kind, packet_id)
        if problem is not None:
            self._carry_out(Close(problem))
            return None
        return session

    def _on_puback(self, packet: Puback) -> None:
        # (``_acked`` inlined, and ``Session.ack_problem``'s test of the usual case:
        # one per QoS 1 delivery)
        session = self.session
        assert session is not None
        pid = packet.packet_id
        entry = session.inflight.get(pid)
        if entry is not None and entry.qos != 1:
            problem = session.ack_problem("PUBACK", pid)
            if problem is not None:
                self._carry_out(Close(problem))
                return
        self.broker.acknowledged(session, pid)

    def _on_pubrec(self, packet: Pubrec) -> None:
        session = self._acked("PUBREC", packet.packet_id)
        if session is None:
            return
        if decisions.pubrec_refused(packet.reason_code):
            self.broker.completed(session, packet.packet_id)
            return
        self.broker.received(session, packet.packet_id)

    def _on_pubrel(self, packet: Pubrel) -> None:
        session = self.session
        assert session is not None
        pid = packet.packet_id
        ack = decisions.pubrel(pid, session.inbound_seen(pid), self._v5)
        self._acknowledge(ack, pid, self.broker.release_qos2(session, pid))

    def _on_pubcomp(self, packet: Pubcomp) -> None:
        session = self._acked("PUBCOMP", packet.packet_id)
        if session is not None:
            self.broker.completed(session, packet.packet_id)

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------

    def _on_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        identity = self.identity
        if identity is None:
            identity = self._identified()
        broker = self.broker
        if self._v5 is not None:
            plan = decisions.subscribe5(packet, self.limits, self.strings,
                                        session.subscriptions)
            granted, d = (broker.subscribe(session, identity, plan.wanted, plan.packed,
                                           _consumer(packet.properties))
                          if plan.wanted else ([], None))
            ack, grants = decisions.suback5(packet, plan, granted)
        else:
            refused = decisions.subscribe(packet, self.strings)
            if refused is not None:
                self._carry_out(refused)
                return
            # A bridge (Mosquitto's flag) gets nothing it published itself back
            # (not on a shared subscription, where no-local is not allowed).
            codes, d = broker.subscribe(session, identity, packet.topics,
                                        [q if f.startswith("$share/") else q | NO_LOCAL
                                         for f, q in packet.topics]
                                        if self.bridge_peer else ())
            ack, grants = decisions.suback(packet, codes, self.version)
        # (a ``partial``, not a lambda: mypyc failed on a lambda in a method of a class
        # that was not native)
        self._acknowledge(ack, packet.packet_id, d,
                          partial(broker.send_retained, session, grants))

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        ack = decisions.unsubscribe(packet, self.strings, self._v5, session.subscriptions)
        if isinstance(ack, Close):
            self._carry_out(ack)
            return
        self._acknowledge(ack, packet.packet_id,
                          self.broker.unsubscribe(session, packet.topics))

    # -- PING / DISCONNECT --------------------------------------------------------------

    def _on_pingreq(self, packet: Pingreq) -> None:
        self._carry_out(decisions.pingreq(packet))

    def _on_disconnect(self, packet: Disconnect) -> None:
        self._carry_out(decisions.disconnect(packet, self._v5, self.limits))
