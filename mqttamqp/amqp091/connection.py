"""One AMQP 0.9.1 connection under Twisted, and what the connections of a
listener share (``AMQP091Factory``).

What it owns: the connection's states (start → authenticating → tune → opening →
open → closing → closed: ``State``), the handshake (``connection.start`` with the
mechanisms on offer, credentials checked off the reactor by the broker's gate,
``tune``, ``open`` of vhost ``/`` only, 530 for others), heartbeats both ways on
one timer (a silent peer is dropped after two intervals), the channels (at most
``channel_max``; channel errors close the channel, connection errors and frame
errors, 501-505, the connection, with one log line per cause a minute),
``connection.blocked``/``unblocked`` while the durable queues' storage alarm is
raised, ``connection.update-secret``, back-pressure from the socket, and what the
console sees of it.

The header sniff (``sniff``) has read the protocol header already; the first
bytes fed here follow it.

What it must not do: carry out a channel's methods (``channel``), decode frames
(``frames``) or hold routing rules (the core).
"""

from __future__ import annotations

import itertools
from collections.abc import Sized
from typing import Any

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.adapter.grace import CloseGrace
from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.amqp091.channel import Channel
from mqttamqp.amqp091.frames import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    UNEXPECTED_FRAME,
    BodyTooLarge,
    ContentAssembler,
    FrameError,
    FrameReader,
    content_frames,
    method_frame,
)
from mqttamqp.amqp091.handshake import PROTOCOL, Handshake, Settings, State
from mqttamqp.amqp091.inspect import details, links
from mqttamqp.amqp091.negotiation import (
    start_method,
)
from mqttamqp.amqp091.pacing import FLOW_KEY, Pacing, short
from mqttamqp.amqp091.properties import sent_with
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.connections import ConnectionInfo, EventFields
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.exchanges.errors import PRECONDITION_FAILED, ChannelError
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import (
    CAUSE_CLEAN,
    CAUSE_CONSOLE,
    CAUSE_LOST,
    CAUSE_PROTOCOL_ERROR,
)
from mqttamqp.net.sending import plain_tcp, send
from mqttamqp.net.tls import verified_common_name

__all__ = ["AMQP091Connection", "AMQP091Factory", "Settings", "PROTOCOL"]


Conn, Basic = commands.Connection, commands.Basic
_PUBLISH = Basic.Publish
# (an Enum member read from its class is a lookup each time: these are read per frame)
_CLOSED, _OPEN = State.CLOSED, State.OPEN
_HANDSHAKE_MAX = 131072   # frame size before tune: the spec's minimum is 4096
# What one batch (a socket read's handling) may hold of a connection's output before
# it is written: below the transport's 64 KiB, so its back-pressure comes in time.
OUTPUT_BATCH_BYTES = 64 * 1024


