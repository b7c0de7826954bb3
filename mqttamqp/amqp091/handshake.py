"""The AMQP 0.9.1 handshake of a connection: ``connection.start-ok`` (credentials
checked by the broker's gate off the reactor thread; EXTERNAL with a verified TLS
client certificate), ``tune-ok`` and ``open`` (vhost ``/`` only: 530 otherwise);
the connection's ``State`` and the 0.9.1 options (``Settings``).

What it must not do: write frames other than through the connection's
``send_method``, or decide what a password is worth (the gate does).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pamqp import commands
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.amqp091.frames import COMMAND_INVALID, FrameError, FrameReader
from mqttamqp.amqp091.negotiation import CredentialsError, negotiate, read_credentials
from mqttamqp.core.auth import Credentials, Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock

__all__ = ["State", "Settings", "Handshake", "PROTOCOL"]

PROTOCOL = "amqp0-9-1"
Conn = commands.Connection


class State(Enum):
    START = "start"                    # connection.start sent
    AUTHENTICATING = "authenticating"  # start-ok's credentials with the gate
    TUNE = "tune"                      # tune sent
    OPENING = "opening"                # tune-ok came, waiting for open
    OPEN = "open"
    CLOSING = "closing"                # connection.close sent, waiting for close-ok
    CLOSED = "closed"


# --amqp091-max-body's default: RabbitMQ 4's max_message_size (16 MiB).  A body is
# held whole while its frames arrive, so this is also the most a channel holds.
MAX_BODY = 16 << 20


class Settings:
    """The 0.9.1 options (``--amqp091-channel-max``, ``-frame-max``, ``-heartbeat``,
    ``-max-unacked``, ``-max-body``)."""

    def __init__(self, channel_max: int = 2047, frame_max: int = 131072,
                 heartbeat: int = 60, max_unacked: int = 10000,
                 max_body: int = MAX_BODY) -> None:
        # (connection.tune's fields: short, long, short; out of range, tune could
        # not be encoded and every handshake would hang)
        self.channel_max = min(max(1, channel_max), 65535)
        self.frame_max = min(max(4096, frame_max), (1 << 32) - 1)
        self.heartbeat = min(max(0, heartbeat), 65535)
        self.max_unacked = max_unacked
        self.max_body = max_body


class Handshake:
    """The handshake's methods of ``connection.AMQP091Connection``."""

    log: Logger
    transport: Any
    factory: Any
    broker: Broker
    clock: Clock
    meter: DeliveryMeter
    reader: FrameReader
    state: State
    peer: str
    key: str
    username: str | None
    client_id: str
    identity: Identity
    mechanisms: list[str]
    cert_user: str | None
    cancel_notify: bool
    blocked_notify: bool
    channel_max: int
    frame_max: int
    heartbeat: int
    connected_since: float
    mechanism = ""        # the SASL mechanism the client chose (shown by the console)

    def send_method(self, channel: int, method: Any) -> None:
        raise NotImplementedError

    def _connection_error(self, code: int, text: str, cause: str = "") -> None:
        raise NotImplementedError

    def _opened(self) -> None:
        """Open: registered with the broker, heartbeats armed."""
        raise NotImplementedError

    # -- handshake -----------------------------------------------------------------

    def _start_ok(self, m: Any) -> None:
        props = m.client_properties or {}
        capabilities = props.get("capabilities") or {}
        if isinstance(capabilities, dict):
            self.cancel_notify = bool(capabilities.get("consumer_cancel_notify"))
            self.blocked_notify = bool(capabilities.get("connection.blocked"))
        name = props.get("connection_name") or props.get("product") or ""
        self.client_id = str(name)[:200] if isinstance(name, (str, bytes)) else ""
        try:
            creds = read_credentials(m.mechanism, m.response, self.mechanisms)
        except CredentialsError as exc:
            self._refuse(f"ACCESS_REFUSED - {exc}")
            return
        self.state = State.AUTHENTICATING
        self.mechanism = creds.mechanism
        self.transport.pauseProducing()
        if creds.mechanism == "EXTERNAL":
            ok = self.cert_user is not None and creds.username in (None, self.cert_user)
            self.username = self.cert_user
            self._authenticated(ok)
            return
        self.username = creds.username
        d = self.broker.gate.authenticate(Credentials(
            self.client_id, creds.username, creds.password, PROTOCOL, self.peer))
        d.addCallbacks(self._authenticated, self._auth_error)

    def _auth_error(self, failure: Failure) -> None:
        self.log.failure("checking AMQP 0.9.1 credentials from {peer} failed", failure,
                         peer=self.peer)
        self._authenticated(False)

    def _authenticated(self, ok: bool) -> None:
        if self.state is not State.AUTHENTICATING:
            return
        self.transport.resumeProducing()
        if not ok:
            self.meter.refused()
            self._refuse(f"ACCESS_REFUSED - Login was refused using authentication "
                         f"mechanism for user '{self.username or ''}'")
            return
        self.state = State.TUNE
        settings = self.factory.settings
        self.send_method(0, Conn.Tune(settings.channel_max, settings.frame_max,
                                      settings.heartbeat))

    def _refuse(self, text: str) -> None:
        self.log.warn("refused AMQP 0.9.1 connection from {peer}: {t}", peer=self.peer,
                      t=text)
        self._connection_error(403, text)

    def _tune_ok(self, m: Any) -> None:
        settings = self.factory.settings
        self.channel_max = negotiate(settings.channel_max, m.channel_max) or 65535
        frame_max = negotiate(settings.frame_max, m.frame_max)
        if frame_max < 4096:
            raise FrameError(COMMAND_INVALID, f"frame_max {frame_max} is under 4096")
        self.frame_max = self.reader.frame_max = frame_max
        self.heartbeat = m.heartbeat
        self.state = State.OPENING

    def _open(self, m: Any) -> None:
        if m.virtual_host not in ("/", ""):
            self._connection_error(530, f"NOT_ALLOWED - vhost {m.virtual_host} not found "
                                   "(this broker has the vhost / only)")
            return
        banned = self.broker.gate.banned("AMQP", self.client_id, self.username, self.peer)
        if banned is not None:
            self._connection_error(530, "NOT_ALLOWED - " + banned)
            return
        self.identity = Identity(self.client_id or self.key, self.username, PROTOCOL)
        self.state = State.OPEN
        self.connected_since = self.clock.seconds()
        self.send_method(0, Conn.OpenOk())
        self.log.info("AMQP 0.9.1 connection from {peer} ({c}, user {u})", peer=self.peer,
                      c=self.client_id or "?", u=self.username or "anonymous")
        self._opened()
