"""Webhooks (issue 14): events and messages POSTed as JSON, batched, signed, retried
with exponential back-off, through a bounded queue whose drops are counted.

The timing rules (batch delay, back-off) are tested with ``task.Clock`` and a fake
``post``; delivery, the signature, retries, TLS and a hanging endpoint against a real
twisted.web server on 127.0.0.1 port 0 (``hookserver``), with treq.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator
from typing import Any

import pytest
from hookserver import HANG, HookServer
from pki import Pki
from twisted.internet import ssl, task
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.selectreactor import SelectReactor

from mqttamqp.core.recorder import CONNECT, DISCONNECT, SUBSCRIBE, NoRecorder
from mqttamqp.ops.config import TableKeyError
from mqttamqp.ops.recorders import FanOutRecorder, fan_out
from mqttamqp.ops.webhooks import HookSettings, WebhookRecorder, signature

pytestmark = pytest.mark.timeout(60)


class FakePost:
    """Records every POST; answers with ``answers`` (a status, an exception, or None
    for a Deferred the test fires), then 200."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, dict[str, str], float, float]] = []
        self.answers: list[Any] = []
        self.pending: list[Deferred[int]] = []
        self.clock: task.Clock | None = None

    def __call__(self, url: str, body: bytes, headers: dict[str, str],
                 timeout: float) -> Deferred[int]:
        now = self.clock.seconds() if self.clock is not None else 0.0
        self.calls.append((url, body, headers, timeout, now))
        answer = self.answers.pop(0) if self.answers else 200
        if answer is None:
            d: Deferred[int] = Deferred()
            self.pending.append(d)
            return d
        if isinstance(answer, Exception):
            return fail(answer)
        return succeed(answer)

    def events(self, n: int) -> list[dict[str, Any]]:
        import json

        events: list[dict[str, Any]] = json.loads(self.calls[n][1])["events"]
        return events


def hook(**table: Any) -> HookSettings:
    return HookSettings.from_table({"url": "http://127.0.0.1:9/hook", **table})


def make(*hooks: HookSettings) -> tuple[WebhookRecorder, FakePost, task.Clock]:
    clock = task.Clock()
    post = FakePost()
    post.clock = clock
    return WebhookRecorder(clock, hooks, post_factory=lambda s: post), post, clock


def connect(recorder: Any, n: int, clock: task.Clock) -> None:
    for i in range(n):
        recorder.event(clock.seconds(), CONNECT, f"c{i}", protocol="mqtt", address="a")


# -- timing and queue rules (task.Clock, fake post) ---------------------------------


def test_a_batch_goes_when_full_or_after_max_delay() -> None:
    """A batch is POSTed when it is full or when its oldest event is max-delay old,
    whichever comes first."""
    recorder, post, clock = make(hook(**{"max-batch": 3, "max-delay": 2.0}))
    connect(recorder, 2, clock)
    clock.advance(1.9)
    assert post.calls == []
    clock.advance(0.1)
    assert [e["client"] for e in post.events(0)] == ["c0", "c1"]
    connect(recorder, 7, clock)         # two full batches at once, one left waiting
    clock.advance(0)
    assert [len(post.events(i)) for i in range(1, len(post.calls))] == [3, 3]
    clock.advance(2.0)
    assert len(post.events(3)) == 1
    assert recorder.counts() == {"dropped": 0, "failed": 0, "delivered": 9}


def test_retries_back_off_exponentially_then_count_the_batch_failed() -> None:
    """Failed POSTs are retried with doubling waits capped at max-backoff, then the batch
    counts as failed and the next goes as usual."""
    recorder, post, clock = make(hook(**{"max-delay": 0.0, "retries": 3, "backoff": 1.0,
                                         "max-backoff": 3.0}))
    post.answers = [503, ConnectionRefusedError(), 500, 502]
    connect(recorder, 1, clock)
    clock.pump([0.0] + [0.5] * 20)
    times = [call[4] for call in post.calls]
    assert times == [0.0, 1.0, 3.0, 6.0]      # waits 1, 2, then 4 capped at 3
    assert recorder.counts()["failed"] == 1
    connect(recorder, 1, clock)               # the next batch is sent as usual
    clock.advance(0)
    assert len(post.calls) == 5 and recorder.counts()["delivered"] == 1


