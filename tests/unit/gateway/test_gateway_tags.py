"""The delivery tags gateway mode sends its PUBLISHes to the core with
(``ClientChannel.send_then``): ready tags from ``net.rawproton``, no tag made per
transfer.  In memory: a proton client engine and a server engine in one process."""

from __future__ import annotations

from typing import Any

from amqp_messages import pump_transports
from proton import Collector, Connection, Event, Transport
from twisted.internet.task import Clock

from mqttamqp.gateway.channel import ClientChannel


class _Conn:
    serial = 1
    flushed = 0

    def flush(self) -> None:
        self.flushed += 1


def _pair() -> tuple[Any, Any, Any]:
    """A sender on a client engine, the server's receiver with credit 10, and a pump."""
    ours, theirs = Connection(), Connection()
    t, st = Transport(), Transport(Transport.SERVER)
    t.bind(ours)
    st.bind(theirs)
    tcol = Collector()
    theirs.collect(tcol)
    ours.open()
    theirs.open()
    session = ours.session()
    session.open()
    sender = session.sender("gw:publish")
    sender.open()

    def pump() -> None:
        pump_transports(t, st)

    pump()
    receiver: Any = None
    for _ in range(100):   # (bounded: the handful of events of one attach)
        e = tcol.peek()
        if e is None:
            break
        if e.type == Event.SESSION_REMOTE_OPEN:
            e.session.open()
        if e.type == Event.LINK_REMOTE_OPEN:
            e.link.open()
            receiver = e.link
        tcol.pop()
    assert receiver is not None
    receiver.flow(10)
    pump()
    return sender, receiver, pump


def test_unsettled_publishes_carry_a_counts_tag_and_qos0_the_settled_tag() -> None:
    """An unsettled send is tagged with a 16-bit count's decimal digits (wrapping to 0
    after 65535), a pre-settled one with "s"; the core reads each, with its body."""
    sender, receiver, pump = _pair()
    channel = ClientChannel(_Conn(), "c", object(), Clock(), 8, 5.0)  # type: ignore[arg-type]
    outcomes: list[object] = []
    channel.send_then(sender, b"one", outcomes.append)
    channel.send_then(sender, b"zero", None)
    channel._tag = 65535
    channel.send_then(sender, b"wrapped", outcomes.append)
    pump()
    got = []
    for _ in range(3):
        dlv = receiver.current
        got.append((dlv.tag, dlv.settled, bytes(receiver.recv(dlv.pending))))
        receiver.advance()
    assert got == [("1", False, b"one"), ("s", True, b"zero"), ("0", False, b"wrapped")]
    assert len(channel._waiting) == 2
