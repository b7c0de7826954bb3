"""The MQTT connection's per-packet decisions (``mqtt.decisions``), with no
transport, no clock and no broker: packets and state in, actions out
(``mqtt.actions``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.mqtt import actions, decisions
from mqttamqp.mqtt.actions import Ack, Arm, Close, Goodbye, Refuse, Send
from mqttamqp.mqtt.codec import Decoder
from mqttamqp.mqtt.connection import StringRules
from mqttamqp.mqtt.decisions import Connecting
from mqttamqp.mqtt.packets import (
    Auth,
    ConnackCode,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    ReasonCode,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from mqttamqp.mqtt.v5 import RECEIVE_MAXIMUM, Negotiated
from mqttamqp.security.enhanced_auth import AuthExchange

LIMITS = Limits()
STRINGS = StringRules(LIMITS)


def _no_methods(method: str) -> AuthExchange | None:
    return None


def _v5(**props: object) -> Negotiated:
    return Negotiated(Connect("MQTT", 5, "c", True, 60,
                              properties=Properties(**props) if props else None))


def _frame(action: object) -> bytes:
    """The frame an ``Ack`` or ``Send`` carries (it must carry one)."""
    assert isinstance(action, (Ack, Send)) and action.frame is not None
    return action.frame


def _decode(frame: bytes, level: int) -> object:
    decoder = Decoder(protocol_level=level)
    decoder.feed(frame)
    return decoder.next_packet()


# -- CONNECT ---------------------------------------------------------------------------

def test_connect_refuses_an_unknown_protocol_before_anything_else() -> None:
    """An unknown protocol name/level is CONNACK 1, whatever else the packet says."""
    decided = decisions.connect(Connect("MQTT", 9, "", False, 0), LIMITS, STRINGS,
                                _no_methods)
    assert isinstance(decided, Refuse) and decided.code == ConnackCode.UNACCEPTABLE_PROTOCOL


def test_connect_client_id_rules_per_version() -> None:
    """3.1 refuses an empty id; 3.1.1 assigns one only with clean session; MQTT 5
    always assigns one and says so."""
    empty31 = decisions.connect(Connect("MQIsdp", 3, "", True, 0), LIMITS, STRINGS,
                                _no_methods)
    assert isinstance(empty31, Connecting) and isinstance(empty31.failure, Refuse)
    assert empty31.failure.code == ConnackCode.IDENTIFIER_REJECTED
    kept = decisions.connect(Connect("MQTT", 4, "", False, 0), LIMITS, STRINGS, _no_methods)
    assert isinstance(kept, Connecting) and isinstance(kept.failure, Refuse)
    clean = decisions.connect(Connect("MQTT", 4, "", True, 0), LIMITS, STRINGS, _no_methods)
    assert isinstance(clean, Connecting) and clean.failure is None
    assert clean.client_id.startswith("auto-") and not clean.assigned
    assert clean.version == "3.1.1" and clean.v5 is None
    five = decisions.connect(Connect("MQTT", 5, "", False, 0), LIMITS, STRINGS, _no_methods)
    assert isinstance(five, Connecting) and five.failure is None and five.assigned
    assert five.version == "5" and five.v5 is not None


def test_connect_strict_mqtt31_refuses_long_ids_and_strings_are_checked() -> None:
    """--strict-mqtt31 bounds 3.1 ids; a control character in the client id is a
    violation with 0x85 for MQTT 5."""
    strict = replace(LIMITS, strict_mqtt31=True)
    long_id = decisions.connect(Connect("MQIsdp", 3, "x" * 24, True, 0), strict,
                                StringRules(strict), _no_methods)
    assert isinstance(long_id, Connecting) and isinstance(long_id.failure, Refuse)
    bad = decisions.connect(Connect("MQTT", 5, "a\x01b", True, 0), LIMITS, STRINGS,
                            _no_methods)
    assert isinstance(bad, Connecting) and isinstance(bad.failure, Close)
    assert bad.failure.code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID


def test_connect_with_a_method_not_offered_is_refused_0x8c() -> None:
    """MQTT 5 enhanced authentication with a method the broker does not offer."""
    packet = Connect("MQTT", 5, "c", True, 0,
                     properties=Properties(authentication_method="NOPE"))
    decided = decisions.connect(packet, LIMITS, STRINGS, _no_methods)
    assert isinstance(decided, Connecting) and isinstance(decided.failure, Refuse)
    assert decided.failure.code == ReasonCode.BAD_AUTHENTICATION_METHOD


# -- PUBLISH ---------------------------------------------------------------------------

def test_publish5_topic_alias_and_receive_maximum() -> None:
    """An alias set once stands for its topic; an unknown alias and a client past
    the receive maximum are closed with their reason codes."""
    v5 = _v5()
    setting = Publish("t/1", b"", properties=Properties(topic_alias=3))
    first = decisions.publish5(setting, v5, STRINGS, "c", 0.0)
    v5.took(setting)
    again = decisions.publish5(Publish("", b"", properties=Properties(topic_alias=3)),
                               v5, STRINGS, "c", 0.0)
    assert isinstance(first, Message) and isinstance(again, Message) and again.topic == "t/1"
    unknown = decisions.publish5(Publish("", b"", properties=Properties(topic_alias=4)),
                                 v5, STRINGS, "c", 0.0)
    assert isinstance(unknown, Close) and unknown.code == ReasonCode.PROTOCOL_ERROR
    for pid in range(1, RECEIVE_MAXIMUM + 1):
        packet = Publish("t", b"", 1, packet_id=pid)
        assert isinstance(decisions.publish5(packet, v5, STRINGS, "c", 0.0), Message)
        v5.took(packet)
    over = decisions.publish5(Publish("t", b"", 1, packet_id=RECEIVE_MAXIMUM + 1), v5,
                              STRINGS, "c", 0.0)
    assert isinstance(over, Close) and over.code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED


def test_publish5_bad_utf8_payload_is_answered_0x99_or_closes_at_qos0() -> None:
    """A payload declared UTF-8 that is not: PUBACK 0x99 (quota given back once it
    is out) for QoS 1, a violation for QoS 0."""
    props = Properties(payload_format_indicator=1)
    answer = decisions.publish5(Publish("t", b"\xff", 1, packet_id=9, properties=props),
                                _v5(), STRINGS, "c", 0.0)
    assert isinstance(answer, Ack) and answer.release and answer.frame is not None
    assert _decode(answer.frame, 5) == Puback(9, ReasonCode.PAYLOAD_FORMAT_INVALID,
                                              Properties(reason_string=answer_reason(answer)))
    closed = decisions.publish5(Publish("t", b"\xff", properties=props), _v5(), STRINGS,
                                "c", 0.0)
    assert isinstance(closed, Close) and closed.code == ReasonCode.PAYLOAD_FORMAT_INVALID


def answer_reason(answer: Ack) -> str | None:
    """The reason string of the PUBACK in ``answer``."""
    assert answer.frame is not None
    packet = _decode(answer.frame, 5)
    assert isinstance(packet, Puback) and packet.properties is not None
    return packet.properties.reason_string


@dataclass
class _Refusal:
    code: int
    reason: str


@dataclass
class _Verdict:
    denied: bool = False
    refusal: _Refusal | None = None
    dropped: int = 0


def test_publish_ack5_says_the_cores_verdict() -> None:
    """Denied: 0x87; a queue's refusal: its code; drops: 0x97 on PUBACK only;
    otherwise the plain 4-byte acknowledgement."""
    v5 = _v5()
    assert decisions.publish_ack5(Puback, 1, _Verdict(), v5) == b"\x40\x02\x00\x01"
    denied = _decode(decisions.publish_ack5(Puback, 1, _Verdict(denied=True), v5), 5)
    assert isinstance(denied, Puback) and denied.reason_code == ReasonCode.NOT_AUTHORIZED
    refused = _decode(decisions.publish_ack5(
        Pubrec, 2, _Verdict(refusal=_Refusal(0x90, "no")), v5), 5)
    assert isinstance(refused, Pubrec) and refused.reason_code == 0x90
    dropped = _decode(decisions.publish_ack5(Puback, 3, _Verdict(dropped=2), v5), 5)
    assert isinstance(dropped, Puback) and dropped.reason_code == ReasonCode.QUOTA_EXCEEDED
    assert decisions.publish_ack5(Pubrec, 4, _Verdict(dropped=2), v5) == b"\x50\x02\x00\x04"


def test_pubrec_and_pubcomp() -> None:
    """A PUBREC >= 0x80 ends the exchange; PUBCOMP says 0x92 (MQTT 5) for an id
    not in flight."""
    assert decisions.pubrec_refused(0x80) and not decisions.pubrec_refused(0x10)
    assert decisions.pubcomp(5, False, None) == b"\x70\x02\x00\x05"
    assert decisions.pubcomp(5, True, _v5()) == b"\x70\x02\x00\x05"
    assert _decode(decisions.pubcomp(5, False, _v5()), 5) == Pubcomp(
        5, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)


# -- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------------

def test_suback_folds_the_cores_codes_per_version() -> None:
    """3.1.1 turns any failure into 0x80; 3.1 answers a refused filter with the QoS
    asked for; the grants list every filter."""
    packet = Subscribe(1, (("a", 1), ("b", 2)))
    ack, grants = decisions.suback(packet, [1, 0x87], "3.1.1")
    assert _decode(_frame(ack), 4) == Suback(1, (1, 0x80))
    assert grants == [("a", 1), ("b", 0x87)]
    ack31, _ = decisions.suback(packet, [1, 0x87], "3.1")
    assert _decode(_frame(ack31), 3) == Suback(1, (1, 2))
    assert isinstance(decisions.subscribe(Subscribe(2, (("a/#/b", 0),)), STRINGS), Close)


def test_subscribe5_retain_handling_and_per_filter_refusals() -> None:
    """Retain handling 1 sends retained messages only for a new filter, 2 never;
    No Local on a shared filter and an invalid filter are 0x8F in SUBACK."""
    packet = Subscribe(3, (("old", 0), ("new", 0), ("never", 0), ("$share/g/x", 0),
                           ("a/#/b", 0)),
                       options=(0x10, 0x10, 0x20, 0x04, 0),
                       properties=Properties(subscription_identifiers=(7,)))
    plan = decisions.subscribe5(packet, LIMITS, STRINGS, {"old": 0})
    assert plan.wanted == [("old", 0), ("new", 0), ("never", 0)]
    assert plan.retained_for == [False, True, False]
    assert [p >> 8 for p in plan.packed] == [7, 7, 7]
    ack, grants = decisions.suback5(packet, plan, [0, 0, 0x87])
    assert _decode(_frame(ack), 5) == Suback(3, (0, 0, 0x87, 0x8F, 0x8F))
    assert grants == [("new", 0)]
    off = replace(LIMITS, subscription_identifiers=False)
    assert decisions.subscribe5(packet, off, STRINGS, {}).codes == [
        ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED] * 5


def test_unsubscribe_codes_and_invalid_filters() -> None:
    """MQTT 5 says 0x11 for a filter with no subscription; 3.1.1's UNSUBACK has no
    codes; an invalid filter closes."""
    packet = Unsubscribe(4, ("a", "b"))
    assert _decode(_frame(decisions.unsubscribe(packet, STRINGS, _v5(), {"a": 0})), 5) == \
        Unsuback(4, (0, ReasonCode.NO_SUBSCRIPTION_EXISTED))
    assert _decode(_frame(decisions.unsubscribe(packet, STRINGS, None, {})), 4) == \
        Unsuback(4)
    assert isinstance(decisions.unsubscribe(Unsubscribe(5, ("a/+b",)), STRINGS, None, {}),
                      Close)


# -- DISCONNECT / AUTH ---------------------------------------------------------------

def test_disconnect_with_will_and_session_expiry() -> None:
    """0x04 keeps the will; a session expiry is bounded by --session-expiry; setting
    one after CONNECT gave 0 is a violation."""
    v5 = _v5(session_expiry_interval=10)
    bye = decisions.disconnect(Disconnect(ReasonCode.DISCONNECT_WITH_WILL, Properties(
        session_expiry_interval=1 << 20)), v5, replace(LIMITS, session_expiry=3600))
    assert isinstance(bye, Goodbye) and bye.with_will and bye.expiry == 3600.0
    assert isinstance(decisions.disconnect(
        Disconnect(0, Properties(session_expiry_interval=5)), _v5(), LIMITS), Close)
    plain = decisions.disconnect(Disconnect(), None, LIMITS)
    assert isinstance(plain, Goodbye) and not plain.with_will and plain.expiry is None


def test_auth_out_of_place_and_reauthentication() -> None:
    """AUTH with no exchange under way closes; connected, 0x19 with the CONNECT's
    method starts a new exchange; a step of the one under way goes on."""
    props = Properties(authentication_method="M", authentication_data=b"d")
    assert isinstance(decisions.auth(Auth(ReasonCode.CONTINUE_AUTHENTICATION, props),
                                     None, False, None, None), Close)
    started: list[str] = []

    def start(method: str) -> AuthExchange | None:
        started.append(method)
        return _Exchange()  # type: ignore[return-value]

    v5 = _v5(authentication_method="M")
    step = decisions.auth(Auth(ReasonCode.REAUTHENTICATE, props), v5, True, None, start)
    assert not isinstance(step, Close) and step[0] == b"d" and started == ["M"]
    going = decisions.auth(Auth(ReasonCode.CONTINUE_AUTHENTICATION, props), v5, False, "M",
                           start)
    assert going == (b"d", None)


class _Exchange:
    def step(self, data: bytes | None) -> object:
        raise AssertionError("not called by the decision")


def test_violation_code_for_mqtt5() -> None:
    """Keepalive and storage failures have their own MQTT 5 codes; 3.1.1 has none."""
    assert decisions.violation_code(_v5(), True, False, 0x82) == ReasonCode.KEEP_ALIVE_TIMEOUT
    assert decisions.violation_code(_v5(), False, True, 0x82) == ReasonCode.UNSPECIFIED_ERROR
    assert decisions.violation_code(_v5(), False, False, 0x95) == 0x95
    assert decisions.violation_code(None, True, False, 0x82) == 0x82


def test_malformed_packets_and_broker_closes_get_their_reasons() -> None:
    """The codec's error becomes one Close with its code and bound; a takeover and
    a console close have their causes and MQTT 5 codes."""
    from mqttamqp.core.recorder import CAUSE_CONSOLE, CAUSE_TAKEN_OVER
    from mqttamqp.mqtt.codec import MalformedPacket

    big = decisions.malformed(MalformedPacket("too big", ReasonCode.PACKET_TOO_LARGE))
    assert (big.reason, big.code, big.limit) == ("packet too large: too big", 0x95, None)
    bound = decisions.malformed(MalformedPacket("many", 0x97, "subscribe_filters"))
    assert bound.reason == "limit exceeded: many" and bound.limit == "subscribe_filters"
    assert decisions.malformed(MalformedPacket("x")).reason == "malformed packet: x"
    assert decisions.closed_by_broker("session taken over by a new connection") == (
        CAUSE_TAKEN_OVER, ReasonCode.SESSION_TAKEN_OVER)
    assert decisions.closed_by_broker("closed from the console") == (
        CAUSE_CONSOLE, ReasonCode.ADMINISTRATIVE_ACTION)


# -- actions per packet type ---------------------------------------------------------

@dataclass
class _Routed:
    denied: bool = False
    refusal: _Refusal | None = None
    dropped: int = 0
    gate: object | None = None


def test_publish5_is_pure_until_the_state_applies_its_changes() -> None:
    """Deciding a PUBLISH changes nothing in the MQTT 5 state: the alias it sets
    and its packet id's quota count only once ``Negotiated.took`` applies them."""
    v5 = _v5()
    setting = Publish("t/1", b"", 1, packet_id=7, properties=Properties(topic_alias=2))
    for _ in range(2):
        assert isinstance(decisions.publish5(setting, v5, STRINGS, "c", 0.0), Message)
    by_alias = Publish("", b"", properties=Properties(topic_alias=2))
    assert isinstance(decisions.publish5(by_alias, v5, STRINGS, "c", 0.0), Close)
    for pid in range(1, RECEIVE_MAXIMUM + 5):   # nothing counted: never over the maximum
        assert isinstance(decisions.publish5(Publish("t", b"", 1, packet_id=pid), v5,
                                             STRINGS, "c", 0.0), Message)
    v5.took(setting)
    routed = decisions.publish5(by_alias, v5, STRINGS, "c", 0.0)
    assert isinstance(routed, Message) and routed.topic == "t/1"
    assert v5.quota_allows(7)        # a resend of an id counted is free
    v5.quota_release(7)
    assert v5.quota_allows(7)


