"""What every route of the console shares: who is asking, the CSRF rule, a
request's parameters, the two kinds of answer (an HTML page or JSON), the two
errors a route raises, the security headers, and how an action is mounted (a
form POST and its JSON twin under ``/api/``).

Security rules enforced here, in one place each:
- every page and API call needs a login (``Gate.require``); pages redirect to the
  login form, the API answers 401;
- every POST needs the session's CSRF token (form field ``csrf_token`` or header
  ``X-CSRF-Token``) unless it carries a bearer token; read-only tokens and users
  get 403;
- every response carries the security headers (``SecureHeaders``);
- templates autoescape; the API is JSON with ``nosniff``.

Routes take Twisted's ``twisted.web.server.Request``, which is what Klein hands
them.  This module knows no page: the apps in ``mqttamqp.console.apps`` do.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast
from urllib.parse import urlencode

import jinja2
from klein import Klein
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Request
from zope.interface import Interface  # type: ignore[import-untyped]

from mqttamqp import __version__
from mqttamqp.console.actions import ActionError, ActionResult
from mqttamqp.console.auth import LoginSession, SessionStore
from mqttamqp.security.userstore import ROLE_ADMIN, ApiToken, User, UserStore

__all__ = [
    "COOKIE_NAME", "CSP", "HTTPError", "Redirect", "Auth", "SecureHeaders", "safe_next",
    "url", "param", "param_list", "flag", "number", "list_args", "Gate", "Pages", "Area",
    "action_routes",
]

COOKIE_NAME = "mqttamqp_console"
CSRF_FIELD = "csrf_token"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


class HTTPError(Exception):
    """An error answer: JSON under /api/, an error page elsewhere."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Redirect(Exception):
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


@dataclass
class Auth:
    """Who is making this request, and how they proved it."""

    user: str
    session: LoginSession | None
    token: ApiToken | None
    role: str = ROLE_ADMIN

    @property
    def read_only(self) -> bool:
        """A read-only token, or a user with the ``read-only`` role: no actions."""
        return (self.token is not None and self.token.read_only) or self.role != ROLE_ADMIN


class SecureHeaders(Resource):
    """Wraps the Klein resource: security headers on every response, pages uncached."""

    isLeaf = True

    def __init__(self, inner: Resource) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.inner = inner

    def render(self, request: Request) -> bytes | int:
        request.setHeader(b"content-security-policy", CSP.encode())
        request.setHeader(b"x-frame-options", b"DENY")
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"referrer-policy", b"no-referrer")
        request.setHeader(b"cross-origin-opener-policy", b"same-origin")
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"server", b"mqttamqp")
        if request.isSecure():
            request.setHeader(b"strict-transport-security", b"max-age=31536000")
        return cast("bytes | int", self.inner.render(request))


def safe_next(value: str, default: str = "/") -> str:
    """A same-site path to go back to (never another host: no open redirect)."""
    if (not value.startswith("/") or value.startswith("//") or "\\" in value
            or any(ord(c) < 32 for c in value)):
        return default
    return value


def here(request: Request) -> str:
    """This page's path and query, without ``partial`` (where a form returns to)."""
    path = request.path.decode("utf-8", "replace")
    params = [(k.decode("utf-8", "replace"), v.decode("utf-8", "replace"))
              for k, vs in request.args.items() for v in vs
              if k not in (b"partial", b"csrf_token")] if request.method == b"GET" else []
    return safe_next(path + ("?" + urlencode(params) if params else ""))


def url(path: str, **params: Any) -> str:
    clean = {k: v for k, v in params.items() if v is not None and v != ""}
    return path + ("?" + urlencode(clean) if clean else "")


# -- a request's parameters ------------------------------------------------------------


class _IJSONBody(Interface):  # type: ignore[misc]
    """A request's JSON body, parsed once and kept on the request as a component (as
    Klein keeps its ``IKleinRequest``)."""


def _json_body(request: Request) -> dict[str, Any]:
    cached = request.getComponent(_IJSONBody)
    if cached is not None:
        return cast(dict[str, Any], cached)
    body: dict[str, Any] = {}
    ctype = (request.getHeader("content-type") or "").split(";")[0].strip().lower()
    if ctype == "application/json" and request.content is not None:
        request.content.seek(0)
        raw = request.content.read()
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                raise HTTPError(400, "request body is not valid JSON") from None
            if not isinstance(parsed, dict):
                raise HTTPError(400, "request body must be a JSON object")
            body = parsed
    request.setComponent(_IJSONBody, body)
    return body


