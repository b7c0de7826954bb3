"""Attaching AMQP links: what the address of a link the peer attaches means, and
which link class serves it (``subscribers``, ``publisher``, ``queuelinks``,
``services``).

What it owns: the dispatch from (role, address kind) to a link class, checking
the address (topic names and filters, session permissions) and refusing a link
it cannot serve with a condition that says why (the connection stays open; the
log has a line per refusal, at most ``REFUSALS_LOGGED`` a minute per condition);
the settle modes the broker answers with (the ones asked for, reported truly).

What it must not do: pump the engine (``pump``) or serve the link once it is
attached (the link classes).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from proton import Data, Terminus, symbol
from twisted.logger import Logger

from mqttamqp.amqp.addresses import QUEUE_CAPABILITY, AddressKind, classify, queue_topic
from mqttamqp.amqp.links import BrokerLink, ControlOutlet, LinkHost
from mqttamqp.amqp.publisher import TopicPublisher
from mqttamqp.amqp.queuelinks import QueueSubscription, consumer_from_properties, queue_filter
from mqttamqp.amqp.selection import message_predicate, source_selector
from mqttamqp.amqp.services import (
    PubrelLink,
    SessionRequests,
    SubscriptionServiceLink,
    WillServiceLink,
)
from mqttamqp.amqp.subscribers import SessionOutlet, TopicSubscription
from mqttamqp.amqp.transactions import LOCAL_TRANSACTIONS, Coordinator
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Consumer, is_queue_topic
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.routing.shared import SHARE_PREFIX
from mqttamqp.core.routing.subscriptions import DYNAMIC_PREFIX
from mqttamqp.core.topics import (
    topic_size_problem,
    validate_topic_filter,
    validate_topic_name,
)
from mqttamqp.net.rawproton import close_with, lib

__all__ = ["AttachHost", "attach", "refuse_link", "TOPIC_CAPABILITY", "RESOURCE_LIMIT",
           "REFUSALS_LOGGED"]

TOPIC_CAPABILITY = "topic"
NOT_IMPLEMENTED = "amqp:not-implemented"
DECODE_ERROR = "amqp:decode-error"
INVALID_FIELD = "amqp:invalid-field"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
# Log lines a minute for the refusals of one condition, of all connections: enough
# to see why an application's links are refused, not a line per attach of a peer
# that attaches refused links in a loop.
REFUSALS_LOGGED = 20

Predicate = Callable[[Message], bool]

_log = Logger(namespace="mqttamqp.amqp.listener.AMQPConnection")


class AttachHost(LinkHost, Protocol):
    """What attaching needs from the connection (``endpoints.SessionsAndLinks``)."""

    links: dict[Any, BrokerLink]
    @property
    def requests(self) -> SessionRequests: ...

    @property
    def refusal_log(self) -> LogLimiter: ...


def refuse_link(host: AttachHost, plink: Any, condition: str, description: str,
                logged: bool = True) -> None:
    """Answer the attach with a null terminus, then detach with the reason (logged
    unless ``logged`` is false: the caller logs its cause its own way)."""
    if logged:
        held = host.refusal_log.allow(condition)
        if held is not None:
            _log.info("refused link {n} from {c} ({peer}): {cond}: {d}{more}",
                      n=_safe_name(plink), c=host.container_id or "?", peer=host.peer,
                      cond=condition, d=description,
                      more=f" ({held} more refused with {condition} since the last such "
                      "line)" if held else "")
    impl = plink._impl
    lib.pn_link_open(impl)
    # (set in the engine, not as ``plink.condition``: proton would keep that object
    # in the link's Python attributes for as long as the link is held)
    close_with(impl, lib.pn_link_condition(impl), lib.pn_link_close, condition,
               description)


def _safe_name(plink: Any) -> str:
    try:
        return str(plink.name)
    except UnicodeDecodeError:
        return "(name not UTF-8)"


def attach(host: AttachHost, plink: Any) -> None:
    """Answer the peer's attach of ``plink`` with the link its address means, or
    refuse it (the connection stays open either way)."""
    try:
        # proton decodes these strings on access: invalid UTF-8 raises here.
        plink.name  # noqa: B018
        remote = plink.remote_source if plink.is_sender else plink.remote_target
        address = remote.address
    except UnicodeDecodeError:
        refuse_link(host, plink, DECODE_ERROR,
                    "the link name or address is not valid UTF-8")
        return
    unsupported = _unsupported(plink, remote)
    if unsupported is not None:
        refuse_link(host, plink, NOT_IMPLEMENTED, unsupported)
        return
    refused, selector = _selector(host, plink, remote) if plink.is_sender else (False, None)
    if refused:
        return
    dynamic = plink.is_sender and remote.dynamic
    coordinator = not plink.is_sender and remote.type == Terminus.COORDINATOR
    if coordinator:
        make: Callable[[], BrokerLink] | None = partial(Coordinator, host, plink, "")
    elif dynamic:
        # A node of its own for this receiver (request/response: its reply-to).
        address = DYNAMIC_PREFIX + uuid.uuid4().hex
        make = partial(
            TopicSubscription, host, plink, address, reserved=True, selector=selector)
    elif plink.is_sender:
        where = classify(address)
        make = _outgoing(host, plink, where.kind, where.value, address or "", selector)
    else:
        where = classify(address)
        make = _incoming(host, plink, where.kind, where.value, address or "")
    if make is None:
        return
    plink.source.copy(plink.remote_source)
    plink.target.copy(plink.remote_target)
    if dynamic:
        plink.source.address = address
    plink.snd_settle_mode = plink.remote_snd_settle_mode
    plink.rcv_settle_mode = plink.remote_rcv_settle_mode
    if not plink.is_sender:
        plink.max_message_size = host.limits.max_packet_size
    if coordinator:
        _set_capabilities(plink.target, [LOCAL_TRANSACTIONS])
    link = make()  # reads the settle modes fixed above
    if isinstance(link, (TopicSubscription, TopicPublisher)) and link.address:
        # What the node is: a topic or a queue (what JMS-style clients ask for with it).
        terminus = plink.source if plink.is_sender else plink.target
        queue = isinstance(link, QueueSubscription) or is_queue_topic(link.address)
        _set_capabilities(terminus, [QUEUE_CAPABILITY if queue else TOPIC_CAPABILITY])
    host.links[link.impl] = link
    plink.open()
    if isinstance(link, TopicSubscription):
        problem = link.subscribe()
        if problem is not None:
            del host.links[link.impl]
            link.closed = True
            impl = plink._impl
            close_with(impl, lib.pn_link_condition(impl), lib.pn_link_close,
                       "amqp:unauthorized-access", problem)
            return
    link.start()


def _unsupported(plink: Any, remote: Any) -> str | None:
    """Why the link asks for something this broker does not do, or None."""
    if not plink.is_sender:
        if remote.type == Terminus.COORDINATOR:
            asked = _capabilities(remote)
            if asked and LOCAL_TRANSACTIONS not in asked:
                return (f"transactions of kind {', '.join(sorted(asked))} are not "
                        f"supported (only {LOCAL_TRANSACTIONS})")
            return None
        if remote.dynamic:
            return "dynamic targets are not supported (a receiver may ask for a dynamic source)"
    return None


def _selector(host: AttachHost, plink: Any, remote: Any) -> tuple[bool, Predicate | None]:
    """Whether the receiver's source filter is refused (the link is refused then),
    and the predicate of the selector it asks for (None: without one)."""
    filters = remote.filter
    filters.rewind()
    if filters.next() is None:
        return False, None
    try:
        found = source_selector(filters.get_object(), host.limits.amqp_max_selector_length)
    except (UnicodeDecodeError, KeyError, TypeError, ValueError):
        found = "the source's filter map does not decode"
    if isinstance(found, str):
        condition = INVALID_FIELD if found.startswith("selector ") else NOT_IMPLEMENTED
        refuse_link(host, plink, condition, found)
        return True, None
    if found is None:
        return False, None
    return False, message_predicate(found[1])


def _set_capabilities(terminus: Any, names: list[str]) -> None:
    capabilities: Data = terminus.capabilities
    capabilities.clear()
    capabilities.put_array(False, Data.SYMBOL)
    capabilities.enter()
    for name in names:
        capabilities.put_symbol(symbol(name))
    capabilities.exit()


def _capabilities(terminus: Any) -> set[str]:
    """The capabilities the peer's terminus names (empty if none or undecodable)."""
    data: Data = terminus.capabilities
    try:
        data.rewind()
        if data.next() is None:
            return set()
        value = data.get_object()
    except (UnicodeDecodeError, KeyError, TypeError):
        return set()
    names: Any = getattr(value, "elements", value)
    if isinstance(names, str):
        return {str(names)}
    return {str(n) for n in names} if isinstance(names, (list, tuple)) else set()


