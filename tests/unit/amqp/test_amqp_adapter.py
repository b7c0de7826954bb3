"""Unit tests of the AMQP side without sockets or real time: the message codec, the
SASL layer, addresses, the users file, and the listener pumped through a
``StringTransport`` on a ``task.Clock`` with a proton client engine as the peer.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
from amqp_memory import ListenerPeer
from amqp_messages import drain, publish_message
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import (
    Connection,
    Endpoint,
    Event,
    Message,
    Transport,
    int32,
    symbol,
    ulong,
)
from twisted.internet.defer import succeed

from mqttamqp.amqp.addresses import AddressKind, classify
from mqttamqp.amqp.codec import publish as publish_codec
from mqttamqp.amqp.codec import sections as sections_codec
from mqttamqp.amqp.codec.contract import (
    message_payload,
    message_qos,
    message_retain,
    mqtt5_props,
    mqtt_payload,
    parse_qos,
)
from mqttamqp.amqp.codec.encode import encode_publish
from mqttamqp.amqp.codec.publish import PublishFields, PublishMemo, decode_publish, recall_publish
from mqttamqp.amqp.codec.sections import decode_message
from mqttamqp.amqp.codec.values import DecodeError, decode_value
from mqttamqp.amqp.pump import ConnectionState
from mqttamqp.amqp.sasl import (
    AMQP_HEADER,
    SASL_HEADER,
    Authenticate,
    Refuse,
    SaslServer,
    SendBytes,
    StartAmqp,
    _encode_frame,
)
from mqttamqp.core.auth import Credentials
from mqttamqp.core.limits import Limits
from mqttamqp.security.users import UserFile, add_user, make_line, parse_line

# -- codec ---------------------------------------------------------------------------


def test_decode_what_proton_encodes() -> None:
    """Every field the contract reads survives proton's encoder and our decoder."""
    msg = Message(subject="will", address="a/b", durable=True, reply_to="r",
                  correlation_id="$mqtt.to.x.publish", id=ulong(7), delivery_count=2,
                  annotations={symbol("x-opt-retain-message"): True,
                               symbol("x-opt-mqtt-qos"): int32(2)}, body=b"payload")
    msg.inferred = True
    got = decode_message(bytes(msg.encode()))
    assert (got.subject, got.to, got.durable, got.reply_to, got.correlation_id,
            got.message_id, got.delivery_count) == (
        "will", "a/b", True, "r", "$mqtt.to.x.publish", 7, 2)
    assert message_qos(got) == 2 and message_retain(got) is True
    assert message_payload(got) == b"payload"


@pytest.mark.parametrize("qos,retain,count,publisher,pid", [
    (0, False, 0, None, None), (1, True, 1, "c", 5), (2, False, 300, "x" * 300, 65535)])
def test_encode_publish_is_what_proton_decodes(qos: int, retain: bool, count: int,
                                               publisher: str | None, pid: int | None) -> None:
    """AMQP_PUBLISH as we encode it reads back in proton with every contract field."""
    data = encode_publish("t/" + "x" * 300, b"p" * 300, qos, retain, count, publisher, pid)
    m = Message()
    m.decode(data)
    assert m.address == "t/" + "x" * 300 and bytes(m.body) == b"p" * 300 and m.inferred
    assert m.durable is (qos > 0) and m.delivery_count == count
    ann = m.annotations
    assert ann[symbol("x-opt-mqtt-qos")] == qos
    assert ann[symbol("x-opt-retain-message")] is retain
    assert ann.get(symbol("x-opt-mqtt-client-id")) == publisher
    assert (m.id if pid is not None else None) == pid
    assert decode_message(data).data == [b"p" * 300]


def test_qos_fallback_and_strings() -> None:
    """x-opt-mqtt-qos as int or decimal string; absent: durable means QoS 1."""
    assert parse_qos(1) == 1 and parse_qos("2") == 2 and parse_qos(" 0 ") == 0
    assert parse_qos("7") is None and parse_qos(True) is None and parse_qos(1.0) is None
    m = decode_message(bytes(Message(durable=True, body="x").encode()))
    assert message_qos(m) == 1
    m = decode_message(bytes(Message(durable=False, body="x").encode()))
    assert message_qos(m) == 0


