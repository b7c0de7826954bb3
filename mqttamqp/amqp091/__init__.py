"""AMQP 0.9.1 (issue 27): the protocol adapter on pamqp, sharing the AMQP port
with AMQP 1.0 (``sniff``: the 8-byte protocol header decides).

Layers, one concern each: ``frames`` (bytes to frames and content, sans-IO,
bounded), ``negotiation`` (what the handshake decides: mechanisms, credentials,
tune values, server properties; pure), ``properties`` (basic properties to and
from the core's ``Message``), ``connection`` (the Twisted protocol: states,
heartbeats, closing, channels), ``channel`` (one channel's methods, against
``Broker.exchanges``), ``consumers`` (a ``basic.consume``: the core's
``ClientLink`` of a queue's consumer group).
"""
