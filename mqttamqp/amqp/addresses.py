"""What an AMQP address means to this broker: a topic, or one of the contract's
control addresses.

Client ids may contain ``.`` and ``/``; addresses are parsed by stripping the
known prefix and suffix, so ``$mqtt.to.a.b.publish`` is client ``a.b``.
Pure functions, no state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from fnmatch import fnmatchcase

from mqttamqp.core.queues.addresses import QUEUE_PREFIX, is_queue_topic

__all__ = [
    "AddressKind", "Address", "classify", "WILL_SERVICE_ADDRESSES",
    "SUBSCRIPTION_SERVICE_ADDRESSES", "publish_address", "control_address",
    "QUEUE_CAPABILITY", "matches_queue_pattern", "queue_topic",
]

WILL_SERVICE_ADDRESSES = frozenset({"$mqtt.willservice", "$mqtt.lwtservice", "$lwt"})
SUBSCRIPTION_SERVICE_ADDRESSES = frozenset({"$mqtt.subscriptionservice", "$subctrl"})
_TO = "$mqtt.to."
_CONTROL_PREFIX = "$mqtt."


class AddressKind(Enum):
    ANONYMOUS = "anonymous"            # null address: each message's ``to`` says where
    TOPIC = "topic"                    # a topic name (senders) or filter (receivers)
    WILL_SERVICE = "will-service"
    SUBSCRIPTION_SERVICE = "subscription-service"
    SESSION_PUBLISH = "session-publish"    # $mqtt.to.<id>.publish
    SESSION_CONTROL = "session-control"    # $mqtt.to.<id>.control
    PUBREL = "pubrel"                  # $mqtt.<id>.pubrel
    UNKNOWN_CONTROL = "unknown-control"    # some other $mqtt. address


@dataclass(frozen=True, slots=True)
class Address:
    kind: AddressKind
    value: str                         # the topic, or the client id for per-client kinds


def classify(address: str | None) -> Address:
    if not address:
        return Address(AddressKind.ANONYMOUS, "")
    if address in WILL_SERVICE_ADDRESSES:
        return Address(AddressKind.WILL_SERVICE, address)
    if address in SUBSCRIPTION_SERVICE_ADDRESSES:
        return Address(AddressKind.SUBSCRIPTION_SERVICE, address)
    if address.startswith(_TO):
        rest = address[len(_TO):]
        if rest.endswith(".publish") and len(rest) > len(".publish"):
            return Address(AddressKind.SESSION_PUBLISH, rest[:-len(".publish")])
        if rest.endswith(".control") and len(rest) > len(".control"):
            return Address(AddressKind.SESSION_CONTROL, rest[:-len(".control")])
    if address.startswith(_CONTROL_PREFIX):
        rest = address[len(_CONTROL_PREFIX):]
        if rest.endswith(".pubrel") and len(rest) > len(".pubrel"):
            return Address(AddressKind.PUBREL, rest[:-len(".pubrel")])
        return Address(AddressKind.UNKNOWN_CONTROL, address)
    return Address(AddressKind.TOPIC, address)


def publish_address(client_id: str) -> str:
    return _TO + client_id + ".publish"


def control_address(client_id: str) -> str:
    return _TO + client_id + ".control"


# -- queue links (issue 12) -------------------------------------------------------------

QUEUE_CAPABILITY = "queue"


def matches_queue_pattern(address: str, pattern: str) -> bool:
    """``address`` matches an ``--amqp-queues`` pattern, level by level: fnmatch's
    ``*`` would match a ``/`` too, so ``*`` (every plain name) would take
    ``sensors/t1`` from its topic subscribers."""
    levels = address.split("/")
    parts = pattern.split("/")
    return len(levels) == len(parts) and all(
        fnmatchcase(level, part) for level, part in zip(levels, parts, strict=True))


def queue_topic(address: str, queue_link: bool, patterns: Iterable[str]) -> str | None:
    """The queue topic an attached address (or a relayed ``to``) means, or None when
    it is a plain topic: ``$queue/...`` and ``$dlq/...`` as they are; a link that
    offers the ``queue`` capability (``queue_link``), or an address matching
    ``--amqp-queues``, names queue ``address`` (``orders`` is ``$queue/orders``)."""
    if is_queue_topic(address):
        return address
    if not address or address.startswith("$"):
        return None
    if queue_link or any(matches_queue_pattern(address, p) for p in patterns):
        return QUEUE_PREFIX + address
    return None
