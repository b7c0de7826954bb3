"""What the core sends a gateway client, and the client's answers to it: the
deliveries of ``$mqtt.to.<id>.publish`` written as PUBLISH, the core's AMQP_PUBREL as
PUBREL, and the client's PUBACK, PUBREC and PUBCOMP, each checked against its
delivery's QoS and state as a broker checks them (``Outbound.ack_problem``: the wrong
kind closes the connection).

``ClientDeliveries`` is a base class of ``frontend.GatewayProtocol`` (the calls of
every delivery stay one method call).  Its order rule: a delivery to a topic the
client itself published to at QoS > 0, while that PUBLISH's PUBACK or PUBREC is not
yet written (it awaits the core, in ``AckQueue``), is written after it, in the same
queue; so is a later delivery to a topic with a delivery held, and any delivery while
a SUBACK or UNSUBACK the core answered waits behind another acknowledgement (retained
messages after SUBACK).  So a client that receives its own QoS 2 message sees PUBREC
first, as from a broker, although the core routes the message before its Accepted
reaches the gateway; and PUBREC still goes only once the core holds the message.
Other deliveries are not delayed.  What is held is bounded by the client's
``.publish`` credit (``--max-inflight``, the MQTT 5 receive maximum): the core sends
no more until the client finishes some; ``held_deliveries`` counts them.  Which
entries are unwritten is known by position: ``_acks_written`` counts the entries
written, and ``_own_topics`` maps a topic to the position of its last entry (its own
PUBLISH's acknowledgement, or a held delivery); it has at most twice the queue's
entries (``AckQueue``'s bound) and is emptied whenever the queue is.

What it must not do: read packets or decide CONNECT (``frontend``), touch proton or
settle anything itself (the channel does, given the delivery back), or keep anything
beyond the connection (the core redelivers what was not settled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from mqttamqp.amqp.codec.contract import Mqtt5Props
from mqttamqp.mqtt.connection import AckQueue, ConnectionRules, ConnectionState
from mqttamqp.mqtt.decisions import pubrec_refused

if TYPE_CHECKING:
    from mqttamqp.gateway.channel import ClientChannel
    from mqttamqp.gateway.outbound import Outbound

__all__ = ["ClientDeliveries", "DeliveryCounts"]


class DeliveryCounts(Protocol):
    """The gateway's counters a delivery moves (``frontend.GatewayFactory``'s)."""

    delivered: int        # deliveries written to clients
    too_large: int        # not written: over a client's maximum packet size
    held_deliveries: int  # written after acknowledgements that awaited the core


class ClientDeliveries:
    """Deliveries to one gateway client and its acknowledgements of them (a base
    class of ``GatewayProtocol``)."""

    # What it reads of the protocol's own.
    factory: DeliveryCounts
    transport: Any
    rules: ConnectionRules
    channel: ClientChannel | None
    outbound: Outbound
    acks: AckQueue

    # The order rule's state (see the module): class defaults until first used.
    _acks_written = 0                       # AckQueue entries written so far
    _hold_until = -1                        # position of an answered SUBACK/UNSUBACK
    _own_topics: dict[str, int] | None = None   # topic -> position of its last entry

    def abort(self, reason: str, brute: bool = True) -> None:
        raise NotImplementedError

    def _violation(self, reason: str) -> None:
        raise NotImplementedError

    def _flush_acks(self) -> None:
        raise NotImplementedError

    def _limited(self, cause: str, fmt: str, **kw: Any) -> None:
        raise NotImplementedError

    # -- deliveries from the core (ChannelOwner) ------------------------------------------

    def deliver(self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                dlv: Any, props: Mqtt5Props | None = None, packet_id: int | None = None
                ) -> None:
        channel = self.channel
        if channel is None or self.rules.state is not ConnectionState.CONNECTED:
            return   # (unsettled: the core keeps it when the link ends)
        frame = self.outbound.publish(topic, payload, qos, retain, dup, dlv, props, packet_id)
        if not frame:
            if frame is None:
                self.abort(f"the core's packet id {packet_id} is already in flight")
                return
            self.factory.too_large += 1   # (settled, not written: as on a broker)
            self._limited("too-large", "{c}: not sent, over its maximum packet size ({n}): "
                          "a message to {t}", t=topic, n=self.outbound.max_packet)
            channel.finished(dlv)
            return
        self.factory.delivered += 1
        written = self._acks_written
        own = self._own_topics
        if self._hold_until >= written or (own and own.get(topic, -1) >= written):
            # Behind the answer the core still owes this client for its own PUBLISH
            # to this topic (its own QoS 2 message: PUBREC first); written, and QoS 0
            # settled, in its turn.
            self.factory.held_deliveries += 1
            self._own_entry(topic)
            self.acks.add(frame, (lambda: channel.finished(dlv)) if qos == 0 else None, True)
            self._flush_acks()
            return
        self.transport.write(frame)
        if qos == 0:
            channel.finished(dlv)

    # -- the order rule's positions (the frontend's PUBLISH, SUBACK and flush) ------------

    def _own_entry(self, topic: str) -> None:
        """The entry about to be added to ``acks`` concerns ``topic`` (the client's
        own PUBLISH's acknowledgement, or a held delivery)."""
        own = self._own_topics
        if own is None:
            own = self._own_topics = {}
        own[topic] = self._acks_written + len(self.acks)

    def _answered_in_turn(self, position: int) -> None:
        """The core answered the SUBACK or UNSUBACK at ``position``: deliveries wait
        until it is written."""
        if position > self._hold_until:
            self._hold_until = position

    def _acks_taken(self, n: int) -> None:
        """``n`` entries of ``acks`` were written: forget the positions passed."""
        written = self._acks_written = self._acks_written + n
        own = self._own_topics
        if not own:
            return
        if self.acks.empty:
            own.clear()
        elif len(own) > 2 * len(self.acks) + 16:
            self._own_topics = {t: at for t, at in own.items() if at >= written}

    def release(self, packet_id: int, dlv: Any) -> None:
        if self.channel is not None and not self.rules.closed:
            self.transport.write(self.outbound.pubrel(packet_id, dlv))

    def upstream_gone(self, reason: str, cause: str = "upstream-gone") -> None:
        if self.rules.state is ConnectionState.CONNECTED:
            self._limited(cause, "closing {c} ({peer}): {r}", r=reason)
            self.abort(reason)

    # -- the client's answers ---------------------------------------------------------------

    def _on_puback(self, pid: int) -> None:
        outbound = self.outbound
        problem = outbound.ack_problem("PUBACK", pid)
        if problem is not None:
            self._violation(problem)
            return
        self._finish(outbound.acknowledged(pid))

    def _on_pubrec(self, pid: int, reason_code: int = 0) -> None:
        outbound = self.outbound
        problem = outbound.ack_problem("PUBREC", pid)
        if problem is not None:
            self._violation(problem)
            return
        dlv = outbound.acknowledged(pid)
        if pubrec_refused(reason_code):
            # MQTT 5 §4.3.3: a failed PUBREC ends the exchange (no PUBREL), as on a
            # broker (mqtt.flows): settled Accepted without release, the core
            # completes the message.
            outbound.exactly_once.discard(pid)
            self._finish(dlv)
            return
        if dlv is not None and self.channel is not None:
            self.channel.released(pid, dlv)

    def _on_pubcomp(self, pid: int) -> None:
        outbound = self.outbound
        problem = outbound.ack_problem("PUBCOMP", pid)
        if problem is not None:
            self._violation(problem)
            return
        self._finish(outbound.completed(pid))

    def _finish(self, dlv: Any) -> None:
        if dlv is not None and self.channel is not None:
            self.channel.finished(dlv)