def test_a_full_queue_drops_and_counts_while_a_request_hangs() -> None:
    """While a request hangs, events beyond the bounded queue are dropped and counted; they
    drain once it answers."""
    recorder, post, clock = make(hook(**{"max-batch": 2, "queue": 5, "max-delay": 1.0}))
    post.answers = [None]
    connect(recorder, 2, clock)
    clock.advance(0)                          # the first batch is in flight, unanswered
    connect(recorder, 8, clock)
    assert recorder.counts()["dropped"] == 3  # 5 queued behind it, 3 dropped
    assert recorder.stats()["webhooks/dropped"] == 3
    assert recorder.dropped == 3
    post.pending[0].callback(200)
    clock.advance(0)
    clock.advance(0)
    assert recorder.counts()["delivered"] == 2 + 4 and len(recorder.senders[0].queue) == 1


def test_the_signature_is_hex_hmac_sha256_of_the_body() -> None:
    """The signature header is the hex HMAC-SHA256 of the body with the hook's secret; the
    body is JSON."""
    recorder, post, clock = make(hook(secret="s3cret", **{"max-delay": 0.0}))
    connect(recorder, 1, clock)
    clock.advance(0)
    _, body, headers, _, _ = post.calls[0]
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers["X-Mqttamqp-Signature"] == expected == signature("s3cret", body)
    assert headers["Content-Type"] == "application/json"


def test_messages_only_for_hooks_that_ask_and_only_on_their_filters() -> None:
    """Messages go only to hooks that ask for them and only on their topic filters, payload
    base64-encoded."""
    events_only = hook()
    messages = hook(events=["message"], topics=["sensors/+/temp", "alarms/#"], payload=True,
                    **{"max-delay": 0.0})
    recorder, post, clock = make(events_only, messages)
    for topic in ("sensors/1/temp", "sensors/1/hum", "alarms", "$SYS/broker/uptime"):
        recorder.message(1.0, topic, 1, False, b"\x00hi", "pub", None, "mqtt", 1, 0)
    clock.advance(0)
    got = post.events(0)
    assert [e["topic"] for e in got] == ["sensors/1/temp", "alarms"]
    assert base64.b64decode(got[0]["payload"]) == b"\x00hi"
    assert got[0]["kind"] == "message" and got[0]["publisher"] == "pub"
    assert len(recorder.senders[0].queue) == 0  # the events-only hook got none


def test_no_hook_wanting_messages_does_nothing_per_message() -> None:
    """Without a hook that wants messages the recorder records none, and kinds a hook did
    not ask for are not queued."""
    recorder, _post, _clock = make(hook(events=["connect"]))
    assert not recorder.records_messages
    recorder.message(1.0, "a", 0, False, b"", None, None, None, 1, 0)
    recorder.event(1.0, DISCONNECT, "c")      # a kind it did not ask for
    assert [len(s.queue) for s in recorder.senders] == [0]


def test_configure_keeps_an_unchanged_hook_and_its_queue() -> None:
    """Reconfiguring keeps an unchanged hook with its queue and adds the new ones."""
    same = hook(**{"max-delay": 5.0})
    recorder, _post, clock = make(same, hook(events=["subscribe"]))
    connect(recorder, 2, clock)
    kept = recorder.senders[0]
    recorder.configure([same, hook(url="http://127.0.0.1:9/other")])
    assert recorder.senders[0] is kept and len(kept.queue) == 2
    recorder.event(1.0, SUBSCRIBE, "c", topic="a/#", qos=1)
    assert len(recorder.senders[1].queue) == 1   # the new one takes every kind


