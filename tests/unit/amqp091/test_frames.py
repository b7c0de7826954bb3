"""The 0.9.1 frame reader and content assembly (pure, no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from mqttamqp.amqp091.frames import (
    FRAME_ERROR,
    UNEXPECTED_FRAME,
    BodyTooLarge,
    ContentAssembler,
    FrameError,
    FrameReader,
    content_frames,
    method_frame,
)


def publish_bytes(body: bytes, channel: int = 1, frame_max: int = 4096) -> bytes:
    props = commands.Basic.Properties(content_type="text/plain", delivery_mode=2)
    return (method_frame(channel, commands.Basic.Publish(exchange="", routing_key="q"))
            + frame.marshal(ContentHeader(0, len(body), props), channel)
            + b"".join(frame.marshal(ContentBody(body[i:i + frame_max - 8]), channel)
                       for i in range(0, len(body), frame_max - 8)))


def assemble(frames: list[tuple[int, object]], max_body: int = 1 << 20) -> list[object]:
    assembler = ContentAssembler(max_body)
    done = []
    for _, f in frames:
        name = getattr(f, "name", "")
        if name == "Basic.Publish":
            assembler.start(f)
        elif name == "ContentHeader":
            content = assembler.header(f)  # type: ignore[arg-type]
            if content is not None:
                done.append(content)
        else:
            content = assembler.body(f)  # type: ignore[arg-type]
            if content is not None:
                done.append(content)
    return done


def test_a_publish_with_content_round_trips() -> None:
    """Publish, header and body frames read back as one content with its properties."""
    data = publish_bytes(b"x" * 10000)
    frames = FrameReader(131072).feed(data)
    [content] = assemble(frames)
    assert content.body == b"x" * 10000  # type: ignore[attr-defined]
    assert content.properties.content_type == "text/plain"  # type: ignore[attr-defined]


def test_byte_at_a_time_gives_the_same_frames() -> None:
    """Feeding one byte at a time yields the same frames as one read."""
    data = publish_bytes(b"hello")
    reader = FrameReader(131072)
    frames = [f for i in range(len(data)) for f in reader.feed(data[i:i + 1])]
    assert [getattr(f, "name", "") for _, f in frames] == [
        "Basic.Publish", "ContentHeader", "ContentBody"]


def test_a_frame_over_frame_max_is_a_frame_error() -> None:
    """A frame larger than the negotiated frame_max is refused with 501."""
    data = frame.marshal(ContentBody(b"y" * 5000), 1)
    with pytest.raises(FrameError) as info:
        FrameReader(4096).feed(data)
    assert info.value.code == FRAME_ERROR


def test_a_bad_frame_end_is_a_frame_error() -> None:
    """A frame whose last octet is not 0xCE is refused with 501."""
    data = bytearray(method_frame(1, commands.Channel.Open()))
    data[-1] = 0
    with pytest.raises(FrameError) as info:
        FrameReader(4096).feed(bytes(data))
    assert info.value.code == FRAME_ERROR


def test_a_body_over_the_bound_is_refused() -> None:
    """A content header announcing more than the bound is refused before the body
    (``BodyTooLarge``: the connection makes it a 406 channel error)."""
    frames = FrameReader(131072).feed(publish_bytes(b"z" * 100))
    with pytest.raises(BodyTooLarge) as info:
        assemble(frames, max_body=10)
    assert (info.value.size, info.value.bound) == (100, 10)


def test_a_body_without_a_header_is_unexpected() -> None:
    """Content without its method is 505 unexpected-frame."""
    assembler = ContentAssembler(100)
    with pytest.raises(FrameError) as info:
        assembler.body(ContentBody(b"x"))
    assert info.value.code == UNEXPECTED_FRAME


def test_content_frames_are_cut_to_frame_max() -> None:
    """A delivery's body is cut into frames no larger than frame_max."""
    props = commands.Basic.Properties(content_type="a/b").marshal()
    data = content_frames(1, commands.Basic.Deliver("t", 1, False, "", "q"), props,
                          b"b" * 9000, 4096)
    frames = FrameReader(4096).feed(data)
    bodies = [f for _, f in frames if getattr(f, "name", "") == "ContentBody"]
    assert b"".join(b.value for b in bodies) == b"b" * 9000  # type: ignore[attr-defined]
    assert len(bodies) == 3


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 65535), st.integers(0, 9000), st.sampled_from([4096, 4200, 131072]),
       st.text(max_size=40))
def test_content_frames_are_what_pamqp_marshals(channel: int, size: int, frame_max: int,
                                                 content_type: str) -> None:
    """A delivery's frames (one body frame, several, or none) equal pamqp's marshalling
    of the method, the content header and the body cut to frame_max."""
    props = commands.Basic.Properties(content_type=content_type or None, delivery_mode=2)
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    method = commands.Basic.Deliver("t", 7, False, "", "q")
    expected = frame.marshal(method, channel) + frame.marshal(
        ContentHeader(0, size, props), channel)
    for start in range(0, size, frame_max - 8):
        expected += frame.marshal(ContentBody(body[start:start + frame_max - 8]), channel)
    assert content_frames(channel, method, props.marshal(), body, frame_max) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_raise_frame_error(data: bytes) -> None:
    """Any bytes either decode to frames or raise FrameError, never another error."""
    try:
        FrameReader(4096).feed(data)
    except FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=4, max_size=60))
