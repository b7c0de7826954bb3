"""The MQTT frames of a gateway client that are not deliveries, sans-IO: CONNACK,
MQTT 5's DISCONNECT of a client taken over or closed, the acknowledgement of a
PUBLISH the core refused (MQTT 5: its reason code), SUBACK and UNSUBACK from the
core's answer, what makes a SUBSCRIBE a protocol error, the subscription options
carried to the core (a bridge's; an MQTT 5 client's), and what
an MQTT 5 PUBLISH's properties become on their way to the core.

What it must not do: write, keep state, or decide when a frame goes (``frontend``).
"""

from __future__ import annotations

from mqttamqp.amqp.codec.contract import Mqtt5Props
from mqttamqp.core.limits import Limits
from mqttamqp.core.routing.shared import SHARE_PREFIX
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, RETAIN_HANDLING
from mqttamqp.gateway.wire import Outcome
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.connection import StringRules
from mqttamqp.mqtt.decisions import Subscription, suback5
from mqttamqp.mqtt.packets import (
    SUBACK_FAILURE,
    Connack,
    Disconnect,
    Properties,
    Puback,
    Publish,
    Pubrec,
    ReasonCode,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from mqttamqp.mqtt.v5 import (
    CONNACK_REASONS,
    RECEIVE_MAXIMUM,
    TOPIC_ALIAS_MAXIMUM,
    InboundAliases,
    message_properties,
    resolve_topic,
)

__all__ = ["TAKEN_OVER", "bridge_options", "connack", "disconnect5", "message_props",
           "publish_ack", "publish_problem", "suback", "subscribe_problem", "unsuback"]

UNAUTHORIZED = "amqp:unauthorized-access"
# An MQTT 5 SUBSCRIBE's options the core is told: no local, retain as published,
# retain handling.
_CARRIED = NO_LOCAL | RETAIN_AS_PUBLISHED | RETAIN_HANDLING
# MQTT 5: the client whose client id a new connection took is told why (as the broker).
TAKEN_OVER = encode(Disconnect(ReasonCode.SESSION_TAKEN_OVER, Properties(
    reason_string="session taken over by a new connection")), 5)


def disconnect5(reason: str, code: int) -> bytes:
    """MQTT 5's DISCONNECT of a client closed for a protocol error: ``code`` (the
    codec's, 0x94 for a topic alias above the maximum, else 0x82) and the reason (as
    the broker)."""
    return encode(Disconnect(code, Properties(reason_string=reason[:200])), 5)


def publish_problem(strings: StringRules, packet: Publish, aliases: InboundAliases | None
                    ) -> tuple[str, Mqtt5Props | None, str | None, int]:
    """A PUBLISH's topic (an MQTT 5 topic alias resolved in ``aliases``, which this
    only reads: ``InboundAliases.of`` records an alias set) and message properties
    (``message_props``), or why it breaks the protocol and the MQTT 5 reason code: its
    topic (0x90), an empty topic or an unknown alias (0x82), or an alias above the
    maximum (0x94)."""
    topic = packet.topic
    props = packet.properties
    if props is not None and props.topic_alias is not None:
        resolved, why, code = resolve_topic(aliases, packet)
        if resolved is None:
            return topic, None, why, code
        topic = resolved
    if not topic:
        return topic, None, "PUBLISH with an empty topic", ReasonCode.PROTOCOL_ERROR
    problem = strings.topic(topic, "PUBLISH topic")
    if problem is not None:
        return topic, None, problem, ReasonCode.TOPIC_NAME_INVALID
    if props is None:
        return topic, None, None, ReasonCode.PROTOCOL_ERROR
    return topic, message_props(props), None, 0


def message_props(props: Properties) -> Mqtt5Props | None:
    """An MQTT 5 PUBLISH's properties that travel with the message (in their AMQP
    places); None without any."""
    mp = message_properties(props)
    if mp is None:
        return None
    return Mqtt5Props(mp.payload_format, mp.expiry_interval, mp.content_type,
                      mp.response_topic, mp.correlation_data, mp.user_properties)


def connack(level: int, present: bool, code: int, assigned: str | None = None,
            limits: Limits | None = None) -> bytes:
    """CONNACK: ``code`` a 3.1.1 return code, translated for MQTT 5; ``assigned``: the
    client id the gateway made up (MQTT 5 says it in CONNACK).  MQTT 3.1 has no
    session present flag (its byte is reserved).  An MQTT 5 acceptance (``limits``
    given) announces what the gateway serves: the receive maximum and packet size it
    applies, the topic alias maximum it serves (the broker's), no subscription
    identifiers (the contract has no place for them)."""
    if level != 5:
        return encode(Connack(present and level != 3, code))
    props = Properties(assigned_client_identifier=assigned) if assigned else None
    if limits is not None and code == 0:
        props = Properties(assigned_client_identifier=assigned,
                           receive_maximum=RECEIVE_MAXIMUM,
                           maximum_packet_size=limits.max_packet_size,
                           topic_alias_maximum=TOPIC_ALIAS_MAXIMUM,
                           subscription_identifier_available=0)
    return encode(Connack(present, CONNACK_REASONS.get(code, code), props), 5)


def publish_ack(qos: int, packet_id: int, outcome: Outcome) -> bytes:
    """The MQTT 5 PUBACK (QoS 1) or PUBREC (QoS 2) of a PUBLISH the core refused: not
    authorized (0x87) when the core said so, else unspecified error (0x80), as
    ``mqtt.decisions`` answers on a broker."""
    code = (ReasonCode.NOT_AUTHORIZED if outcome.condition == UNAUTHORIZED
            else ReasonCode.UNSPECIFIED_ERROR)
    return encode((Puback if qos == 1 else Pubrec)(packet_id, code), 5)


def subscribe_problem(strings: StringRules, limits: Limits, packet: Subscribe,
                      level: int) -> str | None:
    """Why a SUBSCRIBE breaks the protocol (too many filters; before MQTT 5 a bad
    filter too), or None.  An MQTT 5 client's bad filter is no protocol error: it
    gets 0x8F in SUBACK (``mqtt.decisions.subscribe5`` judges it, as on a broker)."""
    if level != 5:
        for topic_filter, _qos in packet.topics:
            problem = strings.filter(topic_filter, "SUBSCRIBE topic filter")
            if problem is not None:
                return problem
    if len(packet.topics) > limits.max_subscribe_filters:
        return "too many topic filters in one SUBSCRIBE"
    return None


def bridge_options(packet: Subscribe) -> dict[str, int]:
    """The subscription options of a bridge's SUBSCRIBE (Mosquitto's flag in CONNECT):
    no local on every filter but shared ones (where MQTT 5 forbids it), as a broker
    subscribes a bridge, so what it publishes is not sent back to it."""
    return {f: NO_LOCAL for f, _q in packet.topics if not f.startswith(SHARE_PREFIX)}


def carried_options(packet: Subscribe, plan: Subscription) -> dict[str, int] | None:
    """The options of an MQTT 5 SUBSCRIBE the core is told (``mqtt.decisions.subscribe5``
    judged it): no local, retain as published and retain handling (the core sends
    retained messages by it, knowing which filters are new) of each filter of
    ``plan.wanted`` that has one; None without any.  (Subscription identifiers are
    not carried.)"""
    # (each entry of ``wanted`` with its own options byte: ``plan.codes`` says SUCCESS
    # exactly for them, in order; a filter given twice keeps its last granted entry's)
    options: dict[str, int] = {}
    for (f, _q), option, code in zip(packet.topics, packet.options or (0,) * len(
            packet.topics), plan.codes, strict=True):
        if code == ReasonCode.SUCCESS:
            if option & _CARRIED:
                options[f] = option & _CARRIED
            else:
                options.pop(f, None)
    return options or None


def suback_v5(packet: Subscribe, plan: Subscription, outcome: Outcome) -> bytes:
    """MQTT 5 SUBACK once the core answered for ``plan.wanted``: the gateway's own
    codes (0x8F: no local on a shared filter) and, for the rest, the QoS asked for or
    0x87 / 0x80 as in ``suback``."""
    failed = 0x87 if outcome.condition else SUBACK_FAILURE
    granted = [q if outcome.accepted else failed for _f, q in plan.wanted]
    frame = suback5(packet, plan, granted)[0].frame
    assert frame is not None
    return frame


def suback(packet: Subscribe, outcome: Outcome, level: int) -> bytes:
    """SUBACK once the core answered: the QoS asked for, or failure (MQTT 5: 0x87
    when the core gave a reason)."""
    failed = 0x87 if level == 5 and outcome.condition else SUBACK_FAILURE
    codes = tuple(q if outcome.accepted else failed for _f, q in packet.topics)
    return encode(Suback(packet.packet_id, codes), level)


def unsuback(packet: Unsubscribe, level: int) -> bytes:
    """UNSUBACK (MQTT 5: success for each filter)."""
    return encode(Unsuback(packet.packet_id, tuple(0 for _ in packet.topics)
                           if level == 5 else ()), level)
