"""Connections a listener could not accept (out of file descriptors, of memory):
a counter and one log line per spell, in place of Twisted's three lines per
refused connection; and ``RefusedAtAccept``, what a factory builds for a socket it
refuses at its accept (a bound reached).

``watch_accept_errors`` replaces a listening ``tcp.Port``'s private ``_logger`` on
the instance (Twisted logs its accept failures there and nowhere else) and matches
the lines it logs by their format strings; ``AcceptRefusals`` counts and logs the
spells.  Both are checked against the installed Twisted by
``tests/unit/net/test_net_pins.py`` (see ``mqttamqp.net``).

What it must not do: know any protocol, or import the broker's core.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any, cast

from twisted.internet.protocol import Protocol
from twisted.internet.tcp import Port
from twisted.logger import Logger

__all__ = ["ACCEPT_PAUSE", "AcceptRefusals", "RefusedAtAccept", "watch_accept_errors"]


class RefusedAtAccept(Protocol):
    """The protocol of a socket refused at its accept (a factory's bound reached):
    it aborts the socket at once, nothing read.  A factory returns it rather than
    None, which only a plain TCP port takes: under TLS (``ssl:`` listeners) Twisted
    wraps what ``buildProtocol`` gives, and a None would break the accept (a
    traceback, and the socket left open, untimed)."""

    transport: Any

    def connectionMade(self) -> None:
        self.transport.abortConnection()

# What ``tcp.Port.doRead`` logs (Twisted's ``tcp._accept``, the same since Twisted 16)
# when ``accept`` fails for want of resources: with EMFILE it closes its reserved
# descriptor, accepts each waiting connection and closes it at once, three lines a
# connection; with ENFILE, ENOBUFS, ENOMEM (or EMFILE without the reserved
# descriptor) it leaves the connection waiting and returns, and the listener, still
# readable, is read again on the next reactor turn.
_EMFILE_RELEASED = "EMFILE encountered; releasing reserved file descriptor."
_EMFILE_CLOSED = "EMFILE recovery: Closed socket from {address}"
_EMFILE_RESERVED = "Re-reserving EMFILE recovery file descriptor."
_NOT_ACCEPTED = "Could not accept new connection ({acceptError})"
#: Seconds a listener stops accepting after an accept failed and left the connection
#: waiting (else the reactor would spin on it, logging, until resources come back).
ACCEPT_PAUSE = 1.0


def watch_accept_errors(port: Any, refused: Callable[[str], None],
                        pause: float = ACCEPT_PAUSE) -> None:
    """Route what a listening ``tcp.Port`` logs about failed accepts to ``refused``
    (called with the errno's name once per connection refused, or per failed accept)
    and log nothing of it; any other line of the port goes on as usual. After a
    failure that leaves the connection waiting, the port stops reading for ``pause``
    seconds. (Twisted's port logs through its private ``_logger``, which this
    replaces on the instance.)"""
    if not isinstance(port, Port):
        return
    original = port._logger   # (a Logger made for this port: its namespace and source)
    forward: Any = original.observer

    def observe(event: dict[str, Any]) -> None:
        what = event.get("log_format")
        if what == _EMFILE_CLOSED:
            refused("EMFILE")
        elif what == _NOT_ACCEPTED:
            refused(str(event.get("acceptError", "?")))
            _pause(port, pause)
        elif what not in (_EMFILE_RELEASED, _EMFILE_RESERVED):
            forward(event)

    port._logger = Logger(namespace=original.namespace, source=port,
                          observer=cast(Any, observe))


def _pause(port: Any, seconds: float) -> None:
    """Stop reading the listener for ``seconds`` (once: a pause already running
    stands)."""
    if getattr(port, "_accept_paused", False):
        return
    port._accept_paused = True
    port.stopReading()

    def resume() -> None:
        port._accept_paused = False
        if port.connected and not port.disconnecting:
            port.startReading()

    port.reactor.callLater(seconds, resume)


_REASONS = {
    "EMFILE": "the broker is out of file descriptors (limit {limit})",
    "ENFILE": "the system is out of file descriptors",
    "ENOBUFS": "the system is out of socket buffers",
    "ENOMEM": "the system is out of memory for sockets",
}
_REMEDY = {
    "EMFILE": "; raise the limit (ulimit -n, or LimitNOFILE= in a systemd unit) or "
              "lower --max-connections",
    "ENFILE": "; raise fs.file-max or close other programs' files",
}


class AcceptRefusals:
    """Connections the listeners could not accept (no file descriptor, no memory).

    Each one is counted (``counted``); the log gets one line when a spell begins,
    saying why and what to do, and one when ``quiet`` seconds passed without a
    refusal, with how many were refused. Never a line per connection.
    """

    log = Logger()

    def __init__(self, clock: Any, counted: Callable[[], None], quiet: float = 10.0) -> None:
        self.clock = clock
        self.counted = counted
        self.quiet = quiet
        self.total = 0
        self._spell = 0              # refused in the current spell
        self._since = 0.0
        self._last = 0.0
        self._check: Any = None      # the pending end-of-spell check

    @property
    def failing(self) -> bool:
        return self._check is not None

    def refused(self, kind: str, error: str) -> None:
        """A ``kind`` listener (MQTT, AMQP, web...) could not accept a connection for
        ``error`` (an errno name)."""
        self.total += 1
        self.counted()
        now = self.clock.seconds()
        self._last = now
        if self._check is None:
            self._spell = 0
            self._since = now
            reason = _REASONS.get(error, "accept failed ({error})").format(
                limit=_descriptor_limit(), error=error)
            self.log.error("refusing new connections: {reason} ({error} on the {kind} "
                           "listener); connections are closed at once until descriptors "
                           "are free again{remedy}", reason=reason, error=error, kind=kind,
                           remedy=_REMEDY.get(error, ""))
            self._check = self.clock.callLater(self.quiet, self._end)
        self._spell += 1

    def _end(self) -> None:
        now = self.clock.seconds()
        wait = self._last + self.quiet - now
        if wait > 0:
            self._check = self.clock.callLater(wait, self._end)
            return
        self._check = None
        self.log.info("no connection refused for {q:g}s: {n} connection(s) refused for "
                      "want of descriptors or memory in {s:.1f}s", q=self.quiet,
                      n=self._spell, s=max(0.0, self._last - self._since))

    def stop(self) -> None:
        if self._check is not None and self._check.active():
            self._check.cancel()
        self._check = None


def _descriptor_limit() -> str:
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return "unknown"
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