def _offers_queue(terminus: Any) -> bool:
    """The peer's terminus offers the ``queue`` capability (its address names a
    durable queue)."""
    return QUEUE_CAPABILITY in _capabilities(terminus)


def _queue_topic(host: AttachHost, terminus: Any, address: str) -> str | None:
    """The queue topic a link's address means (``addresses.queue_topic``), or None."""
    return queue_topic(address, _offers_queue(terminus), host.limits.amqp_queues)


def _queue_receiver(host: AttachHost, plink: Any, topic: str, address: str,
                    selector: Predicate | None = None) -> Callable[[], BrokerLink] | None:
    """A receiver of a durable queue, with the consumer its attach properties ask for;
    a browser (``core.queues.browsing``) if its source asks for distribution-mode
    ``copy`` (echoed: the source is copied into the answer)."""
    browse = plink.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
    topic_filter = queue_filter(topic, plain=topic != address)
    consumer: Consumer | str | None = _size_problem(host, topic_filter)
    if consumer is None:
        try:
            consumer = consumer_from_properties(plink.remote_properties, topic_filter,
                                                selector, browse)
        except (UnicodeDecodeError, KeyError, TypeError, ValueError):
            consumer = "the attach properties do not decode"
    if isinstance(consumer, str):
        refuse_link(host, plink, "amqp:invalid-field",
                    f"source {address!r} is not a queue this broker can serve: {consumer}")
        return None
    return partial(QueueSubscription, host, plink, topic_filter, consumer)


