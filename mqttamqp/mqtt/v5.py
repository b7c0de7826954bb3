"""What one MQTT 5 connection negotiated, and the MQTT 5 rules that need it, sans-IO.

What it owns:

* ``Negotiated``: both sides' limits from CONNECT and CONNACK (receive maximum,
  maximum packet size, topic alias maximum, session expiry, server keep alive,
  request problem / response information), built by ``negotiate``;
* the topic alias tables, inbound (``InboundAliases``: ``resolve_topic`` reads it,
  ``InboundAliases.of`` records what a PUBLISH sets, and makes the table at the
  first PUBLISH that sets an alias: most clients never do, and a 3.1.1 client
  cannot; ``Negotiated.took`` calls it on a broker, a gateway keeps one of its own)
  and outbound
  (``Negotiated.outbound_alias``);
* the inbound receive-maximum quota (``Negotiated.quota_allows``, ``took``,
  ``quota_release``);
* turning PUBLISH properties into the core's ``MessageProperties`` and back, with
  what is left of a message's expiry interval (``message_properties``,
  ``publish_properties``);
* the reason codes for the core's verdicts and for refusals.

What it must not do: touch a transport, a timer or the broker; ``protocol.py``
carries out what these rules decide.
"""

from __future__ import annotations

from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.mqtt.packets import ConnackCode, Connect, Properties, Publish, ReasonCode

__all__ = [
    "CONNACK_REASONS", "InboundAliases", "Negotiated", "RECEIVE_MAXIMUM",
    "TOPIC_ALIAS_MAXIMUM", "message_properties", "negotiate", "publish_properties", "resolve_topic",
    "utf8_payload_problem",
]

# What the broker takes from one client: QoS 1/2 publishes not yet acknowledged,
# and topic aliases (each holds a topic of up to --max-topic-length bytes).
RECEIVE_MAXIMUM = 1000
TOPIC_ALIAS_MAXIMUM = 64

# 3.1.1 CONNACK return codes and the MQTT 5 reason codes that say the same.
CONNACK_REASONS: dict[int, int] = {
    ConnackCode.ACCEPTED: ReasonCode.SUCCESS,
    ConnackCode.UNACCEPTABLE_PROTOCOL: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    ConnackCode.IDENTIFIER_REJECTED: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    ConnackCode.SERVER_UNAVAILABLE: ReasonCode.SERVER_UNAVAILABLE,
    ConnackCode.BAD_CREDENTIALS: ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    ConnackCode.NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,
}


class InboundAliases:
    """The topic aliases a client set on its PUBLISHes (at most
    ``TOPIC_ALIAS_MAXIMUM``, announced in CONNACK), for one connection."""

    __slots__ = ("_topics",)

    def __init__(self) -> None:
        self._topics: dict[int, str] = {}

    @staticmethod
    def of(aliases: InboundAliases | None, packet: Publish) -> InboundAliases | None:
        """``aliases`` (None: none set yet) after ``packet``, once ``resolve_topic``
        let it in: the alias it sets (a topic and an alias together) recorded, in a
        table made now if it is the first."""
        props = packet.properties
        if props is not None and props.topic_alias is not None and packet.topic:
            if aliases is None:
                aliases = InboundAliases()
            aliases._topics[props.topic_alias] = packet.topic
        return aliases


class Negotiated:
    """The MQTT 5 state of one connection (not kept across connections)."""

    __slots__ = ("_aliases_out", "_quota", "aliases_in", "auth", "auth_method",
                 "client_alias_max",
                 "client_max_packet", "client_receive_max", "keepalive", "plain",
                 "problem_info", "response_info", "session_expiry", "too_large")

    def __init__(self, packet: Connect) -> None:
        props = packet.properties or Properties()
        self.session_expiry = props.session_expiry_interval or 0
        self.client_receive_max = props.receive_maximum or 65535
        self.client_max_packet = props.maximum_packet_size   # None: no limit
        self.client_alias_max = props.topic_alias_maximum or 0
        self.problem_info = props.request_problem_information != 0
        self.response_info = props.request_response_information == 1
        self.keepalive = packet.keepalive
        self.auth_method = props.authentication_method   # MQTT 5 enhanced authentication
        # The exchange under way (``handshake.AuthInProgress``; the connection's
        # ``_auth``: a slot here, not one of every connection's).
        self.auth: object | None = None
        self.aliases_in: InboundAliases | None = None   # (made at the first alias set)
        self._aliases_out: dict[str, int] = {}
        self._quota: set[int] = set()
        self.too_large = 0     # PUBLISHes not sent: above the client's maximum
        # No outbound topic aliases and no maximum packet size: a message without
        # properties goes out with an empty property block (the fast path).
        self.plain = not self.client_alias_max and self.client_max_packet is None

    # -- topic aliases ------------------------------------------------------------

    def outbound_alias(self, topic: str) -> tuple[int | None, bool]:
        """The alias to send ``topic`` with, and whether the topic must go too (the
        alias is new).  Aliases are handed out until the client's maximum is used
        up; later topics go without one."""
        alias = self._aliases_out.get(topic)
        if alias is not None:
            return alias, False
        if len(self._aliases_out) >= self.client_alias_max:
            return None, True
        alias = len(self._aliases_out) + 1
        self._aliases_out[topic] = alias
        return alias, True

    def forget_alias(self, topic: str) -> None:
        """Take back the alias just handed out for ``topic`` (it was not sent)."""
        if self._aliases_out.get(topic) == len(self._aliases_out):
            del self._aliases_out[topic]

    # -- receive maximum (inbound) ----------------------------------------------------

    def quota_allows(self, packet_id: int) -> bool:
        """May a QoS 1/2 PUBLISH with ``packet_id`` come?  False if the client is
        past our receive maximum (DISCONNECT 0x93).  A resend of an id already
        counted is free.  (Read only: ``took`` counts it.)"""
        quota = self._quota
        return packet_id in quota or len(quota) < RECEIVE_MAXIMUM

    def took(self, packet: Publish) -> None:
        """What an inbound PUBLISH changes, once ``decisions.publish5`` let it in
        (routed, or answered at once): the topic alias it sets, and its packet id's
        place in the receive-maximum quota (given back by ``quota_release``)."""
        props = packet.properties
        if props is not None and props.topic_alias is not None and packet.topic:
            self.aliases_in = InboundAliases.of(self.aliases_in, packet)
        pid = packet.packet_id
        if pid is not None:
            self._quota.add(pid)

    def quota_release(self, packet_id: int) -> None:
        """Its PUBACK (QoS 1) or PUBCOMP (QoS 2) went out, or a PUBREC refused it."""
        self._quota.discard(packet_id)


