"""The console's publish form and live tail over StubTreq against a real ``Broker`` on a
``task.Clock``: the form keeps what was typed after an error and a success; the tail
streams matching messages (escaped, bounded) and ends, and refuses bad filters and too
many tails."""

from __future__ import annotations

import re
from typing import Any

import console_support
import treq
from console_support import Client, sse_frames

from mqttamqp.core.message import Message


def _field(html: str, name: str) -> str:
    m = re.search(rf'<input name="{name}"[^>]* value="([^"]*)"', html)
    assert m is not None, name
    return m.group(1)


def test_publish_form_keeps_what_was_typed_after_an_error_and_a_success(env: Any) -> None:
    """The publish form keeps what was typed after an error and after a success, and says
    what happened."""
    _, _, _, client = env
    client.get("/publish")
    bad = client.post("/publish", topic="a/+/bad", payload="<keep> me", encoding="utf-8",
                      qos="2", retain="1")
    assert bad.code == 303
    page = client.get("/publish").text
    assert "invalid topic" in page
    assert _field(page, "topic") == "a/+/bad"
    assert "&lt;keep&gt; me</textarea>" in page
    assert re.search(r'<option selected>2</option>', page)
    assert 'name="retain" value="1" checked' in page
    client.post("/publish", topic="ok/topic", payload="0a0b", encoding="hex", qos="1")
    page = client.get("/publish").text
    assert "Published 2 byte(s) to ok/topic (QoS 1)." in page
    assert _field(page, "topic") == "ok/topic" and "0a0b</textarea>" in page
    assert '<option value="hex" selected>' in page and "checked" not in page


def _open_tail(client: Client, **params: str) -> tuple[Any, list[bytes], Any]:
    from urllib.parse import urlencode
    d = client.treq.get(console_support.BASE + "/api/tail?" + urlencode(params))
    client.treq.flush()
    response = console_support._result(d)
    chunks: list[bytes] = []
    done = treq.collect(response, chunks.append) if response.code == 200 else None
    client.treq.flush()
    return response, chunks, done


def test_tail_streams_matching_messages_escaped_bounded_and_ends(env: Any) -> None:
    """The live tail streams matching messages (text, JSON or bytes) escaped and bounded,
    and ends when the console stops it."""
    console, broker, clock, client = env
    evil = b'<script>window.__x=1</script>'
    broker.publish(Message("plant/old", b"retained", 0, True, "p", clock.seconds()))
    response, chunks, done = _open_tail(client, filter="plant/#", view="auto")
    assert response.code == 200
    broker.publish(Message("plant/a", evil, 0, False, "pub-1", clock.seconds()))
    broker.publish(Message("other/b", b"no", 0, False, "pub-1", clock.seconds()))
    broker.publish(Message("plant/j", b'{"t": 21}', 1, False, "pub-2", clock.seconds()))
    broker.publish(Message("plant/h", b"\x00\x01\xff", 0, False, None, clock.seconds()))
    client.treq.flush()
    frames = sse_frames(chunks)
    assert [e for e, _ in frames] == ["open", "message", "message", "message"]
    first = frames[1][1]
    assert (first["topic"], first["mode"], first["body"]) == ("plant/a", "text", evil.decode())
    raw = b"".join(chunks)
    assert b"<script>" not in raw           # JSON-escaped on the wire (\u003c)
    assert frames[2][1]["mode"] == "json" and frames[3][1]["mode"] == "hex"
    # Bounded: over the per-second rate, messages are skipped and reported.
    console.messages.tails.per_second = 2
    clock.advance(1)
    for _ in range(5):
        broker.publish(Message("plant/flood", b"x", 0, False, "p", clock.seconds()))
    clock.advance(1)
    client.treq.flush()
    frames = sse_frames(chunks)
    assert sum(1 for e, d in frames if e == "message" and d["topic"] == "plant/flood") == 2
    assert any(e == "tick" and d["skipped"] == 3 for e, d in frames)
    # Logging out ends the stream and the subscription.
    assert len(broker.link_subscribers) == 1
    client.post("/logout")
    clock.advance(1)
    client.treq.flush()
    assert sse_frames(chunks)[-1][0] == "logout" and done is not None and done.called
    assert not broker.link_subscribers and not console.messages.tails.tails


def test_tail_refuses_bad_filters_and_too_many(env: Any) -> None:
    """The tail refuses bad filters, shared groups, dynamic nodes and more tails than
    allowed; a closed browser frees its tail."""
    console, broker, _, client = env
    assert _open_tail(client, filter="a/#/b")[0].code == 400
    assert _open_tail(client, filter="a", view="pdf")[0].code == 400
    # (review finding) a tail never joins a shared group nor reads a dynamic node
    assert _open_tail(client, filter="$share/workers/jobs/#")[0].code == 403
    assert _open_tail(client, filter="$dynamic/+")[0].code == 403
    assert not broker.link_subscribers
    console.messages.tails.max_tails = 1
    response, _, _ = _open_tail(client, filter="x/#")
    assert response.code == 200
    assert _open_tail(client, filter="y/#")[0].code == 503
    tail = next(iter(console.messages.tails.tails.values()))
    tail.done.cancel()                     # the browser went away
    assert not console.messages.tails.tails and not broker.link_subscribers
