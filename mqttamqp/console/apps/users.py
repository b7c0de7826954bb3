"""Users and access, for admins only: the user store's users with their roles
(never their hashes), the ``--acl`` file in force, and adding a user, changing a
password or a role, deleting a user (``mqttamqp.console.useractions``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.web.server import Request

from mqttamqp.console.context import RunInThread
from mqttamqp.console.useractions import UserActions, user_json
from mqttamqp.console.web import (
    ActionCall,
    Area,
    Auth,
    Gate,
    HTTPError,
    Pages,
    action_routes,
    param,
)
from mqttamqp.core.broker import Broker
from mqttamqp.security.acl import AclAuthorizer
from mqttamqp.security.userstore import ROLES

__all__ = ["UsersApp"]


class UsersApp(Area):
    app = Klein()

    def __init__(self, gate: Gate, pages: Pages, broker: Broker, audit: Callable[..., None],
                 run_in_thread: RunInThread) -> None:
        super().__init__(gate, pages)
        self.broker = broker
        self.users = gate.users
        self.actions = UserActions(self.users, audit, run_in_thread)

    def _admin(self, request: Request, api: bool) -> Auth:
        auth = self.gate.require(request, api=api)
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
    def users_page(self, request: Request) -> bytes:
        auth = self._admin(request, api=False)
        return self.pages.render(request, "users.html", auth, nav="users",
                                 users=self._users_view(), roles=ROLES,
                                 access=self._access(), store=self.users.path)

    @app.route("/api/users", methods=["GET"])
    def users_api(self, request: Request) -> bytes:
        self._admin(request, api=True)
        return self.pages.json(request, {"items": self._users_view(),
                                         "access": self._access()})

    # -- actions ------------------------------------------------------------------------

    def _add(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.add(
            auth.user, param(request, "name"), param(request, "role", "client"),
            param(request, "password"))

    def _passwd(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.passwd(
            auth.user, param(request, "name"), param(request, "password"))

    def _role(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.set_role(
            auth.user, param(request, "name"), param(request, "role"))

    def _delete(self, request: Request) -> ActionCall:
        return lambda auth: self.actions.delete(auth.user, param(request, "name"))

    action_routes(app, (
        ("/users/add", _add, "/users"),
        ("/users/passwd", _passwd, "/users"),
        ("/users/role", _role, "/users"),
        ("/users/delete", _delete, "/users"),
    ))