def test_published_plain_acknowledgements_are_the_shared_actions() -> None:
    """MQTT 5: a routed QoS 0 PUBLISH gets nothing; QoS 1/2 with nothing to say get
    the actions made once (no action object per packet): PUBACK giving the quota
    back, a plain PUBREC that does not (PUBCOMP will), and PUBREC opening the QoS 2
    gate.  (3.1.1's rule is ``flows``', tested through the connection.)"""
    assert decisions.published(0, 0, _Routed(), _v5()) is None
    assert decisions.published(1, 1, _Routed(), _v5()) is actions.PUBACK_RELEASE
    assert decisions.published(2, 1, _Routed(), _v5()) is actions.PUBREC
    assert decisions.published(2, 1, _Routed(dropped=1, gate=object()),
                               _v5()) is actions.PUBREC_OPENS
    assert actions.PUBACK.frame_for(0x0102) == b"\x40\x02\x01\x02"
    assert not actions.PUBACK.release and actions.PUBACK_RELEASE.release
    assert actions.PUBREC_OPENS.opens and not actions.PUBREC.opens


def test_published5_verdicts_carry_their_reason_codes_and_end_the_exchange() -> None:
    """MQTT 5: a denied or refused PUBLISH gets its frame with the reason code and
    gives the quota back (a failing PUBREC ends the QoS 2 exchange); drops are
    0x97 on PUBACK only."""
    v5 = _v5()
    denied = decisions.published(2, 5, _Routed(denied=True), v5)
    assert isinstance(denied, Ack) and denied.release and not denied.opens
    assert _decode(_frame(denied), 5) == Pubrec(
        5, ReasonCode.NOT_AUTHORIZED, Properties(reason_string="not authorized to publish there"))
    refused = decisions.published(1, 6, _Routed(refusal=_Refusal(0x83, "no")), v5)
    assert isinstance(refused, Ack) and refused.release and refused.kind == 0x40
    assert _decode(_frame(refused), 5) == Puback(6, 0x83, Properties(reason_string="no"))
    dropped = decisions.published(1, 7, _Routed(dropped=2), v5)
    assert isinstance(dropped, Ack) and dropped.release
    assert getattr(_decode(_frame(dropped), 5), "reason_code", None) == \
        ReasonCode.QUOTA_EXCEEDED


