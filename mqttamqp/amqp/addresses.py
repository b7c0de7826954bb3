"""What an AMQP address means to this broker: a topic, or one of the contract's
control addresses.

Client ids may contain ``.`` and ``/``; addresses are parsed by stripping the
known prefix and suffix, so ``$mqtt.to.a.b.publish`` is client ``a.b``.
Pure functions, no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "AddressKind", "Address", "classify", "WILL_SERVICE_ADDRESSES",
    "SUBSCRIPTION_SERVICE_ADDRESSES", "publish_address", "control_address",
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
