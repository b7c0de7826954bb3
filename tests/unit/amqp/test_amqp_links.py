"""AMQP links bounded by design (issue 26, section 4): the total of all connections
(``--amqp-max-links-total``), links freed once closed at both ends, and links that
cost little.

In memory, as ``test_amqp_native``: proton client engines and the broker's own
``AMQPConnection`` on one ``task.Clock`` (``amqp_memory.Net``).  What is observed
comes over the wire (the attach answers, the conditions), from ``/metrics`` and the
log; where a test counts what the engine still holds it says so.
"""

from __future__ import annotations

from typing import Any

import pytest
from amqp_memory import ACCEPTED, AmqpPeer, Net, outcome
from proton import Message

from mqttamqp.amqp.links import BrokerLink
from mqttamqp.net.rawproton import lib

RESOURCE_LIMIT = "amqp:resource-limit-exceeded"


def _metrics(net: Net) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``, by name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    from mqttamqp.ops.metrics import broker_registry, exposition

    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(
            exposition(broker_registry(net.broker)).decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _links_gauge(net: Net) -> float:
    return _metrics(net)[("mqttamqp_amqp_links", ())]


def _refusals(net: Net) -> float:
    return _metrics(net).get(
        ("mqttamqp_limit_hits_total", (("limit", "amqp_links_total"),)), 0.0)


def _reached_lines(log_lines: list[str]) -> list[str]:
    return [line for line in log_lines if "--amqp-max-links-total" in line
            and "reached" in line]


def _engine_links(net: Net) -> int:
    """Links the broker's engines still hold, freed or not (what a leak would grow)."""
    held = 0
    for conn in net.factory.connections:
        link = lib.pn_link_head(conn.pconn._impl, 0)
        while link:
            held += 1
            link = lib.pn_link_next(link, 0)
    return held


def test_an_attach_beyond_the_total_is_refused_and_the_connection_stays(
        log_lines: list[str]) -> None:
    """Past --amqp-max-links-total (all connections together) an attach is refused
    with amqp:resource-limit-exceeded, counted, one log line for the episode; the
    connection and its links carry on, and a detach anywhere makes room again."""
    net = Net(amqp_max_links_total=6, amqp_max_links=5)
    first = net.amqp()
    kept = [first.receiver(f"tot/a{i}") for i in range(4)]
    second = net.amqp()
    rcv = second.receiver("tot/t")
    snd = second.sender("tot/t")
    assert _links_gauge(net) == 6
    refused = [second.receiver("tot/over"), first.receiver("tot/over2")]
    for r in refused:
        assert r.link.remote_condition is not None
        assert r.link.remote_condition.name == RESOURCE_LIMIT
        assert "--amqp-max-links-total" in r.link.remote_condition.description
    assert not first.lost and not second.lost
    assert _refusals(net) == 2 and net.broker.stats.limits == {"amqp_links_total": 2}
    assert len(_reached_lines(log_lines)) == 1, log_lines
    assert outcome(second.send(snd, Message(body="still"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["still"]
    for r in refused:             # the peer detaches what was refused: not held
        r.link.close()
    net.pump()
    assert _links_gauge(net) == 6
    kept[0].link.close()
    net.pump()
    again = second.receiver("tot/again")
    assert again.link.remote_condition is None and again.link.remote_source.address
    assert _links_gauge(net) == 6


def test_a_new_episode_logs_again_once_the_total_fell_well_below() -> None:
    """The log line is once per episode: another refusal while the total stays near
    the bound adds none; one after the total fell below nine tenths of it adds one."""
    from twisted.logger import formatEvent, globalLogPublisher

    events: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        events.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        net = Net(amqp_max_links_total=10, amqp_max_links=20)
        app = net.amqp()
        links = [app.receiver(f"ep/{i}") for i in range(10)]
        for _ in range(3):
            over = app.receiver("ep/over")
            over.link.close()
            net.pump()
        links[0].link.close()          # 9 of 10: not below nine tenths
        net.pump()
        app.receiver("ep/x")
        app.receiver("ep/over2").link.close()
        net.pump()
        assert len(_reached_lines(events)) == 1
        for r in links[1:4]:           # 7 of 10: the episode is over
            r.link.close()
        net.pump()
        for i in range(3):
            app.receiver(f"ep/y{i}")
        app.receiver("ep/over3")
        assert len(_reached_lines(events)) == 2
        assert net.broker.stats.limits == {"amqp_links_total": 5}
    finally:
        globalLogPublisher.removeObserver(observe)


def test_a_peer_that_keeps_refused_links_is_closed_at_the_margin() -> None:
    """Refused links count until their peer detaches them; a peer attaching while
    the total and a margin (half the total, at least --amqp-max-links) are held is
    closed (amqp:resource-limit-exceeded): the total never grows past both."""
    from mqttamqp.amqp.endpoints import refusal_margin
    from mqttamqp.core.limits import Limits

    assert refusal_margin(Limits()) == 30_000
    assert refusal_margin(Limits(amqp_max_links_total=4, amqp_max_links=3)) == 7
    net = Net(amqp_max_links_total=4, amqp_max_links=3)
    good = net.amqp()
    rcv = good.receiver("mg/t")
    greedy = [net.amqp() for _ in range(3)]
    for i, peer in enumerate(greedy[:2]):
        for j in range(3 if i == 0 else 2):
            peer.receiver(f"mg/{i}/{j}")
    assert _links_gauge(net) == 6        # 4 served, 2 refused and not detached
    assert not any(p.lost for p in greedy)
    greedy[2].receiver("mg/2/0")         # 7 = total + margin: still refused
    assert not greedy[2].lost
    greedy[2].receiver("mg/2/1")         # 8: past both
    assert greedy[2].lost
    assert greedy[2].conn.remote_condition.name == RESOURCE_LIMIT
    assert _links_gauge(net) == 6
    snd = good.sender("mg/t")
    assert snd.remote_condition.name == RESOURCE_LIMIT   # still full
    snd.close()                          # (a well-behaved peer detaches it)
    greedy[0].close()
    net.pump()
    assert _links_gauge(net) == 3
    snd = good.sender("mg/t")
    assert outcome(good.send(snd, Message(body="room again"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["room again"]


def test_the_count_follows_detach_session_end_and_close() -> None:
    """Links held return to zero whichever way they go: detach (closing or not), the
    end of their session (attached or refused), the connection's close or loss."""
    net = Net()
    app = net.amqp()
    r1 = app.receiver("cnt/1")
    r2 = app.receiver("cnt/2")
    app.receiver("cnt/#/bad")                 # refused, not detached by the peer
    assert _links_gauge(net) == 3
    r1.link.close()
    r2.link.detach()
    net.pump()
    assert _links_gauge(net) == 1
    session = app.conn.session()
    session.open()
    for i in range(3):
        link = session.receiver(f"s{i}")
        link.source.address = f"cnt/s{i}"
        link.open()
    bad = session.sender("sbad")
    bad.target.address = "cnt/+"              # refused: not a topic name
    bad.open()
    net.pump()
    assert _links_gauge(net) == 5
    session.close()
    net.pump()
    assert _links_gauge(net) == 1
    app.close()
    assert _links_gauge(net) == 0
    other = net.amqp()
    other.receiver("cnt/x")
    other.sender("cnt/y")
    assert _links_gauge(net) == 2
    other.kill()
    assert _links_gauge(net) == 0


def test_links_and_sessions_closed_at_both_ends_are_freed() -> None:
    """A connection that attaches and detaches links (and begins and ends sessions)
    for as long as it lives holds only what is attached: proton's links are freed
    once closed at both ends (they were kept until the connection ended, ~2.3 KB
    each)."""
    net = Net()
    app = net.amqp()
    keep = app.receiver("free/keep")
    for i in range(300):
        r = app.receiver(f"free/{i}", credit=1)
        r.link.close()
        app.receivers.remove(r)
        s = app.sender(f"free/{i}")
        s.detach()                 # detached, not closed: a new attach is a new link
        refused = app.receiver("free/#/no")
        refused.link.close()
        app.receivers.remove(refused)
        net.pump()
    for _ in range(50):
        session = app.conn.session()
        session.open()
        link = session.receiver("in-a-session")
        link.source.address = "free/s"
        link.open()
        net.pump()
        session.close()
        net.pump()
    net.pump()
    assert _engine_links(net) == 1
    assert _links_gauge(net) == 1
    snd = app.sender("free/keep")
    assert outcome(app.send(snd, Message(body="kept"))) == (ACCEPTED, None)
    assert [m.body for m, _ in keep.new()] == ["kept"]


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def test_every_link_class_is_slotted() -> None:
    """A link is held for as long as its peer keeps it, thousands at a time: no link
    class carries a per-instance dict (a slotted class is ~200 bytes smaller)."""
    import mqttamqp.amqp.publisher
    import mqttamqp.amqp.queuelinks
    import mqttamqp.amqp.services  # noqa: F401  (their link classes)

    classes = _subclasses(BrokerLink)
    assert len(classes) >= 10
    with_dict = [c.__name__ for c in classes if "__dict__" in dir(c)
                 or any("__dict__" in vars(k) for k in c.__mro__ if k is not object)]
    assert with_dict == []


@pytest.mark.parametrize("kind", ["receiver", "sender"])
def test_an_attached_link_allocates_no_set_dict_or_counter_it_has_not_used(
        kind: str) -> None:
    """What only some links use (unsettled deliveries, packet ids sent, exactly-once
    messages held, a sender's memo) is made on first use: a link attached and idle
    holds none of them."""
    net = Net()
    app = net.amqp()
    if kind == "receiver":
        app.receiver("lazy/t")
    else:
        app.sender("lazy/t")
    [conn] = net.factory.connections
    [link] = conn.links.values()
    unused = [name for name in ("_awaiting", "_sent", "_held", "_memo")
              if getattr(link, name, None) is not None]
    assert unused == []


def test_session_begun_and_ended_by_a_second_peer_leaves_the_first_alone() -> None:
    """Freeing an ended session's links frees that session's only: another
    connection's (and this one's other session's) links keep working."""
    net = Net()
    a = net.amqp()
    rcv = a.receiver("iso/t")
    b = AmqpPeer(net, "iso-b")
    net.peers.append(b)
    net.pump()
    extra = b.conn.session()
    extra.open()
    link = extra.receiver("x")
    link.source.address = "iso/t"
    link.open()
    net.pump()
    extra.close()
    net.pump()
    snd = b.sender("iso/t")
    assert outcome(b.send(snd, Message(body="after"))) == (ACCEPTED, None)
    assert [m.body for m, _ in rcv.new()] == ["after"]


def _remote_active(conn: Any) -> int:
    """Links the peer of ``conn`` has attached and not detached, as its engine says."""
    from proton import Endpoint

    held = 0
    link = lib.pn_link_head(conn.pconn._impl, Endpoint.REMOTE_ACTIVE)
    while link:
        held += 1
        link = lib.pn_link_next(link, Endpoint.REMOTE_ACTIVE)
    return held


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_count_is_what_the_engines_hold_through_random_churn(seed: int) -> None:
    """Peers attach (served, refused, over the bounds), detach, close links, end
    sessions, close and drop connections in a seeded random order: after each step
    the count per connection is what its engine holds (read from the engine) and
    the total their sum; at the end it is zero."""
    import random

    from proton import Endpoint

    rng = random.Random(seed)
    net = Net(amqp_max_links_total=rng.choice([6, 12]), amqp_max_links=rng.choice([4, 8]))
    peers: list[AmqpPeer] = []
    for step in range(120):
        live = [p for p in peers if not p.lost]
        op = rng.randrange(8)
        if op == 0 or not live:
            peer = AmqpPeer(net, f"churn{step}")
            net.peers.append(peer)
            peers.append(peer)
        elif op <= 3:
            peer = rng.choice(live)
            session = peer.session if rng.random() < 0.8 else peer.conn.session()
            session.open()
            address = rng.choice(["ch/a", "ch/b", "ch/#/bad", None])
            if rng.random() < 0.5:
                link = session.receiver(f"r{step}")
                link.source.address = address
            else:
                link = session.sender(f"s{step}")
                link.target.address = address
            link.open()
        elif op == 4:
            peer = rng.choice(live)
            link = peer.conn.link_head(Endpoint.LOCAL_ACTIVE)
            if link is not None:
                link.close() if rng.random() < 0.7 else link.detach()
        elif op == 5:
            peer = rng.choice(live)
            session = peer.conn.session_head(Endpoint.LOCAL_ACTIVE)
            if session is not None and session != peer.session:
                session.close()
        elif op == 6:
            rng.choice(live).conn.close()
        else:
            rng.choice(live).kill()
        net.pump()
        conns = [c for c in net.factory.connections if c.pconn is not None]
        for conn in conns:
            if conn.state.value != "closed":
                assert conn.links_held == _remote_active(conn), step
        assert net.broker.stats.amqp_links == sum(c.links_held for c in conns) >= 0
    for peer in peers:
        if not peer.lost:
            peer.close()
    assert net.broker.stats.amqp_links == 0


def test_a_links_logger_is_bound_to_the_link_and_named_after_its_class() -> None:
    """Its ``log`` as a class attribute ``Logger()`` gives it in pure Python: the
    namespace of the link's class, the link as the source (compiled, a native class's
    ``log = Logger()`` was each instance's own, named after its caller, no source)."""
    from mqttamqp.amqp.links import OutgoingLink

    class Host:
        broker = None

    class PLink:
        _impl = None
        name = "n"
        snd_settle_mode = 0

    link = OutgoingLink(Host(), PLink(), "a")   # type: ignore[arg-type]
    assert link.log.namespace == "mqttamqp.amqp.links.OutgoingLink"
    assert link.log.source is link
