"""What every console site shares (the broker's console, ``app.Console``, and a
gateway's, ``gatewaysite.GatewayConsole``): the answers to errors (an HTTP error, a
redirect, an unknown page or method: JSON under ``/api/``, the error page
otherwise), the static files, running a callable on the reactor's thread pool, and
mounting an area's routes on the site's Klein app.

What it owns: those answers, so both sites give the same ones.

What it must not do: import the broker or an area (a gateway's console uses it
without a broker).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.server import Request
from werkzeug.exceptions import MethodNotAllowed

from mqttamqp.console.web import Area, Gate, HTTPError, Pages

__all__ = ["STATIC_TYPES", "http_error", "mount", "not_found", "redirect", "static_file",
           "thread_pool_runner"]

STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".svg": "image/svg+xml", ".png": "image/png"}


def _error(pages: Pages, gate: Gate, request: Request, status: int, message: str) -> bytes:
    if request.path.startswith(b"/api/"):
        return pages.json(request, {"error": message}, status)
    return pages.render(request, "error.html", gate.authenticate(request, False), status,
                        error_status=status, message=message)


def http_error(pages: Pages, gate: Gate, request: Request, failure: Failure) -> bytes:
    """An ``HTTPError`` a page raised (401 asks for a bearer token too)."""
    err: HTTPError = failure.value  # type: ignore[assignment]
    if err.status == 401:
        request.setHeader(b"www-authenticate", b'Bearer realm="mqttamqp console"')
    return _error(pages, gate, request, err.status, err.message)


def redirect(request: Request, failure: Failure) -> bytes:
    """A ``Redirect`` a page raised: 303 to its location."""
    request.setResponseCode(303)
    request.setHeader(b"location", failure.value.location.encode())  # type: ignore
    return b""


def not_found(pages: Pages, gate: Gate, request: Request, failure: Failure) -> bytes:
    """No such page (404), or not with that method (405)."""
    status = 405 if failure.check(MethodNotAllowed) else 404
    return _error(pages, gate, request, status,
                  "method not allowed" if status == 405 else "no such page")


def static_file(static: Path, request: Request, name: str) -> bytes:
    """A file of the console's static folder (a known kind, no path in the name)."""
    path = static / name
    ctype = STATIC_TYPES.get(path.suffix)
    if ctype is None or "/" in name or name.startswith(".") or not path.is_file():
        raise HTTPError(404, "no such file")
    request.setHeader(b"content-type", ctype.encode())
    request.setHeader(b"cache-control", b"no-cache")
    return path.read_bytes()


def thread_pool_runner(reactor: Any) -> Callable[..., Deferred[Any]]:
    """Run ``f(*args)`` on ``reactor``'s thread pool (password hashing, file reads)."""

    def run_in_thread(f: Callable[..., Any], *args: Any) -> Deferred[Any]:
        d: Deferred[Any] = deferToThreadPool(reactor, reactor.getThreadPool(), f, *args)
        return d

    return run_in_thread


def mount(app: Klein, attribute: str, area: type[Area]) -> None:
    """Serve every route of ``area`` from ``app``: by the instance of the area the
    site holds as ``attribute``, under the same path, methods and endpoint."""
    for rule in area.app.url_map.iter_rules():
        endpoint = rule.endpoint
        assert isinstance(endpoint, str) and endpoint not in app.endpoints, endpoint

        def route(site: Any, request: IRequest, *args: Any,
                  _endpoint: str = endpoint, **kwargs: Any) -> Any:
            mounted: Area = getattr(site, attribute)
            return mounted.app.execute_endpoint(_endpoint, request, *args, **kwargs)
        app.route(rule.rule, methods=sorted(rule.methods or ()), endpoint=endpoint)(route)
