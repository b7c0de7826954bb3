"""The HTTP side of ``ops``: ``/metrics``, ``/healthz`` and ``/readyz`` on the
metrics listener (``--metrics``, no login: keep it on loopback or a private
network), and ``/metrics`` alone on the console's listener behind a bearer token
(``--metrics-token-file``).

What it owns: the resources and their status codes (503 when not ready, 401
without the token).  What it must not do: touch the console's routes or its
login; the token is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from mqttamqp.ops.health import Readiness
from mqttamqp.ops.metrics import CONTENT_TYPE, exposition

__all__ = ["MetricsResource", "ops_site", "with_metrics", "read_token"]


def _json(request: Request, status: int, body: dict[str, Any]) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(body, sort_keys=True).encode() + b"\n"


class MetricsResource(Resource):
    """The Prometheus text format; with ``token``, only for ``Authorization:
    Bearer <token>``."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry, token: str | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.registry = registry
        self._token = token.encode() if token is not None else None

    def render_GET(self, request: Request) -> bytes:
        if self._token is not None:
            given = request.getHeader(b"authorization") or b""
            scheme, _, value = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(value.strip(),
                                                                      self._token):
                request.setHeader(b"www-authenticate", b'Bearer realm="mqttamqp metrics"')
                return _json(request, 401, {"error": "a valid bearer token is required"})
        request.setHeader(b"content-type", CONTENT_TYPE.encode())
        request.setHeader(b"cache-control", b"no-store")
        return exposition(self.registry)


class _Json(Resource):
    isLeaf = True

    def __init__(self, answer: Callable[[], tuple[int, dict[str, Any]]]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.answer = answer

    def render_GET(self, request: Request) -> bytes:
        return _json(request, *self.answer())


class _QuietSite(Site):
    """No access line per scrape (a scrape every 15 s would fill the log)."""

    def log(self, request: Any) -> None:
        pass


def ops_site(registry: CollectorRegistry, readiness: Readiness,
             live: Callable[[], dict[str, Any]]) -> Site:
    """The metrics listener's site."""
    root = Resource()
    children: dict[bytes, Any] = {
        b"metrics": MetricsResource(registry),
        b"healthz": _Json(lambda: (200, live())),
    }

    def ready() -> tuple[int, dict[str, Any]]:
        ok, body = readiness.report()
        return (200 if ok else 503), body

    children[b"readyz"] = _Json(ready)
    for name, child in children.items():
        root.putChild(name, child)
    site = _QuietSite(root)  # type: ignore[no-untyped-call]
    site.displayTracebacks = False
    return site


class _FrontOf(Resource):
    """``/metrics`` here, every other path to the console unchanged."""

    def __init__(self, console: Any, metrics: MetricsResource) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.console = console
        self.metrics = metrics

    def getChildWithDefault(self, path: bytes, request: Any) -> Any:
        if path == b"metrics" and not request.postpath:
            return self.metrics
        # Undo the step getChildForRequest took: the console sees the whole path.
        request.prepath.pop()
        request.postpath.insert(0, path)
        return self.console

    def render(self, request: Any) -> Any:   # the bare "/" (no path segment)
        return self.console.render(request)


def with_metrics(site: Site, metrics: MetricsResource) -> None:
    """Serve ``metrics`` at ``/metrics`` on the console's ``site``."""
    site.resource = _FrontOf(site.resource, metrics)


def read_token(path: str) -> str:
    """The bearer token in ``path`` (surrounding white space removed); a ValueError
    says why it cannot be used."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    if len(token) < 16 or any(ch.isspace() for ch in token):
        raise ValueError(f"{path} must hold one token of at least 16 characters")
    return token
