"""MQTT 3.1 / 3.1.1 control packets as frozen, slotted dataclasses.

This module owns the vocabulary shared by the codec, the Twisted protocol and the
tests.  It does no I/O and no validation: the codec validates on the way in.
"""

from __future__ import annotations

from enum import IntEnum

from mqttamqp.records import record

__all__ = [
    "PacketType", "ConnackCode", "Will", "Connect", "Connack", "Publish", "Puback",
    "Pubrec", "Pubrel", "Pubcomp", "Subscribe", "Suback", "Unsubscribe", "Unsuback",
    "Pingreq", "Pingresp", "Disconnect", "Packet", "PROTOCOL_31", "PROTOCOL_311",
    "SUBACK_FAILURE",
]

PROTOCOL_31 = ("MQIsdp", 3)
PROTOCOL_311 = ("MQTT", 4)
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


@record
class Connack:
    session_present: bool
    return_code: int


@record
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # required (1..65535) when qos > 0, else None


@record
class Puback:
    packet_id: int


@record
class Pubrec:
    packet_id: int


@record
class Pubrel:
    packet_id: int
    dup: bool = False  # MQTT 3.1 allowed DUP on PUBREL; 3.1.1 requires flags 0b0010


@record
class Pubcomp:
    packet_id: int


@record
class Subscribe:
    packet_id: int
    topics: tuple[tuple[str, int], ...]  # (filter, requested qos)


@record
class Suback:
    packet_id: int
    return_codes: tuple[int, ...]  # 0, 1, 2 or SUBACK_FAILURE


@record
class Unsubscribe:
    packet_id: int
    topics: tuple[str, ...]


@record
class Unsuback:
    packet_id: int


@record
class Pingreq:
    pass


@record
class Pingresp:
    pass


@record
class Disconnect:
    pass


Packet = (
    Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback
    | Unsubscribe | Unsuback | Pingreq | Pingresp | Disconnect
)
