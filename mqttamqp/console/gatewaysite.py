"""The console of a gateway (``--web`` in gateway mode): the login of the broker's
console and the gateway's own pages (``apps.gateway``), under the same layout,
static files, security headers and error answers, and none of the broker's pages.

What it owns: the root Klein app of a gateway console (``GatewayConsole``), its
``Site`` and the small service that creates the first admin user at start, as the
broker's console does (``make_gateway_site``).  What it must not do: import the
core's broker, the gateway or the store: the figures come in as an object
(``apps.gateway.GatewaySource``), the users from the user store of ``--data``.
"""

from __future__ import annotations

import os
from typing import Any

from klein import Klein
from twisted.application import service as app_service
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.resource import Resource
from twisted.web.server import Request, Site
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mqttamqp.console import shell
from mqttamqp.console.apps.gateway import GatewayApp, GatewaySource
from mqttamqp.console.apps.login import LoginApp
from mqttamqp.console.auth import SessionStore, ensure_first_admin
from mqttamqp.console.context import RunInThread
from mqttamqp.console.rendering import make_environment, static_dir
from mqttamqp.console.web import Gate, HTTPError, Pages, Redirect, SecureHeaders
from mqttamqp.security.userstore import UserStore

__all__ = ["GatewayConsole", "make_gateway_site"]

class GatewayConsole:
    """The gateway's console as one Klein resource (``resource()``)."""

    app = Klein()

    def __init__(self, source: GatewaySource, users: UserStore, clock: Any,
                 run_in_thread: RunInThread | None = None,
                 idle_timeout: float = 30 * 60) -> None:
        self.users = users
        self.clock = clock
        self.gate = Gate(users, SessionStore(clock.seconds, idle_timeout=idle_timeout))
        self.pages = Pages(make_environment(clock.seconds))
        self.static = static_dir()
        if run_in_thread is None:
            run_in_thread = shell.thread_pool_runner(clock)
        self.login = LoginApp(self.gate, self.pages, clock, run_in_thread)
        self.gateway = GatewayApp(self.gate, self.pages, source)

    def resource(self) -> Resource:
        return SecureHeaders(self.app.resource())

    @app.handle_errors(HTTPError)
    def _http_error(self, request: Request, failure: Failure) -> bytes:
        return shell.http_error(self.pages, self.gate, request, failure)

    @app.handle_errors(Redirect)
    def _redirect(self, request: Request, failure: Failure) -> bytes:
        return shell.redirect(request, failure)

    @app.handle_errors(NotFound, MethodNotAllowed)
    def _not_found(self, request: Request, failure: Failure) -> bytes:
        return shell.not_found(self.pages, self.gate, request, failure)

    @app.route("/static/<name>", methods=["GET"])
    def static_file(self, request: Request, name: str) -> bytes:
        return shell.static_file(self.static, request, name)


for _attribute, _area in (("login", LoginApp), ("gateway", GatewayApp)):
    shell.mount(GatewayConsole.app, _attribute, _area)
del _attribute, _area


class _FirstAdmin(app_service.Service):
    """At start, the first admin user if there is none (its password in a 0600 file
    of the data directory, as on a broker)."""

    log = Logger(namespace="mqttamqp.console")

    def __init__(self, users: UserStore) -> None:
        self.users = users

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        # (a gateway opens no store: its --data may not exist yet)
        os.makedirs(self.users.data_dir, mode=0o700, exist_ok=True)
        created = ensure_first_admin(self.users)
        if created is not None:
            name, _, path = created
            self.log.warn("console: created the first admin user {u!r}; its password is in "
                          "{path} (readable by this user only); change it with: "
                          "mqttamqp-admin user passwd --data {d} {u}", u=name, path=path,
                          d=os.path.dirname(path))


class _QuietSite(Site):
    """No access log (logins, refusals and errors are logged by the console)."""

    def log(self, request: http.Request) -> None:
        pass


def make_gateway_site(source: GatewaySource, data_dir: str, clock: Any,
                      parent: app_service.MultiService | None = None) -> Site:
    """The gateway console's ``Site``; under ``parent``, the first admin is created at
    start."""
    users = UserStore(os.path.abspath(data_dir))
    console = GatewayConsole(source, users, clock)
    site = _QuietSite(console.resource())  # type: ignore[no-untyped-call]
    site.displayTracebacks = False
    site.console = console  # type: ignore[attr-defined]
    if parent is not None:
        _FirstAdmin(users).setServiceParent(parent)  # type: ignore[no-untyped-call]
    return site
