"""The console's Users page: the user store's commands, for admins, audited.

The same store and rules as ``mqttamqp-admin user ...`` (``mqttamqp.security.userstore``):
names of letters, digits and ``._-@``, passwords of at least 8 characters, roles
admin / read-only / client.  Two rules the command line does not need: an admin
cannot delete or demote themself (the console would lock them out mid-action),
and the last admin cannot be deleted or demoted.  Hashing is slow on purpose and
runs in the thread pool.  Passwords are never logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred

from mqttamqp.console.actions import ActionError, ActionResult
from mqttamqp.console.auth import forget_initial_password
from mqttamqp.security.userstore import ROLE_ADMIN, ROLES, User, UserStore, valid_username

__all__ = ["UserActions", "MIN_PASSWORD", "user_json"]

MIN_PASSWORD = 8


def user_json(user: User) -> dict[str, Any]:
    """What the page and ``/api/users`` show of a user (never its hash)."""
    return {"name": user.name, "role": user.role, "password_changed": user.changed,
            "tokens": len(user.tokens), "console": user.console}


class UserActions:
    def __init__(self, store: UserStore, audit: Callable[..., None],
                 run_in_thread: Callable[..., Deferred[Any]]) -> None:
        self.store = store
        self.audit = audit
        self.run_in_thread = run_in_thread

    def _name(self, name: str) -> str:
        if not valid_username(name):
            raise ActionError(400, f"invalid user name {name[:64]!r}: use 1-64 letters, "
                              "digits and ._-@")
        return name

    def _role(self, role: str) -> str:
        if role not in ROLES:
            raise ActionError(400, f"the role must be one of {', '.join(ROLES)}")
        return role

    def _password(self, password: str) -> str:
        if len(password) < MIN_PASSWORD:
            raise ActionError(400, f"the password must have at least {MIN_PASSWORD} "
                              "characters")
        return password

    def _keeps_an_admin(self, admin: str, name: str, what: str) -> None:
        if name == admin:
            raise ActionError(400, f"you cannot {what} yourself here (use mqttamqp-admin, or "
                              "ask another admin)")
        admins = [u.name for u in self.store.admins()]
        if admins == [name]:
            raise ActionError(400, f"{name!r} is the last admin")

    async def add(self, admin: str, name: str, role: str, password: str) -> ActionResult:
        name, role = self._name(name), self._role(role)
        password = self._password(password)
        if self.store.get(name) is not None:
            raise ActionError(409, f"user {name!r} exists")
        await self.run_in_thread(self.store.set_password, name, password, role)
        self.audit(admin, "user_add", "created", name=name, role=role)
        return ActionResult(f"Created user {name} ({role}).", {"created": True})

    async def passwd(self, admin: str, name: str, password: str) -> ActionResult:
        name = self._name(name)
        password = self._password(password)
        if self.store.get(name) is None:
            raise ActionError(404, f"no user {name!r}")
        await self.run_in_thread(self.store.set_password, name, password)
        await self.run_in_thread(forget_initial_password, self.store.data_dir, name)
        self.audit(admin, "user_passwd", "password changed", name=name)
        return ActionResult(f"Changed the password of {name}.", {"changed": True})

    async def set_role(self, admin: str, name: str, role: str) -> ActionResult:
        name, role = self._name(name), self._role(role)
        user = self.store.get(name)
        if user is None:
            raise ActionError(404, f"no user {name!r}")
        if user.role == ROLE_ADMIN and role != ROLE_ADMIN:
            self._keeps_an_admin(admin, name, "demote")
        await self.run_in_thread(self.store.set_role, name, role)   # (writes a file)
        self.audit(admin, "user_role", f"role {role}", name=name)
        return ActionResult(f"{name} is now {role}.", {"role": role})

    async def delete(self, admin: str, name: str) -> ActionResult:
        name = self._name(name)
        user = self.store.get(name)
        if user is None:
            raise ActionError(404, f"no user {name!r}")
        if user.role == ROLE_ADMIN:
            self._keeps_an_admin(admin, name, "delete")
        await self.run_in_thread(self.store.delete_user, name)
        self.audit(admin, "user_delete", "deleted", name=name)
        return ActionResult(f"Deleted user {name}.", {"deleted": True})
