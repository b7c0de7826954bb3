"""Bridges: the broker as a client of another broker (issue #29, part 2).

What it owns: ``[[bridge]]`` tables read and checked (``config``), the MQTT client
connection to the remote on the broker's reactor, written on the broker's own sans-IO
codec (``client``), the reconnect loop with its bounded exponential back-off, the status and the
two directions of one bridge whatever the remote speaks (``base``), the MQTT remote's
side of them (``bridge``: ``out`` is a persistent session of the
broker, ``$bridge/<name>``, whose link is the remote connection, so QoS >= 1 messages
wait durably while the remote is away; ``in`` publishes through the broker's port
with the bridge as publisher), the out session's link fitted to the remote's MQTT 5
limits (``link``), and the service that starts and stops them, holds the sessions of
removed bridges (unsubscribed, backlog kept) and gives their figures to the console
and the metrics (``service``), ``ws(s)://`` remotes through autobahn's client
(``wsremote``), ``amqp://`` and ``amqps://`` remotes over gateway mode's proton client
engine (``amqp``), and the out backlog's own bound (``backlog``).

What it must not do: reach storage other than through the broker's commands (the
session's queue is the backlog; nothing here stores anything), keep a second MQTT
client library on the reactor, or decide routing (the router does).
"""