@pytest.mark.parametrize("body", [{"a": 1}, [1, 2], 3, None, symbol("s")])
def test_payload_rules(body: Any) -> None:
    """Only Data sections and AmqpValue string/binary are payloads; no body is empty."""
    m = decode_message(bytes(Message(body=body).encode()))
    if body is None:
        assert message_payload(m) == b""
    else:
        with pytest.raises(DecodeError, match="body must be"):
            message_payload(m)


def test_multiple_data_sections_join() -> None:
    """A body of several Data sections is their concatenation."""
    data = b"\x00\x53\x75\xa0\x02ab" + b"\x00\x53\x75\xa0\x01c"
    assert message_payload(decode_message(data)) == b"abc"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    """Any bytes either decode or raise DecodeError (never another exception)."""
    try:
        decode_message(data)
    except DecodeError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=60))
def test_random_bytes_after_a_section_header(tail: bytes) -> None:
    """Hostile content inside a section still ends in DecodeError at worst."""
    for code in (0x70, 0x72, 0x73, 0x75, 0x77):
        try:
            decode_message(bytes((0x00, 0x53, code)) + tail)
        except DecodeError:
            pass


def test_zero_width_array_bomb_is_bounded() -> None:
    """An array claiming billions of zero-width elements is refused, not expanded."""
    bomb = b"\xf0" + struct.pack(">II", 5, 0xFFFFFFFF) + b"\x40"
    with pytest.raises(DecodeError):
        decode_value(bomb)


def _uncached_publish(data: bytes, presettled: bool = False) -> PublishFields | str:
    """decode_publish's answer worked out from scratch (no cache), or the error."""
    sections_codec._prefixes.clear()
    publish_codec._publish_heads.clear()
    try:
        m = decode_message(data)
        payload, retain = mqtt_payload(m), message_retain(m)
        annotated = m.annotations.get("x-opt-mqtt-qos") is not None
        if presettled:
            qos = 0
        else:
            qos = message_qos(m) if annotated else 1   # unsettled, no annotation: QoS 1
        wait = qos > 0 and (annotated or m.durable)
        props = mqtt5_props(m)
        return PublishFields(m.to, payload, qos, retain, m.delivery_count > 0, wait,
                             m.durable, m.bare_start, m.props_end, props, m.priority)
    except DecodeError as exc:
        return exc.reason


def _cached_publish(data: bytes, presettled: bool = False, memo: PublishMemo | None = None
                    ) -> PublishFields | str:
    try:
        return decode_publish(data, presettled, memo)
    except DecodeError as exc:
        return exc.reason


def _memo_publish(data: bytes, presettled: bool, memo: PublishMemo) -> PublishFields | str:
    """What a sender's link makes of ``data``: its memo's fields if the memo
    recognises the sections before the body, else decode_publish (which fills it)."""
    payload = recall_publish(data, presettled, memo)
    if payload is not None:
        assert memo.fields is not None
        return memo.fields._replace(payload=payload)
    return _cached_publish(data, presettled, memo)


_DATA = b"\x00\x53\x75"   # a Data section descriptor, also planted inside payloads


def _payloads() -> st.SearchStrategy[bytes]:
    plain = st.binary(max_size=300)
    planted = st.binary(max_size=40).map(lambda b: b[:20] + _DATA + b"\xa0\x01Z" + b[20:])
    return st.one_of(plain, planted)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["a/b", "c", ""]), st.sampled_from([None, 0, 1, 2, "1", "x"]),
    st.sampled_from([None, True, False, 3]), st.integers(0, 2), _payloads(),
    st.sampled_from(["data", "data", "value", "footer"]), st.booleans(),
    st.sampled_from([None, None, "props", "bad-format"])),
    min_size=1, max_size=6))
