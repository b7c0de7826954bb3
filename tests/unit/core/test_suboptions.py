"""MQTT 5 subscription options of one delivery (``core.routing.suboptions``), on real
sessions and no broker: the no-local verdict, retain as published and the
subscription identifiers, at match time and for deliveries found later."""

from __future__ import annotations

from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.routing.shared import SharedGroup
from mqttamqp.core.routing.suboptions import delivery_options, subscription_ids
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, Session


def _session(filters: dict[str, int], client_id: str = "s") -> Session:
    """A session subscribed to ``filters`` (filter -> packed options)."""
    session = Session(client_id, False, Limits())
    for topic_filter, packed in filters.items():
        session.set_subscription(topic_filter, 1)
        session.set_options(topic_filter, packed)
    return session


def _msg(topic: str, publisher: str = "p", retain: bool = False) -> Message:
    return Message(topic, b"x", 1, retain, publisher, 0.0)


def test_identifiers_of_plain_filters_and_of_a_shared_one_only_alone() -> None:
    """Every matching plain filter's identifier; a shared filter's only when no plain
    filter of the session matches (the message came through its group)."""
    both = Session("b", False, Limits())
    for f, packed in (("a/+", 1 << 8), ("a/#", 2 << 8), ("$share/g/a/b", 3 << 8)):
        both.set_subscription(f, 0)
        both.set_options(f, packed)
    assert sorted(subscription_ids(both, "a/b")) == [1, 2]
    shared = Session("s", False, Limits())
    shared.set_subscription("$share/g/a/b", 0)
    shared.set_options("$share/g/a/b", 3 << 8)
    shared.set_subscription("x", 0)
    assert subscription_ids(shared, "a/b") == (3,)
    assert subscription_ids(shared, "z") == ()
    assert subscription_ids(Session("none", False, Limits()), "a/b") == ()


def test_match_time_options_agree_with_the_later_rule() -> None:
    """At match time the same identifiers come out as ``subscription_ids`` finds
    later, with the verdict: a plain match keeps the shared identifiers out."""
    session = _session({"a/+": 5 << 8, "a/#": 6 << 8, "$share/g/a/#": 7 << 8})
    group = SharedGroup[Session]("g", "a/#", "round-robin", 10, 1000)
    message = _msg("a/b")
    assert delivery_options(session, message, group, True) == (False, (5, 6))
    assert subscription_ids(session, "a/b") == (5, 6)
    only_shared = _session({"$share/g/a/#": 7 << 8})
    assert delivery_options(only_shared, message, group, False) == (False, (7,))
    assert subscription_ids(only_shared, "a/b") == (7,)


def test_no_local_and_retain_as_published_with_identifiers() -> None:
    """No local drops the session's own message; retain as published keeps the flag
    of a retained message; identifiers come with either answer."""
    session = _session({"t": NO_LOCAL | 1 << 8, "u": RETAIN_AS_PUBLISHED | 2 << 8}, "me")
    assert delivery_options(session, _msg("t", "me"), None, True) is None
    assert delivery_options(session, _msg("t", "other"), None, True) == (False, (1,))
    assert delivery_options(session, _msg("u", "me", retain=True), None, True) == (True, (2,))
    assert delivery_options(session, _msg("u", "other"), None, True) == (False, (2,))


def test_options_without_identifiers_give_none() -> None:
    """Options without an identifier (no local only) give the verdict and no
    identifiers, and match no topic for them."""
    session = _session({"t": NO_LOCAL, "v": RETAIN_AS_PUBLISHED})
    assert delivery_options(session, _msg("t"), None, True) == (False, ())
    assert delivery_options(session, _msg("v", retain=True), None, True) == (True, ())
    assert subscription_ids(session, "t") == ()