def test_pubrel_answers_pubcomp_and_gives_the_quota_back_for_mqtt5() -> None:
    """PUBREL: the shared PUBCOMP (3.1.1), PUBCOMP releasing the quota (MQTT 5), or
    PUBCOMP 0x92 for an id not in flight (MQTT 5, releasing too)."""
    assert decisions.pubrel(3, False, None) is actions.PUBCOMP
    assert decisions.pubrel(3, True, _v5()) is actions.PUBCOMP_RELEASE
    unknown = decisions.pubrel(3, False, _v5())
    assert unknown.release and _decode(_frame(unknown), 5) == Pubcomp(
        3, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)


def test_pingreq_disconnect_and_unsubscribe_actions() -> None:
    """PINGREQ is the shared PINGRESP ``Send``; DISCONNECT a ``Goodbye`` (or a
    ``Close``); UNSUBSCRIBE an ``Ack`` carrying its UNSUBACK, or a ``Close``."""
    from mqttamqp.mqtt.packets import Pingreq, Pingresp

    ping = decisions.pingreq(Pingreq())
    assert ping is actions.PINGRESP and _decode(_frame(ping), 4) == Pingresp()
    assert isinstance(decisions.disconnect(Disconnect(), None, LIMITS), Goodbye)
    ack = decisions.unsubscribe(Unsubscribe(9, ("a",)), STRINGS, None, {})
    assert isinstance(ack, Ack) and ack.kind == 0xB0 and not ack.release


