"""The MQTT decoders of the connections that have input to decode, lent per read.

An idle connection has nothing buffered between two reads, so it needs no decoder of
its own (88 bytes each, issue 31 §2): it holds ``IDLE``, a decoder that is never fed
and always empty.  At a read it borrows one (``SpareDecoders.take``), and gives it
back when the read left nothing buffered (``give``); a connection with part of a
packet, or input held back (a pause, its share of a turn used up), keeps its own
until that is decoded.  One spare per protocol level is kept, so a stream of reads
from many connections makes no decoder per read; a read that begins while another
connection's is under way (one handler calling into another connection) finds no
spare and makes one.

What it owns: the spares and ``IDLE``.  What it must not do: decode (``codec``), or
know about sockets and connection states (``protocol`` lends and takes back).
"""

from __future__ import annotations

from typing import Final

from mqttamqp.mqtt.codec import Decoder, PropertyLimits

__all__ = ["IDLE", "SpareDecoders"]

#: The decoder of a connection with nothing buffered: never fed (``dataReceived``
#: borrows a real one first), so ``next_packet`` is None and ``buffered`` 0.
IDLE: Final = Decoder(server=True)

# The protocol level of each version label of a connection ("": no CONNECT yet,
# read with the MQTT 3.1.1 rules until CONNECT says otherwise).
_LEVELS = {"": 4, "3.1": 3, "3.1.1": 4, "5": 5}


class SpareDecoders:
    """One spare ``Decoder`` per protocol level, for a listener's connections (the
    bound is one each: nothing grows with the number of connections)."""

    __slots__ = ("_max_packet_size", "_property_limits", "_spare")

    def __init__(self, max_packet_size: int, property_limits: PropertyLimits) -> None:
        self._max_packet_size = max_packet_size
        self._property_limits = property_limits
        self._spare: dict[int, Decoder] = {}

    def take(self, version: str) -> Decoder:
        """An empty decoder for a connection of ``version`` (its label, "" before
        CONNECT)."""
        level = _LEVELS.get(version, 4)
        decoder = self._spare.pop(level, None)
        if decoder is None:
            decoder = Decoder(max_packet_size=self._max_packet_size, protocol_level=level,
                              property_limits=self._property_limits, server=True)
        return decoder

    def give(self, decoder: Decoder) -> None:
        """``decoder`` has nothing buffered and its connection let it go.  (It may
        still hold the last read, taken whole: one per level, until the next feed.)"""
        self._spare[decoder.protocol_level] = decoder
