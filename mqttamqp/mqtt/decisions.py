"""What an MQTT connection decides about each packet a client sends, sans-IO.

One function per packet type (as h11's ``_state.py``, or Mosquitto's
``handle_*.c``): it takes the packet and what the connection knows (its
negotiated MQTT 5 state, the string rules, the limits, the session's filters)
and returns what to do as ``actions`` (a small closed set of values:
``Send``, ``Ack``, ``Close``, ``Refuse``, ``Arm``, ``Goodbye``, and a core
``Message`` to route), which ``executor.ActionExecutor`` carries out:

* PUBLISH: ``publish5`` (MQTT 5: topic alias, receive maximum, payload format;
  a 3.1.1 PUBLISH has one rule, ``connection.StringRules.topic``, which
  ``flows`` applies inline: a call here cost 3% of a QoS 0 delivery), then
  ``published``: the acknowledgement the core's verdict gets (MQTT 5; 3.1.1's
  acknowledgement rule is inline in ``flows`` too, its one home);
* PUBREL: ``pubrel``; PUBREC: ``pubrec_refused``;
* SUBSCRIBE: ``subscribe``/``subscribe5`` (the plan, ``Subscription``), then
  ``suback``/``suback5`` once the core granted it; UNSUBSCRIBE: ``unsubscribe``;
* PINGREQ: ``pingreq``; DISCONNECT: ``disconnect``;
* CONNECT: ``connect`` (the plan, ``Connecting``), ``accepted`` once the
  session is open; AUTH: ``auth``, then ``auth_answer`` for the method's step.

Where a call on the broker's port sits between two decisions (routing a
PUBLISH, a SUBSCRIBE's grants, authentication, opening the session), the
adapter makes it as a thin step and hands its result to the next decision: the
result feeds the decision, and the Deferred it carries (``Ack``'s "after") goes
to the executor untouched.  Decisions change no state of the connection
(CONNECT and a re-authenticating AUTH start the offered method's exchange, a new
object they return): what a PUBLISH changes in the MQTT 5 state (the topic alias
it sets, its packet id's quota) is the packet's own fields, applied by
``Negotiated.took`` once the PUBLISH is routed or answered.

Reason codes, the receive maximum, retain handling, topic aliases and which
acknowledgement a verdict gets live here.  What it must not do: touch a
transport, a timer, the broker or any state (it imports no Twisted:
``.importlinter``).  This is the hottest path of the broker: a QoS 0/1 PUBLISH
and its PUBACK cost no list and no action object (the message is the route
action; the plain acknowledgements are made once, in ``actions``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Protocol

from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.recorder import CAUSE_CONSOLE, CAUSE_TAKEN_OVER
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, RETAIN_HANDLING
from mqttamqp.mqtt.actions import (
    PINGRESP,
    PUBACK_RELEASE,
    PUBCOMP,
    PUBCOMP_RELEASE,
    PUBREC,
    PUBREC_OPENS,
    Ack,
    Arm,
    Close,
    Goodbye,
    Refuse,
    Send,
    ack_frame,
)
from mqttamqp.mqtt.codec import MalformedPacket, encode
from mqttamqp.mqtt.connection import StringRules
from mqttamqp.mqtt.packets import (
    PROTOCOL_5,
    PROTOCOL_31,
    PROTOCOL_311,
    SUBACK_FAILURE,
    Auth,
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
    Pingreq,
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
from mqttamqp.mqtt.v5 import (
    RECEIVE_MAXIMUM,
    Negotiated,
    message_properties,
    resolve_topic,
    utf8_payload_problem,
)
from mqttamqp.security.enhanced_auth import CONTINUE, SUCCESS, AuthExchange, AuthStep

__all__ = [
    "Ack", "Close", "Connecting", "Goodbye", "Refuse", "Send", "Subscription", "Verdict",
    "accepted", "ack_frame", "auth", "auth_answer", "authenticated", "authenticating",
    "banned", "closed_by_broker", "connect",
    "disconnect", "malformed", "pingreq", "problem", "publish5", "publish_ack5",
    "published", "pubcomp", "pubrec_refused", "pubrel", "suback", "suback5",
    "subscribe", "subscribe5", "unsubscribe", "violation_code",
]

_VERSIONS = {3: "3.1", 4: "3.1.1"}
# CONNACK accepting a 3.1/3.1.1 client, by session present (made once).
_CONNACK_ACCEPTED = {present: Send(encode(Connack(present, ConnackCode.ACCEPTED)))
                     for present in (False, True)}


def problem(v5: Negotiated | None, reason: str) -> Properties | None:
    """A reason string for a packet the client may be sent one in (unless it
    asked for no problem information)."""
    if v5 is None or not v5.problem_info:
        return None
    return Properties(reason_string=reason[:200])


def violation_code(v5: Negotiated | None, keepalive: bool, storage: bool, code: int) -> int:
    """The reason code an MQTT 5 client is closed with."""
    if v5 is not None:
        if keepalive:
            return ReasonCode.KEEP_ALIVE_TIMEOUT
        if storage:
            return ReasonCode.UNSPECIFIED_ERROR
    return code


def malformed(exc: MalformedPacket, awaiting_connect: bool = False) -> Close:
    """The close for a packet the codec could not read (its reason code, and the
    bound it went beyond if that was it).  An MQTT 5 CONNECT (``exc.in_connect5``)
    read while ``awaiting_connect`` is answered first with CONNACK and the code
    (MQTT 5 refuses a CONNECT it cannot accept that way)."""
    what = "protocol error" if exc.code == ReasonCode.PROTOCOL_ERROR else (
        "packet too large" if exc.code == ReasonCode.PACKET_TOO_LARGE
        else "limit exceeded" if exc.limit is not None
        else "malformed packet")
    frame = None
    if exc.in_connect5 and awaiting_connect:
        frame = encode(Connack(False, exc.code, Properties(reason_string=exc.reason[:200])), 5)
    return Close(f"{what}: {exc.reason}", exc.code, exc.limit, frame)


def closed_by_broker(reason: str) -> tuple[str, int]:
    """Why the broker closes a connection (takeover or the console), for the
    archive, and the DISCONNECT reason code an MQTT 5 client is told."""
    if "taken over" in reason:
        return CAUSE_TAKEN_OVER, ReasonCode.SESSION_TAKEN_OVER
    return CAUSE_CONSOLE, ReasonCode.ADMINISTRATIVE_ACTION


# -- CONNECT ---------------------------------------------------------------------------

class Connecting:
    """A CONNECT of a known protocol: its version (label and level), its MQTT 5
    state, and either why it fails (``failure``: a refusal, or a violation of the
    string rules) or its client id (``assigned``: made up by the broker, MQTT 5
    says so in CONNACK) and the enhanced authentication exchange it starts."""

    __slots__ = ("assigned", "client_id", "exchange", "failure", "level", "v5", "version")

    def __init__(self, level: int, v5: Negotiated | None) -> None:
        self.level = level
        self.version = _VERSIONS.get(level, "5")
        self.v5 = v5
        self.client_id = ""
        self.assigned = False
        self.exchange: AuthExchange | None = None
        self.failure: Refuse | Close | None = None


def connect(packet: Connect, limits: Limits, strings: StringRules,
            start_exchange: Callable[[str], AuthExchange | None]) -> Connecting | Refuse:
    """CONNECT: the protocol (an unknown one is refused outright), the
    authentication method (MQTT 5), the strings and the client id rules of each
    version.  ``start_exchange``: the exchange of an offered enhanced
    authentication method, or None when it is not offered."""
    proto = (packet.protocol_name, packet.protocol_level)
    if proto not in (PROTOCOL_31, PROTOCOL_311, PROTOCOL_5):
        return Refuse(ConnackCode.UNACCEPTABLE_PROTOCOL,
                      f"unsupported protocol {packet.protocol_name!r} level "
                      f"{packet.protocol_level}")
    level = packet.protocol_level
    decided = Connecting(level, Negotiated(packet) if level == 5 else None)
    decided.failure = _client_id(decided, packet, limits, strings, start_exchange)
    return decided


def _client_id(decided: Connecting, packet: Connect, limits: Limits, strings: StringRules,
               start_exchange: Callable[[str], AuthExchange | None]) -> Refuse | Close | None:
    client_id = packet.client_id
    v5 = decided.v5
    if v5 is not None:
        method = v5.auth_method
        if method is not None:
            decided.exchange = start_exchange(method)
            if decided.exchange is None:
                return Refuse(ReasonCode.BAD_AUTHENTICATION_METHOD,
                              f"authentication method {method!r} is not offered")
        if not client_id:
            # MQTT 5 assigns an id whatever clean start says (and tells it).
            client_id = "auto-" + uuid.uuid4().hex
            decided.assigned = True
    # The strings break the rules (``StringRules``)?
    why = strings.text(packet.client_id, "CONNECT client identifier")
    if why is None and packet.username is not None:
        why = strings.text(packet.username, "CONNECT user name")
    if why is None and packet.will is not None:
        why = strings.topic(packet.will.topic, "CONNECT will topic")
    if why is not None:
        code = (ReasonCode.CLIENT_IDENTIFIER_NOT_VALID if "client identifier" in why
                else ReasonCode.BAD_USER_NAME_OR_PASSWORD if "user name" in why
                else ReasonCode.TOPIC_NAME_INVALID)
        return Close(why, code)
    if decided.level == 3:
        # 3.1 says 1-23 characters; real 3.1 clients send longer ids, which are
        # accepted up to 3.1.1's limits unless --strict-mqtt31.
        if not client_id:
            return Refuse(ConnackCode.IDENTIFIER_REJECTED, "MQTT 3.1 client id is empty")
        if limits.strict_mqtt31 and len(client_id) > limits.max_client_id_31:
            return Refuse(ConnackCode.IDENTIFIER_REJECTED,
                          f"MQTT 3.1 client id must be 1-{limits.max_client_id_31} "
                          f"characters (--strict-mqtt31), got {len(client_id)}")
    elif not client_id:
        if not packet.clean_session:
            return Refuse(ConnackCode.IDENTIFIER_REJECTED,
                          "empty client id requires clean session")
        client_id = "auto-" + uuid.uuid4().hex
    decided.client_id = client_id
    return None


def banned(reason: str, v5: Negotiated | None) -> Refuse:
    """A banned client (counted and logged, rate-limited, by the broker): MQTT 5 has
    its own code for it (0x8A); 3.1.1's is "not authorized"."""
    return Refuse(ReasonCode.BANNED if v5 is not None else ConnackCode.NOT_AUTHORIZED,
                  reason, logged=True)