def test_connect_accepted_and_authentication_deadline() -> None:
    """CONNACK accepting a client is a ``Send`` (3.1 never says session present; the
    3.1.1 ones are made once); the AUTH exchange's deadline is an ``Arm``."""
    from mqttamqp.mqtt.packets import Connack

    plain = decisions.accepted(True, "3.1.1", None, None)
    assert plain is decisions.accepted(True, "3.1.1", None, None)
    assert _decode(_frame(plain), 4) == Connack(True, ConnackCode.ACCEPTED)
    assert _decode(_frame(decisions.accepted(True, "3.1", None, None)), 4) == Connack(
        False, ConnackCode.ACCEPTED)
    five = decisions.accepted(False, "5", _v5(), Properties(receive_maximum=10))
    assert _decode(_frame(five), 5) == Connack(False, ReasonCode.SUCCESS,
                                               Properties(receive_maximum=10))
    connect = decisions.authenticating(replace(LIMITS, connect_timeout=7.0))
    assert (connect.deadline, connect.seconds) == ("connect", 7.0)


def test_auth_answer_per_step_and_exchange() -> None:
    """A challenge is AUTH 0x18; at CONNECT a failure is a refusal (0x86) and a
    success lets the CONNECT go on (None); re-authenticating, success as the same
    user is AUTH 0x00, anything else closes with 0x87."""
    from mqttamqp.security.enhanced_auth import CONTINUE, FAILURE, SUCCESS, AuthStep

    challenge = decisions.auth_answer(AuthStep(CONTINUE, b"c"), "M", False, None)
    assert isinstance(challenge, Send)
    assert _decode(challenge.frame, 5) == Auth(ReasonCode.CONTINUE_AUTHENTICATION, Properties(
        authentication_method="M", authentication_data=b"c"))
    refused = decisions.auth_answer(AuthStep(FAILURE, reason="bad proof"), "M", False, None)
    assert isinstance(refused, Refuse) and refused.code == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert decisions.auth_answer(AuthStep(SUCCESS, b"f", "u"), "M", False, None) is None
    again = decisions.auth_answer(AuthStep(SUCCESS, b"f", "u"), "M", True, "u")
    assert isinstance(again, Send)
    assert _decode(again.frame, 5) == Auth(ReasonCode.SUCCESS, Properties(
        authentication_method="M", authentication_data=b"f"))
    other = decisions.auth_answer(AuthStep(SUCCESS, b"f", "v"), "M", True, "u")
    assert isinstance(other, Close) and other.code == ReasonCode.NOT_AUTHORIZED


