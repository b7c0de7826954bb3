"""The broker's ``Authenticator`` over the user store (``userstore.UserStore``) and,
read-only, a legacy ``--users`` file: MQTT CONNECT and AMQP SASL PLAIN.

Asked once per MQTT CONNECT, so it is compiled (setup.py ``COMPILED``): an anonymous
client's answer (the loopback rule) was four interpreted frames a connect in
``userstore.py``.  Passwords are checked off the reactor thread (a thread pool);
what this module must not do: log or keep a password, or block the reactor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.auth import Credentials, loopback_peer
from mqttamqp.security.users import defer_to_thread, logged_verdict
from mqttamqp.security.userstore import User, UserStore, dummy_hash, verify_password

__all__ = ["StoreAuthenticator"]


class StoreAuthenticator:
    """The broker's ``Authenticator``: the user store (and, read-only, a legacy
    ``--users`` file) for MQTT CONNECT and AMQP SASL PLAIN.

    Anonymous clients (no user name) are accepted from anywhere with
    ``--allow-anonymous``; otherwise from loopback only, and only while no client
    users exist (the store has no ``client`` role and there is no ``--users`` file),
    as Mosquitto 2 does without a password file.

    A client that names a user of the store must give its password.  While no
    client users exist, a user name the store does not know is a label, not a
    credential (the client is anonymous as above; ACL rules for that name match
    it): this keeps a broker without users working for clients that send a name.
    """

    log: ClassVar[Logger] = Logger(namespace="mqttamqp.users")

    def __init__(self, store: UserStore, anywhere: bool = False, legacy: Any = None,
                 reactor: Any = None,
                 run_in_thread: Callable[..., Deferred[Any]] | None = None) -> None:
        self.store = store
        self.anywhere = anywhere
        self.legacy = legacy            # core.users.UserFile or None
        self._defer = run_in_thread or defer_to_thread(reactor)
        # The store's users as seen this reactor turn (None: look again).  A connect
        # storm stat'ed users.json for every CONNECT; now once a turn.  Every CONNECT
        # handled in a turn had arrived before the turn's first look, so a change
        # made before a client connected still applies to it.  (Reactor thread
        # only; without a reactor, every call looks.)
        self._call_later: Callable[..., Any] | None = getattr(reactor, "callLater", None)
        # Changes made in this process (the console) apply at once all the same.
        self._this_turn: tuple[dict[str, User], bool] | None = None
        self._writes = -1

    def _users(self) -> tuple[dict[str, User], bool]:
        """The store's users, and whether any is a client (see ``_this_turn``)."""
        seen = self._this_turn
        if seen is None or self._writes != self.store.writes:
            seen = self.store.users_and_clients()
            if self._call_later is not None:
                if self._this_turn is None:
                    self._call_later(0, self._next_turn)
                self._this_turn = seen
                self._writes = self.store.writes
        return seen

    def _next_turn(self) -> None:
        self._this_turn = None

    # -- the anonymous rule -------------------------------------------------------

    def has_clients(self) -> bool:
        return self.legacy is not None or self._users()[1]

    @property
    def allows_anonymous(self) -> bool:
        return self.anywhere or not self.has_clients()

    def anonymous_from(self, peer: str) -> bool:
        return self.anywhere or (not self.has_clients() and loopback_peer(peer))

    # -- checking -----------------------------------------------------------------

    def authenticate(self, credentials: Credentials) -> bool | Deferred[bool]:
        name = credentials.username
        if name is None:
            return self.anonymous_from(credentials.peer)  # (the protocol logs a refusal)
        user = self._users()[0].get(name)
        if user is not None:
            d = self._defer(self.store.check_password, name, credentials.password or b"")
            d.addCallback(lambda found: found is not None)
        elif self.legacy is not None and self._legacy_knows(name):
            legacy_result: bool | Deferred[bool] = self.legacy.authenticate(credentials)
            return legacy_result   # UserFile logs its own refusals
        elif not self.has_clients():
            return self.anonymous_from(credentials.peer)
        else:
            # (dummy_hash() in the thread too: its first call hashes, and may wait
            # for one of the HASH_SLOTS; the reactor must not)
            d = self._defer(lambda pw: verify_password(pw, dummy_hash()),
                            credentials.password or b"")
            d.addCallback(lambda _: False)
        d.addCallback(logged_verdict, self.log, credentials)
        result: Deferred[bool] = d
        return result

    def _legacy_knows(self, name: str) -> bool:
        self.legacy.reload()
        return name in self.legacy.users