class AMQP091Connection(Handshake, Pacing, Protocol):
    """One 0.9.1 connection: states, handshake, heartbeats, channels."""

    log = Logger()
    transport: Any

    def __init__(self, factory: AMQP091Factory) -> None:
        self.factory = factory
        self.broker: Broker = factory.broker
        self.clock: Clock = factory.clock
        self.meter = factory.meter
        self.serial = next(factory.serials)
        self.key = f"amqp091:{self.serial}"
        self.state = State.START
        self.peer = "?"
        self.username: str | None = None
        self.client_id = ""
        self.identity = Identity("", None, PROTOCOL)
        self.mechanisms: list[str] = ["PLAIN", "AMQPLAIN"]
        self.cert_user: str | None = None
        settings = factory.settings
        self.channel_max = settings.channel_max
        self.frame_max = settings.frame_max
        self.max_unacked = settings.max_unacked
        self.heartbeat = 0
        self.reader = FrameReader(_HANDSHAKE_MAX)
        self.channels: dict[int, Channel] = {}
        self._closing_channels: set[int] = set()
        self._assemblers: dict[int, ContentAssembler] = {}
        self.write_blocked = False
        # Why the socket is not read now: "alarm" (the durable queues' storage),
        # "flow" (subscribers it fed through amq.topic are past their high-water mark)
        self.reading_paused: set[str] = set()
        self.cancel_notify = False
        self.blocked_notify = False
        self._blocked_sent = False
        self.connected_since = 0.0
        self.last_in = self.last_out = 0.0
        self.bytes_in = self.bytes_out = 0
        self.messages_in = self.messages_out = 0
        self._out: list[bytes] | None = None   # written when the current batch ends
        self._out_bytes = 0
        self._timer: DelayedCall | None = None
        self._reason = ""
        self._cause = CAUSE_LOST
        self._registered = False

    # -- Twisted -------------------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.peer = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        if not self.broker.gate.admit("AMQP", self.peer, len(self.factory.connections)
                                      + len(self.factory.port_sharers)):
            self.state = State.CLOSED
            self.transport.abortConnection()
            return
        self.factory.connections.add(self)
        if plain_tcp(self.transport):
            self.transport.setTcpNoDelay(True)
        self.transport.registerProducer(self, True)
        if self.factory.cert_as_user:
            # --tls-cert-as-user: a verified client certificate names the user
            # (SASL EXTERNAL), as for AMQP 1.0.
            self.cert_user = verified_common_name(self.transport)
            if self.cert_user is not None:
                self.mechanisms.insert(0, "EXTERNAL")
        self.last_in = self.last_out = self.clock.seconds()
        self._timer = self.clock.callLater(self.broker.limits.connect_timeout,
                                           self._handshake_timed_out)
        self.send_method(0, start_method(self.mechanisms))

    def dataReceived(self, data: bytes) -> None:
        if self.state is _CLOSED:
            return
        self.bytes_in += len(data)
        self.meter.received_bytes(len(data))
        self.last_in = self.clock.seconds()
        broker = self.broker
        broker.begin_batch()
        try:
            assemblers = self._assemblers
            for channel, frame in self.reader.feed(data):
                if self.state is _CLOSED:   # (``closed``, without the call: per frame)
                    break
                # (the content frames of a basic.publish: an assembler that waits for
                # them exists only on an open channel, see ``_end_channel``; an idle
                # one takes the next basic.publish as ``Channel.basic_publish`` would)
                assembler = assemblers.get(channel) if channel else None
                if assembler is None:
                    self._frame(channel, frame)
                elif assembler.method is not None:   # (busy)
                    _content(self, channel, assembler, frame)
                elif (type(frame) is _PUBLISH and not frame.immediate
                        and self.state is _OPEN):
                    assembler.start(frame)
                else:
                    self._frame(channel, frame)
        except FrameError as exc:
            self._connection_error(exc.code, exc.text, cause=CAUSE_PROTOCOL_ERROR)
        except ChannelError as exc:   # (a connection error raised outside a channel)
            self._connection_error(exc.code, exc.text)
        except Exception:
            self.log.failure("internal error on the AMQP 0.9.1 connection from {peer}",
                             Failure(), peer=self.peer)
            self._connection_error(541, "INTERNAL_ERROR - internal error in the broker")
        finally:
            broker.end_batch()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.factory.connections.discard(self)
        self._out = None
        previous, self.state = self.state, State.CLOSED
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        for channel in list(self.channels.values()):
            channel.end()
        self.channels.clear()
        self.broker.exchanges.connection_closed(self.key)
        if self in self.factory.blocked:
            self.factory.blocked.discard(self)
            self.broker.queues.alarm.forget(id(self))
        if "flow" in self.reading_paused:
            self.broker.forget_paused(self.serial | FLOW_KEY)
        if self._registered:
            if self._cause == CAUSE_PROTOCOL_ERROR:
                self.meter.protocol_error()
            why = self._reason or ("connection lost: " + (
                reason.getErrorMessage() if reason is not None else "unknown"))
            self.broker.unregister_connection(self.key, self, self._cause, why)
        elif previous is not State.CLOSED and self._cause == CAUSE_PROTOCOL_ERROR:
            self.meter.protocol_error()

    # IPushProducer: the transport's buffer is full / drained.
    def pauseProducing(self) -> None:
        self.write_blocked = True

    def resumeProducing(self) -> None:
        if self.write_blocked:
            self.write_blocked = False
            for channel in list(self.channels.values()):
                for member in list(channel.consumers.values()):
                    member.wake()

    def stopProducing(self) -> None:
        pass

    # -- output --------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Every outbound byte goes through here, in order.  While the broker handles
        a socket read (a batch), what it gives this connection is collected and
        written when the batch ends, as MQTT's connections do: one transport write
        for a read's deliveries, confirms and answers instead of one per frame.  At
        most ``OUTPUT_BATCH_BYTES`` are held; a connection whose socket buffer is
        full (``write_blocked``) is written at once, so back-pressure is unchanged.
        Outside a batch (a commit's confirms) the bytes go at once.  Bytes held are
        counted (``bytes_out``, the meter, ``last_out``) once, when written."""
        out = self._out
        if out is not None:
            out.append(data)
            self._out_bytes += len(data)
            if self._out_bytes >= OUTPUT_BATCH_BYTES or self.write_blocked:
                self._flush_out()
        elif not self.write_blocked and self.broker.after_batch(self._flush_out):
            self._out = [data]
            self._out_bytes = len(data)
        else:
            self._count_out(len(data))
            send(self.transport, data)   # (at once when nothing is buffered: ``net.tcp``)

    def _count_out(self, size: int) -> None:
        self.bytes_out += size
        self.meter.sent_bytes(size)
        self.last_out = self.clock.seconds()

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out:
            self._count_out(self._out_bytes)
            if self.transport is not None:
                send(self.transport, out[0] if len(out) == 1 else b"".join(out))

    def call_soon(self, fn: Any) -> None:
        """Call ``fn`` when the current batch ends, or in the reactor's next turn
        outside one (a commit firing its Deferreds one by one)."""
        if not self.broker.after_batch(fn):
            self.clock.callLater(0, fn)

    def _lose(self) -> None:
        """Close after writing everything (including what a batch still holds)."""
        self._flush_out()
        self.transport.loseConnection()

    def send_method(self, channel: int, method: Any) -> None:
        if self.state is not _CLOSED:
            self._write(method_frame(channel, method))

    def send_frames(self, data: bytes) -> None:
        """Frames encoded already (``frames.deliver_frames``)."""
        if self.state is not _CLOSED:
            self._write(data)

    def send_content(self, channel: int, method: Any, properties: bytes, body: bytes) -> None:
        if self.state is not _CLOSED:
            self._write(content_frames(channel, method, properties, body, self.frame_max))

    # -- frames --------------------------------------------------------------------

    def _frame(self, number: int, frame: Any) -> None:
        name = getattr(frame, "name", "")
        state = self.state
        if state is _OPEN and number:
            self._channel_frame(number, frame, name)
            return
        if name == "Heartbeat":
            return
        if number:
            if state is State.CLOSING:
                return
            raise FrameError(UNEXPECTED_FRAME, f"{name or 'frame'} on channel {number} "
                             "before the connection is open")
        if name == "ContentHeader" or name == "ContentBody" or not name:
            raise FrameError(UNEXPECTED_FRAME, "content on channel 0")
        handler = _CONNECTION_METHODS.get((state, name))
        if handler is None:
            if state is State.CLOSING:
                return
            if name == "Connection.Close":
                self._peer_close(frame)
                return
            raise FrameError(COMMAND_INVALID if state is State.OPEN else UNEXPECTED_FRAME,
                             f"{name} is not expected now ({state.value})")
        handler(self, frame)

    def _channel_frame(self, number: int, frame: Any, name: str) -> None:
        if number in self._closing_channels:
            if name == "Channel.CloseOk" or name == "Channel.Close":
                self._closing_channels.discard(number)
                self._assemblers.pop(number, None)
                if name == "Channel.Close":
                    self.send_method(number, commands.Channel.CloseOk())
            return
        channel = self.channels.get(number)
        if channel is None:
            if name != "Channel.Open":
                raise FrameError(CHANNEL_ERROR, f"channel {number} is not open")
            if number > self.channel_max:
                self.meter.limit_hit("amqp091_channels")
                raise FrameError(CHANNEL_ERROR, f"channel {number} is over channel_max "
                                 f"{self.channel_max}")
            self.channels[number] = Channel(self, number)
            self.send_method(number, commands.Channel.OpenOk())
            return
        try:
            if name == "ContentHeader" or name == "ContentBody":
                raise FrameError(UNEXPECTED_FRAME, "content without a content method")
            if name == "Channel.Close":
                self._end_channel(channel)
                self.send_method(number, commands.Channel.CloseOk())
                return
            if name == "Channel.CloseOk":
                return
            if name == "Channel.Open":
                raise FrameError(CHANNEL_ERROR, f"channel {number} is already open")
            if name.startswith("Connection."):
                raise FrameError(COMMAND_INVALID, f"{name} on channel {number}")
            channel.handle(frame)
        except ChannelError as exc:
            if exc.connection_error:
                self._connection_error(exc.code, exc.text)
                return
            self._channel_error(channel, exc, frame)

    def assembler(self, channel: Channel) -> ContentAssembler:
        assembler = self._assemblers.get(channel.number)
        if assembler is None:
            assembler = self._assemblers[channel.number] = ContentAssembler(
                self.factory.settings.max_body)
        return assembler

    def _channel_error(self, channel: Channel, exc: ChannelError, method: Any) -> None:
        held = self.factory.log_limit.allow(f"channel {exc.code}")
        if held is not None:
            self.log.info("AMQP 0.9.1 channel {n} of {peer} closed: {t}", n=channel.number,
                          peer=self.peer, t=exc.text)
        self._end_channel(channel)
        self._closing_channels.add(channel.number)
        index = getattr(method, "index", 0) or 0
        self.send_method(channel.number, commands.Channel.Close(
            exc.code, short(exc.text), index >> 16, index & 0xFFFF))

    def close_channel(self, channel: Channel, exc: ChannelError) -> None:
        """Close ``channel`` with ``exc`` outside its methods (a failed tx.commit)."""
        if self.channels.get(channel.number) is channel:
            self._channel_error(channel, exc, None)

    def _end_channel(self, channel: Channel) -> None:
        self.channels.pop(channel.number, None)
        self._assemblers.pop(channel.number, None)
        channel.end()

    def _opened(self) -> None:
        self.broker.register_connection(self.key, self, PROTOCOL)
        self._registered = True
        self._arm()

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self.state is State.OPEN or self.state is State.CLOSED:
            return
        self.meter.refused()
        self.log.warn("AMQP 0.9.1 connection from {peer} did not open in time; closing",
                      peer=self.peer)
        self.state = State.CLOSED
        self.transport.abortConnection()

    # -- closing -------------------------------------------------------------------

    def _connection_error(self, code: int, text: str, cause: str = "") -> None:
        if self.state is State.CLOSED or self.state is State.CLOSING:
            return
        if cause == CAUSE_PROTOCOL_ERROR or code >= 500:
            self._cause = CAUSE_PROTOCOL_ERROR
            held = self.factory.log_limit.allow(f"connection {code}")
            if held is not None:
                self.log.info("AMQP 0.9.1 connection from {peer} closed: {code} {t}"
                              "{more}", peer=self.peer, code=code, t=text,
                              more=f" ({held} more for this cause)" if held else "")
        self._reason = f"closed by the broker: {code} {text}"
        self.send_method(0, Conn.Close(code, short(text), 0, 0))
        self.state = State.CLOSING
        self._arm_close()

    def unacked_bound(self) -> None:
        """A channel holds --amqp091-max-unacked deliveries: its consumers wait for
        acknowledgements (counted; one log line a minute for this cause)."""
        self.meter.limit_hit("amqp091_unacked")
        held = self.factory.log_limit.allow("unacked")
        if held is not None:
            self.log.warn("AMQP 0.9.1 connection from {peer}: a channel holds "
                          "{n} unacknowledged deliveries (--amqp091-max-unacked); its "
                          "consumers get more as they acknowledge{more}", peer=self.peer,
                          n=self.max_unacked,
                          more=f" ({held} more since the last line)" if held else "")

    def fail(self, code: int, text: str) -> None:
        """A connection error found outside the input's handling (a failed commit)."""
        self._connection_error(code, text)

    def _arm_close(self) -> None:
        """Abort after --close-grace unless the connection is lost first: the
        close-ok the broker waits for, and the flush after a close either side
        started (loseConnection waits for the send buffer to drain, which never ends
        for a peer that stopped reading); counted and logged (``CloseGrace``)."""
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        self._timer = self.factory.close_grace.arm(self.transport, self.peer, self.abort)

    def _peer_close(self, m: Any) -> None:
        self._reason = f"closed by the client ({m.reply_code} {m.reply_text})"
        self._cause = CAUSE_CLEAN
        self.send_method(0, Conn.CloseOk())
        self.state = State.CLOSED
        self._lose()
        self._arm_close()   # (a client that sent close and stopped reading: aborted)

    def _close_ok(self, m: Any) -> None:
        self.state = State.CLOSED
        self._lose()

    def _update_secret(self, m: Any) -> None:
        self.send_method(0, Conn.UpdateSecretOk())

    def close(self, reason: str) -> None:
        """Closed by the broker (the console)."""
        if self.state is State.CLOSED:
            return
        self._cause = CAUSE_CONSOLE
        self._connection_error(320, f"CONNECTION_FORCED - {reason}")

    # -- console (InspectableConnection) -------------------------------------------

    def event_fields(self) -> EventFields:
        return (self.client_id or self.key, self.peer, self.username, None, self.heartbeat)

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(
            key=self.key, client_id=self.client_id or self.key, protocol=PROTOCOL,
            remote=self.peer, user=self.username, connected_since=self.connected_since,
            keepalive=self.heartbeat, clean_session=None, session_id=None, links=links(self),
            amqp091=details(self),
            messages_in=self.messages_in, messages_out=self.messages_out,
            bytes_in=self.bytes_in, bytes_out=self.bytes_out, last_activity=self.last_in)


def _content(self: AMQP091Connection, number: int, assembler: ContentAssembler,
             frame: Any) -> None:
    """A frame on channel ``number`` of connection ``self`` while its
    ``basic.publish`` waits for its content: the header, then body frames; anything
    else is 505.  (Outside the class, which the shape test keeps under 400 lines.)"""
    if self.state is not _OPEN:
        return   # (closing: what the client still sends is discarded)
    channel = self.channels[number]
    try:
        if type(frame) is ContentBody:
            content = assembler.body(frame)
        elif isinstance(frame, ContentHeader):
            content = assembler.header(frame)
        else:
            raise FrameError(UNEXPECTED_FRAME, f"{getattr(frame, 'name', 'frame')} "
                             "while content was due")
        if content is not None:
            self.messages_in += 1
            channel.published(content)
    except BodyTooLarge as exc:
        # (RabbitMQ's answer: a channel error; the body frames after it are
        # discarded by the closing channel)
        self.meter.limit_hit("amqp091_max_body")
        self._channel_error(channel, ChannelError(PRECONDITION_FAILED, str(exc)),
                            frame)
    except ChannelError as exc:
        if exc.connection_error:
            self._connection_error(exc.code, exc.text)
            return
        self._channel_error(channel, exc, frame)


_CONNECTION_METHODS: dict[tuple[State, str], Any] = {
    (State.START, "Connection.StartOk"): AMQP091Connection._start_ok,
    (State.TUNE, "Connection.TuneOk"): AMQP091Connection._tune_ok,
    (State.OPENING, "Connection.Open"): AMQP091Connection._open,
    (State.CLOSING, "Connection.CloseOk"): AMQP091Connection._close_ok,
    (State.CLOSING, "Connection.Close"): AMQP091Connection._close_ok,
    (State.OPEN, "Connection.UpdateSecret"): AMQP091Connection._update_secret,
}


class AMQP091Factory(Factory):
    """Builds one ``AMQP091Connection`` per socket the sniff hands over."""

    def __init__(self, broker: Broker, clock: Clock, settings: Settings | None = None
                 ) -> None:
        self.broker = broker
        self.clock = clock
        self.settings = settings if settings is not None else Settings()
        broker.exchanges.attach_envelope(sent_with)   # (the key dead letters take)
        self.connections: set[AMQP091Connection] = set()
        self.serials = itertools.count(1)
        self.meter = DeliveryMeter(broker.stats)
        self.log_limit = LogLimiter(clock.seconds)
        self.close_grace = CloseGrace(clock, broker.limits.close_grace, AMQP091Connection.log,
                                      "AMQP 0.9.1", lambda: self.meter.limit_hit("close_grace"))
        self.blocked: set[AMQP091Connection] = set()
        # queue -> its exclusive 0.9.1 consumer (basic.consume exclusive=true)
        self.exclusive: dict[str, Any] = {}
        self.cert_as_user = False   # --tls-cert-as-user: offer SASL EXTERNAL
        # The AMQP 1.0 connections on the same port: --max-connections counts both.
        self.port_sharers: Sized = ()
        self.noisy = False
        # A queue deleted anywhere (the console, queue.delete, an auto-delete or
        # exclusive queue's end): its 0.9.1 consumers hear basic.cancel.
        broker.queues.deleted_hooks.append(self.queue_deleted)

    def watch_alarm(self, connection: AMQP091Connection) -> None:
        """A publisher while the durable queues are paused (the storage alarm, or the
        writer behind): it is not read until they are writable again, and hears
        ``connection.blocked`` if the alarm is raised."""
        alarm = self.broker.queues.alarm
        if not alarm.paused or connection in self.blocked:
            return
        if alarm.blocked:
            connection.set_blocked(alarm.reason or "storage alarm")
        self.blocked.add(connection)
        # As RabbitMQ: a publisher is not read while the alarm lasts (what it sent
        # before was appended); consumers on other connections drain the queues.
        connection.hold_reading("alarm")
        self.broker.when_queues_writable(id(connection), lambda: self._clear(connection))

    def _clear(self, connection: AMQP091Connection) -> None:
        self.blocked.discard(connection)
        if connection.closed:
            return
        connection.release_reading("alarm")
        connection.set_blocked(None)

    def consumers_of(self, queue: str) -> int:
        """The 0.9.1 consumers of ``queue`` now (an exclusive consume wants none)."""
        return sum(1 for connection in self.connections
                   for channel in connection.channels.values()
                   for member in channel.consumers.values()
                   if member.queue == queue and not member.closed)

    def queue_deleted(self, name: str) -> None:
        """Queue ``name`` was deleted (the queue manager's ``deleted_hooks``): its
        0.9.1 consumers hear ``basic.cancel`` (those that announced
        consumer_cancel_notify)."""
        for connection in list(self.connections):
            for channel in list(connection.channels.values()):
                for member in list(channel.consumers.values()):
                    if member.queue == name:
                        member.queue_gone()

    def buildProtocol(self, addr: Any) -> AMQP091Connection:
        return AMQP091Connection(self)