def test_random_method_payloads_raise_only_frame_error(payload: bytes) -> None:
    """A method frame with a random payload decodes or raises FrameError."""
    data = b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    try:
        FrameReader(4096).feed(data)
    except FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 65535), st.text(max_size=60), st.integers(0, 2 ** 63 - 1),
       st.booleans(), st.from_regex(r"[a-zA-Z0-9_.:-]{0,60}", fullmatch=True),
       st.text(max_size=60))
def test_deliver_frame_is_what_pamqp_marshals(channel: int, ctag: str, tag: int,
                                              redelivered: bool, exchange: str,
                                              key: str) -> None:
    """The cached basic.deliver frame equals pamqp's own marshalling, for any values."""
    from mqttamqp.amqp091.frames import deliver_frame

    expected = frame.marshal(commands.Basic.Deliver(ctag, tag, redelivered, exchange, key),
                             channel)
    assert deliver_frame(channel, ctag, tag, redelivered, exchange, key) == expected
    assert deliver_frame(channel, ctag, tag, redelivered, exchange, key) == expected


def test_a_name_outside_the_specs_domain_is_a_syntax_error() -> None:
    """An exchange name the spec's domain does not allow (it could never be sent back
    in a deliver) is refused as the frame is read (502)."""
    from mqttamqp.amqp091.frames import SYNTAX_ERROR

    data = frame.marshal(commands.Exchange.Declare(exchange="not_ok"), 1)
    with pytest.raises(FrameError) as info:
        FrameReader(4096).feed(data.replace(b"not_ok", b"not*ok"))
    assert info.value.code == SYNTAX_ERROR


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40), st.booleans(), st.integers(0, 1 << 40),
       st.sampled_from([None, "text/plain"]), st.sampled_from([None, 1, 2]),
       st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3))
def test_a_repeated_publish_decodes_as_pamqp_decodes_it(
        key: str, mandatory: bool, size: int, content_type: str | None,
        mode: int | None, headers: dict[str, str]) -> None:
    """The second basic.publish and content header with the same bytes (served from
    the decode cache) decode to what pamqp decodes them to, body size included."""
    props = commands.Basic.Properties(content_type=content_type, delivery_mode=mode,
                                      headers=headers or None)
    data = (method_frame(1, commands.Basic.Publish(exchange="amq.topic", routing_key=key,
                                                   mandatory=mandatory))
            + frame.marshal(ContentHeader(0, 7, props), 1)
            + frame.marshal(ContentHeader(0, size, props), 1))
    first = [f for _, f in FrameReader(1 << 20).feed(data)]
    again = [f for _, f in FrameReader(1 << 20).feed(data)]
    for decoded in (first, again):
        publish, header7, header = decoded
        assert (publish.name, publish.exchange, publish.routing_key, publish.mandatory) == (
            "Basic.Publish", "amq.topic", key, mandatory)
        assert (header7.name, header7.class_id, header7.body_size) == ("ContentHeader", 60, 7)
        assert (header.body_size, header.weight) == (size, 0)
        assert header.properties.marshal() == props.marshal()
        assert header.raw == header7.raw


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-zA-Z0-9_.:-]{0,60}", fullmatch=True), st.text(max_size=60),
       st.binary(max_size=1200))
def test_an_envelope_opens_to_what_was_published(exchange: str, key: str, raw: bytes) -> None:
    """A publish's envelope (memoized or not) gives back its exchange, routing key and
    property bytes, the first time and again."""
    from mqttamqp.amqp091.properties import envelope, opened, sent_with
    from mqttamqp.core.message import Message

    for _ in range(2):
        data = envelope(exchange, key, raw)
        assert opened(data) == (exchange, key, raw)
        assert sent_with(Message("t", b"", 1, False, "p", 0.0, amqp091=data)) == (exchange, key)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 65535), st.text(max_size=60), st.integers(0, 2 ** 63 - 1),
       st.booleans(), st.from_regex(r"[a-zA-Z0-9_.:-]{0,60}", fullmatch=True),
       st.text(max_size=60), st.integers(0, 9000), st.sampled_from([4096, 4200, 131072]),
       st.text(max_size=20))
def test_deliver_frames_are_what_pamqp_marshals(channel: int, ctag: str, tag: int,
                                                redelivered: bool, exchange: str, key: str,
                                                size: int, frame_max: int,
                                                content_type: str) -> None:
    """A whole delivery built from the cached prefix (deliver_frames) equals pamqp's
    basic.deliver, content header and body frames cut to frame_max, for any values."""
    from pamqp import body, header

    from mqttamqp.amqp091.frames import deliver_frames

    props = commands.Basic.Properties(content_type=content_type or None)
    payload = bytes(i % 251 for i in range(size))
    expected = [frame.marshal(commands.Basic.Deliver(ctag, tag, redelivered, exchange, key),
                              channel),
                frame.marshal(header.ContentHeader(0, size, props), channel)]
    room = frame_max - 8
    expected += [frame.marshal(body.ContentBody(payload[at:at + room]), channel)
                 for at in range(0, size, room)]
    for _ in range(2):   # (the prefix made, then found in the cache)
        assert deliver_frames(channel, ctag, tag, redelivered, exchange, key,
                              props.marshal(), payload, frame_max) == b"".join(expected)
