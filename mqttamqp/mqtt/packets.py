"""MQTT 3.1 / 3.1.1 / 5 control packets as immutable records (``mqttamqp.records``: the
ones with fields are ``@final_record``, native classes in the compiled build).

This module owns the vocabulary shared by the codec, the Twisted protocol and the
tests.  It does no I/O and no validation: the codec validates on the way in.

MQTT 5 fields ride on the same classes, after the 3.1.1 ones and with defaults
that mean "absent" (``properties=None``, reason code 0), so 3.1.1 code builds
packets as before and a 3.1.1 encoding never sees them.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar, Final

from mqttamqp.records import final_record, record

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


@final_record
class Properties:
    """The MQTT 5 properties of one packet (section 2.2.2); None or () is absent.

    Which packet may carry which property, and the wire form, are the codec's
    (``properties.PROPERTY_TABLE``).  ``user_properties`` keeps the order and
    repetitions it arrived with; ``subscription_identifiers`` may hold several
    only on a PUBLISH sent to a client.
    """

    payload_format_indicator: Final[int | None]
    message_expiry_interval: Final[int | None]
    content_type: Final[str | None]
    response_topic: Final[str | None]
    correlation_data: Final[bytes | None]
    subscription_identifiers: Final[tuple[int, ...]]
    session_expiry_interval: Final[int | None]
    assigned_client_identifier: Final[str | None]
    server_keep_alive: Final[int | None]
    authentication_method: Final[str | None]
    authentication_data: Final[bytes | None]
    request_problem_information: Final[int | None]
    will_delay_interval: Final[int | None]
    request_response_information: Final[int | None]
    response_information: Final[str | None]
    server_reference: Final[str | None]
    reason_string: Final[str | None]
    receive_maximum: Final[int | None]
    topic_alias_maximum: Final[int | None]
    topic_alias: Final[int | None]
    maximum_qos: Final[int | None]
    retain_available: Final[int | None]
    user_properties: Final[tuple[tuple[str, str], ...]]
    maximum_packet_size: Final[int | None]
    wildcard_subscription_available: Final[int | None]
    subscription_identifier_available: Final[int | None]
    shared_subscription_available: Final[int | None]

    def __init__(self, payload_format_indicator: int | None = None,
                 message_expiry_interval: int | None = None,
                 content_type: str | None = None, response_topic: str | None = None,
                 correlation_data: bytes | None = None,
                 subscription_identifiers: tuple[int, ...] = (),
                 session_expiry_interval: int | None = None,
                 assigned_client_identifier: str | None = None,
                 server_keep_alive: int | None = None,
                 authentication_method: str | None = None,
                 authentication_data: bytes | None = None,
                 request_problem_information: int | None = None,
                 will_delay_interval: int | None = None,
                 request_response_information: int | None = None,
                 response_information: str | None = None,
                 server_reference: str | None = None, reason_string: str | None = None,
                 receive_maximum: int | None = None, topic_alias_maximum: int | None = None,
                 topic_alias: int | None = None, maximum_qos: int | None = None,
                 retain_available: int | None = None,
                 user_properties: tuple[tuple[str, str], ...] = (),
                 maximum_packet_size: int | None = None,
                 wildcard_subscription_available: int | None = None,
                 subscription_identifier_available: int | None = None,
                 shared_subscription_available: int | None = None) -> None:
        self.payload_format_indicator = payload_format_indicator
        self.message_expiry_interval = message_expiry_interval
        self.content_type = content_type
        self.response_topic = response_topic
        self.correlation_data = correlation_data
        self.subscription_identifiers = subscription_identifiers
        self.session_expiry_interval = session_expiry_interval
        self.assigned_client_identifier = assigned_client_identifier
        self.server_keep_alive = server_keep_alive
        self.authentication_method = authentication_method
        self.authentication_data = authentication_data
        self.request_problem_information = request_problem_information
        self.will_delay_interval = will_delay_interval
        self.request_response_information = request_response_information
        self.response_information = response_information
        self.server_reference = server_reference
        self.reason_string = reason_string
        self.receive_maximum = receive_maximum
        self.topic_alias_maximum = topic_alias_maximum
        self.topic_alias = topic_alias
        self.maximum_qos = maximum_qos
        self.retain_available = retain_available
        self.user_properties = user_properties
        self.maximum_packet_size = maximum_packet_size
        self.wildcard_subscription_available = wildcard_subscription_available
        self.subscription_identifier_available = subscription_identifier_available
        self.shared_subscription_available = shared_subscription_available


class ConnackCode(IntEnum):
    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_CREDENTIALS = 4
    NOT_AUTHORIZED = 5


@final_record
class Will:
    topic: Final[str]
    payload: Final[bytes]
    qos: Final[int]
    retain: Final[bool]
    properties: Final[Properties | None]  # MQTT 5 will properties

    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool,
                 properties: Properties | None = None) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties


@final_record
class Connect:
    protocol_name: Final[str]
    protocol_level: Final[int]
    client_id: Final[str]
    clean_session: Final[bool]
    keepalive: Final[int]
    will: Final[Will | None]
    username: Final[str | None]
    password: Final[bytes | None]
    properties: Final[Properties | None]
    # Mosquitto's bridge flag (3.1/3.1.1 level | 0x80): the client is a bridge; the
    # level above is without it.  What it publishes is not sent back to it.
    bridge: Final[bool]

    def __init__(self, protocol_name: str, protocol_level: int, client_id: str,
                 clean_session: bool, keepalive: int, will: Will | None = None,
                 username: str | None = None, password: bytes | None = None,
                 properties: Properties | None = None, bridge: bool = False) -> None:
        self.protocol_name = protocol_name
        self.protocol_level = protocol_level
        self.client_id = client_id
        self.clean_session = clean_session
        self.keepalive = keepalive
        self.will = will
        self.username = username
        self.password = password
        self.properties = properties
        self.bridge = bridge


@final_record
class Connack:
    session_present: Final[bool]
    return_code: Final[int]  # MQTT 5: the reason code
    properties: Final[Properties | None]

    def __init__(self, session_present: bool, return_code: int,
                 properties: Properties | None = None) -> None:
        self.session_present = session_present
        self.return_code = return_code
        self.properties = properties


@final_record
class Publish:
    topic: Final[str]
    payload: Final[bytes]
    qos: Final[int]
    retain: Final[bool]
    dup: Final[bool]
    packet_id: Final[int | None]  # required (1..65535) when qos > 0, else None
    properties: Final[Properties | None]
    # The bytes this packet came in as, when they are also the frame a 3.1/3.1.1
    # subscriber gets of it at QoS 0 (the decoder sets it: ``codec.Decoder``); not
    # part of its value (equality, hash, ``encode``).
    wire: Final[bytes | None]
    _uncompared: ClassVar[tuple[str, ...]] = ("wire",)
    _unshown: ClassVar[tuple[str, ...]] = ("wire",)

    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 dup: bool = False, packet_id: int | None = None,
                 properties: Properties | None = None, wire: bytes | None = None) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = properties
        self.wire = wire


@final_record
class Puback:
    packet_id: Final[int]
    reason_code: Final[int]
    properties: Final[Properties | None]

    def __init__(self, packet_id: int, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


@final_record
class Pubrec:
    packet_id: Final[int]
    reason_code: Final[int]
    properties: Final[Properties | None]

    def __init__(self, packet_id: int, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


@final_record
class Pubrel:
    packet_id: Final[int]
    dup: Final[bool]  # MQTT 3.1 allowed DUP on PUBREL; 3.1.1 requires flags 0b0010
    reason_code: Final[int]
    properties: Final[Properties | None]

    def __init__(self, packet_id: int, dup: bool = False, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.dup = dup
        self.reason_code = reason_code
        self.properties = properties


@final_record
class Pubcomp:
    packet_id: Final[int]
    reason_code: Final[int]
    properties: Final[Properties | None]

    def __init__(self, packet_id: int, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


@final_record
class Subscribe:
    packet_id: Final[int]
    topics: Final[tuple[tuple[str, int], ...]]  # (filter, requested qos)
    # MQTT 5: each filter's subscription options byte without its QoS bits
    # (no local 0x04, retain as published 0x08, retain handling 0x30), in order.
    options: Final[tuple[int, ...]]
    properties: Final[Properties | None]

    def __init__(self, packet_id: int, topics: tuple[tuple[str, int], ...],
                 options: tuple[int, ...] = (), properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.topics = topics
        self.options = options
        self.properties = properties


@final_record
class Suback:
    packet_id: Final[int]
    return_codes: Final[tuple[int, ...]]  # 0, 1, 2 or SUBACK_FAILURE; MQTT 5: reason codes
    properties: Final[Properties | None]

    def __init__(self, packet_id: int, return_codes: tuple[int, ...],
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.return_codes = return_codes
        self.properties = properties


@final_record
class Unsubscribe:
    packet_id: Final[int]
    topics: Final[tuple[str, ...]]
    properties: Final[Properties | None]

    def __init__(self, packet_id: int, topics: tuple[str, ...],
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.topics = topics
        self.properties = properties


@final_record
class Unsuback:
    packet_id: Final[int]
    reason_codes: Final[tuple[int, ...]]  # MQTT 5 only: one per filter
    properties: Final[Properties | None]

    def __init__(self, packet_id: int, reason_codes: tuple[int, ...] = (),
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_codes = reason_codes
        self.properties = properties


@record
class Pingreq:
    pass


@record
class Pingresp:
    pass


@final_record
class Disconnect:
    reason_code: Final[int]  # MQTT 5 only
    properties: Final[Properties | None]

    def __init__(self, reason_code: int = 0, properties: Properties | None = None) -> None:
        self.reason_code = reason_code
        self.properties = properties


@final_record
class Auth:
    """MQTT 5 enhanced authentication exchange."""

    reason_code: Final[int]
    properties: Final[Properties | None]

    def __init__(self, reason_code: int = 0, properties: Properties | None = None) -> None:
        self.reason_code = reason_code
        self.properties = properties


Packet = (
    Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback
    | Unsubscribe | Unsuback | Pingreq | Pingresp | Disconnect | Auth
)
