"""``DeliveryMeter``: what the protocol adapters count in the core's ``BrokerStats``.

One meter per listener factory, shared by its connections (and their links): it
writes the counters ``$SYS``, the console and the metrics read, so every adapter
counts a delivery, a socket read or a refusal the same way.

The sampling rule: the delivery that makes ``messages_sent`` a multiple of
``DELIVER_SAMPLE_MASK + 1`` has its publish-to-deliver latency observed
(``BrokerStats.deliver_sampled``).  A transfer that is not a message (an AMQP
pubrel or control reply) is counted and passes 0 as its timestamp, which the
histogram ignores: on its turn no latency is observed, as before the rule was
shared.

What it must not do: hold counters of its own (the core's ``BrokerStats`` is the
one source), or allocate per message: each method is a few additions on the
stats object.
"""

from __future__ import annotations

from mqttamqp.core.stats import DELIVER_SAMPLE_MASK, BrokerStats

__all__ = ["DeliveryMeter"]


class DeliveryMeter:
    """The adapters' writes to ``BrokerStats``."""

    __slots__ = ("stats",)

    def __init__(self, stats: BrokerStats) -> None:
        self.stats = stats

    # -- messages ----------------------------------------------------------------------

    def delivered(self, published_at: float, size: int) -> None:
        """A message of ``size`` bytes on the wire written to a subscriber (MQTT: bytes
        are counted with the message), sampled by the one rule."""
        stats = self.stats
        sent = stats.messages_sent + 1
        stats.messages_sent = sent
        stats.bytes_sent += size
        if not sent & DELIVER_SAMPLE_MASK:
            stats.deliver_sampled(published_at)

    def transferred(self, published_at: float = 0.0) -> None:
        """An AMQP transfer handed to the engine (its bytes are counted when the
        engine's output is written: ``sent_bytes``), sampled by the one rule;
        ``published_at`` 0 for a transfer that is not a message."""
        stats = self.stats
        sent = stats.messages_sent + 1
        stats.messages_sent = sent
        stats.messages_sent_amqp += 1
        if not sent & DELIVER_SAMPLE_MASK:
            stats.deliver_sampled(published_at)

    def delivered_amqp091(self, published_at: float) -> None:
        """An AMQP 0.9.1 delivery (``basic.deliver`` or ``get-ok``) handed to the
        socket (its bytes are counted when written: ``sent_bytes``), sampled by the
        one rule."""
        stats = self.stats
        sent = stats.messages_sent + 1
        stats.messages_sent = sent
        stats.messages_sent_amqp091 += 1
        if not sent & DELIVER_SAMPLE_MASK:
            stats.deliver_sampled(published_at)

    def received_amqp(self) -> None:
        """A message an AMQP sender published was routed (the router counted it in
        ``messages_received``; this is AMQP's share)."""
        self.stats.messages_received_amqp += 1

    def amqp_only(self) -> None:
        """An AMQP body with no MQTT form: not sent to MQTT subscribers."""
        self.stats.messages_amqp_only += 1

    # -- bytes -------------------------------------------------------------------------

    def received_bytes(self, size: int) -> None:
        """One socket read."""
        self.stats.bytes_received += size

    def sent_bytes(self, size: int) -> None:
        """One socket write (other than a counted ``delivered`` message)."""
        self.stats.bytes_sent += size

    # -- refusals and limits -----------------------------------------------------------

    def refused(self) -> None:
        """A connection refused before it was open (admission, handshake, auth)."""
        self.stats.connections_refused += 1

    def protocol_error(self) -> None:
        """A connection closed for breaking its protocol's rules."""
        self.stats.protocol_errors += 1

    def limit_hit(self, name: str) -> None:
        """A limit (``--max-...``) refused something (``$SYS/broker/limits/<name>``)."""
        self.stats.limit_hit(name)

    def turn_yielded(self) -> None:
        """An MQTT connection's input was held for a later reactor turn."""
        self.stats.mqtt_turns_yielded += 1

    def links_attached(self, total: int) -> None:
        """The AMQP links attached now, all connections (a gauge)."""
        self.stats.amqp_links = total
