"""MQTT 5 subscription options as one delivery needs them: whether a session takes a
message at all (no local), the retain flag it gets (retain as published), and the
subscription identifiers of the session's filters that the message matched.

What it owns: that rule, in one place.  ``delivery_options`` is the router's, at
match time: one pass over the session's options gives the verdict and the
identifiers.  ``subscription_ids`` is for the deliveries that do not come from a
live match: a shared group's backlog or loan given to a member, retained messages
fed to a new subscription, entries restored at start.  The identifiers travel with
the delivery (``OutEntry.subscription_ids``, or ``Session.deliver``'s parameter for
QoS 0) to ``ClientLink.send_publish``, so no protocol adapter matches a topic again.

The identifiers (MQTT 5 §3.3.4): every matching plain filter's, the overlapping
ones included, in the one copy sent; a shared filter's only when no plain filter of
the session matches (then the message came through its group).  Only MQTT 5
sessions have options, so MQTT 3.1.1 and AMQP deliveries never carry any.

What it must not do: keep state, or know about connections and frames.
"""

from __future__ import annotations

from mqttamqp.core.message import Message
from mqttamqp.core.routing.shared import SHARE_PREFIX, SharedGroup, route_filter
from mqttamqp.core.sessions.entries import NO_SUBSCRIPTION_IDS
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, Session
from mqttamqp.core.topics import topic_matches

__all__ = ["delivery_options", "subscription_ids"]

# The two answers without identifiers, shared (most deliveries have none).
_KEEP_FLAG = (False, NO_SUBSCRIPTION_IDS)
_RETAIN_FLAG = (True, NO_SUBSCRIPTION_IDS)


def delivery_options(session: Session, message: Message,
                     picked_by: SharedGroup[Session] | None, plain: bool
                     ) -> tuple[bool, tuple[int, ...]] | None:
    """MQTT 5 subscription options of ``session`` for ``message``: None when every
    filter that delivers it is "no local" and the session published it itself; else
    the retain flag to deliver with (set if such a filter is "retain as published"
    and the message was published retained) and the subscription identifiers.  A
    shared filter delivers it only when its group picked this session
    (``picked_by``); ``plain``: a plain filter of the session matched."""
    options = session.sub_options
    topic = message.topic
    picked = picked_by.key if picked_by is not None else None
    if message.publisher == session.client_id:
        if not any(f == picked if f.startswith(SHARE_PREFIX) else topic_matches(f, topic)
                   for f in session.subscriptions if not options.get(f, 0) & NO_LOCAL):
            return None
    as_published = message.retain
    retain = False
    ids: list[int] | None = None
    shared: list[tuple[str, int]] | None = None
    for f, packed in options.items():
        sid = packed >> 8
        if f.startswith(SHARE_PREFIX):
            if as_published and packed & RETAIN_AS_PUBLISHED and f == picked:
                retain = True
            if sid and not plain:
                if shared is None:
                    shared = [(f, sid)]
                else:
                    shared.append((f, sid))
        elif (sid or (as_published and packed & RETAIN_AS_PUBLISHED)) and topic_matches(
                f, topic):
            if as_published and packed & RETAIN_AS_PUBLISHED:
                retain = True
            if sid:
                if ids is None:
                    ids = [sid]
                else:
                    ids.append(sid)
    if ids is None and shared is not None:
        ids = [sid for f, sid in shared if topic_matches(route_filter(f), topic)]
    if not ids:
        return _RETAIN_FLAG if retain else _KEEP_FLAG
    return retain, tuple(ids)


def subscription_ids(session: Session, topic: str) -> tuple[int, ...]:
    """The subscription identifiers of ``session``'s filters that match ``topic``, for
    a delivery that does not come from the router's match (see the module's rule)."""
    options = session.sub_options
    if not options:
        return NO_SUBSCRIPTION_IDS
    ids = tuple(packed >> 8 for f, packed in options.items()
                if packed >> 8 and not f.startswith(SHARE_PREFIX) and topic_matches(f, topic))
    if ids or any(topic_matches(f, topic) for f in session.subscriptions
                  if not f.startswith(SHARE_PREFIX)):
        return ids
    return tuple(packed >> 8 for f, packed in options.items()
                 if packed >> 8 and f.startswith(SHARE_PREFIX)
                 and topic_matches(route_filter(f), topic))
