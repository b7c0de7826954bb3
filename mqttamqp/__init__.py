"""mqttamqp: an MQTT 3.1/3.1.1 and AMQP 1.0 broker on one Twisted reactor."""

__version__ = "0.2.0"
__all__ = ["__version__"]