def test_publish_fast_path_agrees_with_full_decode(specs: list[Any]) -> None:
    """decode_publish (cached section prefixes) gives exactly what a full decode gives,
    for repeated and interleaved senders, payloads that contain a Data descriptor,
    AmqpValue bodies, a footer after the Data section, invalid annotations, and
    pre-settled deliveries (QoS 0, annotation not checked), and the MQTT 5 mapping
    (ttl, content type, reply-to, correlation id, application properties, payload
    format, valid or not)."""
    cases = []
    for to, qos, retain, count, payload, shape, presettled, extra in specs:
        ann: dict[Any, Any] = {}
        if qos is not None:
            ann[symbol("x-opt-mqtt-qos")] = int32(qos) if isinstance(qos, int) else qos
        if retain is not None:
            ann[symbol("x-opt-retain-message")] = retain
        if extra == "bad-format":
            ann[symbol("x-opt-mqtt-payload-format")] = 7
        msg = Message(address=to or None, delivery_count=count, annotations=ann or None,
                      body=payload if shape != "value" else payload.decode("latin-1"))
        msg.inferred = shape != "value"
        if extra == "props":
            msg.priority = 9
            msg.ttl, msg.content_type, msg.reply_to = 1.5, "text/plain", "re/ply"
            msg.correlation_id = b"c1"
            msg.properties = {"k": "v", "n": 3}
        data = bytes(msg.encode())
        if shape == "footer":
            data += b"\x00\x53\x78\xc1\x01\x00"   # an empty footer map after the body
        cases.append((data, presettled))
    expected = [_uncached_publish(d, p) for d, p in cases]
    for _ in range(2):   # the second round meets cached prefixes
        assert [_cached_publish(d, p) for d, p in cases] == expected
    memo = PublishMemo()   # one sender's link sending them all, in turn
    for _ in range(2):
        assert [_memo_publish(d, p, memo) for d, p in cases] == expected


POISON = ("poisoned", 2, True, True, False, -1, -1, None, None)


def test_publish_fast_path_is_used_and_checks_the_tail() -> None:
    """After one message of a sender, the next ones come from the cache (shown by
    poisoning the cached entry); a cached prefix followed by anything but exactly
    one Data section goes the full way."""
    first = bytes(publish_message("t/1", b"one", qos=1).encode())
    fields = decode_publish(first, False)
    assert fields[:6] == ("t/1", b"one", 1, False, False, True)
    prefix = first[:first.rfind(_DATA)]
    assert prefix in publish_codec._publish_heads
    publish_codec._publish_heads[prefix] = POISON
    second = bytes(publish_message("t/1", b"two", qos=1).encode())
    assert decode_publish(second, False)[:6] == ("poisoned", b"two", 2, True, True, True)
    # Not exactly one Data section after the cached prefix: decoded in full.
    for tail in (b"\xa0\x01x" + _DATA + b"\xa0\x01y",        # two Data sections
                 b"\xa0\x01x\x00\x53\x78\xc1\x01\x00",      # a footer after it
                 b"\xa0\x05x",                                # vbin8 cut short
                 b"\xb0\xff\xff\xff\xffx"):                      # vbin32 cut short
        data = prefix + _DATA + tail
        assert _cached_publish(data)[:1] != ("poisoned",)
        publish_codec._publish_heads[prefix] = POISON
        assert _cached_publish(data) == _uncached_publish(data)
    publish_codec._publish_heads.clear()


def test_publish_memo_is_used_and_checks_the_tail() -> None:
    """A sender's memo recognises its next message by the sections before the body
    and reads only the body (shown by poisoning the memo's fields); anything but
    exactly one Data section after them, or another settlement, is not recognised."""
    publish_codec._publish_heads.clear()
    memo = PublishMemo()
    first = bytes(publish_message("t/1", b"one", qos=1).encode())
    assert _memo_publish(first, False, memo)[:6] == ("t/1", b"one", 1, False, False, True)
    prefix = first[:first.rfind(_DATA)]
    assert memo.prefix == prefix
    memo.fields = memo.fields._replace(to="poisoned")   # type: ignore[union-attr]
    second = bytes(publish_message("t/1", b"two" * 100, qos=1).encode())   # (a vbin32 body)
    assert recall_publish(second, False, memo) == b"two" * 100
    assert recall_publish(prefix + _DATA + b"\xa0\x02xy", False, memo) == b"xy"
    assert recall_publish(prefix + _DATA + b"\xa0\x00", False, memo) == b""
    assert recall_publish(second, True, memo) is None   # pre-settled: QoS 0, not 1
    for tail in (b"\xa0\x01x" + _DATA + b"\xa0\x01y",        # two Data sections
                 b"\xa0\x01x\x00\x53\x78\xc1\x01\x00",      # a footer after it
                 b"\xa0\x05x", b"\xa0", b"",                      # vbin8 cut short
                 b"\xb0\xff\xff\xff\xffx",                       # vbin32 cut short
                 b"\xa1\x01x"):                                 # a string, not binary
        assert recall_publish(prefix + _DATA + tail, False, memo) is None
    other = prefix[:-1] + bytes((prefix[-1] ^ 1,))   # another sender's sections
    assert recall_publish(other + _DATA + b"\xa0\x01x", False, memo) is None
    publish_codec._publish_heads.clear()


