"""The MQTT factory's open connections without a table of their own: the registry's
live table (from CONNACK) plus ``opened.unregistered`` (before CONNACK, and
closing after it until lost), as ``--max-connections`` counts them and the shutdown
sweep finds them (``MQTTFactory.opened``, ``mqtt.opened``).

StringTransport and Clock, no reactor; where a reactor would report a connection
lost after ``loseConnection``, the test does (``Client.lost``).
"""

from __future__ import annotations

import sys

from fakes import ManualStore
from mqtt_memory import ACCEPTED, Client, Harness, client5, connected
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure

from mqttamqp.mqtt.packets import Connect, Disconnect, Pingreq, Publish, Suback, Subscribe
from mqttamqp.mqtt.protocol import ConnectionState


def _lost(c: Client) -> None:
    """The reactor reports the connection lost (whether or not it was closing)."""
    c.proto.connectionLost(Failure(ConnectionDone()))


def _empty(h: Harness) -> bool:
    """No open connection left in either table, and none counted."""
    return (h.factory.opened.all() == [] and not h.factory.opened.unregistered
            and not h.broker.connections.mqtt and h.factory.opened.count() == 0)


def test_opened_finds_every_state_once() -> None:
    """A connected client, a socket that never sent CONNECT, one whose CONNACK waits
    for a commit, one closing after DISCONNECT and one taken over are each found once,
    and counted; after all are lost nothing is left in either table."""
    store = ManualStore()
    h = Harness(store=store)
    idle = h.client()                                    # never sends CONNECT
    live = h.client()
    assert live.connect("live") == [ACCEPTED]
    waiting = h.client()                                 # a persistent session's commit
    waiting.send(Connect("MQTT", 4, "waiting", False, 0))
    assert waiting.proto.state is ConnectionState.CONNECTING
    leaving = h.client()
    assert leaving.connect("leaving") == [ACCEPTED]
    leaving.send(Disconnect())
    assert not leaving.open                              # closing, not yet lost
    old = h.client()
    assert old.connect("dev") == [ACCEPTED]
    new = h.client()
    assert new.connect("dev") == [ACCEPTED]              # takes over: ``old`` closes
    assert not old.open
    everyone = [idle, live, waiting, leaving, old, new]
    found = h.factory.opened.all()
    assert sorted(map(id, found)) == sorted(id(c.proto) for c in everyone)
    assert h.factory.opened.count() == len(everyone)
    # the connected ones are in the live table only, the others in ``unregistered`` only
    assert set(h.factory.opened.unregistered) == {idle.proto, waiting.proto, leaving.proto,
                                           old.proto}
    for c in everyone:
        _lost(c)
    store.commit_all()
    assert _empty(h)


def test_every_close_leaves_no_entry_behind() -> None:
    """A refused CONNECT, a protocol error, a keepalive time-out, a CONNECT time-out,
    a console disconnect and a lost connected client each leave neither table holding
    the connection once it is lost."""
    h = Harness(connect_timeout=10)
    refused = h.client()
    refused.send(Connect("MQTT", 4, "", False, 0))       # empty id, clean 0: refused
    broken = h.client()
    assert broken.connect("broken") == [ACCEPTED]
    broken.send(Publish("a/+", b"x", 0))                 # a wildcard in a topic name
    quiet = h.client()
    assert quiet.connect("quiet", keepalive=1) == [ACCEPTED]
    silent = h.client()                                  # no CONNECT at all
    kicked = h.client()
    assert kicked.connect("kicked") == [ACCEPTED]
    gone = h.client()
    assert gone.connect("gone") == [ACCEPTED]
    gone.send(Pingreq())
    assert h.broker.commands.disconnect("mqtt:kicked", False, "by the console") is not None
    h.clock.advance(11)                                  # keepalive 1.5 s, CONNECT 10 s
    for c in (refused, broken, quiet, silent, kicked):
        assert not c.open, c.proto.client_id
    for c in (refused, broken, quiet, silent, kicked, gone):
        _lost(c)
    assert _empty(h)


def test_max_connections_counts_connections_closing_and_before_connect() -> None:
    """``--max-connections`` counts a connected client, one before CONNECT and one
    closing but not yet lost; a refused socket frees no place when it goes, and a
    place is free again once a counted connection is lost."""
    h = Harness(max_connections=3)
    live = h.client()
    assert live.connect("live") == [ACCEPTED]
    early = h.client()
    leaving = h.client()
    assert leaving.connect("leaving") == [ACCEPTED]
    leaving.send(Disconnect())
    refused = h.client()
    assert refused.transport.disconnecting and h.broker.stats.connections_refused == 1
    _lost(refused)                                       # (its place was never taken)
    assert h.factory.opened.count() == 3
    assert h.client().transport.disconnecting            # still full
    leaving.lost()
    after = h.client()
    assert after.open and h.factory.opened.count() == 3
    assert h.broker.stats.connections_refused == 2
    assert early.open and live.open


