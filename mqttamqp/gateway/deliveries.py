"""What the core sends a gateway client, and the client's answers to it: the
deliveries of ``$mqtt.to.<id>.publish`` written as PUBLISH, the core's AMQP_PUBREL as
PUBREL, and the client's PUBACK, PUBREC and PUBCOMP, each checked against its
delivery's QoS and state as a broker checks them (``Outbound.ack_problem``: the wrong
kind closes the connection).

``ClientDeliveries`` is a base class of ``frontend.GatewayProtocol`` (the calls of
every delivery stay one method call).  Its order rule: a delivery that arrives while
acknowledgements of the client's own packets still await the core (PUBACK, PUBREC,
SUBACK, UNSUBACK in ``AckQueue``) is written after them, in the same queue.  So a
client that receives its own QoS 2 message sees PUBREC first, as from a broker,
although the core routes the message before its Accepted reaches the gateway; and
PUBREC still goes only once the core holds the message.  What is held is bounded by
the client's ``.publish`` credit (``--max-inflight``, the MQTT 5 receive maximum): the
core sends no more until the client finishes some; ``held_deliveries`` counts them.

What it must not do: read packets or decide CONNECT (``frontend``), touch proton or
settle anything itself (the channel does, given the delivery back), or keep anything
beyond the connection (the core redelivers what was not settled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from mqttamqp.amqp.codec.contract import Mqtt5Props
from mqttamqp.mqtt.connection import AckQueue, ConnectionRules, ConnectionState

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
        if not self.acks.empty:
            # Behind the answers the core still owes this client (its own QoS 2
            # message: PUBREC first); written, and QoS 0 settled, in their turn.
            self.factory.held_deliveries += 1
            self.acks.add(frame, (lambda: channel.finished(dlv)) if qos == 0 else None, True)
            self._flush_acks()
            return
        self.transport.write(frame)
        if qos == 0:
            channel.finished(dlv)

    def release(self, packet_id: int, dlv: Any) -> None:
        if self.channel is not None and not self.rules.closed:
            self.transport.write(self.outbound.pubrel(packet_id, dlv))

    def upstream_gone(self, reason: str) -> None:
        if self.rules.state is ConnectionState.CONNECTED:
            self.abort(reason)

    # -- the client's answers ---------------------------------------------------------------

    def _on_puback(self, pid: int) -> None:
        outbound = self.outbound
        problem = outbound.ack_problem("PUBACK", pid)
        if problem is not None:
            self._violation(problem)
            return
        self._finish(outbound.acknowledged(pid))

    def _on_pubrec(self, pid: int) -> None:
        outbound = self.outbound
        problem = outbound.ack_problem("PUBREC", pid)
        if problem is not None:
            self._violation(problem)
            return
        dlv = outbound.acknowledged(pid)
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
