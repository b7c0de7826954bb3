"""AMQP messages of the MQTT-over-AMQP contract as the tests' clients send them, and
the proton transport drain: shared by the in-memory harness (``amqp_memory``),
the real-client helpers (``amqp_clients``) and the engine unit tests."""

from __future__ import annotations

from typing import Any

from proton import Message, int32, symbol

__all__ = ["publish_message", "will_message", "control", "annotation", "drain"]


def publish_message(topic: str | None, payload: bytes, qos: int | None = None,
                    retain: bool | None = None, durable: bool | None = None) -> Message:
    """AMQP_PUBLISH as an FE or a native client sends it (one Data section)."""
    annotations: dict[Any, Any] = {}
    if qos is not None:
        annotations[symbol("x-opt-mqtt-qos")] = int32(qos)
    if retain is not None:
        annotations[symbol("x-opt-retain-message")] = retain
    msg = Message(address=topic, body=payload, annotations=annotations or None,
                  durable=bool(qos) if durable is None else durable)
    msg.inferred = True  # a Data section
    return msg


def will_message(topic: str, payload: bytes, qos: int | None = None, retain: bool = False,
                 durable: bool | None = None) -> Message:
    msg = publish_message(topic, payload, qos, retain, durable)
    msg.subject = "will"
    return msg


def control(subject: str, client_id: str | None = None, body: Any = None,
            reply_to: str | None = None, message_id: Any = None) -> Message:
    """A control message of the contract; ``client_id`` sets the correlation-id."""
    msg = Message(subject=subject, body=body)
    if client_id is not None:
        msg.correlation_id = f"$mqtt.to.{client_id}.publish"
    if reply_to is not None:
        msg.reply_to = reply_to
    if message_id is not None:
        msg.id = message_id
    return msg


def annotation(message: Message, key: str) -> Any:
    return (message.annotations or {}).get(symbol(key))


def drain(transport: Any) -> bytes:
    """Everything a proton transport has to send, taken out of it."""
    n = transport.pending()
    if n <= 0:
        return b""
    data = bytes(transport.peek(n))
    transport.pop(n)
    return data


def meta(message: Message) -> dict[str, Any]:
    """The message annotations (a queue's metadata: ``x-opt-message-id`` ...)."""
    return {str(key): value for key, value in (message.annotations or {}).items()}


def pump_transports(ours: Any, theirs: Any, rounds: int = 4) -> None:
    """Move the bytes two proton ``Transport``s have pending into each other, both
    ways, ``rounds`` times (enough for an open, begin and attach and their answers)."""
    for _ in range(rounds):
        for a, b in ((ours, theirs), (theirs, ours)):
            n = a.pending()
            if n > 0:
                b.push(a.peek(n))
                a.pop(n)
