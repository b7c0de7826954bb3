"""The console's Klein application: HTML pages, the JSON API under ``/api/``, the
live feed (Server-Sent Events) and the login flow.

Routes are bound to a ``Console`` instance (``app = Klein()`` on the class); the
broker service, clock, users file and thread runner are injected, so tests drive
it with ``treq.testing.StubTreq``, a ``task.Clock`` and a synchronous thread
runner.  What a page shows comes from ``mqttamqp.console.views`` (the same dicts the API
returns); what a button does is in ``mqttamqp.console.actions``.

Security rules enforced here, in one place each:
- every page and API call needs a login (``_require``); pages redirect to the
  login form, the API answers 401;
- every POST needs the session's CSRF token (form field ``csrf_token`` or header
  ``X-CSRF-Token``) unless it carries a bearer token; read-only tokens get 403;
- every response carries the security headers (``SecureHeaders``);
- templates autoescape; the API is JSON with ``nosniff``.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlencode

from klein import Klein
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mqttamqp import __version__
from mqttamqp.console import views
from mqttamqp.console.actions import ActionError, ActionResult, ConsoleActions
from mqttamqp.console.apidoc import api_index
from mqttamqp.console.auth import LoginSession, LoginThrottle, SessionStore
from mqttamqp.console.feed import EventStream, StatsFeed
from mqttamqp.console.queues import (
    BROWSE_DEFAULT,
    QueueActions,
    QueueRates,
    find_queue,
    message_detail,
    queue_detail,
    queue_list,
)
from mqttamqp.console.rendering import make_environment, static_dir
from mqttamqp.console.tail import TAIL_MODES, TailHub
from mqttamqp.console.traffic import TrafficSource
from mqttamqp.console.useractions import UserActions, user_json
from mqttamqp.core.broker import Broker
from mqttamqp.core.topics import validate_topic_filter, validate_topic_name
from mqttamqp.security.acl import AclAuthorizer
from mqttamqp.security.userstore import ROLE_ADMIN, ROLES, ApiToken, User, UserStore

__all__ = ["Console", "SecureHeaders", "COOKIE_NAME"]

COOKIE_NAME = "mqttamqp_console"
CSRF_FIELD = "csrf_token"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".svg": "image/svg+xml", ".png": "image/png"}

MAX_DRAFT = 256 * 1024     # what a form keeps of what was typed (bytes of text)

RunInThread = Callable[..., "Deferred[Any]"]


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

    def __init__(self, inner: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.inner = inner

    def render(self, request: Any) -> Any:
        request.setHeader(b"content-security-policy", CSP.encode())
        request.setHeader(b"x-frame-options", b"DENY")
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"referrer-policy", b"no-referrer")
        request.setHeader(b"cross-origin-opener-policy", b"same-origin")
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"server", b"mqttamqp")
        if request.isSecure():
            request.setHeader(b"strict-transport-security", b"max-age=31536000")
        return self.inner.render(request)


def safe_next(value: str, default: str = "/") -> str:
    """A same-site path to go back to (never another host: no open redirect)."""
    if (not value.startswith("/") or value.startswith("//") or "\\" in value
            or any(ord(c) < 32 for c in value)):
        return default
    return value


def _here(request: Any) -> str:
    """This page's path and query, without ``partial`` (where a form returns to)."""
    path = request.path.decode("utf-8", "replace")
    params = [(k.decode("utf-8", "replace"), v.decode("utf-8", "replace"))
              for k, vs in request.args.items() for v in vs
              if k not in (b"partial", b"csrf_token")] if request.method == b"GET" else []
    return safe_next(path + ("?" + urlencode(params) if params else ""))


def _url(path: str, **params: Any) -> str:
    clean = {k: v for k, v in params.items() if v is not None and v != ""}
    return path + ("?" + urlencode(clean) if clean else "")



def _form_route(builder: str, back: str) -> Callable[[Any, Any], Awaitable[bytes]]:
    async def form(self: Any, request: Any) -> bytes:
        return await self._form_action(request, getattr(self, builder)(request), back)  # type: ignore[no-any-return]
    return form


def _api_route(builder: str) -> Callable[[Any, Any], Awaitable[bytes]]:
    async def api(self: Any, request: Any) -> bytes:
        return await self._api_action(request, getattr(self, builder)(request))  # type: ignore[no-any-return]
    return api

@dataclass(frozen=True)
class ConsoleContext:
    """What the console needs from the process around it, and nothing more: the
    broker's façade, where the admin users live, the clock, and the listeners and
    storage figures the overview shows."""

    broker: Broker
    data_dir: str
    clock: Any
    listeners: Callable[[], list[dict[str, str]]]
    storage_stats: Callable[[], dict[str, Any] | None]
    archive_dir: str | None = None        # None: the archive is off
    report_dir: str | None = None         # where the traffic report is written
    report_job: Any = None                # a mqttamqp.console.traffic.ReportRunner, or None

    @classmethod
    def of(cls, service: Any) -> ConsoleContext:
        """The context of a ``BrokerService`` (or anything shaped like one)."""
        def listeners() -> list[dict[str, str]]:
            return [{"kind": ls.kind, "description": ls.description, "address": ls.address}
                    for ls in getattr(service, "listeners", [])]

        def storage_stats() -> dict[str, Any] | None:
            stats_fn = getattr(getattr(service, "store", None), "stats", None)
            return stats_fn() if callable(stats_fn) else None

        return cls(service.broker, service.data_dir, service.reactor, listeners,
                   storage_stats, getattr(service, "archive_dir", None),
                   getattr(service, "report_dir", None),
                   getattr(service, "report_job", None))


