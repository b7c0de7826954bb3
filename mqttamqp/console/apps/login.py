"""Logging in and out: the login form, the password check (off the reactor, paced
by the ``LoginThrottle``) and the logout button.  The rules of who may use the
console are in ``mqttamqp.console.web.Gate``; this app only opens and ends login
sessions.
"""

from __future__ import annotations

import hmac
from typing import Any

from klein import Klein
from twisted.internet.defer import CancelledError
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.web.server import Request

from mqttamqp.console.context import RunInThread
from mqttamqp.console.throttle import LoginThrottle
from mqttamqp.console.web import CSRF_FIELD, Area, Gate, Pages, Redirect, param, safe_next

__all__ = ["LoginApp"]


class LoginApp(Area):
    app = Klein()
    log = Logger(namespace="mqttamqp.console")

    def __init__(self, gate: Gate, pages: Pages, clock: Any,
                 run_in_thread: RunInThread) -> None:
        super().__init__(gate, pages)
        self.clock = clock
        self.run_in_thread = run_in_thread
        self.throttle = LoginThrottle(clock.seconds)

    def _login_form(self, request: Request, status: int = 200, error: str = "",
                    username: str = "") -> bytes:
        session = self.gate.cookie_session(request, touch=False)
        if session is None or session.user is not None:
            session = self.gate.sessions.anonymous()
            self.gate.set_cookie(request, session.id)
        return self.pages.render(request, "login.html", None, status,
                                 login_csrf=session.csrf, error=error, username=username,
                                 next=safe_next(param(request, "next")))

    @app.route("/login", methods=["GET"])
    def login_page(self, request: Request) -> bytes:
        if self.gate.authenticate(request, False) is not None:
            raise Redirect(safe_next(param(request, "next")))
        return self._login_form(request)

    @app.route("/login", methods=["POST"])
    async def login_submit(self, request: Request) -> bytes:
        session = self.gate.cookie_session(request, touch=False)
        given = param(request, CSRF_FIELD)
        if session is None or session.user is not None or not given or \
                not hmac.compare_digest(given.encode(), session.csrf.encode()):
            return self._login_form(request, 403, "The login form expired. Please try again.")
        name = param(request, "username").strip()
        password = param(request, "password")
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
            user = await self.run_in_thread(self.gate.users.check_password, name, password)
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
        fresh = self.gate.sessions.login(session.id, user.name, user.changed)
        self.gate.set_cookie(request, fresh.id)
        self.log.info("console: {name!r} logged in from {a}", name=user.name, a=address)
        raise Redirect(safe_next(param(request, "next")))

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
    def logout(self, request: Request) -> bytes:
        auth = self.gate.require(request, api=False, write=True, any_role=True)
        assert auth.session is not None
        self.gate.sessions.end(auth.session.id)
        self.gate.set_cookie(request, "", clear=True)
        self.log.info("console: {name!r} logged out", name=auth.user)
        raise Redirect("/login")