def test_fan_out_gives_every_call_to_each_recorder_and_merges_stats() -> None:
    """fan_out passes every call to each recorder, drops the missing ones and merges their
    stats."""
    one, _post_one, clock = make(hook(**{"max-delay": 0.0}))
    two, _post_two, _ = make(hook(events=["message"], **{"max-delay": 0.0}))
    two.clock = clock
    both = fan_out(one, None, two)
    assert isinstance(both, FanOutRecorder)
    assert fan_out(None, one) is one and isinstance(fan_out(), NoRecorder)
    both.event(1.0, CONNECT, "c")
    both.message(1.0, "t", 0, False, b"", None, None, None, 0, 0)
    assert len(one.senders[0].queue) == 1 and len(two.senders[0].queue) == 1
    assert set(both.stats()) == {"webhooks/dropped", "webhooks/failed", "webhooks/delivered"}


def test_fan_out_calls_only_the_recorder_that_takes_messages_until_a_reload() -> None:
    """With the default hooks (no messages) the archive's ``message`` is the fan-out's
    own: one call a message. A reload that adds a hook on messages changes that at
    once, through every fan-out above the hooks."""
    archived: list[str] = []

    class Archive:
        records_messages = True

        def message(self, timestamp: float, topic: str, *rest: Any) -> None:
            archived.append(topic)

        def event(self, *args: Any, **fields: object) -> None:
            pass

        def fields_event(self, *args: Any) -> None:
            pass

        def stats(self) -> dict[str, int]:
            return {}

    archive = Archive()
    hooks, _post, _clock = make(hook())
    quiet, _, _ = make()
    both = fan_out(archive, hooks, quiet)   # (archive, hooks) inside a second fan-out
    assert isinstance(both, FanOutRecorder)
    assert both.records_messages and both.message == archive.message
    hooks.configure([hook(events=["message"], **{"max-delay": 0.0})])
    assert both.records_messages
    both.message(1.0, "t", 0, False, b"", None, None, None, 0, 0)
    assert archived == ["t"] and len(hooks.senders[0].queue) == 1
    hooks.configure([hook()])
    assert both.records_messages and both.message == archive.message
    only_hooks = fan_out(make()[0], hooks)
    assert not only_hooks.records_messages
    hooks.configure([hook(events=["message"])])
    assert only_hooks.records_messages and only_hooks.message == hooks.message


def test_fan_out_gives_events_only_to_recorders_that_take_them_until_a_reload() -> None:
    """Webhooks with no hook on events (none configured, the default) are not called
    per event: the archive's ``event`` is the fan-out's own, as for messages, and a
    reload that adds an event hook gives it every event from then on."""
    recorded: list[str] = []

    class Archive:
        records_messages = True

        def message(self, *rest: Any) -> None:
            pass

        def event(self, timestamp: float, kind: str, client_id: str | None,
                  **fields: object) -> None:
            recorded.append(kind)

        def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                         names: tuple[str, ...], values: tuple[object, ...]) -> None:
            recorded.append(kind)

        def stats(self) -> dict[str, int]:
            return {}

    archive = Archive()
    hooks, _post, _clock = make()
    both = fan_out(archive, hooks)
    assert isinstance(both, FanOutRecorder)
    assert both.records_events and both.event == archive.event
    assert both.fields_event == archive.fields_event
    hooks.configure([hook(events=["connect"], **{"max-delay": 0.0})])
    both.event(1.0, CONNECT, "c", address="127.0.0.1:1")
    assert recorded == [CONNECT] and len(hooks.senders[0].queue) == 1
    # (the positional form: the same item for the hooks as the keywords made)
    both.fields_event(1.0, CONNECT, "c", ("address",), ("127.0.0.1:1",))
    queued = list(hooks.senders[0].queue)
    assert recorded == [CONNECT] * 2 and len(queued) == 2 and queued[0] == queued[1]
    hooks.configure([])
    assert both.event == archive.event and both.fields_event == archive.fields_event
    none = fan_out(make()[0], make()[0])
    assert isinstance(none, FanOutRecorder) and not none.records_events
    none.event(1.0, CONNECT, "c")     # (taken by neither, and no error)
    none.fields_event(1.0, CONNECT, "c", (), ())