class Console:
    app = Klein()
    log = Logger(namespace="mqttamqp.console")

    def __init__(self, context: ConsoleContext, clock: Any = None,
                 run_in_thread: RunInThread | None = None,
                 users: UserStore | None = None, idle_timeout: float = 30 * 60) -> None:
        self.context = context
        self.broker: Broker = context.broker
        self.clock = clock if clock is not None else context.clock
        self.users = users if users is not None else UserStore(context.data_dir)
        self.sessions = SessionStore(self.clock.seconds, idle_timeout=idle_timeout)
        self.throttle = LoginThrottle(self.clock.seconds)
        self.actions = ConsoleActions(self.broker, context.report_job)
        self.env = make_environment(self.clock.seconds)
        self.static = static_dir()
        if run_in_thread is None:
            reactor = self.clock

            def run_in_thread(f: Callable[..., Any], *args: Any) -> Deferred[Any]:
                d: Deferred[Any] = deferToThreadPool(reactor, reactor.getThreadPool(), f,
                                                     *args)
                return d
        self.run_in_thread = run_in_thread
        self.user_actions = UserActions(self.users, self.actions.audit, run_in_thread)
        report_dir = context.report_dir or os.path.join(context.data_dir, "report")
        self.traffic = TrafficSource(
            report_dir, context.archive_dir, self.clock.seconds,
            self.broker.recorder.stats if context.archive_dir is not None else None,
            job=context.report_job)
        self.client_rates = views.ClientRates(self.clock.seconds)
        self.tails = TailHub(self.broker, self.clock)
        self.topic_rates = views.TopicRates(self.clock.seconds)
        self.queue_rates = QueueRates(self.clock.seconds)
        self.queue_actions = QueueActions(self.broker, self.actions.audit)
        self.feed = StatsFeed(self.clock, self._live_snapshot, self._counters)

    def resource(self) -> Resource:
        return SecureHeaders(self.app.resource())

    # -- request helpers --------------------------------------------------------

    def _json_body(self, request: Any) -> dict[str, Any]:
        cached = getattr(request, "_console_json", None)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
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
        request._console_json = body
        return body

    def _param(self, request: Any, name: str, default: str = "") -> str:
        body = self._json_body(request)
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

    def _list(self, request: Any, name: str, limit: int = 1000) -> list[str]:
        """A repeated form field, or a JSON array of strings (at most ``limit``)."""
        body = self._json_body(request)
        if name in body:
            value = body[name]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise HTTPError(400, f"{name} must be a list of strings")
            return value[:limit + 1]
        try:
            return [v.decode("utf-8") for v in request.args.get(name.encode(), [])][:limit + 1]
        except UnicodeDecodeError:
            raise HTTPError(400, f"parameter {name} is not UTF-8") from None

    def _flag(self, request: Any, name: str) -> bool:
        return self._param(request, name).lower() in ("1", "true", "on", "yes")

    def _int(self, request: Any, name: str, default: int) -> int:
        raw = self._param(request, name)
        try:
            return int(raw) if raw else default
        except ValueError:
            raise HTTPError(400, f"parameter {name} must be a whole number") from None

    def _cookie_session(self, request: Any, touch: bool) -> LoginSession | None:
        raw = request.getCookie(COOKIE_NAME.encode())
        if not raw:
            return None
        return self.sessions.get(raw.decode("ascii", "replace"), touch=touch)

    def _set_cookie(self, request: Any, session_id: str, clear: bool = False) -> None:
        request.addCookie(COOKIE_NAME.encode(), session_id.encode(), path=b"/",
                          httpOnly=True, sameSite=b"strict", secure=request.isSecure(),
                          max_age=b"0" if clear else None)

    def _user_valid(self, session: LoginSession) -> User | None:
        assert session.user is not None
        user = self.users.get(session.user)
        if user is None or user.changed > session.password_changed or not user.console:
            # Deleted, its password changed since this login, or no longer a console
            # user: log it out.
            self.sessions.end(session.id)
            return None
        return user

    def _authenticate(self, request: Any, api: bool) -> Auth | None:
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
        session = self._cookie_session(request, touch)
        if session is None or session.user is None:
            return None
        user = self._user_valid(session)
        if user is None:
            return None
        return Auth(session.user, session, None, user.role)

    def _require(self, request: Any, api: bool, write: bool = False,
                 any_role: bool = False) -> Auth:
        """Who is asking; ``write``: a POST (CSRF-checked), refused to read-only users
        and tokens unless ``any_role`` (logging out)."""
        auth = self._authenticate(request, api)
        if auth is None:
            if api:
                raise HTTPError(401, "login required")
            here = request.uri.decode("utf-8", "replace") if request.method == b"GET" else "/"
            raise Redirect(_url("/login", next=safe_next(here)))
        if write:
            if auth.session is not None:
                given = self._param(request, CSRF_FIELD) or (
                    request.getHeader("x-csrf-token") or "")
                if not given or not hmac.compare_digest(given.encode(),
                                                        auth.session.csrf.encode()):
                    self.log.warn("console: POST {path} by {user!r} without a valid CSRF "
                                  "token; refused", path=request.path, user=auth.user)
                    raise HTTPError(403, "missing or wrong CSRF token; reload the page")
            if auth.read_only and not any_role:
                raise HTTPError(403, "this API token is read-only" if auth.token is not None
                                and auth.token.read_only else
                                f"user {auth.user!r} has the read-only role")
        return auth

    # -- responses --------------------------------------------------------------

    def _json(self, request: Any, data: Any, status: int = 200) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json; charset=utf-8")
        return json.dumps(data, indent=1).encode("utf-8") + b"\n"

    def _render(self, request: Any, template: str, auth: Auth | None, status: int = 200,
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
            flash=flash, url=_url, version=__version__, here=_here(request), **context)
        return page.encode("utf-8")

    @app.handle_errors(HTTPError)
    def _http_error(self, request: Any, failure: Failure) -> bytes:
        err: HTTPError = failure.value  # type: ignore[assignment]
        api = request.path.startswith(b"/api/")
        if err.status == 401:
            request.setHeader(b"www-authenticate", b'Bearer realm="mqttamqp console"')
        if api:
            return self._json(request, {"error": err.message}, err.status)
        auth = self._authenticate(request, False)
        return self._render(request, "error.html", auth, err.status, error_status=err.status,
                            message=err.message)

    @app.handle_errors(Redirect)
    def _redirect(self, request: Any, failure: Failure) -> bytes:
        request.setResponseCode(303)
        request.setHeader(b"location", failure.value.location.encode())  # type: ignore
        return b""

    @app.handle_errors(NotFound, MethodNotAllowed)
    def _not_found(self, request: Any, failure: Failure) -> bytes:
        status = 405 if failure.check(MethodNotAllowed) else 404
        message = "method not allowed" if status == 405 else "no such page"
        if request.path.startswith(b"/api/"):
            return self._json(request, {"error": message}, status)
        return self._render(request, "error.html", self._authenticate(request, False),
                            status, error_status=status, message=message)

    # -- login ------------------------------------------------------------------

    def _login_form(self, request: Any, status: int = 200, error: str = "",
                    username: str = "") -> bytes:
        session = self._cookie_session(request, touch=False)
        if session is None or session.user is not None:
            session = self.sessions.anonymous()
            self._set_cookie(request, session.id)
        return self._render(request, "login.html", None, status, login_csrf=session.csrf,
                            error=error, username=username,
                            next=safe_next(self._param(request, "next")))

    @app.route("/login", methods=["GET"])
    def login_page(self, request: Any) -> bytes:
        if self._authenticate(request, False) is not None:
            raise Redirect(safe_next(self._param(request, "next")))
        return self._login_form(request)

    @app.route("/login", methods=["POST"])
    async def login_submit(self, request: Any) -> bytes:
        session = self._cookie_session(request, touch=False)
        given = self._param(request, CSRF_FIELD)
        if session is None or session.user is not None or not given or \
                not hmac.compare_digest(given.encode(), session.csrf.encode()):
            return self._login_form(request, 403, "The login form expired. Please try again.")
        name = self._param(request, "username").strip()
        password = self._param(request, "password")
        address = getattr(request.getClientAddress(), "host", "?")
        shown = name[:64]                     # user names in the log: bounded, repr-escaped
        wait = self.throttle.retry_after(name, address)
        if wait > 0:
            seconds = int(wait + 0.999)
            request.setHeader(b"retry-after", str(seconds).encode())
            if self.throttle.note_refusal(name, address):
                self.log.warn("console: login for {name!r} from {a} refused for {s} s: too "
                              "many failed attempts (more refusals in this back-off are not "
                              "logged)", name=shown, a=address, s=seconds)
            return self._login_form(
                request, 429, f"Too many failed attempts. Try again in {seconds} s.", name)
        hold = self.throttle.user_hold(name, address)
        if hold is None:
            seconds = int(self.throttle.user_retry_after(name, address) + 1.999)
            request.setHeader(b"retry-after", str(seconds).encode())
            self._log_user_pace(name, refused=True)
            return self._login_form(
                request, 429, f"Too many failed attempts. Try again in {seconds} s.", name)
        self.throttle.begin(name, address)
        try:
            if hold > 0:
                self._log_user_pace(name)
                await deferLater(self.clock, hold, lambda: None)
            user = await self.run_in_thread(self.users.check_password, name, password)
        except CancelledError:   # the browser went away while it waited
            self.throttle.abandon(address)
            raise
        except Exception:
            self.throttle.finish(name, address, False)
            raise
        self.throttle.finish(name, address, user is not None)
        if user is not None and not user.console:
            self.log.warn("console: {name!r} from {a} is a client user (role {r}); console "
                          "login refused", name=shown, a=address, r=user.role)
            return self._login_form(request, 403, "This user may not use the console "
                                    "(its role is client).", name)
        if user is None:
            self.log.warn("console: failed login for {name!r} from {a} ({n} from this address)",
                          name=shown, a=address, n=self.throttle.failures(address))
            return self._login_form(request, 401, "Wrong user name or password.", name)
        fresh = self.sessions.login(session.id, user.name, user.changed)
        self._set_cookie(request, fresh.id)
        self.log.info("console: {name!r} logged in from {a}", name=user.name, a=address)
        raise Redirect(safe_next(self._param(request, "next")))

    def _log_user_pace(self, name: str, refused: bool = False) -> None:
        """One line per spell of failed logins for one user name from many
        addresses, when its pacing starts (and one if an attempt is refused)."""
        spell = self.throttle.user_spell(name, refused)
        if spell is None:
            return
        failures, addresses, seconds = spell
        shown = name[:64]
        if refused:
            self.log.warn("console: login for {name!r} refused: its password checks from "
                          "new addresses are paced and the queue is {w:g} s long (more "
                          "refusals in this spell are not logged)", name=shown,
                          w=self.throttle.user_max_wait)
            return
        more = " or more" if addresses >= self.throttle.addresses_kept else ""
        self.log.warn("console: {n} failed logins for {name!r} from {k}{more} addresses "
                      "in {s:.0f} s: its password checks from addresses it has not logged "
                      "in from now wait their turn, one every {p:g} s or more (until 15 "
                      "minutes pass without a failure)", n=failures, name=shown,
                      k=addresses, more=more, s=seconds, p=self.throttle.user_pace_now(name))

    @app.route("/logout", methods=["POST"])
    def logout(self, request: Any) -> bytes:
        auth = self._require(request, api=False, write=True, any_role=True)
        assert auth.session is not None
        self.sessions.end(auth.session.id)
        self._set_cookie(request, "", clear=True)
        self.log.info("console: {name!r} logged out", name=auth.user)
        raise Redirect("/login")

    # -- static files -------------------------------------------------------------

    @app.route("/static/<name>", methods=["GET"])
    def static_file(self, request: Any, name: str) -> bytes:
        path = self.static / name
        ctype = _STATIC_TYPES.get(path.suffix)
        if ctype is None or "/" in name or name.startswith(".") or not path.is_file():
            raise HTTPError(404, "no such file")
        request.setHeader(b"content-type", ctype.encode())
        request.setHeader(b"cache-control", b"no-cache")
        return path.read_bytes()

    @app.route("/favicon.ico", methods=["GET"])
    def favicon(self, request: Any) -> bytes:
        request.setResponseCode(204)
        return b""

    # -- pages ------------------------------------------------------------------

    def _overview(self, history: bool) -> dict[str, Any]:
        data = views.overview(self.context, self.broker.view, self.clock.seconds(),
                              self.feed.rates)
        if history:
            data["history"] = list(self.feed.history)
        return data

    def _live_snapshot(self) -> dict[str, Any]:
        return views.overview(self.context, self.broker.view, self.clock.seconds(),
                              self.feed.rates, include_storage=True)

    def _counters(self) -> tuple[int, int]:
        stats = self.broker.stats
        return stats.messages_received, stats.messages_sent

    @app.route("/", methods=["GET"])
    def overview_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        return self._render(request, "overview.html", auth, nav="overview",
                            o=self._overview(False))

    @app.route("/api/overview", methods=["GET"])
    def overview_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, self._overview(True))

    def _list_args(self, request: Any, sorts: dict[str, Any]) -> dict[str, Any]:
        sort = self._param(request, "sort", "client_id")
        return {
            "query": self._param(request, "q")[:200],
            "sort": sort if sort in sorts else "client_id",
            "desc": self._param(request, "dir") == "desc",
            "page": self._int(request, "page", 1),
            "per_page": self._int(request, "per_page", 50),
        }

    def _client_filters(self, request: Any) -> views.ClientFilters:
        def choice(name: str, allowed: tuple[str, ...]) -> str:
            value = self._param(request, name)
            if value and value not in allowed:
                raise HTTPError(400, f"parameter {name} must be one of {', '.join(allowed)}")
            return value
        return views.ClientFilters(
            protocol=choice("protocol", ("mqtt", "mqtt3.1", "mqtt3.1.1", "mqtt5", "amqp")),
            user=self._param(request, "user")[:200], remote=self._param(request, "remote")[:200],
            kind=choice("kind", ("clean", "persistent")), will=choice("will", ("yes", "no")))

    def _clients(self, request: Any) -> tuple[dict[str, Any], views.ClientFilters, views.Page]:
        args = self._list_args(request, views.CLIENT_SORTS)
        filters = self._client_filters(request)
        page = views.list_clients(self.broker.view, filters=filters, rates=self.client_rates,
                                  **args)
        return args, filters, page

    @app.route("/clients", methods=["GET"])
    def clients_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        args, filters, page = self._clients(request)
        partial = self._flag(request, "partial")
        return self._render(request, "_client_rows.html" if partial else "clients.html", auth,
                            nav="clients", page=page, args=args, sorts=views.CLIENT_SORTS,
                            filters=filters, extra=filters.as_params())

    @app.route("/api/clients", methods=["GET"])
    def clients_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        _, filters, page = self._clients(request)
        return self._json(request, {**page.as_json(), "filters": filters.as_params()})

    def _client(self, request: Any) -> dict[str, Any] | None:
        key = self._param(request, "key")
        session_id = self._param(request, "session")
        model = self.broker.view
        if key:
            client = model.client(key)
            if client is not None:
                detail = views.client_detail(client)
                detail["rates"] = self.client_rates.rates(key, detail["counters"])
                return detail
            if key.startswith("mqtt:"):
                session_id = key[5:]
        if session_id:
            session = model.session(session_id)
            if session is not None:
                holder = model.client_holding(session_id)
                if holder is not None:
                    return views.client_detail(holder)
                return views.session_detail(session, model.will(session_id))
        if not key and not session_id:
            raise HTTPError(400, "give key=<connection key> or session=<client id>")
        return None

    @app.route("/client", methods=["GET"])
    def client_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        detail = self._client(request)
        partial = self._flag(request, "partial")
        template = "_client_live.html" if partial else "client.html"
        # A live refresh of a client that left gets a fragment saying so, not an error.
        status = 200 if detail is not None or partial else 404
        return self._render(request, template, auth, status,
                            nav="clients", c=detail,
                            key=self._param(request, "key"),
                            session_id=self._param(request, "session"),
                            found=detail is not None)

    @app.route("/api/client", methods=["GET"])
    def client_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        detail = self._client(request)
        if detail is None:
            raise HTTPError(404, "no such client or session")
        return self._json(request, detail)

    @app.route("/sessions", methods=["GET"])
    def sessions_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        args = self._list_args(request, views.SESSION_SORTS)
        state = self._param(request, "state", "all")
        page = views.list_sessions(self.broker.view, state=state, **args)
        partial = self._flag(request, "partial")
        return self._render(request, "_session_rows.html" if partial else "sessions.html",
                            auth, nav="sessions", page=page, args=args, state=state,
                            extra_state=state)

    @app.route("/api/sessions", methods=["GET"])
    def sessions_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        page = views.list_sessions(self.broker.view, state=self._param(request, "state", "all"),
                                   **self._list_args(request, views.SESSION_SORTS))
        return self._json(request, page.as_json())

    def _retained(self, request: Any) -> tuple[str, str | None, views.Page]:
        topic_filter = self._param(request, "filter", "#") or "#"
        problem = validate_topic_filter(topic_filter)
        messages = [] if problem else self.broker.view.retained_matching(topic_filter)
        page = views.list_retained(messages, self._int(request, "page", 1),
                                   self._int(request, "per_page", 50))
        return topic_filter, problem, page

    @app.route("/retained", methods=["GET"])
    def retained_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        topic_filter, problem, page = self._retained(request)
        return self._render(request, "retained.html", auth, nav="retained", page=page,
                            filter=topic_filter, problem=problem, extra_filter=topic_filter,
                            args={"query": "", "sort": "", "desc": False,
                                  "per_page": page.per_page})

    @app.route("/api/retained", methods=["GET"])
    def retained_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        topic_filter, problem, page = self._retained(request)
        if problem:
            raise HTTPError(400, f"invalid topic filter: {problem}")
        return self._json(request, {"filter": topic_filter, **page.as_json()})

    def _retained_message(self, request: Any) -> dict[str, Any]:
        topic = self._param(request, "topic")
        message = self.broker.view.retained(topic) if topic else None
        if message is None:
            raise HTTPError(404, "no retained message on that topic")
        return views.retained_detail(message, self._param(request, "view", "auto"))

    @app.route("/retained/message", methods=["GET"])
    def retained_message_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        return self._render(request, "retained_message.html", auth, nav="retained",
                            msg=self._retained_message(request))

    @app.route("/api/retained/message", methods=["GET"])
    def retained_message_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, self._retained_message(request))

    @app.route("/retained/delete-matching", methods=["GET"])
    def retained_confirm_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        topic_filter = self._param(request, "filter", "#") or "#"
        try:
            count = self.actions.count_retained(topic_filter)
        except ActionError as e:
            raise HTTPError(e.status, e.message) from None
        return self._render(request, "retained_confirm.html", auth, nav="retained",
                            filter=topic_filter, count=count,
                            sample=[views.retained_row(m) for m in
                                    self.broker.view.retained_matching(topic_filter)[:10]])

    @app.route("/api/retained/count", methods=["GET"])
    def retained_count_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        topic_filter = self._param(request, "filter", "#") or "#"
        try:
            count = self.actions.count_retained(topic_filter)
        except ActionError as e:
            raise HTTPError(e.status, e.message) from None
        return self._json(request, {"filter": topic_filter, "count": count})

    def _wills(self) -> list[dict[str, Any]]:
        return [views.will_json(w) for w in self.broker.view.wills()]

    @app.route("/wills", methods=["GET"])
    def wills_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        return self._render(request, "wills.html", auth, nav="wills", wills=self._wills())

    @app.route("/api/wills", methods=["GET"])
    def wills_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, {"items": self._wills()})

    @app.route("/publish", methods=["GET"])
    def publish_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        draft = dict(auth.session.drafts.get("publish", {})) if auth.session else {}
        if self._param(request, "topic"):
            draft["topic"] = self._param(request, "topic")
        return self._render(request, "publish.html", auth, nav="publish", draft=draft)

    def _topics(self, request: Any) -> dict[str, Any]:
        prefix = self._param(request, "prefix").strip("/")
        if prefix and validate_topic_name(prefix) is not None:
            raise HTTPError(400, f"invalid topic prefix: {validate_topic_name(prefix)}")
        return views.topic_tree(self.broker.view, prefix, self.topic_rates)

    @app.route("/topics", methods=["GET"])
    def topics_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        tree = self._topics(request)
        partial = self._flag(request, "partial")
        return self._render(request, "_topic_rows.html" if partial else "topics.html", auth,
                            nav="topics", tree=tree)

    @app.route("/api/topics", methods=["GET"])
    def topics_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, self._topics(request))

    def _subscriptions(self, request: Any) -> tuple[dict[str, Any], views.Page]:
        query = self._param(request, "q")[:200]
        page = views.list_subscriptions(self.broker.view, query, self._int(request, "page", 1),
                                        self._int(request, "per_page", 50))
        return {"query": query, "sort": "", "desc": False, "per_page": page.per_page}, page

    @app.route("/subscriptions", methods=["GET"])
    def subscriptions_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        args, page = self._subscriptions(request)
        return self._render(request, "subscriptions.html", auth, nav="subscriptions", page=page,
                            args=args, groups=self._shared_groups())

    def _shared_groups(self) -> list[dict[str, Any]]:
        return [{"name": g.name, "filter": g.topic_filter, "strategy": g.strategy,
                 "members": [{"client_id": c, "given": n, "online": on}
                             for c, n, on in g.members]}
                for g in self.broker.view.shared_groups()]

    @app.route("/api/shared", methods=["GET"])
    def shared_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, {"items": self._shared_groups()})

    @app.route("/api/subscriptions", methods=["GET"])
    def subscriptions_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, self._subscriptions(request)[1].as_json())

    def _bans(self) -> list[dict[str, Any]]:
        return [views.ban_json(b, self.clock.seconds()) for b in self.broker.view.bans()]

    @app.route("/bans", methods=["GET"])
    def bans_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        return self._render(request, "bans.html", auth, nav="bans", bans=self._bans(),
                            kind=self._param(request, "kind", "client_id"),
                            value=self._param(request, "value"),
                            durations=views.BAN_DURATIONS)

    @app.route("/api/bans", methods=["GET"])
    def bans_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, {"items": self._bans()})

    # -- durable queues ---------------------------------------------------------------

    @app.route("/queues", methods=["GET"])
    def queues_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        partial = self._flag(request, "partial")
        return self._render(request, "_queue_rows.html" if partial else "queues.html", auth,
                            nav="queues", q=queue_list(self.broker, self.queue_rates))

    @app.route("/api/queues", methods=["GET"])
    def queues_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, queue_list(self.broker, self.queue_rates))

    def _queue(self, request: Any, browse: bool = True) -> dict[str, Any] | None:
        name = self._param(request, "name")
        if not name:
            raise HTTPError(400, "give name=<queue> ($dlq/<queue> for a dead-letter queue)")
        view = find_queue(self.broker, name)
        if view is None:
            return None
        return queue_detail(self.broker, view, self.queue_rates,
                            self._int(request, "start", 0),
                            self._int(request, "limit", BROWSE_DEFAULT), browse)

    @app.route("/queues/queue", methods=["GET"])
    def queue_page(self, request: Any) -> bytes:
        """The page; ``partial=1`` its figures and groups (live, browsing nothing),
        ``partial=messages`` its first page of messages (live)."""
        auth = self._require(request, api=False)
        messages = self._param(request, "partial") == "messages"
        partial = messages or self._flag(request, "partial")
        detail = self._queue(request, browse=messages or not partial)
        if detail is None and not partial:
            raise HTTPError(404, "no such queue")
        template = ("_queue_messages.html" if messages else
                    "_queue_live.html" if partial else "queue.html")
        return self._render(request, template, auth, nav="queues", qd=detail,
                            name=self._param(request, "name"))

    @app.route("/api/queues/queue", methods=["GET"])
    def queue_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        detail = self._queue(request)
        if detail is None:
            raise HTTPError(404, "no such queue")
        return self._json(request, detail)

    def _queue_message(self, request: Any) -> dict[str, Any]:
        found = message_detail(self.broker, self._param(request, "name"),
                               self._int(request, "offset", -1),
                               self._param(request, "view", "auto"))
        if found is None:
            raise HTTPError(404, "no such message in that queue")
        return found

    @app.route("/queues/message", methods=["GET"])
    def queue_message_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        return self._render(request, "queue_message.html", auth, nav="queues",
                            msg=self._queue_message(request))

    @app.route("/api/queues/message", methods=["GET"])
    def queue_message_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, self._queue_message(request))

    # -- users and access (admins) ---------------------------------------------------

    def _admin(self, request: Any, api: bool) -> Auth:
        auth = self._require(request, api=api)
        if auth.read_only:
            raise HTTPError(403, "users and access rules are for admins")
        return auth

    def _access(self) -> dict[str, Any]:
        acl = self.broker.authorizer
        if not isinstance(acl, AclAuthorizer):
            return {"file": None, "text": "", "rules": 0}
        return {"file": acl.path, "text": acl.loaded_text, "rules": acl.rules.count(),
                "users": sorted(acl.rules.users)}

    def _users_view(self) -> list[dict[str, Any]]:
        return [user_json(u) for u in sorted(self.users.users().values(),
                                            key=lambda u: u.name)]

    @app.route("/users", methods=["GET"])
    def users_page(self, request: Any) -> bytes:
        auth = self._admin(request, api=False)
        return self._render(request, "users.html", auth, nav="users",
                            users=self._users_view(), roles=ROLES, access=self._access(),
                            store=self.users.path)

    @app.route("/api/users", methods=["GET"])
    def users_api(self, request: Any) -> bytes:
        self._admin(request, api=True)
        return self._json(request, {"items": self._users_view(), "access": self._access()})

    def _user_add(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.user_actions.add(
            auth.user, self._param(request, "name"), self._param(request, "role", "client"),
            self._param(request, "password"))

    def _user_passwd(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.user_actions.passwd(
            auth.user, self._param(request, "name"), self._param(request, "password"))

    def _user_role(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.user_actions.set_role(
            auth.user, self._param(request, "name"), self._param(request, "role"))

    def _user_delete(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.user_actions.delete(auth.user, self._param(request, "name"))

    @app.route("/api/", methods=["GET"])
    def api_index(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, api_index(self.app.url_map))

    @app.route("/api/whoami", methods=["GET"])
    def whoami_api(self, request: Any) -> bytes:
        auth = self._require(request, api=True)
        return self._json(request, {
            "user": auth.user, "via": "token" if auth.token else "session",
            "role": auth.role, "read_only": auth.read_only,
            "csrf_token": auth.session.csrf if auth.session is not None else None})

    @app.route("/traffic", methods=["GET"])
    async def traffic_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        view = await self.run_in_thread(self.traffic.view)  # reads files: off the reactor
        return self._render(request, "traffic.html", auth, nav="traffic", t=view)

    @app.route("/api/traffic", methods=["GET"])
    async def traffic_api(self, request: Any) -> bytes:
        self._require(request, api=True)
        return self._json(request, await self.run_in_thread(self.traffic.view))

    # -- live feed ----------------------------------------------------------------

    def _still_allowed(self, auth: Auth) -> Callable[[], bool]:
        """For a long-lived stream: is its login (or token) still good?"""
        def still_allowed() -> bool:
            if auth.token is not None:
                user = self.users.get(auth.user)
                return (user is not None and user.console
                        and self.users.token_exists(auth.user, auth.token.id))
            session = auth.session
            assert session is not None
            live = self.sessions.get(session.id, touch=False)
            return live is not None and self._user_valid(live) is not None
        return still_allowed

    @app.route("/tail", methods=["GET"])
    def tail_page(self, request: Any) -> bytes:
        auth = self._require(request, api=False)
        return self._render(request, "tail.html", auth, nav="tail",
                            filter=self._param(request, "filter", "#") or "#",
                            view=self._param(request, "view", "auto"), modes=TAIL_MODES,
                            per_second=self.tails.per_second,
                            max_payload=self.tails.max_payload)

    @app.route("/api/tail", methods=["GET"])
    def tail_stream(self, request: Any) -> Deferred[None] | bytes:
        auth = self._require(request, api=True)
        topic_filter = self._param(request, "filter", "#") or "#"
        problem = validate_topic_filter(topic_filter)
        if problem is not None:
            raise HTTPError(400, f"invalid topic filter: {problem}")
        mode = self._param(request, "view", "auto")
        if mode not in TAIL_MODES:
            raise HTTPError(400, f"view must be one of {', '.join(TAIL_MODES)}")
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"x-accel-buffering", b"no")
        tail = self.tails.open(request, auth.user, topic_filter, mode,
                               self._still_allowed(auth))
        if isinstance(tail, str):
            request.setHeader(b"content-type", b"application/json; charset=utf-8")
            raise HTTPError(503 if "at most" in tail else 403, tail)
        return tail.done

    @app.route("/api/events", methods=["GET"])
    def events(self, request: Any) -> Deferred[None] | bytes:
        auth = self._require(request, api=True)
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"x-accel-buffering", b"no")
        stream = EventStream(request, self._still_allowed(auth))
        if not self.feed.subscribe(stream):
            raise HTTPError(503, "too many live streams open")
        return stream.done

    # -- actions --------------------------------------------------------------------

    async def _form_action(self, request: Any,
                           act: Callable[[Auth], Awaitable[ActionResult]],
                           default_back: str) -> bytes:
        auth = self._require(request, api=False, write=True)
        assert auth.session is not None
        back = safe_next(self._param(request, "back"), default_back)
        try:
            result = await act(auth)
        except ActionError as e:
            auth.session.flash.append(("error", e.message))
        else:
            auth.session.flash.append(("ok", result.message))
            if result.connection_gone and back.startswith("/client?key="):
                back = "/clients"   # its detail page went with the connection
        raise Redirect(back)

    async def _api_action(self, request: Any,
                          act: Callable[[Auth], Awaitable[ActionResult]]) -> bytes:
        auth = self._require(request, api=True, write=True)
        try:
            result = await act(auth)
        except ActionError as e:
            raise HTTPError(e.status, e.message) from None
        return self._json(request, {"ok": True, "message": result.message, **result.data})

    # Each builder reads its parameters only when called, after _require passed:
    # an anonymous request gets 401/redirect, never a parameter error.
    def _force_will(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.force_will(
            auth.user, self._param(request, "key"), self._flag(request, "keep_connected"))

    def _disconnect(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.disconnect(
            auth.user, self._param(request, "key"), self._flag(request, "with_will"))

    def _debug_client(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.debug_client(
            auth.user, self._param(request, "client_id"), self._int(request, "minutes", 10))

    def _bulk(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.bulk(
            auth.user, self._param(request, "action"), self._list(request, "keys"),
            self._flag(request, "with_will"))

    def _ban(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        def act(auth: Auth) -> Awaitable[ActionResult]:
            raw = self._param(request, "seconds")
            try:
                seconds = float(raw) if raw and raw not in ("0", "forever") else None
            except ValueError:
                raise HTTPError(400, "seconds must be a number (or 0 / forever)") from None
            return self.actions.ban(auth.user, self._param(request, "kind"),
                                    self._param(request, "value"), seconds,
                                    self._param(request, "reason"),
                                    self._flag(request, "disconnect"))
        return act

    def _unban(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.unban(auth.user, self._param(request, "kind"),
                                               self._param(request, "value"))

    def _clear_session(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.clear_session(
            auth.user, self._param(request, "client_id"))

    def _fire_will(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.fire_will(auth.user, self._param(request, "owner"))

    def _discard_will(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.discard_will(auth.user,
                                                      self._param(request, "owner"))

    def _delete_retained(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.delete_retained(auth.user,
                                                         self._param(request, "topic"))

    def _delete_matching(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        def act(auth: Auth) -> Awaitable[ActionResult]:
            raw = self._param(request, "expected")
            expected = self._int(request, "expected", 0) if raw else None
            return self.actions.delete_retained_matching(
                auth.user, self._param(request, "filter"), expected)
        return act

    def _publish(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        def act(auth: Auth) -> Awaitable[ActionResult]:
            draft = {name: self._param(request, name)[:MAX_DRAFT]
                     for name in ("topic", "payload", "encoding", "qos", "retain")}
            if auth.session is not None:
                # The form shows what was typed again, after an error or a success.
                auth.session.drafts["publish"] = draft
            return self.actions.publish(
                auth.user, draft["topic"], self._param(request, "payload"),
                draft["encoding"] or "utf-8", self._int(request, "qos", 0),
                self._flag(request, "retain"))
        return act

    def _queue_purge(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.queue_actions.purge(auth.user, self._param(request, "name"))

    def _queue_delete(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.queue_actions.delete(auth.user, self._param(request, "name"))

    def _queue_requeue(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.queue_actions.requeue(
            auth.user, self._param(request, "name"), self._param(request, "offset"))

    def _queue_retention(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.queue_actions.retention(
            auth.user, self._param(request, "name"), self._param(request, "max_age"),
            self._param(request, "max_bytes"), self._param(request, "max_messages"))

    def _run_report(self, request: Any) -> Callable[[Auth], Awaitable[ActionResult]]:
        return lambda auth: self.actions.run_report(auth.user)

    # Every action is a form POST (answered with a redirect and a flash message) and
    # its JSON twin under /api/, registered together from one row: the path, the
    # builder of the call, and the page a form goes back to by default.
    _ACTION_ROUTES: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("/clients/force-will", "_force_will", "/clients"),
        ("/clients/disconnect", "_disconnect", "/clients"),
        ("/clients/debug", "_debug_client", "/clients"),
        ("/clients/bulk", "_bulk", "/clients"),
        ("/sessions/clear", "_clear_session", "/sessions"),
        ("/wills/fire", "_fire_will", "/wills"),
        ("/wills/discard", "_discard_will", "/wills"),
        ("/retained/delete", "_delete_retained", "/retained"),
        ("/retained/delete-matching", "_delete_matching", "/retained"),
        ("/publish", "_publish", "/publish"),
        ("/bans/add", "_ban", "/bans"),
        ("/bans/remove", "_unban", "/bans"),
        ("/users/add", "_user_add", "/users"),
        ("/users/passwd", "_user_passwd", "/users"),
        ("/users/role", "_user_role", "/users"),
        ("/users/delete", "_user_delete", "/users"),
        ("/traffic/run-report", "_run_report", "/traffic"),
        ("/queues/purge", "_queue_purge", "/queues"),
        ("/queues/delete", "_queue_delete", "/queues"),
        ("/queues/requeue", "_queue_requeue", "/queues"),
        ("/queues/retention", "_queue_retention", "/queues"),
    )
    for _path, _builder, _back in _ACTION_ROUTES:
        app.route(_path, methods=["POST"], endpoint="form:" + _path)(
            _form_route(_builder, _back))
        app.route("/api" + _path, methods=["POST"], endpoint="api:" + _path)(
            _api_route(_builder))
    del _path, _builder, _back

