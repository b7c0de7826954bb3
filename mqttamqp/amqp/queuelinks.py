"""Queue links (issue 12): AMQP receivers served by the durable queue manager.

What it owns: how an attached receiver joins a consumer group (the filter its
address means, ``consumer-group``/``consumer-mode``/``stream-offset`` from the
attach properties, the default group) and ``QueueSubscription``, the outgoing
link whose credit is its prefetch.  Its deliveries' outcomes go to the core as
for any topic link (``subscribers._SessionLink``); the core's queue manager turns them
into acknowledgements: Accepted acks, Released nacks uncounted,
Modified(delivery-failed) nacks counted, Rejected dead-letters with its error
description.

What it must not do: decide which addresses are queues (``addresses``), attach
links (``attach``), or hold queue rules (``core.queues``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqttamqp.amqp.links import LinkHost
from mqttamqp.amqp.subscribers import TopicSubscription
from mqttamqp.core.clock import DelayedCall
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import (
    CLASSIC,
    STREAM,
    Consumer,
    parse_queue_filter,
    parse_stream_offset,
)
from mqttamqp.net.rawproton import link_credit

__all__ = ["QueueSubscription", "queue_filter", "consumer_from_properties"]

_CONSUMER_KEYS = ("consumer-group", "consumer-mode", "stream-offset")
# How often a drain that waits for storage (``QueueSubscription._answer_drain``)
# looks again, and for how long at most (then it is answered with what came), in
# seconds.
_DRAIN_RECHECK = 0.005
_DRAIN_WAIT_MAX = 5.0


def queue_filter(topic: str, plain: bool) -> str:
    """The group filter a receiver's queue address means: ``$queue/<name>[/<filter>]``
    as given; a plain address ``X`` (``plain``: named by ``--amqp-queues`` or the
    ``queue`` capability) every message of queue ``X`` (``$queue/X/#``)."""
    return topic + "/#" if plain else topic


def consumer_from_properties(properties: Any, topic_filter: str,
                             selector: Callable[[Message], bool] | None = None,
                             browse: bool = False) -> Consumer | str:
    """The consumer a receiver's attach properties ask for, or why they are refused.

    Without ``consumer-group`` every receiver of the queue is one group, named
    after the queue (competing consumers, as a queue is usually read): AMQP has
    no client id to take a group from, and a container id is often random.
    ``selector``: the receiver's (``selection``), the consumer takes only what it
    matches.  ``browse`` (distribution-mode ``copy``): a browser, which reads the
    queue without taking anything (its group and mode do not apply)."""
    values: dict[str, str | None] = dict.fromkeys(_CONSUMER_KEYS)
    if isinstance(properties, dict):
        for key, value in properties.items():
            name = str(key)
            if name not in values or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                return f"attach property {name!r} must be a string"
            values[name] = str(value)
    address = parse_queue_filter(topic_filter)
    if isinstance(address, str):
        return address
    mode = values["consumer-mode"]
    if mode is not None and mode not in (CLASSIC, STREAM):
        return f"consumer-mode {mode!r}: use classic or stream"
    start = parse_stream_offset(values["stream-offset"])
    if isinstance(start, str):
        return start
    group = values["consumer-group"]
    if group is None:
        group = address.name
    elif not group or "/" in group or "@" in group:
        return f"consumer-group {group!r}: a group name is not empty and holds no / or @"
    return Consumer(group, mode, values["stream-offset"], explicit=False, selector=selector,
                    browse=browse)


class QueueSubscription(TopicSubscription):
    """A receiver of a durable queue: a member of its consumer group.

    Pre-settled, its deliveries are acknowledged on send (QoS 0); unsettled, by
    their outcomes (QoS 1).  The queue hands a member messages only while it has
    credit: a member without credit is skipped in the round-robin, and a flow that
    grants more makes the queue pump again (``Broker.link_drained``)."""

    __slots__ = ("_blocked", "_drain_check", "_drain_since", "consumer")
    queue = True

    def __init__(self, host: LinkHost, plink: Any, topic_filter: str,
                 consumer: Consumer) -> None:
        self._blocked = False
        self._drain_check: DelayedCall | None = None
        self._drain_since = 0.0   # when the drain being answered began to wait
        super().__init__(host, plink, topic_filter)
        self.consumer = consumer
        # (``_blocked`` is kept here and in ``on_blocked``/``end``, not only by the
        # setter below: in the compiled build ``_SessionLink``'s own writes of
        # ``congested`` go to its attribute, not through this class's property)
        self._blocked = host.write_blocked

    def subscribe(self) -> str | None:
        granted = 0 if self.presettled else 1
        session = self.broker.add_topic_receiver(
            self.key, self.address, self.host.identity, granted, consumer=self.consumer)
        if session is None:
            return (f"could not join group {self.consumer.group!r} of {self.address!r} "
                    "(not allowed, or refused: the broker's log says why)")
        self.session = session
        self.broker.start_topic_receiver(session, self)
        return None

    @property
    def congested(self) -> bool:
        # Credit is the prefetch here: what the queue hands a member without credit
        # would wait in the engine while other members of the group sit idle.
        return self._blocked or link_credit(self.impl) <= 0

    @congested.setter
    def congested(self, value: bool) -> None:
        self._blocked = value   # (closed or a full socket buffer: ``_SessionLink``)

    def on_blocked(self) -> None:
        super().on_blocked()
        self._blocked = self.closed or self.host.write_blocked

    def end(self, brute: bool, reason: str) -> None:
        self._blocked = True
        super().end(brute, reason)

    def on_flow(self) -> None:
        # More credit: take from the queue first, so a drain is answered with what
        # the queue had rather than with nothing.
        if self.session is not None and not self.closed:
            self.broker.link_drained(self.session)
        if self._drain_check is None and self.plink.drain_mode:
            self._drain_since = self.host.clock.seconds()
            self._answer_drain()   # (else the check already waiting answers it)

    def _answer_drain(self) -> None:
        """A drain (AMQP 1.0 §2.6.7) is answered once the queue has handed this link
        what it can up to its credit: the credit left is given back (delivery-count
        advanced, credit 0) in a flow.  What the queue will hand out once storage
        answers (a new group's dispatch watermark is committed first, bodies are
        read back) is waited for, rechecked every ``_DRAIN_RECHECK`` seconds: a
        commit or a read, and never longer than ``_DRAIN_WAIT_MAX``."""
        self._drain_check = None
        plink = self.plink
        if self.closed or not plink.drain_mode or plink.credit <= 0:
            return
        session = self.session
        if session is not None and self.broker.queues.feeding(session):
            clock = self.host.clock
            if clock.seconds() - self._drain_since < _DRAIN_WAIT_MAX:
                self._drain_check = clock.callLater(_DRAIN_RECHECK, self._answer_drain)
                return
        self.drained()

    def ended(self, brute: bool, reason: str) -> None:
        check, self._drain_check = self._drain_check, None
        if check is not None and check.active():
            check.cancel()
        super().ended(brute, reason)
