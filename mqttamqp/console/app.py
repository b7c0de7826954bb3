"""The console's root Klein app: it builds what every area shares (the ``Gate``,
the ``Pages``, the audited ``ConsoleActions``), makes one Klein app per area
(``mqttamqp.console.apps``), mounts their routes on its own, serves the static
files, and turns what a route raises into an answer (JSON under ``/api/``, an
error page elsewhere).

Routes are bound to instances; the broker's context, clock, users file and thread
runner are injected, so tests drive the console with ``treq.testing.StubTreq``, a
``task.Clock`` and a synchronous thread runner.  The security rules are in
``mqttamqp.console.web``; what a page shows comes from ``mqttamqp.console.views``
(the same dicts the API returns); what a button does is in
``mqttamqp.console.actions``.
"""

from __future__ import annotations

import os
from typing import Any

from klein import Klein
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Request
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mqttamqp.console import shell
from mqttamqp.console.actions import ConsoleActions
from mqttamqp.console.apps.api import ApiApp
from mqttamqp.console.apps.bridges import BridgesApp, no_bridges
from mqttamqp.console.apps.clients import ClientsApp
from mqttamqp.console.apps.exchanges import ExchangesApp
from mqttamqp.console.apps.login import LoginApp
from mqttamqp.console.apps.messages import MessagesApp
from mqttamqp.console.apps.overview import OverviewApp
from mqttamqp.console.apps.queues import QueuesApp
from mqttamqp.console.apps.retained import RetainedApp
from mqttamqp.console.apps.sessions import SessionsApp
from mqttamqp.console.apps.topics import TopicsApp
from mqttamqp.console.apps.traffic import TrafficApp
from mqttamqp.console.apps.users import UsersApp
from mqttamqp.console.auth import SessionStore
from mqttamqp.console.context import ConsoleContext, RunInThread
from mqttamqp.console.rendering import make_environment, static_dir
from mqttamqp.console.traffic import TrafficSource
from mqttamqp.console.web import Area, Gate, HTTPError, Pages, Redirect, SecureHeaders
from mqttamqp.core.broker import Broker
from mqttamqp.security.userstore import UserStore

__all__ = ["Console", "AREAS"]

class Console:
    """The whole console as one Klein resource (``resource()``): the areas' apps over
    one gate and one set of pages, the user store as ``users``."""

    app = Klein()

    def __init__(self, context: ConsoleContext, clock: Any = None,
                 run_in_thread: RunInThread | None = None,
                 users: UserStore | None = None, idle_timeout: float = 30 * 60) -> None:
        self.context = context
        self.broker: Broker = context.broker
        self.clock = clock if clock is not None else context.clock
        self.users = users if users is not None else UserStore(context.data_dir)
        self.gate = Gate(self.users, SessionStore(self.clock.seconds,
                                                  idle_timeout=idle_timeout))
        ha = context.ha
        if ha is not None:
            self.gate.read_only_because = lambda: (
                "" if ha()["role"] == "leader" else
                f"this broker is the {ha()['role']} (--ha): it does not serve, and its "
                "console is read-only")
        self.pages = Pages(make_environment(self.clock.seconds))
        self.static = static_dir()
        if run_in_thread is None:
            run_in_thread = shell.thread_pool_runner(self.clock)
        self.actions = ConsoleActions(self.broker, context.report_job)
        gate, pages, broker, clock = self.gate, self.pages, self.broker, self.clock
        # One app per area, each as the attribute AREAS mounts it from.
        self.login = LoginApp(gate, pages, clock, run_in_thread)
        self.overview = OverviewApp(gate, pages, context, clock)
        self.clients = ClientsApp(gate, pages, broker, self.actions, clock)
        self.sessions = SessionsApp(gate, pages, broker, self.actions)
        self.retained = RetainedApp(gate, pages, broker, self.actions)
        self.topics = TopicsApp(gate, pages, broker, clock)
        self.messages = MessagesApp(gate, pages, broker, self.actions, clock)
        self.queues = QueuesApp(gate, pages, broker, self.actions.audit, clock)
        self.exchanges = ExchangesApp(gate, pages, broker, self.actions.audit)
        self.bridges = BridgesApp(gate, pages, context.bridges or no_bridges)
        # The Users page (``users`` is the user store itself).
        self.accounts = UsersApp(gate, pages, broker, self.actions.audit, run_in_thread)
        report_dir = context.report_dir or os.path.join(context.data_dir, "report")
        self.traffic = TrafficApp(gate, pages, TrafficSource(
            report_dir, context.archive_dir, clock.seconds,
            broker.recorder.stats if context.archive_dir is not None else None,
            job=context.report_job), self.actions, run_in_thread)
        self.api = ApiApp(gate, pages, lambda: self.app.url_map)

    def resource(self) -> Resource:
        return SecureHeaders(self.app.resource())

    def start(self) -> None:
        """The live feed starts sampling the broker's counters."""
        self.overview.feed.start()

    def stop(self) -> None:
        """End every live stream (shutdown must not wait on open browser tabs)."""
        self.overview.feed.stop()
        self.messages.tails.stop()

    # -- errors --------------------------------------------------------------------------

    @app.handle_errors(HTTPError)
    def _http_error(self, request: Request, failure: Failure) -> bytes:
        return shell.http_error(self.pages, self.gate, request, failure)

    @app.handle_errors(Redirect)
    def _redirect(self, request: Request, failure: Failure) -> bytes:
        return shell.redirect(request, failure)

    @app.handle_errors(NotFound, MethodNotAllowed)
    def _not_found(self, request: Request, failure: Failure) -> bytes:
        return shell.not_found(self.pages, self.gate, request, failure)

    # -- static files -------------------------------------------------------------------

    @app.route("/static/<name>", methods=["GET"])
    def static_file(self, request: Request, name: str) -> bytes:
        return shell.static_file(self.static, request, name)

    @app.route("/favicon.ico", methods=["GET"])
    def favicon(self, request: Request) -> bytes:
        request.setResponseCode(204)
        return b""


AREAS: tuple[tuple[str, type[Area]], ...] = (
    ("login", LoginApp), ("overview", OverviewApp), ("clients", ClientsApp),
    ("sessions", SessionsApp), ("retained", RetainedApp), ("topics", TopicsApp),
    ("messages", MessagesApp), ("queues", QueuesApp), ("exchanges", ExchangesApp),
    ("bridges", BridgesApp),
    ("accounts", UsersApp),
    ("traffic", TrafficApp), ("api", ApiApp),
)
for _attribute, _area in AREAS:
    shell.mount(Console.app, _attribute, _area)
del _attribute, _area
