"""The one place an MQTT connection ends from our side: a protocol error (or a
keepalive, a storage failure) becomes the disconnect (``_violation``: MQTT 5 says
why first, with DISCONNECT once connected or CONNACK before), and the broker
closes a connection (takeover, the console, shutdown).

``Disconnects`` is the part of ``protocol.MQTTProtocol`` that does it: the reason
code (``decisions``), the counters and the rate-limited lines, the archive's
cause, and the close.  The will fires later, in ``connectionLost``.
"""

from __future__ import annotations

from mqttamqp.core.recorder import (
    CAUSE_CLEAN,
    CAUSE_KEEPALIVE,
    CAUSE_PROTOCOL_ERROR,
    CAUSE_STORAGE,
)
from mqttamqp.mqtt import decisions
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.connection import ConnectionState
from mqttamqp.mqtt.decisions import problem, violation_code
from mqttamqp.mqtt.packets import Connack, Disconnect, Properties, ReasonCode
from mqttamqp.mqtt.reading import InputPump
from mqttamqp.native import NO_SLOTS, mypyc_attr

__all__ = ["Disconnects"]

_CONNECTED = ConnectionState.CONNECTED


@mypyc_attr(allow_interpreted_subclasses=True)
class Disconnects(InputPump):
    """Protocol errors and broker-side closes, for ``protocol.MQTTProtocol`` (a
    base class of it)."""

    __slots__ = NO_SLOTS   # (the connection has no __dict__: protocol.MQTTProtocol)

    @property
    def _clean_close(self) -> bool:
        """The client said DISCONNECT (the one cause that says so:
        ``executor.ActionExecutor._goodbye``)."""
        return self._cause == CAUSE_CLEAN

    def _violation(self, reason: str, cause: str | None = None,
                   code: int = ReasonCode.PROTOCOL_ERROR, limit: str | None = None) -> None:
        """Close for ``reason``; ``limit``: the bound the client went beyond (counted
        as ``$SYS/broker/limits/<limit>``, one line per bound a minute)."""
        cause = cause or (
            CAUSE_KEEPALIVE if reason.startswith("keepalive") else CAUSE_PROTOCOL_ERROR)
        if self._v5 is not None:
            code = violation_code(self._v5, cause == CAUSE_KEEPALIVE, cause == CAUSE_STORAGE,
                                  code)
            # MQTT 5 says why before closing: DISCONNECT once connected, CONNACK
            # with the reason code while the CONNECT is being handled.
            if self.state is _CONNECTED:
                self._send_disconnect(code, reason)
            else:
                self._write(encode(Connack(False, code, problem(self._v5, reason)), 5))
        if cause == CAUSE_STORAGE:
            # Not the client's fault, and the core logged the failing storage once
            # for every client it hits: no line per connection.
            self.log.debug("closing the connection of {c} ({peer}): {r}",
                           c=self.client_id, peer=self.peer, r=reason)
        else:
            self.meter.protocol_error()
            if limit is not None:
                self.meter.limit_hit(limit)
                held = self._factory.log_limit.allow("limit " + limit)
                if held is not None:
                    self.log.warn("{c} ({peer}) went beyond a limit: {r}; closing the "
                                  "connection (reason code {code:#04x}; {h} more beyond "
                                  "that limit since the last such line)",
                                  c=self.client_id or "(no client id yet)", peer=self.peer,
                                  r=reason, code=int(code), h=held)
            elif self._v5 is not None and cause != CAUSE_KEEPALIVE:
                # MQTT 5: one line per reason code a minute, saying how many more.
                held = self._factory.log_limit.allow(f"mqtt5 disconnect {code:#04x}")
                if held is not None:
                    self.log.warn("protocol error from {c} ({peer}): {r}; closing the "
                                  "connection with reason code {code:#04x} ({h} more "
                                  "with that code since the last such line)",
                                  c=self.client_id or "(no client id yet)", peer=self.peer,
                                  r=reason, code=int(code), h=held)
            elif cause != CAUSE_KEEPALIVE:   # (that one's line is the disconnect's own)
                self.log.warn("protocol error from {c} ({peer}): {r}; closing the "
                              "connection", c=self.client_id or "(no client id yet)",
                              peer=self.peer, r=reason)
        self._cause = cause
        self._factory.opened.closing(self._link, reason)   # (read when it is lost)
        self.advance("close")
        self._cancel_timers()
        # It is over now, though the socket may linger (a half-open peer): it leaves
        # the console and $SYS with its cause, and a reconnecting client finds its
        # key free.
        self.broker.registry.unregister_client(self.client_id, self._link, self._cause, reason)
        # The will fires in connectionLost (the client did not send DISCONNECT).
        self._lose()

    def close(self, reason: str) -> None:
        """Closed by the broker (takeover, console): the session was already ended."""
        if self.state is ConnectionState.CLOSED:
            return
        cause, code = decisions.closed_by_broker(reason)
        if self._v5 is not None and self.state is _CONNECTED:
            self._send_disconnect(code, reason)
        self.advance("close")
        self.session = None
        self._cancel_timers()
        self.broker.registry.unregister_client(self.client_id, self._link, cause, reason)
        self._lose()

    def server_stopping(self) -> None:
        """The broker is stopping: an MQTT 5 client is told why (DISCONNECT 0x8B)
        before the socket closes; any other is cut at once."""
        if self._v5 is not None and self.state is _CONNECTED:
            self._send_disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")
            self._cancel_timers()   # (as every close: a keepalive or turn is over)
            self._lose()
        else:
            self.transport.abortConnection()

    def _send_disconnect(self, code: int, reason: str) -> None:
        # DISCONNECT may always carry a reason string (request problem
        # information covers the other packets).
        self._write(encode(Disconnect(code, Properties(reason_string=reason[:200])), 5))
