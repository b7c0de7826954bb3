"""A webhook endpoint for tests: a real twisted.web server on 127.0.0.1 port 0.

It runs in a reactor of its own (a ``SelectReactor`` instance, not the global one,
which pytest never runs) on a thread of its own, so in-process tests can also run
``WebhookRecorder`` on it (``call``) with the real treq client, and tests that
start a broker child process can point a hook at it.  Each request is answered from
``answers`` (an HTTP status, or ``HANG`` to never answer), then 200; every request
that arrives is put on ``requests`` for the test to wait on.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.selectreactor import SelectReactor
from twisted.internet.threads import blockingCallFromThread
from twisted.web import resource, server

HANG = "hang"
TIMEOUT = 10.0


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = json.loads(self.body)["events"]
        return events


class _Endpoint(resource.Resource):
    isLeaf = True

    def __init__(self, owner: HookServer) -> None:
        super().__init__()
        self.owner = owner

    def render_POST(self, request: Any) -> Any:
        owner = self.owner
        headers = {k.decode().lower(): v[0].decode()
                   for k, v in request.requestHeaders.getAllRawHeaders()}
        owner.requests.put(Received(request.path.decode(), headers, request.content.read()))
        answer = owner.answers.pop(0) if owner.answers else 200
        if answer == HANG:
            owner.hanging.append(request)
            return server.NOT_DONE_YET
        request.setResponseCode(answer)
        return b"{}"


class HookServer:
    def __init__(self, tls: Any = None, reactor: Any = None) -> None:
        """``tls``: a ``CertificateOptions`` to serve https instead of http;
        ``reactor``: a new ``SelectReactor`` unless given."""
        self.reactor = reactor if reactor is not None else SelectReactor()
        self.requests: queue.Queue[Received] = queue.Queue()
        self.answers: list[int | str] = []
        self.hanging: list[Any] = []
        self.outcomes: queue.Queue[int | str] = queue.Queue()
        self._thread = threading.Thread(target=self.reactor.run,
                                        kwargs={"installSignalHandlers": False},
                                        daemon=True)
        self._thread.start()
        site = server.Site(_Endpoint(self), reactor=self.reactor)
        if tls is None:
            self.port = self.call(self.reactor.listenTCP, 0, site, interface="127.0.0.1")
        else:
            self.port = self.call(self.reactor.listenSSL, 0, site, tls,
                                  interface="127.0.0.1")
        scheme = "http" if tls is None else "https"
        self.url = f"{scheme}://127.0.0.1:{self.port.getHost().port}/hook"

    def call(self, f: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run ``f`` on the server's reactor thread; its result (a Deferred's, once
        fired)."""
        return blockingCallFromThread(self.reactor, f, *args, **kw)

    def post_factory(self, settings: Any) -> Any:
        """The real treq ``Post`` on this reactor, each outcome (an HTTP status or
        a failure's message) also put on ``outcomes`` for the test to wait on."""
        from mqttamqp.ops.webhooks import treq_post

        post = treq_post(self.reactor, settings)

        def observed(url: str, body: bytes, headers: dict[str, str], timeout: float) -> Any:
            d = post(url, body, headers, timeout)

            def answered(code: int) -> int:
                self.outcomes.put(code)
                return code

            def failed(failure: Any) -> Any:
                self.outcomes.put(failure.getErrorMessage() or failure.type.__name__)
                return failure

            return d.addCallbacks(answered, failed)

        return observed

    def next_outcome(self, timeout: float = TIMEOUT) -> int | str:
        try:
            return self.outcomes.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no webhook outcome within {timeout}s") from None

    def next_request(self, timeout: float = TIMEOUT) -> Received:
        try:
            return self.requests.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no webhook request within {timeout}s") from None

    def close(self) -> None:
        def stop() -> Any:
            for request in self.hanging:
                if request.channel is not None:   # not already gone (client timed out)
                    request.channel.transport.abortConnection()
            return self.port.stopListening()

        self.call(stop)
        self.reactor.callFromThread(self.reactor.stop)
        self._thread.join(TIMEOUT)