def authenticated(ok: bool, packet: Connect, may_claim: bool) -> Refuse | None:
    """The authenticator's answer and whether the user may take the session of that
    client id: a refusal (4 bad user name or password when a name was given, else
    5 not authorized), or None: the session opens."""
    if not ok:
        return Refuse(ConnackCode.BAD_CREDENTIALS if packet.username is not None
                      else ConnackCode.NOT_AUTHORIZED, "authentication failed")
    if not may_claim:
        return Refuse(ConnackCode.NOT_AUTHORIZED,
                      "the session of this client id belongs to another user")
    return None


def accepted(present: bool, version: str, v5: Negotiated | None,
             connack_props: Properties | None) -> Send:
    """The session is open: CONNACK (session present, which 3.1 has not; MQTT 5
    with what was negotiated)."""
    if v5 is not None:
        return Send(encode(Connack(present, ReasonCode.SUCCESS, connack_props), 5))
    return _CONNACK_ACCEPTED[present and version == "3.1.1"]


# -- PUBLISH ---------------------------------------------------------------------------

def publish5(packet: Publish, v5: Negotiated, strings: StringRules, client_id: str,
             now: float) -> Message | Ack | Close:
    """An MQTT 5 PUBLISH: topic alias, receive maximum, payload format, then the
    message to route; a declared-UTF-8 payload that is not is answered 0x99 (QoS
    1/2, without routing: an ``Ack`` with its frame, sent at once, that gives the
    quota back) or closes (QoS 0).  ``v5`` is only read: once the message is
    routed or answered, ``v5.took(packet)`` records the alias it sets and its
    packet id's quota."""
    topic, why, code = resolve_topic(v5.aliases_in, packet)
    if topic is None:
        return Close(why, code)
    props = packet.properties
    if props is not None and props.subscription_identifiers:
        return Close("PUBLISH from a client carries a subscription identifier")
    why_topic = strings.topic(topic, "PUBLISH topic")
    if why_topic is not None:
        return Close(why_topic, ReasonCode.TOPIC_NAME_INVALID)
    qos = packet.qos
    pid = packet.packet_id
    if pid is not None and not v5.quota_allows(pid):
        return Close(f"more than {RECEIVE_MAXIMUM} QoS 1/2 publishes awaiting "
                     "acknowledgement (receive maximum)", ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
    bad_payload = utf8_payload_problem(props, packet.payload)
    if bad_payload is not None:
        if pid is None:
            return Close(bad_payload, ReasonCode.PAYLOAD_FORMAT_INVALID)
        ack = Puback if qos == 1 else Pubrec
        return Ack(0x40 if qos == 1 else 0x50,
                   encode(ack(pid, ReasonCode.PAYLOAD_FORMAT_INVALID,
                              problem(v5, bad_payload)), 5), release=True)
    return Message(topic, packet.payload, qos, packet.retain, client_id, now, packet.dup,
                   props=message_properties(props))


class Verdict(Protocol):
    """What the core said about a publish (``core``'s ``Published``)."""

    @property
    def denied(self) -> bool: ...

    @property
    def refusal(self) -> _Refusal | None: ...

    @property
    def dropped(self) -> int: ...

    @property
    def gate(self) -> object | None: ...


class _Refusal(Protocol):
    @property
    def code(self) -> int: ...

    @property
    def reason(self) -> str: ...


def publish_ack5(kind: type[Puback] | type[Pubrec], packet_id: int, result: Verdict,
                 v5: Negotiated) -> bytes:
    """PUBACK/PUBREC for an MQTT 5 publisher; the core's verdict is its reason
    code: not authorized (0x87), or a subscriber's queue bound refused the
    message (0x97 quota exceeded on PUBACK: it was not a silent drop; a PUBREC
    that failed would end the QoS 2 exchange the other subscribers still get
    the message through, so it stays 0); a durable queue's refusal
    (``Published.refusal``: a bad ``$queue/`` topic, an acknowledgement of a
    message that is not pending) is its code with the reason string."""
    if result.denied:
        return encode(kind(packet_id, ReasonCode.NOT_AUTHORIZED,
                           problem(v5, "not authorized to publish there")), 5)
    refusal = result.refusal
    if refusal is not None:   # a durable queue refused the message or acknowledgement
        return encode(kind(packet_id, refusal.code, problem(v5, refusal.reason)), 5)
    if result.dropped and kind is Puback:
        return encode(kind(packet_id, ReasonCode.QUOTA_EXCEEDED, problem(
            v5, f"{result.dropped} subscriber(s) had no room for it")), 5)
    return ack_frame(0x40 if kind is Puback else 0x50, packet_id)


def published(qos: int, packet_id: int, result: Verdict, v5: Negotiated) -> Ack | None:
    """The acknowledgement of an MQTT 5 client's routed PUBLISH (None at QoS 0),
    after what its routing made durable: PUBACK, or PUBREC (opening the QoS 2 gate,
    if the core holds the deliveries behind one, once written).  The core's verdict
    is its reason code (``publish_ack5``), and the acknowledgement gives the
    receive-maximum quota back (a PUBREC only when it refuses: the exchange ends
    there; otherwise PUBCOMP does).  MQTT 3.1.1's rule (PUBACK, or PUBREC opening
    the gate if there is one; no verdict shows) has its one home in
    ``flows.Flows._on_publish``, inline: that path costs no call."""
    if qos == 0:
        return None
    if qos == 1:
        if result.denied or result.refusal is not None or result.dropped:
            return Ack(0x40, publish_ack5(Puback, packet_id, result, v5), release=True)
        return PUBACK_RELEASE
    if result.denied or result.refusal is not None:
        return Ack(0x50, publish_ack5(Pubrec, packet_id, result, v5), release=True)
    return PUBREC if result.gate is None else PUBREC_OPENS


# -- PUBREC / PUBREL ---------------------------------------------------------------------

def pubrec_refused(reason_code: int) -> bool:
    """MQTT 5: a PUBREC with a failure code refuses the message; the exchange ends
    there (no PUBREL)."""
    return reason_code >= 0x80


def pubcomp(packet_id: int, known: bool, v5: Negotiated | None) -> bytes:
    """PUBCOMP for a PUBREL; MQTT 5 says 0x92 when the id was not in flight."""
    if v5 is None or known:
        return ack_frame(0x70, packet_id)
    return encode(Pubcomp(packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), 5)


def pubrel(packet_id: int, known: bool, v5: Negotiated | None) -> Ack:
    """PUBREL: PUBCOMP once the release is durable (``pubcomp``); MQTT 5 gives the
    packet id's receive-maximum quota back with it."""
    if v5 is None:
        return PUBCOMP
    if known:
        return PUBCOMP_RELEASE
    return Ack(0x70, pubcomp(packet_id, known, v5), release=True)


# -- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------------

def _filters_problem(filters: Iterable[str], strings: StringRules, what: str) -> str | None:
    """An invalid filter is a protocol violation ([MQTT-4.7.1], [MQTT-4.8.0-1]),
    in SUBSCRIBE (no SUBACK 0x80) and UNSUBSCRIBE alike."""
    for topic_filter in filters:
        why = strings.filter(topic_filter, what)
        if why is not None:
            return why
    return None


def subscribe(packet: Subscribe, strings: StringRules) -> Close | None:
    """A 3.1/3.1.1 SUBSCRIBE: why it breaks the rules, or None (to the core)."""
    why = _filters_problem((f for f, _ in packet.topics), strings, "SUBSCRIBE topic filter")
    return None if why is None else Close(why)


def suback(packet: Subscribe, codes: Sequence[int], version: str
           ) -> tuple[Ack, list[tuple[str, int]]]:
    """The 3.1/3.1.1 SUBACK for the core's ``codes``, and the grants whose retained
    messages follow it."""
    grants = [(f, code) for (f, _), code in zip(packet.topics, codes, strict=True)]
    # 3.1.1 has one failure code: any verdict of the core (an MQTT 5 reason code
    # such as 0x87 not authorized) is 0x80 here.
    acked = tuple(code if code < SUBACK_FAILURE else SUBACK_FAILURE for code in codes)
    if version == "3.1" and SUBACK_FAILURE in acked:
        # MQTT 3.1's SUBACK has no failure code: a refused filter is answered with
        # the QoS asked for and simply has no route (nothing is ever sent for it).
        acked = tuple(qos if code == SUBACK_FAILURE else code
                      for (_, qos), code in zip(packet.topics, acked, strict=True))
    return Ack(0x90, encode(Suback(packet.packet_id, acked))), grants


class Subscription:
    """An MQTT 5 SUBSCRIBE judged filter by filter: ``codes`` (SUCCESS where the
    core decides), the filters that go to the core (``wanted``) with their packed
    options, and for each whether it gets retained messages."""

    __slots__ = ("codes", "packed", "retained_for", "wanted")

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.wanted: list[tuple[str, int]] = []
        self.packed: list[int] = []
        self.retained_for: list[bool] = []


def subscribe5(packet: Subscribe, limits: Limits, strings: StringRules,
               subscriptions: Container[str]) -> Subscription:
    """MQTT 5 SUBSCRIBE: a filter that cannot be subscribed gets its reason code
    in SUBACK (0x8F invalid, or No Local on a shared subscription; 0xA1 when
    subscription identifiers are off), the others go to the core with their
    options (no local, retain as published, the subscription identifier).  Retain
    handling picks which filters get retained messages: 0 all, 1 only new
    subscriptions (not in ``subscriptions``), 2 none."""
    props = packet.properties
    sub_id = props.subscription_identifiers[0] if (
        props is not None and props.subscription_identifiers) else 0
    plan = Subscription()
    options = packet.options or (0,) * len(packet.topics)
    no_ids = sub_id != 0 and not limits.subscription_identifiers
    for (topic_filter, qos), option in zip(packet.topics, options, strict=True):
        code = ReasonCode.SUCCESS
        if no_ids:      # --no-subscription-identifiers (CONNACK said so)
            code = ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED
        elif topic_filter.startswith("$share/") and option & NO_LOCAL:
            # MQTT 5 §3.8.3.1: No Local on a shared subscription is a protocol
            # error; refused here, per filter, rather than closing.
            code = ReasonCode.TOPIC_FILTER_INVALID
        elif strings.filter(topic_filter, "SUBSCRIBE topic filter") is not None:
            code = ReasonCode.TOPIC_FILTER_INVALID
        else:
            plan.wanted.append((topic_filter, qos))
            plan.packed.append((option & (NO_LOCAL | RETAIN_AS_PUBLISHED)) | sub_id << 8)
            handling = (option & RETAIN_HANDLING) >> 4
            plan.retained_for.append(handling == 0 or (
                handling == 1 and topic_filter not in subscriptions))
        plan.codes.append(code)
    return plan


def suback5(packet: Subscribe, plan: Subscription, granted: Sequence[int]
            ) -> tuple[Ack, list[tuple[str, int]]]:
    """The MQTT 5 SUBACK once the core granted ``plan.wanted`` (its codes: 0x80,
    and 0x87 once access rules say so), and the grants that get retained messages."""
    it = iter(granted)
    codes = [next(it) if code == ReasonCode.SUCCESS else code for code in plan.codes]
    grants = [(f, code) for (f, _), code, send in zip(plan.wanted, granted,
                                                      plan.retained_for, strict=True)
              if send]
    return Ack(0x90, encode(Suback(packet.packet_id, tuple(codes)), 5)), grants


def unsubscribe(packet: Unsubscribe, strings: StringRules, v5: Negotiated | None,
                subscriptions: Container[str]) -> Close | Ack:
    """UNSUBSCRIBE: why it breaks the rules, or its UNSUBACK (MQTT 5: 0x11 for a
    filter that had no subscription)."""
    why = _filters_problem(packet.topics, strings, "UNSUBSCRIBE topic filter")
    if why is not None:
        return Close(why)
    if v5 is None:
        return Ack(0xB0, encode(Unsuback(packet.packet_id)))
    codes = tuple(ReasonCode.SUCCESS if f in subscriptions
                  else ReasonCode.NO_SUBSCRIPTION_EXISTED for f in packet.topics)
    return Ack(0xB0, encode(Unsuback(packet.packet_id, codes), 5))


# -- PINGREQ / DISCONNECT / AUTH -----------------------------------------------------

def pingreq(packet: Pingreq) -> Send:
    """PINGREQ: PINGRESP at once (the keepalive counts any input)."""
    return PINGRESP


_PLAIN_GOODBYE = Goodbye(False, None)


def disconnect(packet: Disconnect, v5: Negotiated | None, limits: Limits) -> Goodbye | Close:
    """DISCONNECT: how the session ends, or (MQTT 5) why it breaks the rules."""
    if v5 is None:
        return _PLAIN_GOODBYE
    props = packet.properties
    expiry = props.session_expiry_interval if props is not None else None
    new_expiry: float | None = None
    if expiry is not None:
        if v5.session_expiry == 0 and expiry != 0:
            return Close("DISCONNECT sets a session expiry interval after CONNECT gave 0")
        # Applied by the registry as the session ends (which restarts its expiry
        # timer on it), not here: only the holder may change it.
        limit = limits.session_expiry
        new_expiry = float(min(expiry, limit) if limit else expiry)
    # 0x04: the client wants its will published though it says goodbye.
    return Goodbye(packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL, new_expiry)


def auth(packet: Auth, v5: Negotiated | None, connected: bool,
         method_under_way: str | None,
         start_exchange: Callable[[str], AuthExchange | None] | None
         ) -> tuple[bytes | None, AuthExchange | None] | Close:
    """AUTH: the next step of the exchange CONNECT began (``method_under_way``),
    or (connected) a re-authentication with the same method (0x19), which starts
    a new exchange.  Returns the authentication data for the step and the new
    exchange (None: the one under way goes on), or why it is out of place."""
    props = packet.properties
    method = props.authentication_method if props is not None else None
    data = props.authentication_data if props is not None else None
    if (method_under_way is None and connected and v5 is not None
            and packet.reason_code == ReasonCode.REAUTHENTICATE
            and method is not None and method == v5.auth_method
            and start_exchange is not None):
        exchange = start_exchange(method)
        assert exchange is not None
        return data, exchange
    if (method_under_way is None or packet.reason_code != ReasonCode.CONTINUE_AUTHENTICATION
            or method != method_under_way):
        return Close("AUTH out of place (no exchange under way with that method)")
    return data, None


def authenticating(limits: Limits) -> Arm:
    """An AUTH exchange began: it must end within the connect timeout."""
    return Arm("connect", limits.connect_timeout)


def auth_answer(step: AuthStep, method: str, reauthenticating: bool,
                username: str | None) -> Send | Close | Refuse | None:
    """What the method's ``step`` means: a challenge (AUTH 0x18); for a
    re-authentication its end (AUTH 0x00, or a close 0x87 when it failed or proved
    another user); for CONNECT a refusal, or None: accepted, the CONNECT goes on
    (bans, the session, CONNACK with the step's data)."""
    if step.outcome == CONTINUE:
        return Send(encode(Auth(ReasonCode.CONTINUE_AUTHENTICATION, Properties(
            authentication_method=method, authentication_data=step.data)), 5))
    if reauthenticating:
        if step.outcome == SUCCESS and step.username == username:
            return Send(encode(Auth(ReasonCode.SUCCESS, Properties(
                authentication_method=method, authentication_data=step.data)), 5))
        return Close(f"re-authentication failed: {step.reason or 'another user'}",
                     ReasonCode.NOT_AUTHORIZED)
    if step.outcome != SUCCESS:
        return Refuse(ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                      f"authentication failed ({step.reason})")
    return None