def test_publish_fast_path_not_fooled_by_payload_bytes() -> None:
    """A payload holding a Data descriptor never makes a cached prefix: the cache only
    holds prefixes that end on a section boundary."""
    publish_codec._publish_heads.clear()
    tail = _DATA + b"\xa0\x03xyz"
    first = bytes(Message(address="t", body=b"ab" + tail).encode())
    assert decode_publish(first, False).payload == b"ab" + tail
    assert publish_codec._publish_heads == {}
    cut = first.rfind(_DATA)
    second = first[:cut] + _DATA + b"\xa0\x01q"
    assert second != first
    assert _cached_publish(second) == _uncached_publish(second)


def test_presettled_publish_ignores_a_bad_qos_annotation() -> None:
    """Pre-settled means QoS 0: a bad x-opt-mqtt-qos is not an error then (it is for an
    unsettled delivery), cached or not."""
    msg = Message(address="t", body=b"x", annotations={symbol("x-opt-mqtt-qos"): "x"})
    msg.inferred = True
    data = bytes(msg.encode())
    for _ in range(2):
        assert decode_publish(data, True)[:6] == ("t", b"x", 0, False, False, False)
        with pytest.raises(DecodeError, match="x-opt-mqtt-qos"):
            decode_publish(data, False)


# -- the native mapping: properties ---------------------------------------------------------

# Text an AMQP peer can send: UTF-8 on the wire, so no lone surrogates (proton cannot
# encode them, and the test builds the sent message with proton).
_utf8 = st.characters(blacklist_categories=("Cs",))
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**31), 2**31 - 1).map(int32),
    st.integers(0, 2**63).map(ulong), st.text(_utf8, max_size=20),
    st.binary(max_size=20), st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet="abcxyz-", min_size=1, max_size=8).map(symbol))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(_utf8, max_size=6), inner, max_size=4)),
    max_leaves=12)


