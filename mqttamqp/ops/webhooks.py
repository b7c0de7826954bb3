"""Webhooks: the broker's events and messages POSTed as JSON to configured URLs.

What it owns: a hook's settings (``HookSettings``, from a ``[[webhook]]`` table or a
``--webhook URL``), one ``HookSender`` per hook (a bounded queue, batching, a timeout,
retries with exponential back-off, an HMAC-SHA256 signature) and ``WebhookRecorder``,
which implements the core's recorder contract and hands each call to the hooks that
want it.

What it must not do: make the reactor wait on a hook, or cost the hot path more than
an attribute test when no hook wants messages.  ``message()`` matches the topic
against one trie of every hook's filters (``core.topics``), remembering the answer
per topic (bounded), and appends a tuple; the JSON is built when a batch is sent.
A hook that is slow or down costs its bounded queue and nothing else: beyond it,
events are dropped and counted (``dropped``), and a batch that fails every retry is
counted too (``failed``).  Queued events are not durable: a restart loses them.

The body of each POST is ``{"events": [...]}``; every event has ``kind``, ``time``
(Unix seconds) and ``client`` plus the fields of its kind (``mqttamqp.events``); a
``message`` event has ``topic``, ``qos``, ``retain``, ``publisher``, ``user``,
``protocol``, ``deliveries``, ``dropped`` and, with ``payload = true``, ``payload``
(base64).  With a ``secret`` the header ``X-Mqttamqp-Signature`` holds the hex
HMAC-SHA256 of the body under it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IBodyProducer, IPolicyForHTTPS
from zope.interface import implementer  # type: ignore[import-untyped]

from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.topics import SubscriptionTrie, validate_topic_filter
from mqttamqp.events import EVENT_KINDS
from mqttamqp.ops.config import TableKeyError, as_table, table_values

__all__ = ["MESSAGE", "HookSettings", "HookSender", "WebhookRecorder", "signature",
           "treq_post"]

MESSAGE = "message"                       # the kind of a routed message's event
KINDS = EVENT_KINDS | {MESSAGE}
SIGNATURE_HEADER = "X-Mqttamqp-Signature"
TOPIC_CACHE = 10_000     # topics whose matching hooks are remembered

# Post(url, body, headers, timeout) -> Deferred firing with the HTTP status code.
Post = Callable[[str, bytes, dict[str, str], float], "Deferred[int]"]


@dataclass(frozen=True)
class HookSettings:
    """One hook.  Field names are the TOML keys with '_' for '-'."""

    url: str
    events: tuple[str, ...] = tuple(sorted(EVENT_KINDS))
    topics: tuple[str, ...] = ("#",)
    payload: bool = False
    max_batch: int = 100
    max_delay: float = 1.0
    timeout: float = 10.0
    retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 60.0
    queue: int = 10_000
    secret: str | None = None
    tls_verify: bool = True
    tls_ca: str | None = None
    # The CA file's certificates, read when the settings are parsed (never on the
    # reactor thread); not a setting of its own.
    ca_certificates: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    @property
    def wants_messages(self) -> bool:
        return MESSAGE in self.events

    @classmethod
    def from_url(cls, url: str) -> HookSettings:
        """A hook with every default (``--webhook URL``)."""
        return cls.from_table({"url": url})

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> HookSettings:
        """From a ``[[webhook]]`` table; ``TableKeyError`` naming the bad key."""
        values = table_values(cls, table, "ca_certificates",
                              lambda k, f, v: _check(k, f.type, v))
        if "url" not in values:
            raise TableKeyError("url", "missing (every webhook needs a url)")
        settings = cls(**values)
        settings._validate()
        if settings.tls_ca is not None:
            from mqttamqp.net import tls

            try:
                certificates = tuple(tls.load_ca_bundle(settings.tls_ca))
            except ValueError as e:
                raise TableKeyError("tls-ca", str(e)) from None
            object.__setattr__(settings, "ca_certificates", certificates)
        return settings

    def _validate(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TableKeyError("url", f"{self.url!r} is not an http:// or https:// URL")
        for kind in self.events:
            if kind not in KINDS:
                raise TableKeyError("events", f"{kind!r} is not one of "
                                              + ", ".join(sorted(KINDS)))
        for topic_filter in self.topics:
            problem = validate_topic_filter(topic_filter)
            if problem is not None:
                raise TableKeyError("topics", f"{topic_filter!r}: {problem}")
        for name in ("max_batch", "queue"):
            if getattr(self, name) < 1:
                raise TableKeyError(name.replace("_", "-"), "must be at least 1")
        for name in ("max_delay", "timeout", "retries", "backoff", "max_backoff"):
            if getattr(self, name) < 0:
                raise TableKeyError(name.replace("_", "-"), "must not be negative")
        if self.timeout == 0:
            raise TableKeyError("timeout", "must be more than 0 seconds")

    def as_table(self) -> dict[str, Any]:
        """The TOML table ``from_table`` reads back to these settings."""
        return as_table(self, "ca_certificates")


def _check(key: str, kind: Any, value: Any) -> Any:
    """``value`` as the field's type, or ``TableKeyError``."""
    kind = str(kind)
    if "tuple" in kind:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TableKeyError(key, "must be a list of strings")
        return tuple(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise TableKeyError(key, "must be true or false")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TableKeyError(key, "must be an integer")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TableKeyError(key, "must be a number")
        return float(value)
    if not isinstance(value, str):
        raise TableKeyError(key, "must be a string")
    return value


def signature(secret: str, body: bytes) -> str:
    """The ``X-Mqttamqp-Signature`` of ``body``: hex HMAC-SHA256 under ``secret``."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def encode(batch: Sequence[tuple[Any, ...]], with_payload: bool) -> bytes:
    """The JSON body for queued items (built here, off the hot path)."""
    events: list[dict[str, Any]] = []
    for item in batch:
        if item[0] == MESSAGE:
            (_, time, topic, qos, retain, payload, publisher, user, protocol,
             deliveries, dropped) = item
            event: dict[str, Any] = {
                "kind": MESSAGE, "time": time, "client": publisher, "topic": topic,
                "qos": qos, "retain": retain, "publisher": publisher, "user": user,
                "protocol": protocol, "deliveries": deliveries, "dropped": dropped}
            if with_payload:
                event["payload"] = base64.b64encode(payload).decode("ascii")
        else:
            kind, time, client, extra = item
            event = {"kind": kind, "time": time, "client": client, **extra}
        events.append(event)
    return json.dumps({"events": events}, default=str, separators=(",", ":")).encode()


class HookSender:
    """One hook's queue and delivery: at most one request in flight, in order.

    States: idle (nothing queued), waiting (a batch timer of ``max_delay`` runs, or
    a full batch is due), sending (a request in flight), backing off (a timer before
    the next attempt of the same batch).  What arrives meanwhile waits in the queue.
    """

    log = Logger()

    def __init__(self, settings: HookSettings, clock: Any, post: Post,
                 limiter: LogLimiter) -> None:
        self.settings = settings
        self.clock = clock
        self.post = post
        self.limiter = limiter
        self.queue: deque[tuple[Any, ...]] = deque()
        self.dropped = 0      # not queued: the queue was full
        self.failed = 0       # queued, but every attempt to deliver them failed
        self.delivered = 0
        self._timer: Any = None
        self._due: float | None = None
        self._busy = False
        self._inflight: Deferred[int] | None = None
        self._closed = False

    def add(self, item: tuple[Any, ...]) -> None:
        queue = self.queue
        if len(queue) >= self.settings.queue:
            self.dropped += 1
            return
        queue.append(item)
        if self._busy:
            return
        if len(queue) >= self.settings.max_batch:
            self._schedule(0.0)
        elif self._timer is None:
            self._schedule(self.settings.max_delay)

    def _schedule(self, delay: float) -> None:
        due = self.clock.seconds() + delay
        if self._timer is not None:
            if self._due is not None and self._due <= due:
                return
            self._timer.cancel()
        self._due = due
        self._timer = self.clock.callLater(delay, self._flush)

    def _flush(self) -> None:
        self._timer = self._due = None
        if self._busy or self._closed or not self.queue:
            return
        take = min(len(self.queue), self.settings.max_batch)
        batch = [self.queue.popleft() for _ in range(take)]
        body = encode(batch, self.settings.payload)
        headers = {"Content-Type": "application/json"}
        if self.settings.secret is not None:
            headers[SIGNATURE_HEADER] = signature(self.settings.secret, body)
        self._busy = True
        self._attempt(body, headers, take, 0)

    def _attempt(self, body: bytes, headers: dict[str, str], count: int, tries: int) -> None:
        self._timer = self._due = None
        if self._closed:
            return
        d = self.post(self.settings.url, body, headers, self.settings.timeout)
        self._inflight = d
        d.addCallbacks(self._answered, self._not_delivered,
                       callbackArgs=(body, headers, count, tries),
                       errbackArgs=(body, headers, count, tries))

    def _answered(self, code: int, body: bytes, headers: dict[str, str], count: int,
                  tries: int) -> None:
        self._inflight = None
        if 200 <= code < 300:
            self.delivered += count
            self._done()
        else:
            self._retry(f"HTTP status {code}", body, headers, count, tries)

    def _not_delivered(self, failure: Failure, body: bytes, headers: dict[str, str],
                       count: int, tries: int) -> None:
        self._inflight = None
        if self._closed:
            return
        reason = failure.getErrorMessage() or failure.type.__name__  # type: ignore[union-attr]
        self._retry(reason, body, headers, count, tries)

    def _retry(self, reason: str, body: bytes, headers: dict[str, str], count: int,
               tries: int) -> None:
        settings = self.settings
        if tries >= settings.retries:
            self.failed += count
            self._say(f"{count} events not delivered after {tries + 1} attempts "
                      f"({reason}); dropped")
            self._done()
            return
        delay = min(settings.backoff * 2 ** tries, settings.max_backoff)
        self._say(f"delivery failed ({reason}); retrying in {delay:g} s")
        self._due = self.clock.seconds() + delay
        self._timer = self.clock.callLater(delay, self._attempt, body, headers, count,
                                           tries + 1)

    def _say(self, text: str) -> None:
        held = self.limiter.allow(self.settings.url)
        if held is not None:
            more = f" ({held} more such lines held back)" if held else ""
            self.log.warn("webhook {url}: {text}{more}", url=self.settings.url, text=text,
                          more=more)

    def _done(self) -> None:
        self._busy = False
        if self._closed:
            return
        if len(self.queue) >= self.settings.max_batch:
            self._schedule(0.0)
        elif self.queue:
            self._schedule(self.settings.max_delay)

    def close(self) -> None:
        """Stop: no more requests; what is queued is dropped (not counted)."""
        self._closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._inflight is not None:
            self._inflight.cancel()
        self.queue.clear()


PostFactory = Callable[[HookSettings], Post]


class WebhookRecorder:
    """The recorder contract for every hook: each call goes to the hooks that want it.

    ``configure`` replaces the hooks (a reload): a hook whose settings are unchanged
    keeps its sender and queue; the counters stay cumulative."""

    def __init__(self, clock: Any, hooks: Sequence[HookSettings] = (),
                 post_factory: PostFactory | None = None) -> None:
        self.clock = clock
        self.post_factory = post_factory or (lambda s: treq_post(clock, s))
        self.limiter = LogLimiter(clock.seconds)
        self.senders: list[HookSender] = []
        self._by_kind: dict[str, list[HookSender]] = {}
        self._messages: SubscriptionTrie[int] | None = None
        self._by_topic: dict[str, tuple[HookSender, ...]] = {}
        self._retired = {"dropped": 0, "failed": 0, "delivered": 0}
        # Called after every configure (the fan-out's choice of message recorders).
        self.on_change: list[Callable[[], None]] = []
        self.configure(hooks)

    def configure(self, hooks: Sequence[HookSettings]) -> None:
        old = {s.settings: s for s in self.senders}
        senders = []
        for settings in hooks:
            sender = old.pop(settings, None)
            if sender is None:
                sender = HookSender(settings, self.clock, self.post_factory(settings),
                                    self.limiter)
            senders.append(sender)
        for gone in old.values():
            gone.close()
            for name in self._retired:
                self._retired[name] += getattr(gone, name)
        self.senders = senders
        by_kind: dict[str, list[HookSender]] = {}
        trie: SubscriptionTrie[int] = SubscriptionTrie()
        for index, sender in enumerate(senders):
            for kind in sender.settings.events:
                if kind != MESSAGE:
                    by_kind.setdefault(kind, []).append(sender)
            if sender.settings.wants_messages:
                for topic_filter in sender.settings.topics:
                    trie.add(topic_filter, index, 0)
        self._by_kind = by_kind
        self._by_topic = {}
        self._messages = trie if len(trie) else None
        # The core's name for it (no hook on messages, no call per message); a plain
        # attribute, not a property: it is read on every publish.
        self.records_messages = self._messages is not None
        self.records_events = bool(by_kind)   # (the same for ``event``)
        for listener in self.on_change:
            listener()

    def message(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                publisher: str | None, user: str | None, protocol: str | None,
                deliveries: int, dropped: int) -> None:
        if self._messages is None:
            return
        senders = self._by_topic.get(topic)
        if senders is None:
            senders = self._match(topic)
        if senders:
            item = (MESSAGE, timestamp, topic, qos, retain, payload, publisher, user,
                    protocol, deliveries, dropped)
            for sender in senders:
                sender.add(item)

    def _match(self, topic: str) -> tuple[HookSender, ...]:
        """The hooks wanting ``topic``, remembered: a trie match costs a microsecond
        or two, a dictionary look-up a few dozen nanoseconds, and a broker's topics
        are mostly the same ones again.  Bounded: forgotten all at once when full."""
        assert self._messages is not None
        senders = tuple(self.senders[index] for index in self._messages.match(topic))
        if len(self._by_topic) >= TOPIC_CACHE:
            self._by_topic.clear()
        self._by_topic[topic] = senders
        return senders

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        senders = self._by_kind.get(kind)
        if senders:
            item = (kind, timestamp, client_id, fields)
            for sender in senders:
                sender.add(item)

    def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None:
        senders = self._by_kind.get(kind)
        if senders:
            item = (kind, timestamp, client_id, dict(zip(names, values, strict=True)))
            for sender in senders:
                sender.add(item)

    def counts(self) -> dict[str, int]:
        """Cumulative: events dropped (queue full), failed (retries spent), delivered."""
        totals = dict(self._retired)
        for sender in self.senders:
            for name in totals:
                totals[name] += getattr(sender, name)
        return totals

    @property
    def dropped(self) -> int:
        """Events dropped and lost to failures together (for metrics)."""
        counts = self.counts()
        return counts["dropped"] + counts["failed"]

    def stats(self) -> dict[str, int]:
        """For ``$SYS/broker/webhooks/...`` (through the fan-out recorder)."""
        return {f"webhooks/{name}": value for name, value in self.counts().items()}

    def close(self) -> None:
        for sender in self.senders:
            sender.close()


# -- the real HTTP client (treq) --------------------------------------------------------


@implementer(IBodyProducer)
class _Body:
    """The whole body at once: no cooperator (it would tie the request to the global
    reactor), no copies."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.length = len(body)

    def startProducing(self, consumer: Any) -> Deferred[None]:
        consumer.write(self.body)
        return succeed(None)

    def stopProducing(self) -> None:
        pass

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass


def _tls_policy(settings: HookSettings) -> Any:
    """How an https:// hook checks its server: the platform's CAs or the hook's
    ``tls-ca``, and the host name through service-identity; or nothing at all with
    ``tls-verify = false``."""
    from twisted.internet import ssl
    from twisted.web.client import BrowserLikePolicyForHTTPS

    if not settings.tls_verify:
        @implementer(IPolicyForHTTPS)
        class _NoVerify:
            def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
                return ssl.CertificateOptions(verify=False)

        return _NoVerify()
    if settings.ca_certificates:
        roots = ssl.trustRootFromCertificates(
            [ssl.Certificate(c) for c in settings.ca_certificates])
        return BrowserLikePolicyForHTTPS(trustRoot=roots)
    return BrowserLikePolicyForHTTPS()


def treq_post(reactor: Any, settings: HookSettings) -> Post:
    """A ``Post`` through treq on ``reactor``, with the hook's TLS settings and a
    persistent connection pool of its own."""
    import treq.client
    from twisted.web.client import Agent, HTTPConnectionPool

    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 1
    agent: Any = Agent(reactor, contextFactory=_tls_policy(settings), pool=pool)
    client = treq.client.HTTPClient(agent)

    def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> Deferred[int]:
        # One time-out for the request and reading the answer (treq's own covers
        # only the first).
        producer: Any = _Body(body)
        send: dict[Any, Any] = dict(headers)
        d: Deferred[Any] = client.post(url, data=producer, headers=send, reactor=reactor)

        def read(response: Any) -> Deferred[int]:
            done: Deferred[Any] = treq.content(response)
            return done.addCallback(lambda _: int(response.code))

        d.addCallback(read)
        timed_out: list[bool] = []

        def expire() -> None:
            timed_out.append(True)
            d.cancel()

        timer = reactor.callLater(timeout, expire)

        def settle(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            if timed_out and isinstance(result, Failure):
                return Failure(TimeoutError(f"no answer within {timeout:g} s"))
            return result

        return d.addBoth(settle)

    return post
