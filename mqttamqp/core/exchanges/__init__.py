"""AMQP 0.9.1's model on the core: exchanges, bindings and declared queues (issue 27).

``Exchanges`` (``Broker.exchanges``) is what the 0.9.1 adapter calls; see
``exchanges.py``."""
