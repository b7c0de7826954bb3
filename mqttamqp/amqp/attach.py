"""Attaching AMQP links: what the address of a link the peer attaches means, and
which ``links``/``services`` class serves it.

What it owns: the dispatch from (role, address kind) to a link class, checking
the address (topic names and filters, session permissions) and refusing a link
it cannot serve with a condition that says why (the connection stays open); the
settle modes the broker answers with (the ones asked for, reported truly).

What it must not do: pump the engine (``listener``) or serve the link once it is
attached (``links``, ``services``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from proton import Condition
from twisted.logger import Logger

from mqttamqp.amqp.addresses import AddressKind, classify
from mqttamqp.amqp.links import (
    BrokerLink,
    ControlOutlet,
    LinkHost,
    SessionOutlet,
    TopicPublisher,
    TopicSubscription,
)
from mqttamqp.amqp.services import (
    PubrelLink,
    SessionRequests,
    SubscriptionServiceLink,
    WillServiceLink,
)
from mqttamqp.core.topics import validate_topic_filter, validate_topic_name

__all__ = ["AttachHost", "attach", "refuse_link"]

_log = Logger(namespace="mqttamqp.amqp.listener.AMQPConnection")


class AttachHost(LinkHost, Protocol):
    """What attaching needs from the connection (``listener.AMQPConnection``)."""

    links: dict[Any, BrokerLink]
    @property
    def requests(self) -> SessionRequests: ...


def refuse_link(host: AttachHost, plink: Any, condition: str, description: str) -> None:
    """Answer the attach with a null terminus, then detach with the reason."""
    _log.info("refused link {n} from {c} ({peer}): {cond}: {d}", n=plink.name,
                  c=host.container_id or "?", peer=host.peer, cond=condition, d=description)
    plink.open()
    plink.condition = Condition(condition, description)
    plink.close()


def attach(host: AttachHost, plink: Any) -> None:
    """Answer the peer's attach of ``plink`` with the link its address means, or
    refuse it (the connection stays open either way)."""
    if plink.is_sender:
        source = plink.remote_source
        if source.dynamic:
            refuse_link(host, plink, "amqp:not-implemented", "dynamic nodes are not supported")
            return
        address = source.address
        where = classify(address)
        make = _outgoing(host, plink, where.kind, where.value, address or "")
    else:
        target = plink.remote_target
        if target.dynamic:
            refuse_link(host, plink, "amqp:not-implemented", "dynamic nodes are not supported")
            return
        address = target.address
        where = classify(address)
        make = _incoming(host, plink, where.kind, where.value, address or "")
    if make is None:
        return
    plink.source.copy(plink.remote_source)
    plink.target.copy(plink.remote_target)
    plink.snd_settle_mode = plink.remote_snd_settle_mode
    plink.rcv_settle_mode = plink.remote_rcv_settle_mode
    if not plink.is_sender:
        plink.max_message_size = host.limits.max_packet_size
    link = make()  # reads the settle modes fixed above
    host.links[link.impl] = link
    plink.open()
    if isinstance(link, TopicSubscription):
        problem = link.subscribe()
        if problem is not None:
            del host.links[link.impl]
            link.closed = True
            plink.condition = Condition("amqp:unauthorized-access", problem)
            plink.close()
            return
    link.start()


def _outgoing(host: AttachHost, plink: Any, kind: AddressKind, value: str,
              address: str) -> Callable[[], BrokerLink] | None:
    if kind is AddressKind.TOPIC:
        problem = validate_topic_filter(value)
        if problem is not None:
            refuse_link(host, plink, "amqp:invalid-field",
                        f"source {address!r} is not a topic filter: {problem}")
            return None
        return partial(TopicSubscription, host, plink, value)
    if kind is AddressKind.SESSION_PUBLISH:
        if not host.broker.may_use_session(host.identity, value):
            refuse_link(host, plink, "amqp:unauthorized-access",
                        f"not allowed to attach to the session of {value!r}")
            return None
        return partial(SessionOutlet, host, plink, address, value)
    if kind is AddressKind.SESSION_CONTROL:
        return partial(ControlOutlet, host, plink, address, value)
    if kind is AddressKind.ANONYMOUS:
        refuse_link(host, plink, "amqp:invalid-field",
                    "a receiver needs a source address (a topic filter)")
        return None
    refuse_link(host, plink, "amqp:not-found",
                f"cannot receive from {address!r}")
    return None


def _incoming(host: AttachHost, plink: Any, kind: AddressKind, value: str,
              address: str) -> Callable[[], BrokerLink] | None:
    if kind is AddressKind.TOPIC:
        problem = validate_topic_name(value)
        if problem is not None:
            refuse_link(host, plink, "amqp:invalid-field",
                        f"target {address!r} is not a topic name: {problem}")
            return None
        return partial(TopicPublisher, host, plink, value)
    if kind is AddressKind.ANONYMOUS:
        return partial(TopicPublisher, host, plink, None)
    if kind is AddressKind.WILL_SERVICE:
        return partial(WillServiceLink, host, plink, address)
    if kind is AddressKind.SUBSCRIPTION_SERVICE:
        return partial(SubscriptionServiceLink, host, plink, address, host.requests)
    if kind is AddressKind.PUBREL:
        return partial(PubrelLink, host, plink, address, value)
    refuse_link(host, plink, "amqp:not-found", f"cannot send to {address!r}")
    return None


