"""An AMQP 1.0 bridge's reading of the remote's attach (``amqp.refused``) on two
in-memory proton engines wired to each other: a null source or target refuses the
link, the anonymous relay's null target address does not; the back-off across
connections the remote ends at once (on ``task.Clock``)."""

from __future__ import annotations

from typing import Any

from amqp_messages import pump_transports
from proton import Collector, Connection, Event, Terminus, Transport

from mqttamqp.bridge.amqp import refused


def _attach(sender: bool, answer: Any) -> Any:
    """Our link as it stands once the remote's attach came (``answer(link)`` sets the
    remote's terminus before it opens its end)."""
    ours, theirs = Connection(), Connection()
    t, st = Transport(), Transport(Transport.SERVER)
    t.bind(ours)
    st.bind(theirs)
    events = Collector()
    theirs.collect(events)
    ours.open()
    theirs.open()
    session = ours.session()
    session.open()
    link = session.sender("b:out") if sender else session.receiver("b:in:0")
    if sender:
        link.target.address = None
    else:
        link.source.address = "in/#"
    link.open()

    def pump() -> None:
        pump_transports(t, st)

    pump()
    for _ in range(20):   # (the few events of one open, begin and attach)
        event = events.peek()
        if event is None:
            break
        if event.type == Event.SESSION_REMOTE_OPEN:
            event.session.open()
        if event.type == Event.LINK_REMOTE_OPEN:
            answer(event.link)
            event.link.open()
        events.pop()
    pump()
    assert link.state & link.REMOTE_ACTIVE
    return link


def _null_source(link: Any) -> None:
    link.source.address = None
    link.source.type = Terminus.UNSPECIFIED


def _null_target(link: Any) -> None:
    link.target.address = None
    link.target.type = Terminus.UNSPECIFIED


def _copy(link: Any) -> None:
    link.source.copy(link.remote_source)
    link.target.copy(link.remote_target)


def test_a_null_source_refuses_our_receiver() -> None:
    """The remote answers our receiver with a null source: refused."""
    assert refused(_attach(False, _null_source))


def test_a_source_given_back_accepts_our_receiver() -> None:
    """The remote answers with our source: attached."""
    assert not refused(_attach(False, _copy))


def _source_without_address(link: Any) -> None:
    link.source.copy(link.remote_source)
    link.source.address = None
    link.source.dynamic = True   # (else proton sends a null source: no field is set)


def test_a_source_without_an_address_accepts_our_receiver() -> None:
    """The remote answers our receiver with a source that has no address (not a null
    terminus, which the spec allows): attached, not refused."""
    assert not refused(_attach(False, _source_without_address))


def test_a_null_target_refuses_our_sender() -> None:
    """The remote answers our sender with a null target: refused."""
    assert refused(_attach(True, _null_target))


def test_the_anonymous_relay_target_accepts_our_sender() -> None:
    """The remote answers with a target whose address is null (the anonymous relay):
    attached."""
    assert not refused(_attach(True, _copy))


def test_a_connection_ended_at_once_each_time_makes_the_backoff_grow() -> None:
    """A remote that attaches every link, then detaches one at once, each time: the
    delay before the next attempt grows (the attach no longer resets the back-off)."""
    from test_bridge_amqp_settle import FakeRemote, _connected

    bridge, remote, _, clock = _connected(**{"reconnect-min": 1.0})
    delays = []
    for _ in range(5):
        bridge.remote_lost(remote, "the remote detached hq:out: amqp:not-allowed")
        call = bridge._retry
        delays.append(call.getTime() - clock.seconds())
        call.cancel()
        remote = FakeRemote()
        bridge._client = remote
        bridge.links_ready(remote)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_a_connection_that_lasted_resets_the_backoff() -> None:
    """Connected for max(keepalive, reconnect-max) seconds, the back-off starts over:
    the attempt after that connection is lost waits reconnect-min."""
    from test_bridge_amqp_settle import FakeRemote, _connected

    bridge, remote, _, clock = _connected(**{"reconnect-min": 1.0, "keepalive": 30})
    for _ in range(3):
        bridge.remote_lost(remote, "gone")
        bridge._retry.cancel()
        remote = FakeRemote()
        bridge._client = remote
        bridge.links_ready(remote)
    clock.advance(60.0)   # (reconnect-max, above keepalive)
    bridge.remote_lost(remote, "gone")
    assert bridge._retry.getTime() - clock.seconds() == 1.0
