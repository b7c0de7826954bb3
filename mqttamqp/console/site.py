"""Entry point for the broker service: ``make_site(service)`` builds the console.

It creates the ``Console`` (routes, auth, live feed) for the broker service and
returns the ``twisted.web.server.Site`` the service listens with.  A small child
service ties the console to the broker's life: at start it creates the first
admin user if there is none (the password goes only to a 0600 file in the data
directory; the log says where) and starts the live feed; at stop it ends the live
streams so shutdown does not wait on open browser tabs.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.application import service as app_service
from twisted.logger import Logger
from twisted.web import http
from twisted.web.server import Site

from mqttamqp.console.app import Console
from mqttamqp.console.auth import ensure_first_admin
from mqttamqp.console.context import ConsoleContext

__all__ = ["make_site", "ConsoleService"]


class ConsoleService(app_service.Service):
    log = Logger(namespace="mqttamqp.console")

    def __init__(self, console: Console) -> None:
        self.console = console

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        created = ensure_first_admin(self.console.users)
        if created is not None:
            # Where the password is, never the password: logs are copied, shipped
            # and kept far more widely than a 0600 file.
            name, _, path = created
            data_dir = os.path.dirname(path)
            self.log.warn(
                "console: created the first admin user {u!r}; its password is in {path} "
                "(readable by this user only); change it with: "
                "mqttamqp-admin user passwd --data {d} {u}", u=name, path=path, d=data_dir)
        self.console.start()

    def stopService(self) -> None:
        self.console.stop()
        super().stopService()  # type: ignore[no-untyped-call]


class _ConsoleSite(Site):
    """No access log: the live feed would log a line a second per open tab.  Logins,
    refusals and every action are logged by the console itself."""

    def log(self, request: http.Request) -> None:
        pass


def make_site(service: Any) -> Site:
    """The console's ``Site`` for ``service`` (a ``BrokerService``)."""
    console = Console(ConsoleContext.of(service))
    site = _ConsoleSite(console.resource())  # type: ignore[no-untyped-call]
    site.displayTracebacks = False
    site.console = console  # type: ignore[attr-defined]
    if isinstance(service, app_service.MultiService):
        ConsoleService(console).setServiceParent(service)  # type: ignore[no-untyped-call]
    return site
