"""The toolkit every protocol adapter (MQTT, AMQP 1.0, and those to come) uses for
the rules they share, so that each adapter states them once, the same way:

* ``meter``: ``DeliveryMeter``, the one writer of the core's traffic counters for
  the adapters (messages and bytes in and out, refusals, protocol errors, limits)
  and the one rule that picks 1 delivery in ``DELIVER_SAMPLE_MASK + 1`` for the
  publish-to-deliver latency;
* ``throttle``: ``PublishThrottle``, the pause of a publisher over its publish
  rate (``--max-publish-rate``, ``--max-publish-byte-rate``) and its end;
* ``backoff``: ``Backoff``, the reconnect delays of the outbound connections
  (bridges, gateway mode's upstream).

What it must not do: import a protocol, the network tricks (``mqttamqp.net``) or
anything but the core (``.importlinter``); the adapters call it, not the core.
"""