def _plain(value: Any) -> Any:
    """proton's decoded value in comparable form (memoryview → bytes)."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@settings(max_examples=200, deadline=None)
@given(body=_values, sequence=st.booleans(), to=st.sampled_from([None, "t/x", "other"]),
       props=st.dictionaries(st.text(_utf8, max_size=5), _scalars, max_size=3),
       durable=st.booleans(), presettled=st.booleans(),
       # (proton's message object cuts a subject at NUL: it is a C string there)
       subject=st.none() | st.text(st.characters(blacklist_characters="\x00",
                                                 blacklist_categories=("Cs",)), max_size=8),
       priority=st.integers(0, 255), queued=st.booleans(), first=st.booleans())
def test_native_mapping_keeps_what_was_sent(body: Any, sequence: bool, to: str | None,
                                             props: dict[str, Any], durable: bool,
                                             presettled: bool, subject: str | None,
                                             priority: int, queued: bool, first: bool
                                             ) -> None:
    """What an AMQP receiver gets of an AMQP sender's message (decode_publish →
    native_sections → encode_native) decodes, with proton, to the body, body
    section type, properties, application properties, durable and priority that
    were sent, `to` = the topic (through a durable queue: `to` as sent), and the
    broker's first-acquirer; and the MQTT form is what docs/amqp.md says (bytes,
    UTF-8, or JSON that decodes to the same value), or None only where JSON cannot
    say it."""
    import json

    from mqttamqp.amqp.codec.encode import encode_native
    from mqttamqp.amqp.codec.native import native_sections

    if sequence and not isinstance(body, list):
        body = [body]
    sent = Message(body=body, address=to, subject=subject, durable=durable,
                   properties=props or None, correlation_id="c", priority=priority)
    sent.inferred = sequence
    data = bytes(sent.encode())
    fields = decode_publish(data, presettled)
    assert fields.priority in (priority, None if priority == 4 else priority)   # (4: the default)
    native = native_sections(data, fields.bare_start, fields.props_end, fields.to, "t/x",
                             fields.durable, fields.priority, queued)
    got = Message()
    got.decode(encode_native(native, fields.qos, False, 0, "pub", None, first))
    assert _plain(got.body) == _plain(body)
    assert got.inferred == sequence
    assert got.address == (to if queued else "t/x")
    assert got.subject == subject and got.correlation_id == "c"
    assert _plain(got.properties or {}) == _plain(props)
    assert (got.durable, got.priority, got.first_acquirer) == (durable, priority, first)
    assert got.annotations[symbol("x-opt-mqtt-qos")] == (0 if presettled else 1)
    assert fields.wait == (not presettled and durable)
    payload = fields.payload
    if body is None and not sequence:
        assert payload == b""                  # proton sends no body section for None
    elif isinstance(body, (bytes, str)) and not isinstance(body, symbol) and not sequence:
        assert payload == (body if isinstance(body, bytes) else body.encode())
    elif _holds_binary(body):
        assert payload is None                 # JSON cannot say binary
    else:
        assert payload is not None and _json_same(json.loads(payload), body)


def _holds_binary(value: Any) -> bool:
    if isinstance(value, bytes):
        return True
    if isinstance(value, list):
        return any(_holds_binary(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_binary(v) for v in value.values())
    return False


def _json_same(decoded: Any, value: Any) -> bool:
    if isinstance(value, list):
        return isinstance(decoded, list) and len(decoded) == len(value) and all(
            _json_same(d, v) for d, v in zip(decoded, value, strict=True))
    if isinstance(value, dict):
        return isinstance(decoded, dict) and decoded.keys() == value.keys() and all(
            _json_same(decoded[k], v) for k, v in value.items())
    return bool(decoded == value)


# -- addresses ---------------------------------------------------------------------------

@pytest.mark.parametrize("address,kind,value", [
    (None, AddressKind.ANONYMOUS, ""),
    ("$mqtt.willservice", AddressKind.WILL_SERVICE, "$mqtt.willservice"),
    ("$lwt", AddressKind.WILL_SERVICE, "$lwt"),
    ("$subctrl", AddressKind.SUBSCRIPTION_SERVICE, "$subctrl"),
    ("$mqtt.to.a.b.publish", AddressKind.SESSION_PUBLISH, "a.b"),
    ("$mqtt.to.x/y.control", AddressKind.SESSION_CONTROL, "x/y"),
    ("$mqtt.c1.pubrel", AddressKind.PUBREL, "c1"),
    ("$mqtt.other", AddressKind.UNKNOWN_CONTROL, "$mqtt.other"),
    ("sensors/+/temp", AddressKind.TOPIC, "sensors/+/temp"),
])
def test_classify(address: str | None, kind: AddressKind, value: str) -> None:
    """Client ids are parsed by stripping the known prefix and suffix."""
    got = classify(address)
    assert (got.kind, got.value) == (kind, value)


# -- SASL ------------------------------------------------------------------------------

def _client(mechs: str, user: str | None = None, password: str | None = None) -> Any:
    conn = Connection()
    if user is not None:
        conn.user, conn.password = user, password
    transport = Transport()
    sasl = transport.sasl()
    sasl.allowed_mechs(mechs)
    sasl.allow_insecure_mechs = True
    transport.bind(conn)
    conn.open()
    return transport, sasl





@pytest.mark.parametrize("ok", [True, False])
def test_sasl_plain_exchange(ok: bool) -> None:
    """PLAIN credentials reach the authenticator; the outcome is what proton's client reads."""
    transport, sasl = _client("PLAIN", "bob", "secret")
    server = SaslServer(["PLAIN", "ANONYMOUS"], allow_no_sasl=True)
    steps = server.feed(drain(transport))
    assert isinstance(steps[0], SendBytes) and steps[0].data.startswith(SASL_HEADER)
    transport.push(steps[0].data)
    steps = server.feed(drain(transport))
    assert steps == [Authenticate("PLAIN", "bob", b"secret")]
    steps = server.outcome(ok)
    transport.push(steps[0].data)
    if ok:
        assert isinstance(steps[1], StartAmqp) and sasl.outcome == 0
    else:
        assert isinstance(steps[0], Refuse) and sasl.outcome == 1
        drain(transport)
        assert transport.condition.name == "amqp:unauthorized-access"


