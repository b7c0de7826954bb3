"""Listening on the broker's endpoints: one ``ListenerService`` per listener
description, which binds when the broker starts, logs the address it got (and
whether it is reachable from other machines) and stops listening at shutdown."""

from __future__ import annotations

from typing import Any

from twisted.application import service
from twisted.internet.defer import Deferred
from twisted.internet.error import CannotListenError
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.core.auth import loopback_host
from mqttamqp.net.accept import AcceptRefusals, watch_accept_errors
from mqttamqp.net.tcp import lean_port
from mqttamqp.net.tls import TLSSettings, server_endpoint
from mqttamqp.optiontable import DEFAULT_LISTENERS

__all__ = ["LISTEN_BACKLOG", "ListenerService", "with_backlog"]

# Connections the kernel queues before the broker accepts them, for a tcp:/ssl:
# listener whose description names no ``backlog=`` (the kernel caps it at
# net.core.somaxconn).  Twisted's default is 50: in a reconnect storm (a takeover,
# a network coming back) the queue overflows, the kernel drops the SYNs past it, and
# each of those clients waits for its TCP retransmission, a second and then more.
LISTEN_BACKLOG = 1024

_BACKLOG_KINDS = ("tcp:", "tcp6:", "ssl:")


def with_backlog(description: str) -> str:
    """``description`` with ``:backlog=LISTEN_BACKLOG`` unless it names one (or is
    not a tcp:, tcp6: or ssl: listener)."""
    lowered = description.strip().lower()
    if not lowered.startswith(_BACKLOG_KINDS) or "backlog=" in lowered:
        return description
    return f"{description.rstrip()}:backlog={LISTEN_BACKLOG}"


class ListenerService(service.Service):
    """Listens on one endpoint description and logs the address it got.

    The log line ``listening for KIND on HOST:PORT`` is what operators (and the
    tests, which listen on port 0) read to find the bound port.
    """

    log = Logger()

    def __init__(self, kind: str, description: str, factory: Any, reactor: Any,
                 access: str = "users") -> None:
        self.kind = kind
        self.description = description
        self.factory = factory
        self.reactor = reactor
        # Who may connect: "users" (a user store), "loopback" (no users: loopback
        # clients only), "anyone" (no users, --allow-anonymous) or "open" (no login
        # at all: the metrics listener).
        self.access = access
        self.port: Any = None
        self.address = ""
        self.tls: TLSSettings | None = None   # client certificates on an ssl: listener
        # Connections it cannot accept (out of descriptors): counted, one line a spell.
        self.refusals: AcceptRefusals | None = None

    def listen(self) -> Deferred[Any]:
        """Bind the endpoint (``BrokerService`` does this for every listener before
        it starts anything else).  For TCP, SSL and UNIX endpoints the Deferred has
        fired when this returns; failures are the caller's to handle."""
        endpoint = server_endpoint(self.reactor, with_backlog(self.description), self.tls)
        d: Deferred[Any] = endpoint.listen(self.factory)

        def bound(port: Any) -> Any:
            self.port = port
            if self.kind == "MQTT":
                lean_port(port)   # (lighter transports for many idle clients)
            refusals = self.refusals
            if refusals is not None:
                kind = self.kind
                watch_accept_errors(port, lambda error: refusals.refused(kind, error))
            if self.running:  # bound after the service started (an asynchronous endpoint)
                self._listening(port)
            return port

        return d.addCallback(bound)

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        if self.port is not None:
            self._listening(self.port)

    def failure_reason(self, failure: Failure) -> str:
        """One line: why this listener could not be bound."""
        e = failure.value
        if isinstance(e, CannotListenError):
            error = e.socketError
            why = getattr(error, "strerror", None) or str(error)
            return (f"cannot listen for {self.kind} on {self.description} "
                    f"({e.interface or '*'}:{e.port}): {why}")
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        return f"cannot listen for {self.kind} on {self.description}: {reason}"

    def close_now(self) -> None:
        """Stop listening without waiting for the reactor (start-up failed)."""
        port, self.port = self.port, None
        if port is None:
            return
        port.stopListening()  # the socket is closed on the reactor's next turn or at exit

    def _listening(self, port: Any) -> None:
        self.port = port
        host = port.getHost()
        self.address = f"{getattr(host, 'host', '?')}:{getattr(host, 'port', '?')}"
        self.log.info("listening for {kind} on {address}", kind=self.kind, address=self.address)
        address = getattr(host, "host", "")
        if not address or loopback_host(address):   # no host: a UNIX socket
            if self.description in DEFAULT_LISTENERS.values():
                self.log.info("{kind} is on loopback only (the default): give a listener "
                              "such as --{opt} {d} to accept other machines, with --users",
                              kind=self.kind, opt=self.kind.lower(),
                              d=self.description.split(":interface=")[0])
        elif self.access == "open":
            self.log.warn("{kind} listens on {address}, beyond loopback: its pages need no "
                          "login (keep it on a private network, or use "
                          "--metrics-token-file and the console)", kind=self.kind,
                          address=self.address)
        elif self.access == "anyone":
            self.log.warn("{kind} listens on {address}, beyond loopback, and no users are "
                          "configured: anyone who can reach it may connect (give --users "
                          "FILE)", kind=self.kind, address=self.address)
        elif self.access == "loopback":
            self.log.warn("{kind} listens on {address}, beyond loopback, but no users are "
                          "configured, so only clients on this machine are accepted: give "
                          "--users FILE (or --allow-anonymous to accept anyone)",
                          kind=self.kind, address=self.address)

    def stopService(self) -> Deferred[None] | None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self.port is not None:
            port, self.port = self.port, None
            return port.stopListening()  # type: ignore[no-any-return]
        return None