def param(request: Request, name: str, default: str = "") -> str:
    """A parameter from the JSON body, else the query or form (the first value)."""
    body = _json_body(request)
    if name in body:
        value = body[name]
        if isinstance(value, bool):
            return "1" if value else ""
        return str(value)
    values = request.args.get(name.encode())
    if not values:
        return default
    try:
        return str(values[0].decode("utf-8"))
    except UnicodeDecodeError:
        raise HTTPError(400, f"parameter {name} is not UTF-8") from None


def param_list(request: Request, name: str, limit: int = 1000) -> list[str]:
    """A repeated form field, or a JSON array of strings (at most ``limit``)."""
    body = _json_body(request)
    if name in body:
        value = body[name]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise HTTPError(400, f"{name} must be a list of strings")
        return value[:limit + 1]
    try:
        return [v.decode("utf-8") for v in request.args.get(name.encode(), [])][:limit + 1]
    except UnicodeDecodeError:
        raise HTTPError(400, f"parameter {name} is not UTF-8") from None


def flag(request: Request, name: str) -> bool:
    return param(request, name).lower() in ("1", "true", "on", "yes")


def number(request: Request, name: str, default: int) -> int:
    raw = param(request, name)
    try:
        return int(raw) if raw else default
    except ValueError:
        raise HTTPError(400, f"parameter {name} must be a whole number") from None


def list_args(request: Request, sorts: dict[str, Any]) -> dict[str, Any]:
    """A list page's search, sort and paging parameters."""
    sort = param(request, "sort", "client_id")
    return {
        "query": param(request, "q")[:200],
        "sort": sort if sort in sorts else "client_id",
        "desc": param(request, "dir") == "desc",
        "page": number(request, "page", 1),
        "per_page": number(request, "per_page", 50),
    }


# -- who is asking ------------------------------------------------------------------------


class Gate:
    """Logins (the session cookie) and API tokens; the CSRF check of every POST."""

    log = Logger(namespace="mqttamqp.console")

    def __init__(self, users: UserStore, sessions: SessionStore) -> None:
        self.users = users
        self.sessions = sessions
        # Why changes are refused now ("" while they are not): a --ha standby, whose
        # state is not loaded, is read-only.
        self.read_only_because: Callable[[], str] = lambda: ""

    def cookie_session(self, request: Request, touch: bool) -> LoginSession | None:
        raw = request.getCookie(COOKIE_NAME.encode())
        if not raw:
            return None
        return self.sessions.get(raw.decode("ascii", "replace"), touch=touch)

    def set_cookie(self, request: Request, session_id: str, clear: bool = False) -> None:
        request.addCookie(COOKIE_NAME.encode(), session_id.encode(), path=b"/",
                          httpOnly=True, sameSite=b"strict", secure=request.isSecure(),
                          max_age=b"0" if clear else None)

    def user_valid(self, session: LoginSession) -> User | None:
        assert session.user is not None
        user = self.users.get(session.user)
        if user is None or user.changed > session.password_changed or not user.console:
            # Deleted, its password changed since this login, or no longer a console
            # user: log it out.
            self.sessions.end(session.id)
            return None
        return user

    def authenticate(self, request: Request, api: bool) -> Auth | None:
        header = request.getHeader("authorization")
        if api and header:
            scheme, _, value = header.partition(" ")
            if scheme.lower() != "bearer":
                raise HTTPError(401, "only Bearer tokens are accepted")
            found = self.users.find_token(value.strip())
            if found is None or not found[0].console:
                raise HTTPError(401, "invalid API token")
            return Auth(found[0].name, None, found[1], found[0].role)
        touch = request.getHeader("x-background") is None
        session = self.cookie_session(request, touch)
        if session is None or session.user is None:
            return None
        user = self.user_valid(session)
        if user is None:
            return None
        return Auth(session.user, session, None, user.role)

    def require(self, request: Request, api: bool, write: bool = False,
                any_role: bool = False) -> Auth:
        """Who is asking; ``write``: a POST (CSRF-checked), refused to read-only users
        and tokens unless ``any_role`` (logging out)."""
        auth = self.authenticate(request, api)
        if auth is None:
            if api:
                raise HTTPError(401, "login required")
            where = request.uri.decode("utf-8", "replace") if request.method == b"GET" else "/"
            raise Redirect(url("/login", next=safe_next(where)))
        if write:
            if auth.session is not None:
                given = param(request, CSRF_FIELD) or (request.getHeader("x-csrf-token") or "")
                if not given or not hmac.compare_digest(given.encode(),
                                                        auth.session.csrf.encode()):
                    self.log.warn("console: POST {path} by {user!r} without a valid CSRF "
                                  "token; refused", path=request.path, user=auth.user)
                    raise HTTPError(403, "missing or wrong CSRF token; reload the page")
            refused = "" if any_role else self.read_only_because()
            if refused:
                raise HTTPError(503, refused)
            if auth.read_only and not any_role:
                raise HTTPError(403, "this API token is read-only" if auth.token is not None
                                and auth.token.read_only else
                                f"user {auth.user!r} has the read-only role")
        return auth

    def still_allowed(self, auth: Auth) -> Callable[[], bool]:
        """For a long-lived stream: is its login (or token) still good?"""
        def still_allowed() -> bool:
            if auth.token is not None:
                user = self.users.get(auth.user)
                return (user is not None and user.console
                        and self.users.token_exists(auth.user, auth.token.id))
            session = auth.session
            assert session is not None
            live = self.sessions.get(session.id, touch=False)
            return live is not None and self.user_valid(live) is not None
        return still_allowed


