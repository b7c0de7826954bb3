"""AMQP 1.0 message bodies as the MQTT-over-AMQP contract uses them: bytes in,
plain Python values out, and the encoder for the messages the broker sends.

One module per concern, each imported by its own name (this package re-exports
nothing):

* ``values``: the AMQP types a value decodes to (``Symbol``, ``Described``), the
  value decoder with its limits, and ``DecodeError``, the one exception;
* ``sections``: a transfer's payload as an ``InboundMessage`` (sections in order,
  each once);
* ``contract``: the contract's fields of a message (QoS and its fallback, retain,
  the payload, the MQTT 5 properties);
* ``publish``: the per-message path of a topic publisher (``decode_publish``,
  ``recall_publish``);
* ``native``: what AMQP receivers get of a received message (its own sections);
* ``encode``: AMQP_PUBLISH by hand, native messages with the contract's head, and
  the control messages.

What it must not do: touch a socket, a proton engine, Twisted or the broker
(import contract ``codecs-are-pure``).  Only ``encode`` imports proton, to encode
the rare control messages.
"""
