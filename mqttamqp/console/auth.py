"""Console authentication: the first admin and login sessions (the throttle that
slows down password guessing is ``mqttamqp.console.throttle``).

Users, roles, password hashing and API tokens are the broker's one user store
(``mqttamqp.security.userstore``): only users with the ``admin`` or
``read-only`` role may log in.  A new password takes effect (and logs out the
user's open sessions) without a restart.

Login sessions are in memory (a broker restart logs everyone out) and bounded.
This module does no HTTP; ``mqttamqp.console.web`` maps it onto cookies and headers.
"""

from __future__ import annotations

import os
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from mqttamqp.security.userstore import ROLE_ADMIN, UserStore, write_private

__all__ = [
    "INITIAL_PASSWORD_FILE", "forget_initial_password", "LoginSession", "SessionStore",
    "ensure_first_admin",
]

INITIAL_PASSWORD_FILE = "admin-password.txt"


def forget_initial_password(data_dir: str, user: str) -> None:
    """``user``'s password changed: the generated first password in
    ``DATA/admin-password.txt`` (if it is that user's) is no longer valid, so the
    file goes rather than lie around (whoever changed it: the console or the CLI)."""
    initial = os.path.join(data_dir, INITIAL_PASSWORD_FILE)
    try:
        with open(initial, encoding="utf-8") as f:
            if f.readline().strip() == f"user: {user}":
                os.unlink(initial)
    except (FileNotFoundError, UnicodeDecodeError):
        pass


def ensure_first_admin(store: UserStore, name: str = "admin",
                       **cost: int) -> tuple[str, str, str] | None:
    """With no admin at all, create ``name`` (an admin) with a random password; a
    ``name`` taken by a user of another role gets a suffix.

    The password goes only to a 0600 file in the data directory (never to the log),
    written before the user exists, so no start can leave an admin whose password
    nobody was given.  Returns (user name, password, path of that file), or None if
    admins exist.
    """
    if store.admins():
        return None
    if store.get(name) is not None:
        name = f"{name}-{secrets.token_hex(2)}"
    password = secrets.token_urlsafe(15)
    path = os.path.join(store.data_dir, INITIAL_PASSWORD_FILE)
    write_private(path, f"user: {name}\npassword: {password}\n")
    store.set_password(name, password, role=ROLE_ADMIN, **cost)
    return name, password, path


# -- login sessions -------------------------------------------------------------


@dataclass
class LoginSession:
    """A browser's session: anonymous (only a CSRF token for the login form) or logged in."""

    id: str
    csrf: str
    created: float
    last_active: float
    user: str | None = None
    password_changed: float = 0.0   # the user's ``changed`` at login
    flash: list[tuple[str, str]] = field(default_factory=list)  # (kind, text) to show once
    drafts: dict[str, dict[str, str]] = field(default_factory=dict)  # form -> what was typed


class SessionStore:
    """Bounded in-memory sessions with idle and absolute expiry.

    Anonymous (pre-login) sessions are kept apart with their own bound, so a flood
    of login-page visits can never push out a logged-in operator.
    """

    def __init__(self, clock: Callable[[], float], idle_timeout: float = 30 * 60,
                 max_age: float = 12 * 3600, anonymous_timeout: float = 15 * 60,
                 max_sessions: int = 1000, max_anonymous: int = 1000) -> None:
        self.clock = clock
        self.idle_timeout = idle_timeout
        self.max_age = max_age
        self.anonymous_timeout = anonymous_timeout
        self.max_sessions = max_sessions
        self.max_anonymous = max_anonymous
        self._users: OrderedDict[str, LoginSession] = OrderedDict()
        self._anonymous: OrderedDict[str, LoginSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._users) + len(self._anonymous)

    def _new(self, table: OrderedDict[str, LoginSession], bound: int, user: str | None,
             password_changed: float) -> LoginSession:
        now = self.clock()
        self.prune()
        while len(table) >= bound:
            table.popitem(last=False)
        session = LoginSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now, now,
                               user, password_changed)
        table[session.id] = session
        return session

    def anonymous(self) -> LoginSession:
        return self._new(self._anonymous, self.max_anonymous, None, 0.0)

    def login(self, old_id: str | None, user: str, password_changed: float) -> LoginSession:
        """A fresh session id for ``user``; the pre-login id is discarded (no fixation)."""
        if old_id is not None:
            self.end(old_id)
        return self._new(self._users, self.max_sessions, user, password_changed)

    def get(self, session_id: str | None, touch: bool = True) -> LoginSession | None:
        """The live session with this id, or None (an expired one is removed).

        ``touch`` counts the request as activity (background refreshes do not)."""
        if not session_id:
            return None
        table = self._users if session_id in self._users else self._anonymous
        session = table.get(session_id)
        if session is None:
            return None
        now = self.clock()
        if self._expired(session, now):
            del table[session_id]
            return None
        if touch:
            session.last_active = now
            table.move_to_end(session_id)
        return session

    def _expired(self, session: LoginSession, now: float) -> bool:
        if session.user is None:
            return now - session.created > self.anonymous_timeout
        return (now - session.last_active > self.idle_timeout
                or now - session.created > self.max_age)

    def end(self, session_id: str) -> None:
        self._users.pop(session_id, None)
        self._anonymous.pop(session_id, None)

    def end_user(self, user: str) -> None:
        for sid in [sid for sid, s in self._users.items() if s.user == user]:
            del self._users[sid]

    def prune(self) -> None:
        now = self.clock()
        for table in (self._users, self._anonymous):
            for sid in [sid for sid, s in table.items() if self._expired(s, now)]:
                del table[sid]