def test_refusals_and_closes_are_actions_with_their_details() -> None:
    """A refusal may say it was logged already (bans); a close carries the bound it
    went beyond; every action says what it is when printed."""
    banned = Refuse(ReasonCode.BANNED, "banned", logged=True)
    assert banned.logged and not Refuse(0x05, "no").logged
    assert Close("many", 0x97, "subscribe_filters").limit == "subscribe_filters"
    for action in (banned, Close("x"), actions.PUBACK, actions.PINGRESP,
                   Arm("connect", 1.0), Goodbye(True, None)):
        assert type(action).__name__ in repr(action)


def test_banned_and_authenticated_refusals() -> None:
    """A ban is 0x8A for MQTT 5 and 5 for 3.1.1, logged already by the broker; a
    failed password is 4 when a user name was given, else 5; a session owned by
    another user is 5; otherwise the session opens (None)."""
    assert decisions.banned("ban", _v5()).code == ReasonCode.BANNED
    old = decisions.banned("ban", None)
    assert old.code == ConnackCode.NOT_AUTHORIZED and old.logged
    named = Connect("MQTT", 4, "c", True, 0, username="u", password=b"p")
    anonymous = Connect("MQTT", 4, "c", True, 0)
    refused = decisions.authenticated(False, named, False)
    assert refused is not None and refused.code == ConnackCode.BAD_CREDENTIALS
    refused = decisions.authenticated(False, anonymous, True)
    assert refused is not None and refused.code == ConnackCode.NOT_AUTHORIZED
    owned = decisions.authenticated(True, named, False)
    assert owned is not None and "another user" in owned.reason and not owned.logged
    assert decisions.authenticated(True, named, True) is None


def test_a_short_printable_topic_breaks_no_topic_rule() -> None:
    """``StringRules.short_topic``: the PUBLISH path skips ``topic`` for a printable
    topic name that long or shorter, so none such may break a rule; one character
    more, in levels or in UTF-8 bytes, can."""
    for levels, length in ((4, 1000), (200, 12), (3, 8), (200, 65535)):
        strings = StringRules(Limits(max_topic_levels=levels, max_topic_length=length))
        n = strings.short_topic
        for topic in ("/" * n, "\U0001f600" * n, "a" * n, "a/" * (n // 2)):
            assert len(topic) <= n and topic.isprintable()
            assert strings.topic(topic, "PUBLISH topic") is None, (levels, length, topic)
        longer = "/" * (n + 1) if n == levels - 1 else "\U0001f600" * (n + 1)
        assert strings.topic(longer, "PUBLISH topic") is not None, (levels, length)