def _size_problem(host: AttachHost, topic: str) -> str | None:
    limits = host.limits
    return topic_size_problem(topic, limits.max_topic_levels, limits.max_topic_length)


def _outgoing(host: AttachHost, plink: Any, kind: AddressKind, value: str,
              address: str, selector: Predicate | None = None
              ) -> Callable[[], BrokerLink] | None:
    if selector is not None and kind is not AddressKind.TOPIC:
        refuse_link(host, plink, NOT_IMPLEMENTED,
                    f"a selector applies to topic and queue sources, not {address!r}")
        return None
    if kind is AddressKind.TOPIC:
        queued = _queue_topic(host, plink.remote_source, value)
        if queued is not None:
            return _queue_receiver(host, plink, queued, value, selector)
        problem = validate_topic_filter(value) or _size_problem(host, value)
        if problem is not None:
            refuse_link(host, plink, "amqp:invalid-field",
                        f"source {address!r} is not a topic filter: {problem}")
            return None
        if selector is not None and value.startswith(SHARE_PREFIX):
            refuse_link(host, plink, NOT_IMPLEMENTED,
                        f"a selector on a shared subscription ({address!r}) is not supported")
            return None
        return partial(TopicSubscription, host, plink, value, selector=selector)
    if kind is AddressKind.SESSION_PUBLISH:
        if not host.broker.gate.may_use_session(host.identity, value):
            refuse_link(host, plink, "amqp:unauthorized-access",
                        f"not allowed to attach to the session of {value!r}")
            return None
        return partial(SessionOutlet, host, plink, address, value)
    if kind is AddressKind.SESSION_CONTROL:
        if not host.broker.gate.may_use_session(host.identity, value):
            refuse_link(host, plink, "amqp:unauthorized-access",
                        f"not allowed to attach to the control link of {value!r}")
            return None
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
        value = _queue_topic(host, plink.remote_target, value) or value
        problem = validate_topic_name(value) or _size_problem(host, value)
        if problem is not None:
            refuse_link(host, plink, "amqp:invalid-field",
                        f"target {address!r} is not a topic name: {problem}")
            return None
        if not host.broker.gate.may_write(host.identity, value):
            refuse_link(host, plink, "amqp:unauthorized-access",
                        f"not allowed to publish to {value!r}")
            return None
        return partial(TopicPublisher, host, plink, value)
    if kind is AddressKind.ANONYMOUS:
        return partial(TopicPublisher, host, plink, None)
    if kind is AddressKind.WILL_SERVICE:
        # The link's name is the will's owner: only that client (or an FE acting
        # for it, without an ACL) may hold it.
        if not host.broker.gate.may_use_session(host.identity, plink.name):
            refuse_link(host, plink, "amqp:unauthorized-access",
                        f"not allowed to hold the will of {plink.name!r}")
            return None
        return partial(WillServiceLink, host, plink, address)
    if kind is AddressKind.SUBSCRIPTION_SERVICE:
        return partial(SubscriptionServiceLink, host, plink, address, host.requests)
    if kind is AddressKind.PUBREL:
        if not host.broker.gate.may_use_session(host.identity, value):
            refuse_link(host, plink, "amqp:unauthorized-access",
                        f"not allowed to release messages of the session of {value!r}")
            return None
        return partial(PubrelLink, host, plink, address, value)
    refuse_link(host, plink, "amqp:not-found", f"cannot send to {address!r}")
    return None