def test_sasl_refusals() -> None:
    """Garbage headers, unoffered mechanisms and skipped SASL (when required) are refused."""
    assert isinstance(SaslServer(["PLAIN"], False).feed(b"HTTP/1.1")[0], Refuse)
    refused = SaslServer(["PLAIN"], False).feed(AMQP_HEADER)
    assert isinstance(refused[0], Refuse) and refused[0].data == SASL_HEADER
    started = SaslServer(["PLAIN", "ANONYMOUS"], True).feed(AMQP_HEADER + b"rest")
    assert started == [StartAmqp(AMQP_HEADER + b"rest", anonymous_without_sasl=True)]
    server = SaslServer(["PLAIN"], False)
    server.feed(SASL_HEADER)
    init = _encode_frame(0x41, lambda data: data.put_symbol("ANONYMOUS"))
    steps = server.feed(init)
    assert isinstance(steps[-1], Refuse) and "not offered" in steps[-1].reason


@pytest.mark.parametrize(("response", "expected"), [
    (None, Authenticate("EXTERNAL", None, None)),
    (b"", Authenticate("EXTERNAL", None, None)),
    (b"alice", Authenticate("EXTERNAL", "alice", None)),
])
def test_sasl_external_hands_over_the_authorization_identity(
        response: bytes | None, expected: Authenticate) -> None:
    """SASL EXTERNAL hands over the authorization identity the client gave, or none."""
    server = SaslServer(["EXTERNAL", "PLAIN"], False)
    server.feed(SASL_HEADER)

    def build(data: Any) -> None:
        data.put_symbol("EXTERNAL")
        if response is not None:
            data.put_binary(response)
    assert server.feed(_encode_frame(0x41, build))[-1] == expected


def test_sasl_external_authzid_must_be_utf8() -> None:
    """An EXTERNAL authorization identity that is not UTF-8 is refused with the reason."""
    server = SaslServer(["EXTERNAL"], False)
    server.feed(SASL_HEADER)

    def build(data: Any) -> None:
        data.put_symbol("EXTERNAL")
        data.put_binary(b"\xff")
    steps = server.feed(_encode_frame(0x41, build))
    assert isinstance(steps[-1], Refuse) and "not UTF-8" in steps[-1].reason


def test_sasl_frame_bound() -> None:
    """A SASL frame larger than the bound is refused before it is buffered."""
    server = SaslServer(["PLAIN"], False, max_frame=512)
    server.feed(SASL_HEADER)
    steps = server.feed(struct.pack(">IBBH", 1 << 30, 2, 1, 0))
    assert isinstance(steps[-1], Refuse)


# -- users file -----------------------------------------------------------------------------

def test_users_lines_round_trip(tmp_path: os.PathLike[str]) -> None:
    """A line made for a user verifies its password and no other."""
    record = parse_line(make_line("alice", "s3cret"))
    assert record.username == "alice" and record.verify(b"s3cret")
    assert not record.verify(b"wrong")
    for bad in ("nocolon", "a:md5$1$2$3$aa$bb", "a:scrypt$3$8$1$aa$bb", "a:scrypt$x$8$1$aa$bb"):
        with pytest.raises(ValueError):
            parse_line(bad)
    with pytest.raises(ValueError):
        make_line("a:b", "x")


def test_user_file_authenticates_and_reloads(tmp_path: os.PathLike[str]) -> None:
    """UserFile checks passwords (off the reactor), refuses anonymous, sees file changes."""
    path = os.path.join(str(tmp_path), "users")
    add_user(path, "alice", "one")
    users = UserFile(path)
    users._defer = lambda fn, *args: succeed(fn(*args))  # no thread pool in a unit test

    def check(user: str | None, password: bytes | None) -> bool:
        result: list[bool] = []
        d = users.authenticate(Credentials("c", user, password, "amqp", "peer"))
        d.addCallback(result.append)  # type: ignore[union-attr]
        return result[0]

    assert check("alice", b"one") and not check("alice", b"two")
    assert not check(None, None) and not check("eve", b"one")
    add_user(path, "alice", "two")
    os.utime(path, (1, 1))   # a different stamp even within the same second
    assert check("alice", b"two") and not check("alice", b"one")
    assert users.allows_anonymous is False


# -- the listener on a fake transport and clock ----------------------------------------------

