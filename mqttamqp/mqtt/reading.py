"""How much of an MQTT connection's input is handled, and when: the pump from the
decoder to the packet handlers, and the pauses of reading.

``InputPump`` is the part of ``protocol.MQTTProtocol`` that takes packets from the
decoder (``_process``, one batch per socket read) and hands each to its handler,
after ``ConnectionRules`` said it may come.  Reading stops, and what was read
waits, while CONNECT is being accepted, while subscribers it feeds are congested,
while commits lag (``storage``), while its publish rate is over (``rate``),
while durable queues are blocked past what ``parking`` holds, and when its share
of a reactor turn (``Limits.mqtt_turn``) is used up while others wait
(``_yield_turn``), so that a costly client cannot stall the others.
"""

from __future__ import annotations

from typing import Any, Final, cast

from mqttamqp.mqtt import decisions
from mqttamqp.mqtt.actions import Close
from mqttamqp.mqtt.codec import MalformedPacket
from mqttamqp.mqtt.connection import ConnectionState
from mqttamqp.mqtt.decoders import IDLE, SpareDecoders
from mqttamqp.mqtt.inspect import ConnectionView
from mqttamqp.mqtt.packets import Publish
from mqttamqp.mqtt.parking import Parked
from mqttamqp.native import NO_SLOTS, mypyc_attr
from mqttamqp.net.sending import plain_tcp
from mqttamqp.net.tcp import others_waiting

__all__ = ["NOT_PAUSED", "SINGLE_PUBLISH", "InputPump"]

_CONNECTED: Final = ConnectionState.CONNECTED
_AWAITING_CONNECT: Final = ConnectionState.AWAITING_CONNECT
NOT_PAUSED: frozenset[str] = frozenset()   # (one, shared)
# Reading paused for these, what was read is not handled either (``_process``).
_HOLD_INPUT: Final = frozenset({"congestion", "turn"})
_RECHECK: Final = 0.001   # seconds between "do others wait?" once a turn's share is used up
#: The connection whose read is exactly one PUBLISH while that read is handled, else
#: None.  What it routes to another connection holding nothing for this batch is sent
#: at once (``MQTTProtocol._emit``): one frame either way, but ahead of the rest of the
#: publish (the archive record, the statistics, the publisher's PUBACK, the batch's
#: end), which was a third of the calls between the poll's end and the subscriber's
#: send at a paced rate (``bench/lateness.py --critical``).  The publisher's own
#: output, every read of more than one packet, and a read handled inside a batch
#: already open (the frames of a WebSocket read of several: ``websocket.py`` opens
#: one batch for such a socket read) wait for the batch's end.
SINGLE_PUBLISH: Final[list[Any]] = [None]


