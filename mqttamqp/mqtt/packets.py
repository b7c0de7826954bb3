"""MQTT 3.1 / 3.1.1 / 5 control packets as frozen, slotted dataclasses.

This module owns the vocabulary shared by the codec, the Twisted protocol and the
tests.  It does no I/O and no validation: the codec validates on the way in.

MQTT 5 fields ride on the same classes, after the 3.1.1 ones and with defaults
that mean "absent" (``properties=None``, reason code 0), so 3.1.1 code builds
packets as before and a 3.1.1 encoding never sees them.
"""

from __future__ import annotations

from dataclasses import field
from enum import IntEnum

from mqttamqp.records import record

__all__ = [
    "PacketType", "ConnackCode", "Will", "Connect", "Connack", "Publish", "Puback",
    "Pubrec", "Pubrel", "Pubcomp", "Subscribe", "Suback", "Unsubscribe", "Unsuback",
    "Pingreq", "Pingresp", "Disconnect", "Packet", "PROTOCOL_31", "PROTOCOL_311",
    "SUBACK_FAILURE", "PROTOCOL_5", "Auth", "Properties", "ReasonCode",
]

PROTOCOL_31 = ("MQIsdp", 3)
PROTOCOL_311 = ("MQTT", 4)
PROTOCOL_5 = ("MQTT", 5)
SUBACK_FAILURE = 0x80


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # MQTT 5 only


class ReasonCode(IntEnum):
    """MQTT 5 reason codes (section 2.4).  0x00 is Success, Normal disconnection
    and Granted QoS 0 alike; 0x80 and above are failures."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    REAUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


@record
class Properties:
    """The MQTT 5 properties of one packet (section 2.2.2); None or () is absent.

    Which packet may carry which property, and the wire form, are the codec's
    (``properties.PROPERTY_TABLE``).  ``user_properties`` keeps the order and
    repetitions it arrived with; ``subscription_identifiers`` may hold several
    only on a PUBLISH sent to a client.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


class ConnackCode(IntEnum):
    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_CREDENTIALS = 4
    NOT_AUTHORIZED = 5


@record
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Properties | None = None  # MQTT 5 will properties


@record
class Connect:
    protocol_name: str
    protocol_level: int
    client_id: str
    clean_session: bool
    keepalive: int
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties | None = None
    # Mosquitto's bridge flag (3.1/3.1.1 level | 0x80): the client is a bridge; the
    # level above is without it.  What it publishes is not sent back to it.
    bridge: bool = False


@record
class Connack:
    session_present: bool
    return_code: int  # MQTT 5: the reason code
    properties: Properties | None = None


@record
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # required (1..65535) when qos > 0, else None
    properties: Properties | None = None
    # The bytes this packet came in as, when they are also the frame a 3.1/3.1.1
    # subscriber gets of it at QoS 0 (the decoder sets it: ``codec.Decoder``); not
    # part of its value (equality, hash, ``encode``).
    wire: bytes | None = field(default=None, compare=False, repr=False)


@record
class Puback:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@record
class Pubrec:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@record
class Pubrel:
    packet_id: int
    dup: bool = False  # MQTT 3.1 allowed DUP on PUBREL; 3.1.1 requires flags 0b0010
    reason_code: int = 0
    properties: Properties | None = None


@record
class Pubcomp:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@record
class Subscribe:
    packet_id: int
    topics: tuple[tuple[str, int], ...]  # (filter, requested qos)
    # MQTT 5: each filter's subscription options byte without its QoS bits
    # (no local 0x04, retain as published 0x08, retain handling 0x30), in order.
    options: tuple[int, ...] = ()
    properties: Properties | None = None


@record
class Suback:
    packet_id: int
    return_codes: tuple[int, ...]  # 0, 1, 2 or SUBACK_FAILURE; MQTT 5: reason codes
    properties: Properties | None = None


@record
class Unsubscribe:
    packet_id: int
    topics: tuple[str, ...]
    properties: Properties | None = None


@record
class Unsuback:
    packet_id: int
    reason_codes: tuple[int, ...] = ()  # MQTT 5 only: one per filter
    properties: Properties | None = None


@record
class Pingreq:
    pass


@record
class Pingresp:
    pass


@record
class Disconnect:
    reason_code: int = 0  # MQTT 5 only
    properties: Properties | None = None


@record
class Auth:
    """MQTT 5 enhanced authentication exchange."""

    reason_code: int = 0
    properties: Properties | None = None


Packet = (
    Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback
    | Unsubscribe | Unsuback | Pingreq | Pingresp | Disconnect | Auth
)