def test_listener_opens_and_arms_one_idle_timer() -> None:
    """Open handshake over a fake transport; one tick timer armed; closed on idle time-out."""
    peer = ListenerPeer(idle=4.0)
    peer.conn.open()
    peer.exchange()
    assert peer.server.state is ConnectionState.OPEN
    assert peer.conn.state & Endpoint.REMOTE_ACTIVE
    assert peer.transport.remote_idle_timeout == 2.0   # proton advertises half
    assert peer.factory.broker.connections[peer.server.key] is peer.server
    timers = [c for c in peer.clock.getDelayedCalls() if c.active()]
    assert len(timers) == 1
    peer.clock.advance(3.9)       # silent but within the time-out: still open
    assert peer.server.state is ConnectionState.OPEN
    peer.clock.advance(5)         # past it
    peer.exchange(1)
    assert peer.wire.disconnecting
    assert Event.CONNECTION_REMOTE_CLOSE in peer.events()
    assert peer.conn.remote_condition.name == "amqp:resource-limit-exceeded"
    peer.server.connectionLost(None)
    assert [c for c in peer.clock.getDelayedCalls() if c.active()] == []
    assert peer.server.key not in peer.factory.broker.connections


def test_listener_handshake_timeout() -> None:
    """A socket that never opens is closed after the connect timeout, nothing left behind."""
    peer = ListenerPeer(idle=60.0)
    peer.server.dataReceived(AMQP_HEADER)
    peer.clock.advance(4.9)
    assert not peer.wire.disconnecting
    peer.clock.advance(0.2)
    assert peer.wire.disconnecting
    peer.server.connectionLost(None)
    assert [c for c in peer.clock.getDelayedCalls() if c.active()] == []


def test_listener_survives_a_failing_handler() -> None:
    """An exception while handling input closes that connection with amqp:internal-error."""
    peer = ListenerPeer()
    peer.conn.open()
    peer.exchange()

    def boom(self: Any, event: Any) -> None:
        raise RuntimeError("bug")

    handlers = dict(type(peer.server)._handlers)
    peer.server._handlers = {**handlers, Event.SESSION_REMOTE_OPEN.number: boom}
    ssn = peer.conn.session()
    ssn.open()
    peer.exchange()
    assert peer.wire.disconnecting
    assert peer.conn.remote_condition is not None
    assert peer.conn.remote_condition.name == "amqp:internal-error"


def test_console_view_of_a_connection() -> None:
    """info() lists the links with role, address, settle modes and credit; close() ends it."""
    from proton import Link

    peer = ListenerPeer(idle=60.0)
    peer.conn.open()
    ssn = peer.conn.session()
    ssn.open()
    rcv = ssn.receiver("r1")
    rcv.source.address = "a/+"
    rcv.snd_settle_mode = Link.SND_SETTLED
    rcv.open()
    rcv.flow(7)
    snd = ssn.sender("client-9")
    snd.target.address = "$mqtt.willservice"
    snd.open()
    peer.exchange()
    info = peer.server.info()
    assert (info.protocol, info.client_id, info.keepalive) == ("amqp", "unit", 60)
    links = {link.name: link for link in info.links}
    assert links["r1"].role == "sender" and links["r1"].address == "a/+"
    assert links["r1"].snd_settle_mode == "settled" and links["r1"].credit == 7
    assert links["client-9"].role == "receiver"
    assert links["client-9"].address == "$mqtt.willservice"
    assert rcv.remote_snd_settle_mode == Link.SND_SETTLED    # reported truly in the attach
    peer.server.close("operator said so")
    peer.exchange(1)
    assert peer.wire.disconnecting
    assert peer.conn.remote_condition.name == "amqp:connection:forced"
    assert peer.broker.link_subscribers == {}


def test_session_decisions_of_an_fe_connection_are_bounded() -> None:
    """An FE deciding AMQP_LIST for many client ids over one connection: the
    remembered decisions stay within 4 x amqp_max_links, the oldest of clients without
    a .publish link going first, and a client with a link keeps its decision."""
    from types import SimpleNamespace

    from mqttamqp.amqp.services import SessionRequests

    host = SimpleNamespace(limits=Limits(amqp_max_links=10))
    requests = SessionRequests(host)  # type: ignore[arg-type]
    requests.outlets["keeper"] = SimpleNamespace(client_id="keeper")  # type: ignore[assignment]
    requests.decided("keeper", True)
    for i in range(1000):
        requests.decided(f"c{i}", i % 2 == 0)
    assert len(requests.clean) == 40
    assert requests.clean["keeper"] is True
    assert list(requests.clean)[-1] == "c999"