@mypyc_attr(allow_interpreted_subclasses=True)
class InputPump(ConnectionView):
    """The input pump and reading pauses, for ``protocol.MQTTProtocol`` (a base
    class of it)."""

    __slots__ = NO_SLOTS   # (the connection has no __dict__: protocol.MQTTProtocol)

    def _process_batch(self, now: float = 0.0, one_publish: bool = False) -> None:
        """``_process`` as one batch: what it causes is committed and written once.
        (``now``: the clock's time if the caller just read it; ``one_publish``: the
        read is exactly one PUBLISH, ``SINGLE_PUBLISH``.)"""
        broker = self.broker
        outermost = broker.begin_batch()
        try:
            if one_publish and outermost:   # (inside another batch: that one's end writes)
                single = SINGLE_PUBLISH
                was, single[0] = single[0], self
                try:
                    self._process(now)
                finally:
                    single[0] = was
            else:
                self._process(now)
        finally:
            broker.end_batch()
        decoder = self.decoder
        if decoder is not IDLE and not decoder.buffered and not self._in_process:
            # Nothing held back: an idle connection keeps no decoder (``decoders``).
            self.decoder = IDLE
            spares: SpareDecoders = self.factory.decoders   # (per read: not ``_factory``)
            spares.give(decoder)

    def _process(self, now: float = 0.0) -> None:
        decoder = self.decoder
        connected = self._connected_handlers
        on_publish = type(self)._plain_publish   # (the function itself, not bound)
        turn = self.limits.mqtt_turn
        seconds = self.clock.seconds
        until = (now or seconds()) + turn if turn else 0.0
        was_processing, self._in_process = self._in_process, True
        try:
            while True:
                state = self.state
                if (state is not _CONNECTED and state is not _AWAITING_CONNECT
                        and state is not ConnectionState.AUTHENTICATING):
                    return
                paused = self._reading_paused_for
                if paused and not paused.isdisjoint(_HOLD_INPUT):
                    # Back-pressure holds what was read but not handled too (a
                    # 64 KB read is a thousand small PUBLISHes, and a hundred
                    # publishers' reads overran a subscriber's QoS 0 bound), and so
                    # does the end of this connection's share of a turn: handled
                    # once reading resumes (``_resume_reading``).  (A rate pause
                    # handles the read and grows instead: ``_after_publish``.)
                    return
                parked = self._parked
                if parked is not None and not parked.waiting:
                    # The queues have room again: what waited goes first, in order.
                    if parked.packets:
                        packet = parked.take()
                    else:
                        self._parked = parked = None
                        packet = decoder.next_packet()
                else:
                    packet = decoder.next_packet()
                if packet is None:
                    return
                if parked is not None and parked.waiting and state is _CONNECTED \
                        and self._park(parked, packet):
                    continue
                # Connected, the table holds exactly what a client may send; anything
                # else (and anything before CONNECT) the rules explain.
                handler = connected.get(type(packet)) if state is _CONNECTED else None
                if handler is on_publish:
                    # (the table's own: a direct call, not through the table's entry
                    # with its arguments checked, every PUBLISH)
                    self._on_publish(cast(Publish, packet))
                elif handler is not None:
                    handler(self, packet)
                else:
                    problem = self.check(packet)
                    if problem is not None:
                        self._carry_out(Close(problem))
                        return
                    self._handlers[type(packet)](self, packet)
                    # CONNECT (or AUTH) may have connected it, and ``start_debug``
                    # swapped its class: what follows in this read takes the new table.
                    connected = self._connected_handlers
                if until and seconds() >= until:
                    if (decoder.buffered and self.state is _CONNECTED
                            and self._others_waiting()):
                        self._yield_turn()     # (the next round returns: input held)
                    # Its share used up, it asks again every millisecond: another
                    # client's packet waits at most that long once the share is over.
                    until = seconds() + min(turn, _RECHECK)
        except MalformedPacket as exc:
            self._carry_out(decisions.malformed(exc, self.state is _AWAITING_CONNECT))
        finally:
            self._in_process = was_processing

    def _others_waiting(self) -> bool:
        """Another connection (or the reactor's waker, a listener) has input ready
        (``net.tcp.others_waiting``; a transport that is not plain TCP cannot tell
        its own descriptor apart: True when its socket has more)."""
        transport = self.transport
        own = transport.fileno() if plain_tcp(transport) else -1
        return others_waiting(self.clock, own)

    def _yield_turn(self) -> None:
        """This connection had its share of the reactor turn (``Limits.mqtt_turn``)
        and others wait: stop reading it and hold what it sent until the reactor
        has polled once more and read them.  (A reactor runs the calls due at the
        start of a turn, then polls: a ``callLater(0)`` made now would run before
        the next poll, ahead of the others; the call it makes runs after it.)"""
        self.meter.turn_yielded()
        self._pause_reading("turn")
        if self._turn_timer is None:
            self._turn_timer = self.clock.callLater(0, self._after_next_poll)

    def _after_next_poll(self) -> None:
        self._turn_timer = self.clock.callLater(0, self._turn_over)

    def _turn_over(self) -> None:
        self._turn_timer = None
        self._resume_reading("turn")

    def _pause_reading(self, why: str) -> None:
        if not self._reading_paused_for:
            self.transport.pauseProducing()
        if why not in self._reading_paused_for:
            self._reading_paused_for = self._reading_paused_for | {why}

    def _resume_reading(self, why: str) -> None:
        if why in self._reading_paused_for:
            # (``or``: back to the shared empty one, not a new 216-byte frozenset)
            self._reading_paused_for = self._reading_paused_for - {why} or NOT_PAUSED
            if not self._reading_paused_for and self.state is not ConnectionState.CLOSED:
                self._last_activity = self.clock.seconds()
                self.transport.resumeProducing()
                if (self.decoder.buffered or self._parked is not None) \
                        and not self._in_process:
                    # The packets held back when reading stopped (see ``_process``):
                    # after the batch that resumed us (another connection's PUBACK,
                    # say), not nested inside it.
                    if not self.broker.after_batch(self._process_held):
                        self._process_held()

    def _park(self, parked: Parked, packet: Any) -> bool:
        """Hold ``packet`` while publishers to durable queues are blocked (True), or
        let it be handled now (False): ``Parked.hold``.  Past its bound the
        connection is not read any more (the keepalive then waits too)."""
        if not parked.hold(packet, self._v5 is not None, self.broker.queues):
            return False
        if parked.over_bound:
            self._pause_reading("queues")
        return True

    def _process_held(self) -> None:
        if (self._reading_paused_for or self._in_process
                or self.state is ConnectionState.CLOSED):
            return   # (paused again meanwhile: the next resume comes back here)
        self._process_batch()

    def _drained(self) -> None:
        self._resume_reading("congestion")

    def _queues_writable(self) -> None:
        parked = self._parked
        if parked is not None:
            parked.waiting = False
            if not parked.packets and not self._in_process:
                self._parked = None
        self._resume_reading("queues")
        if (self._parked is not None and not self._reading_paused_for
                and not self._in_process and self.state is not ConnectionState.CLOSED
                and not self.broker.after_batch(self._process_held)):
            self._process_held()
