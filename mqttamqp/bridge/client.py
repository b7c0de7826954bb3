"""The bridge's MQTT client connection to the remote broker, and its back-off.

What it owns: one TCP connection's MQTT 3.1.1 or 5 client side on the broker's own sans-IO
codec (``mqtt.codec``): CONNECT (with Mosquitto's bridge flag, ``try_private``:
protocol level | 0x80), the CONNACK deadline, keepalive (PINGREQ every keepalive
seconds, the connection dropped when the remote is silent for one and a half; not
judged while reading is paused), a clean close (``disconnect``: the producer
unregistered first, cut after ``--close-grace``: the bridge's ``CloseGrace``), and
each packet from the remote handed to its ``Bridge`` as a call.  (``Backoff``, the
reconnect delays, is ``adapter.backoff``'s, imported here as it was.)

What it must not do: touch the broker or its sessions (``bridge.Bridge`` does), or
decide what to send: it writes what it is given.  A second MQTT client library
would bring its own event loop and packet model; the codec already encodes and
decodes every packet type both ways.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.adapter.backoff import Backoff
from mqttamqp.adapter.grace import CloseGrace
from mqttamqp.bridge.oversize import OversizedPublish
from mqttamqp.core.clock import Clock
from mqttamqp.core.limits import Limits
from mqttamqp.mqtt.codec import Decoder, MalformedPacket, encode, encode_publish
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
)

__all__ = ["Backoff", "BridgeClient", "ClientOwner"]

BRIDGE_FLAG = 0x80
LEVEL = 4     # MQTT 3.1.1
MAX_PACKET = 268_435_455


class ClientOwner(Protocol):
    """What a ``BridgeClient`` tells its bridge: each call names the client, and the
    bridge ignores one that is not its current connection (stopped, replaced)."""

    def remote_accepted(self, client: BridgeClient, connack: Connack) -> None: ...

    def remote_lost(self, client: BridgeClient, reason: str) -> None: ...

    def remote_publish(self, client: BridgeClient, packet: Publish) -> None: ...

    def remote_puback(self, client: BridgeClient, packet_id: int,
                      reason_code: int = 0) -> None: ...

    def remote_pubrec(self, client: BridgeClient, packet_id: int) -> None: ...

    def remote_pubcomp(self, client: BridgeClient, packet_id: int) -> None: ...

    def remote_pubrel(self, client: BridgeClient, packet_id: int) -> None: ...

    def remote_suback(self, client: BridgeClient, codes: tuple[int, ...]) -> None: ...

    def remote_too_large(self, client: BridgeClient, topic: str, size: int,
                         maximum: int) -> None: ...

    def client_drained(self, client: BridgeClient) -> None: ...


class BridgeClient(TwistedProtocol):
    """One connection to the remote, as an MQTT 3.1.1 or 5 client."""

    log: ClassVar[Logger] = Logger()
    transport: Any

    def __init__(self, owner: ClientOwner, clock: Clock, connect: Connect,
                 connect_timeout: float, max_packet_size: int = MAX_PACKET,
                 level: int = LEVEL, grace: CloseGrace | None = None) -> None:
        self.owner = owner
        # (the bridge's: --close-grace; without one, the default's)
        self.grace = grace or CloseGrace(clock, Limits().close_grace, self.log, "bridge")
        self.clock = clock
        self.connect_packet = connect
        self.connect_timeout = connect_timeout
        self.level = level          # 4 (3.1.1) or 5
        self.decoder = Decoder(max_packet_size, level)   # (--max-packet-size)
        self.accepted = False
        self.paused = False        # the transport's buffer is full (push producer)
        # Why the remote is not read now ("alarm": the durable queues' storage
        # alarm, "congestion": subscribers here behind); empty: it is read.
        self.paused_for: set[str] = set()
        self.reason = "connection lost"
        self._last_heard = 0.0
        self._timer: Any = None
        self._next_id = 0
        self._skipping: OversizedPublish | None = None   # (3.1.1: see ``oversize``)
        self.closing = False   # ``disconnect`` called: what is read is not handed on
        self.closed = False    # ``connectionLost`` called
        self._closing_sent = False

    # -- Twisted ------------------------------------------------------------

    def connectionMade(self) -> None:
        self.transport.registerProducer(self, True)
        self._last_heard = self.clock.seconds()
        self.transport.write(encode(self.connect_packet, self.level))
        self._timer = self.clock.callLater(self.connect_timeout, self._no_connack)

    def dataReceived(self, data: bytes) -> None:
        if self.closing:
            return
        self._last_heard = self.clock.seconds()
        if self._skipping is not None:
            self._skip(data)   # (what follows the packet goes to the decoder)
        else:
            self.decoder.feed(data)
        if self._skipping is None:
            self._read()

    def _read(self) -> None:
        """Handle the packets received, until reading is paused (the rest wait in
        the decoder, unacknowledged, until ``resume_reading``)."""
        decoder = self.decoder
        while not self.paused_for and not self.closing:
            try:
                packet = decoder.next_packet()
            except MalformedPacket as e:
                # 3.1.1: a PUBLISH above our maximum is read past (``oversize``); at
                # MQTT 5 the remote was told the maximum, and broke the rule.
                if e.code == 0x95 and self.level != 5 and decoder.buffered:
                    if self._skip(decoder.take_rest()):
                        continue
                    return
                self.drop(f"malformed packet from the remote: {e}")
                return
            if packet is None:
                return
            self._handle(packet)

    def _skip(self, data: bytes) -> bool:
        """Read past an oversized PUBLISH from ``data`` on: True once it is behind
        (what follows it is in the decoder again), False while it goes on."""
        skipping = self._skipping
        if skipping is None:
            skipping = self._skipping = OversizedPublish()
        try:
            rest = skipping.feed(data)
        except MalformedPacket as e:
            self._skipping = None
            self.drop(f"malformed packet from the remote: {e}")
            return False
        if rest is None:
            return False
        self._skipping = None
        if skipping.packet_id is not None:   # (it cannot be taken: the remote forgets it)
            self.send(Puback(skipping.packet_id) if skipping.qos == 1
                      else Pubrec(skipping.packet_id))
        self.owner.remote_too_large(self, skipping.topic, skipping.size,
                                    self.decoder.max_packet_size)
        self.decoder.feed(rest)
        return True

    def pause_reading(self, why: str) -> None:
        """Stop reading the remote (``why``: until ``resume_reading(why)``): what it
        sends waits in its socket, unacknowledged, so it keeps it."""
        if not self.paused_for and self.transport is not None:
            self.transport.pauseProducing()
        self.paused_for.add(why)

    def resume_reading(self, why: str) -> None:
        if why not in self.paused_for:
            return
        self.paused_for.discard(why)
        if not self.paused_for and self.transport is not None:
            self._last_heard = self.clock.seconds()   # (its silence was ours)
            self.transport.resumeProducing()
            self._read()

    def connectionLost(self, reason: Failure | None = None) -> None:
        if (self.reason == "connection lost" and reason is not None
                and not reason.check(ConnectionDone)):
            self.reason = f"connection lost: {reason.getErrorMessage()}"
        self.closed = True
        self._cancel_timer()
        self.owner.remote_lost(self, self.reason)

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        self.owner.client_drained(self)

    def stopProducing(self) -> None:
        self.paused = True

    # -- packets from the remote -------------------------------------------

    def _handle(self, packet: object) -> None:
        if isinstance(packet, Puback):
            self.owner.remote_puback(self, packet.packet_id, packet.reason_code)
        elif isinstance(packet, Publish):
            if not packet.topic:   # (MQTT 5: a topic alias, which CONNECT allowed none of)
                self.drop("a PUBLISH with a topic alias from the remote (none allowed)")
                return
            self.owner.remote_publish(self, packet)
        elif isinstance(packet, Pingresp):
            pass
        elif isinstance(packet, Pubrec):
            self.owner.remote_pubrec(self, packet.packet_id)
        elif isinstance(packet, Pubcomp):
            self.owner.remote_pubcomp(self, packet.packet_id)
        elif isinstance(packet, Pubrel):
            self.owner.remote_pubrel(self, packet.packet_id)
        elif isinstance(packet, Connack):
            self._connack(packet)
        elif isinstance(packet, Suback):
            self.owner.remote_suback(self, packet.return_codes)
        elif isinstance(packet, Unsuback):
            pass
        else:
            self.drop(f"unexpected {type(packet).__name__} from the remote")

    def _connack(self, packet: Connack) -> None:
        if self.accepted:
            self.drop("a second CONNACK from the remote")
            return
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if packet.return_code != 0:
            self.drop(f"the remote refused CONNECT (code {packet.return_code})")
            return
        self.accepted = True
        keepalive = self.connect_packet.keepalive
        self._timer = self.clock.callLater(keepalive, self._ping) if keepalive else None
        self.owner.remote_accepted(self, packet)

    # -- timers -------------------------------------------------------------

    def _no_connack(self) -> None:
        self._timer = None
        self.drop(f"no CONNACK within {self.connect_timeout:g} s")

    def _ping(self) -> None:
        keepalive = self.connect_packet.keepalive
        self._timer = None
        if self.paused_for:
            # Not read: its PINGRESP waits in the socket, so silence is not judged
            # until reading resumes; PINGREQs still go out, and a remote that is gone
            # ends the connection through TCP (reset, retransmission time-out).
            # docs/bridges.md says so.
            self._last_heard = self.clock.seconds()
        elif self.clock.seconds() - self._last_heard > keepalive * 1.5:
            self.drop(f"the remote was silent for more than {keepalive * 1.5:g} s")
            return
        self.transport.write(encode(Pingreq(), self.level))
        self._timer = self.clock.callLater(keepalive, self._ping)

    # -- what the bridge sends ----------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int, packet_id: int | None,
                dup: bool, retain: bool, properties: bytes | None = None) -> None:
        """``properties``: MQTT 5's property block, encoded (None at 3.1.1)."""
        self.transport.write(encode_publish(topic.encode(), payload, qos, retain, dup,
                                            packet_id, properties))

    def write(self, data: bytes) -> None:
        """A packet encoded already (a PUBLISH fitted to the remote's limits)."""
        self.transport.write(data)

    def send(self, packet: Puback | Pubrec | Pubrel | Pubcomp | Disconnect) -> None:
        """An acknowledgement (none once ``disconnect`` sent DISCONNECT: a message made
        durable meanwhile is sent again by the remote, a duplicate at most)."""
        if not self.closing:
            self.transport.write(encode(packet, self.level))

    def subscribe(self, topics: tuple[tuple[str, int], ...], options: tuple[int, ...] = ()
                  ) -> None:
        self._next_id = self._next_id % 65535 + 1
        self.transport.write(encode(Subscribe(self._next_id, topics, options), self.level))

    def drop(self, reason: str) -> None:
        """Close the connection (the bridge reconnects) saying why, once."""
        if self.reason == "connection lost":
            self.reason = reason
        self.transport.abortConnection()

    def disconnect(self) -> None:
        """A clean end (the bridge stops): DISCONNECT, then close; nothing it reads
        from now on is handed to the bridge.  The producer is unregistered first (a
        TLS transport closes only once it is), and the connection is aborted if it
        has not closed ``--close-grace`` seconds later (counted, logged)."""
        self.reason = "bridge stopped"
        self.closing = True
        self._cancel_timer()
        transport = self.transport
        if transport is None or self.closed or self._closing_sent:
            return   # (never connected, gone already, or closing)
        self._closing_sent = True
        if self.accepted:
            transport.write(encode(Disconnect(), self.level))
        transport.unregisterProducer()
        transport.loseConnection()
        self._timer = self.grace.arm(transport, "the remote")

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