# -- answers ------------------------------------------------------------------------------


class Pages:
    """The two kinds of answer: a page from a template, or JSON."""

    def __init__(self, env: jinja2.Environment) -> None:
        self.env = env

    @staticmethod
    def json(request: Request, data: Any, status: int = 200) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json; charset=utf-8")
        return json.dumps(data, indent=1).encode("utf-8") + b"\n"

    def render(self, request: Request, template: str, auth: Auth | None, status: int = 200,
               **context: Any) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        session = auth.session if auth is not None else None
        flash: list[tuple[str, str]] = []
        if session is not None and template[0] != "_":
            flash, session.flash = session.flash, []
        context.setdefault("nav", "")
        page = self.env.get_template(template).render(
            user=auth.user if auth is not None else None,
            csrf_token=session.csrf if session is not None else "",
            flash=flash, url=url, version=__version__, here=here(request), **context)
        return page.encode("utf-8")


# -- the apps and their actions -----------------------------------------------------------

ActionCall = Callable[[Auth], Awaitable[ActionResult]]


class Area:
    """Base of the console's apps: each has its own ``app = Klein()`` and routes, and
    shares the gate and the pages."""

    app: ClassVar[Klein]

    def __init__(self, gate: Gate, pages: Pages) -> None:
        self.gate = gate
        self.pages = pages

    async def form_action(self, request: Request, act: ActionCall, default_back: str) -> bytes:
        auth = self.gate.require(request, api=False, write=True)
        assert auth.session is not None
        back = safe_next(param(request, "back"), default_back)
        try:
            result = await act(auth)
        except ActionError as e:
            auth.session.flash.append(("error", e.message))
        else:
            auth.session.flash.append(("ok", result.message))
            if result.connection_gone and back.startswith("/client?key="):
                back = "/clients"   # its detail page went with the connection
        raise Redirect(back)

    async def api_action(self, request: Request, act: ActionCall) -> bytes:
        auth = self.gate.require(request, api=True, write=True)
        try:
            result = await act(auth)
        except ActionError as e:
            raise HTTPError(e.status, e.message) from None
        return self.pages.json(request, {"ok": True, "message": result.message, **result.data})


A = TypeVar("A", bound=Area)


def action_routes(app: Klein,
                  rows: Sequence[tuple[str, Callable[[A, Request], ActionCall], str]]) -> None:
    """Mount every action of an app twice: a form POST (answered with a redirect and a
    flash message) and its JSON twin under /api/, from one row each: the path, the
    builder of the call, and the page a form goes back to by default.

    A builder reads its parameters only when its call runs, after ``require``
    passed: an anonymous request gets 401 or a redirect, never a parameter error."""
    for path, builder, back in rows:
        app.route(path, methods=["POST"], endpoint="form:" + path)(_form_route(builder, back))
        app.route("/api" + path, methods=["POST"], endpoint="api:" + path)(
            _api_route(builder))


def _form_route(builder: Callable[[A, Request], ActionCall], back: str
                ) -> Callable[[A, Request], Awaitable[bytes]]:
    async def form(self: A, request: Request) -> bytes:
        return await self.form_action(request, builder(self, request), back)
    return form


def _api_route(builder: Callable[[A, Request], ActionCall]
               ) -> Callable[[A, Request], Awaitable[bytes]]:
    async def api(self: A, request: Request) -> bytes:
        return await self.api_action(request, builder(self, request))
    return api