@pytest.mark.parametrize(("table", "key"), [
    ({"url": "ftp://x/"}, "url"),
    ({"url": "http://x/", "events": ["conect"]}, "events"),
    ({"url": "http://x/", "topics": ["a/#/b"]}, "topics"),
    ({"url": "http://x/", "retries": "3"}, "retries"),
    ({"url": "http://x/", "max-batch": 0}, "max-batch"),
    ({"url": "http://x/", "colour": "red"}, "colour"),
    ({"events": ["connect"]}, "url"),
    ({"url": "https://x/", "tls-ca": "/nonexistent.pem"}, "tls-ca"),
])
def test_a_bad_hook_table_names_its_key(table: dict[str, Any], key: str) -> None:
    """A bad [[webhook]] table is refused with the name of the key at fault."""
    with pytest.raises(TableKeyError) as e:
        HookSettings.from_table(table)
    assert e.value.key == key


def test_settings_round_trip_through_their_table() -> None:
    """Hook settings written as a table read back the same."""
    settings = hook(events=["message", "connect"], topics=["a/+"], secret="x", payload=True,
                    retries=0, **{"tls-verify": False, "max-backoff": 2.5})
    assert HookSettings.from_table(settings.as_table()) == settings


# -- against a real HTTP server (twisted.web, treq) -----------------------------------


@pytest.fixture
def endpoint() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.close()


def real(server: HookServer, *hooks: HookSettings) -> WebhookRecorder:
    return server.call(WebhookRecorder, server.reactor, hooks, server.post_factory)


def test_events_arrive_batched_and_signed(endpoint: HookServer) -> None:
    """A real HTTP endpoint on loopback gets the events in order, in batches of max-batch,
    each signed."""
    settings = HookSettings.from_table({"url": endpoint.url, "secret": "k", "max-batch": 5,
                                        "max-delay": 0.2})
    recorder = real(endpoint, settings)
    endpoint.call(connect, recorder, 12, endpoint.reactor)
    got = [endpoint.next_request() for _ in range(3)]
    assert [len(r.events()) for r in got] == [5, 5, 2]
    assert [e["client"] for r in got for e in r.events()] == [f"c{i}" for i in range(12)]
    for r in got:
        assert r.headers["x-mqttamqp-signature"] == signature("k", r.body)
        assert r.path == "/hook"
    endpoint.call(recorder.close)


def test_a_failing_endpoint_is_retried_until_it_answers(endpoint: HookServer) -> None:
    """An endpoint answering 500 and 503 gets the same batch again until it answers 200."""
    endpoint.answers = [500, 503]
    settings = HookSettings.from_table({"url": endpoint.url, "max-delay": 0.0,
                                        "backoff": 0.05, "retries": 3})
    recorder = real(endpoint, settings)
    endpoint.call(connect, recorder, 1, endpoint.reactor)
    assert [endpoint.next_outcome() for _ in range(3)] == [500, 503, 200]
    bodies = {endpoint.next_request().body for _ in range(3)}
    assert len(bodies) == 1                     # the same batch each time
    assert endpoint.call(recorder.counts) == {"dropped": 0, "failed": 0, "delivered": 1}
    endpoint.call(recorder.close)


