"""Hypothesis strategies for MQTT packets with valid fields (3.1, 3.1.1 and 5, properties
included) and the byte builders of hand-made packets, shared by the codec's properties
and the input-bound tests."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import strategies as st

from mqttamqp.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from mqttamqp.mqtt.properties import (
    PROPERTY_TABLE,
    PropertyContext,
    encode_varint,
)


def u16(n: int) -> bytes:
    return struct.pack(">H", n)


def s(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return u16(len(raw)) + raw


def texts(level: int, min_size: int = 0, exclude: str = "") -> st.SearchStrategy[str]:
    forbidden = exclude + ("\x00" if level == 4 else "")
    return st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters=forbidden),
        min_size=min_size,
        max_size=20,
    )


def topic_names(level: int) -> st.SearchStrategy[str]:
    return texts(level, min_size=1, exclude="+#\x00")


def topic_filters(level: int) -> st.SearchStrategy[str]:
    """Topics and filters carry no U+0000 under either version."""
    return texts(level, min_size=1, exclude="\x00")


packet_ids = st.integers(1, 0xFFFF)


small_binary = st.binary(max_size=40)


_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "byte": st.integers(0, 1),
    "u16": st.integers(1, 0xFFFF),
    "u32": st.integers(1, 0xFFFFFFFF),
    "var": st.integers(1, 268_435_455),
    "bin": small_binary,
    "str": texts(4, min_size=1, exclude="+#"),
    "pair": st.tuples(texts(4), texts(4)),
}


def properties_for(context: PropertyContext) -> st.SearchStrategy[Properties | None]:
    specs = [spec for spec in PROPERTY_TABLE.values() if context in spec.contexts]
    multi = {"user_properties"} | (
        {"subscription_identifiers"} if context is PropertyContext.PUBLISH else set())

    @st.composite
    def build(draw: st.DrawFn) -> Properties | None:
        chosen = draw(st.lists(st.sampled_from(specs), unique_by=lambda x: x.identifier))
        if not chosen:
            return None
        values: dict[str, Any] = {}
        for spec in chosen:
            if spec.field in multi:
                values[spec.field] = tuple(draw(st.lists(_VALUES[spec.kind], min_size=1,
                                                         max_size=3)))
            elif spec.field == "subscription_identifiers":
                values[spec.field] = (draw(_VALUES[spec.kind]),)
            else:
                values[spec.field] = draw(_VALUES[spec.kind])
        return Properties(**values)

    return build()


C = PropertyContext


def connects5() -> st.SearchStrategy[Connect]:
    wills = st.none() | st.builds(Will, topic_names(4), small_binary, st.integers(0, 2),
                                  st.booleans(), properties_for(C.WILL))
    return st.builds(lambda cid, clean, ka, will, user, pw, props: Connect(
        "MQTT", 5, cid, clean, ka, will, user, pw, props),
        texts(4), st.booleans(), st.integers(0, 0xFFFF), wills, st.none() | texts(4),
        st.none() | small_binary, properties_for(C.CONNECT))


def publishes5() -> st.SearchStrategy[Publish]:
    def build(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, pid: int,
              props: Properties | None) -> Publish:
        return Publish(topic, payload, qos, retain, dup and qos > 0, pid if qos else None,
                       props)
    return st.builds(build, topic_names(4), st.binary(max_size=300), st.integers(0, 2),
                     st.booleans(), st.booleans(), packet_ids, properties_for(C.PUBLISH))


def acks(cls: Any, codes: list[int], context: PropertyContext) -> st.SearchStrategy[Packet]:
    return st.builds(cls, packet_ids, st.sampled_from(codes), properties_for(context))


_PUBACK = [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99]


_SUBACK = [0, 1, 2, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2]


filters_and_options = st.lists(
    st.tuples(topic_filters(4), st.integers(0, 2), st.sampled_from(
        [0, 0x04, 0x08, 0x10, 0x20, 0x2C])), min_size=1, max_size=5)


STRATEGIES: dict[str, st.SearchStrategy[Packet]] = {
    "connect": connects5(),
    "connack": st.builds(Connack, st.booleans(), st.sampled_from([0, 0x80, 0x85, 0x86, 0x87,
                                                                   0x88, 0x89, 0x8A, 0x97]),
                         properties_for(C.CONNACK)),
    "publish": publishes5(),
    "puback": acks(Puback, _PUBACK, C.PUBACK),
    "pubrec": acks(Pubrec, _PUBACK, C.PUBREC),
    "pubrel": st.builds(lambda pid, code, props: Pubrel(pid, False, code, props),
                        packet_ids, st.sampled_from([0, 0x92]), properties_for(C.PUBREL)),
    "pubcomp": acks(Pubcomp, [0, 0x92], C.PUBCOMP),
    "subscribe": st.builds(
        lambda pid, fo, props: Subscribe(pid, tuple((f, q) for f, q, _ in fo),
                                         tuple(o for _, _, o in fo), props),
        packet_ids, filters_and_options, properties_for(C.SUBSCRIBE)),
    "suback": st.builds(Suback, packet_ids,
                        st.lists(st.sampled_from(_SUBACK), min_size=1, max_size=5).map(tuple),
                        properties_for(C.SUBACK)),
    "unsubscribe": st.builds(Unsubscribe, packet_ids,
                             st.lists(topic_filters(4), min_size=1, max_size=5).map(tuple),
                             properties_for(C.UNSUBSCRIBE)),
    "unsuback": st.builds(Unsuback, packet_ids,
                          st.lists(st.sampled_from([0, 0x11, 0x80, 0x87, 0x8F]), min_size=1,
                                   max_size=5).map(tuple),
                          properties_for(C.UNSUBACK)),
    "pingreq": st.just(Pingreq()),
    "pingresp": st.just(Pingresp()),
    "disconnect": st.builds(Disconnect, st.sampled_from([0, 4, 0x80, 0x8B, 0x8E, 0x98]),
                            properties_for(C.DISCONNECT)),
    "auth": st.builds(Auth, st.sampled_from([0, 0x18, 0x19]), properties_for(C.AUTH)),
}


any_packet5 = st.one_of(list(STRATEGIES.values()))


def pairs(n: int, name: str = "k", value: str = "v") -> tuple[tuple[str, str], ...]:
    return tuple((name, value) for _ in range(n))


def users(n: int, **more: Any) -> Properties:
    return Properties(user_properties=pairs(n), **more)


def raw_publish(props_body: bytes, topic: bytes = b"t") -> bytes:
    """A QoS 0 PUBLISH with this property block body (built by hand)."""
    body = len(topic).to_bytes(2, "big") + topic + encode_varint(len(props_body)) \
        + props_body + b"x"
    return b"\x30" + encode_varint(len(body)) + body


def raw_pair(name: bytes, value: bytes) -> bytes:
    return (b"\x26" + len(name).to_bytes(2, "big") + name
            + len(value).to_bytes(2, "big") + value)