def negotiate(packet: Connect, limits: Limits, client_id: str, assigned: bool
              ) -> tuple[Negotiated, Properties]:
    """The connection's MQTT 5 state and the CONNACK properties that announce the
    broker's side of it."""
    state = Negotiated(packet)
    expiry = state.session_expiry
    announced_expiry = None
    if limits.session_expiry > 0 and expiry > limits.session_expiry:
        # The broker keeps offline sessions no longer than --session-expiry.
        state.session_expiry = int(limits.session_expiry)
        announced_expiry = state.session_expiry
    server_keepalive = None
    if limits.max_keepalive and (packet.keepalive == 0
                                 or packet.keepalive > limits.max_keepalive):
        state.keepalive = server_keepalive = limits.max_keepalive
    response_info = None
    if state.response_info and limits.response_information:
        response_info = limits.response_information + client_id
    props = Properties(
        session_expiry_interval=announced_expiry,
        assigned_client_identifier=client_id if assigned else None,
        server_keep_alive=server_keepalive,
        response_information=response_info,
        receive_maximum=RECEIVE_MAXIMUM,
        topic_alias_maximum=TOPIC_ALIAS_MAXIMUM,
        maximum_packet_size=limits.max_packet_size,
        retain_available=None,          # absent: retain is available
        maximum_qos=None,               # absent: QoS 2 is available
        # absent: available; 0 when the operator turned the feature off
        wildcard_subscription_available=None if limits.wildcard_subscriptions else 0,
        subscription_identifier_available=None if limits.subscription_identifiers else 0,
        shared_subscription_available=None if limits.shared_subscriptions else 0,
    )
    return state, props


def resolve_topic(aliases: InboundAliases | None, packet: Publish
                  ) -> tuple[str | None, str, int]:
    """The topic of an inbound PUBLISH after its alias (section 3.3.2.3.4), or
    (None, why, reason code): Topic Alias invalid (0x94) or Protocol Error (0x82).
    Read only: a topic and alias together set the alias once ``InboundAliases.of``
    (``Negotiated.took`` on a broker); ``aliases`` None: none set yet."""
    props = packet.properties
    alias = props.topic_alias if props is not None else None
    if alias is None:
        if not packet.topic:
            return None, "PUBLISH with an empty topic and no topic alias", \
                ReasonCode.PROTOCOL_ERROR
        return packet.topic, "", 0
    if alias > TOPIC_ALIAS_MAXIMUM:
        return None, f"topic alias {alias} above the maximum {TOPIC_ALIAS_MAXIMUM}", \
            ReasonCode.TOPIC_ALIAS_INVALID
    if packet.topic:
        return packet.topic, "", 0
    topic = aliases._topics.get(alias) if aliases is not None else None
    if topic is None:
        return None, f"topic alias {alias} was never set", ReasonCode.PROTOCOL_ERROR
    return topic, "", 0


def message_properties(props: Properties | None) -> MessageProperties | None:
    """The part of PUBLISH (or will) properties that travels with the message."""
    if props is None:
        return None
    if (props.payload_format_indicator is None and props.message_expiry_interval is None
            and props.content_type is None and props.response_topic is None
            and props.correlation_data is None and not props.user_properties):
        return None
    return MessageProperties(props.payload_format_indicator, props.message_expiry_interval,
                             props.content_type, props.response_topic,
                             props.correlation_data, props.user_properties)


def publish_properties(message: Message, now: float, alias: int | None,
                       subscription_ids: tuple[int, ...] = ()) -> Properties | None:
    """PUBLISH properties for delivering ``message`` at ``now``: its own, with the
    remaining expiry interval, plus the alias and subscription identifiers."""
    mp = message.props
    if mp is None:
        if alias is None and not subscription_ids:
            return None
        return Properties(topic_alias=alias, subscription_identifiers=subscription_ids)
    return Properties(
        payload_format_indicator=mp.payload_format,
        message_expiry_interval=message.remaining_expiry(now),
        content_type=mp.content_type,
        response_topic=mp.response_topic,
        correlation_data=mp.correlation_data,
        user_properties=mp.user_properties,
        topic_alias=alias,
        subscription_identifiers=subscription_ids,
    )


def utf8_payload_problem(props: Properties | None, payload: bytes) -> str | None:
    """A payload declared UTF-8 (payload format indicator 1) that is not: 0x99."""
    if props is None or props.payload_format_indicator != 1:
        return None
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"payload declared UTF-8 is not ({exc.reason} at byte {exc.start})"
    return None