def test_mqtt5_shutdown_sweep_reaches_a_connection_once() -> None:
    """An MQTT 5 client told of the shutdown stays in the live table until it is lost
    (it is not also put in ``unregistered``): the sweep sends it one DISCONNECT."""
    h = Harness()
    c = connected(h, "five")
    c.received()
    [found] = h.factory.opened.all()
    found.server_stopping()
    assert not c.open and not h.factory.opened.unregistered
    assert h.factory.opened.all() == [c.proto]
    _lost(c)
    assert _empty(h)


def test_a_storm_gives_its_table_back() -> None:
    """After 500 sockets that waited for their CONNECT together have connected, the
    table that held them is given back (an empty dict's size), not kept for good."""
    h = Harness(connect_burst=500)   # (all from one address, in one instant)
    clients = [client5(h) for _ in range(500)]
    assert len(h.factory.opened.unregistered) == 500
    for n, c in enumerate(clients):
        c.connect5(f"c{n}")
    assert h.factory.opened.count() == 500 and not h.factory.opened.unregistered
    assert sys.getsizeof(h.factory.opened.unregistered) == sys.getsizeof({})


def test_only_a_table_that_held_many_is_measured_and_given_back() -> None:
    """``registered`` measures the emptied table only after it held more than a few
    (it cannot have grown past the kept size with fewer): a small one is kept through
    connects that come one at a time or a few together, a storm's is given back, and
    a pop of what is not there leaves the table as it was."""
    from mqttamqp.mqtt.opened import OpenConnections

    opened = OpenConnections(Harness().factory.opened.live, None)
    table = opened.unregistered
    for n in range(3):
        for c in range(n + 1):
            table[(n, c)] = "why" if c else ""
        assert opened.registered("absent") == "" and len(table) == n + 1
        assert [opened.registered((n, c)) for c in range(n + 1)] == [""] + ["why"] * n
        assert not table and opened.most == 0
        assert sys.getsizeof(table) > sys.getsizeof({})     # (kept: no clear)
    table.update(dict.fromkeys(range(200), ""))
    for c in range(200):
        opened.registered(c)
        assert opened.most == (200 if c < 199 else 0)
    assert sys.getsizeof(table) == sys.getsizeof({})


def test_a_protocol_errors_reason_is_the_sessions_end_when_lost() -> None:
    """The reason of a protocol error (kept in ``opened.unregistered`` while the
    connection closes, not in a slot) is why its session ends once it is lost."""
    h = Harness()
    ended: list[str] = []
    end = h.broker.end_session
    h.broker.end_session = (  # type: ignore[method-assign]
        lambda conn, session, clean, why, *a, **k: (ended.append(why),
                                                    end(conn, session, clean, why, *a, **k)))
    c = h.client()
    assert c.connect("broken") == [ACCEPTED]
    c.send(Publish("a/+", b"x", 0))
    reason = h.factory.opened.unregistered[c.proto]
    assert "wildcard" in reason and not c.open
    c.lost()
    assert ended == [reason] and _empty(h)


def test_the_bridge_flag_is_kept_by_the_factory_while_connected() -> None:
    """A client that sets Mosquitto's bridge flag is a ``bridge_peer`` (its
    subscriptions get no-local) until it is lost; another client is not."""
    h = Harness()
    bridge, plain = h.client(), h.client()
    bridge.send(Connect("MQTT", 4, "br", True, 0, bridge=True))
    assert bridge.received() == [ACCEPTED]
    assert plain.connect("plain") == [ACCEPTED]
    assert bridge.proto.bridge_peer and not plain.proto.bridge_peer
    bridge.send(Subscribe(1, (("t", 1),)))
    bridge.send(Publish("t", b"own", 0))
    plain.send(Publish("t", b"other", 0))
    got = bridge.received()
    assert isinstance(got[0], Suback) and list(got[0].return_codes) == [1]
    assert [p.payload for p in got if isinstance(p, Publish)] == [b"other"]
    assert h.factory.bridge_peers == {bridge.proto}
    _lost(bridge)
    _lost(plain)
    assert not h.factory.bridge_peers and _empty(h)