def test_a_hanging_endpoint_costs_the_bounded_queue_and_drops_are_counted(
        endpoint: HookServer) -> None:
    """A hanging endpoint costs only the bounded queue (drops counted); after its time-out
    the queue drains."""
    endpoint.answers = [HANG]
    settings = HookSettings.from_table({"url": endpoint.url, "max-delay": 0.0,
                                        "max-batch": 10, "queue": 50, "retries": 0,
                                        "timeout": 0.5})
    recorder = real(endpoint, settings)
    endpoint.call(connect, recorder, 10, endpoint.reactor)
    endpoint.next_request()                     # the first batch hangs there
    endpoint.call(connect, recorder, 200, endpoint.reactor)
    counts = endpoint.call(recorder.counts)
    assert counts["dropped"] == 150 and len(recorder.senders[0].queue) == 50
    assert endpoint.next_outcome() == "no answer within 0.5 s"
    # The hung batch is given up (retries = 0); the queue then drains to the server.
    for _ in range(5):
        assert endpoint.next_outcome() == 200
    counts = endpoint.call(recorder.counts)
    assert counts == {"dropped": 150, "failed": 10, "delivered": 50}
    endpoint.call(recorder.close)


def test_https_verifies_the_server_against_the_hooks_ca(
        pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """With its tls-ca a hook trusts the server, without it (the platform's CAs) it
    does not and sends nothing; tls-verify = false sends anyway."""
    from twisted.protocols import tls as twisted_tls

    from mqttamqp.net import tls

    key = ssl.PrivateCertificate.loadPEM(open(pki.server_key).read()
                                         + open(pki.server_crt).read())
    # Twisted's TLS layer schedules its writes on the global reactor unless given a
    # clock, and Agent and listenSSL give none: here that reactor never runs, so they
    # get the server's (in the broker it is the global one anyway).
    reactor = SelectReactor()
    monkeypatch.setattr(twisted_tls, "_get_default_clock", lambda: reactor)
    server = HookServer(tls=key.options(), reactor=reactor)
    try:
        trusted = HookSettings.from_table({"url": server.url, "tls-ca": pki.ca,
                                           "max-delay": 0.0, "retries": 0})
        assert [c.to_cryptography() for c in trusted.ca_certificates] == [
            c.to_cryptography() for c in tls.load_ca_bundle(pki.ca)]
        untrusted = HookSettings.from_table({"url": server.url, "max-delay": 0.0,
                                             "retries": 0})
        unchecked = HookSettings.from_table({"url": server.url, "max-delay": 0.0,
                                             "retries": 0, "tls-verify": False})
        for settings, expected in ((trusted, 200), (unchecked, 200)):
            recorder = real(server, settings)
            server.call(connect, recorder, 1, server.reactor)
            assert server.next_outcome() == expected
            server.call(recorder.close)
        recorder = real(server, untrusted)
        server.call(connect, recorder, 1, server.reactor)
        assert server.next_outcome() != 200     # the platform's CAs do not know it
        assert server.call(recorder.counts)["failed"] == 1
        server.call(recorder.close)
        assert server.requests.qsize() == 2     # only the verified and unchecked ones
    finally:
        server.close()


def test_the_per_topic_memory_is_bounded_and_forgotten_on_reconfigure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-topic filter memory is bounded and forgotten when the hooks are
    reconfigured."""
    import mqttamqp.ops.webhooks as webhooks

    monkeypatch.setattr(webhooks, "TOPIC_CACHE", 3)
    recorder, _post, _clock = make(hook(events=["message"], topics=["a/#"]))
    for i in range(10):
        recorder.message(1.0, f"a/{i}", 0, False, b"", None, None, None, 1, 0)
        assert len(recorder._by_topic) <= 3
    assert len(recorder.senders[0].queue) == 10
    recorder.configure([hook(events=["message"], topics=["b/#"])])
    recorder.message(1.0, "a/9", 0, False, b"", None, None, None, 1, 0)  # was remembered
    recorder.message(1.0, "b/1", 0, False, b"", None, None, None, 1, 0)
    assert [item[2] for item in recorder.senders[0].queue] == ["b/1"]
