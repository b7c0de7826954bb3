"""Strings that are not valid UTF-8 in every AMQP field a peer controls (issue 26,
section 4), against the real broker over real sockets.

proton's Python binding decodes the strings it hands out (ids, names, addresses,
error conditions, its own error texts quoting a peer's bytes) and raises
``UnicodeDecodeError`` on bytes that are not UTF-8.  Each case here sends the frames
a proton client engine makes, with the marker ``BADBAD`` replaced on the wire by
bytes that are not UTF-8 (and put back in what comes back, so the client engine
recognises its own names), then waits for the broker's answer.  Every case ends
cleanly: the field is refused (``amqp:decode-error`` or another condition that says
why), ignored, or escaped in the log; never an internal error, a traceback or a
line at critical level, and the broker goes on serving.
"""

from __future__ import annotations

import re
import select
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from amqp_messages import drain
from brokerproc import BrokerProcess
from proton import (
    Condition,
    Connection,
    Delivery,
    Endpoint,
    Link,
    Message,
    Transport,
    symbol,
)

pytestmark = pytest.mark.timeout(120)

MARK = b"BADBAD"
BAD = b"BA\xff\xfeAD"           # (as long as the marker: frame sizes stay right)
BAD_LINE = re.compile(r"Traceback|#critical\]|Unhandled error|internal error")
DECODE_ERROR = "amqp:decode-error"


class RawPeer:
    """A proton client engine on a socket to the broker; ``MARK`` becomes ``BAD`` in
    what it sends (and ``BAD`` becomes ``MARK`` again in what it reads)."""

    def __init__(self, port: int, container: str = "hs-app", user: str | None = None,
                 password: str | None = None, hostname: str | None = None) -> None:
        self.conn = Connection()
        self.conn.container = container
        if hostname is not None:
            self.conn.hostname = hostname
        self.transport = Transport()
        if user is not None:
            self.conn.user, self.conn.password = user, password
            sasl = self.transport.sasl()
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True
        self.transport.bind(self.conn)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.closed = False           # the broker closed the socket
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()

    def receiver(self, address: str | None, name: str = "r", credit: int = 10) -> Link:
        link = self.session.receiver(name)
        link.source.address = address
        link.open()
        if credit:
            link.flow(credit)
        return link

    def sender(self, address: str | None, name: str = "s") -> Link:
        link = self.session.sender(name)
        link.target.address = address
        link.open()
        return link

    def wait(self, until: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Move bytes both ways until ``until()`` holds, the broker closes the socket
        or ``timeout`` passes; whether ``until()`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            out = drain(self.transport)
            if out and not self.closed:
                try:
                    self.sock.sendall(out.replace(MARK, BAD))
                except OSError:
                    self.closed = True
            if until() or self.closed:
                return until()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            readable, _, _ = select.select([self.sock], [], [], left)
            if not readable:
                continue
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.closed = True
                self.transport.close_tail()
                continue
            data = data.replace(BAD, MARK)
            while data and self.transport.capacity() > 0:
                n = min(len(data), self.transport.capacity())
                self.transport.push(data[:n])
                data = data[n:]

    def opened(self) -> bool:
        return bool(self.conn.state & Endpoint.REMOTE_ACTIVE)

    def close(self) -> None:
        self.sock.close()


def _answered(link: Link) -> Callable[[], bool]:
    """The broker answered the attach (and, for a refusal, detached it)."""
    return lambda: bool(link.state & Endpoint.REMOTE_CLOSED) or (
        bool(link.state & Endpoint.REMOTE_ACTIVE) and link.remote_condition is None
        and (link.remote_source.address is not None or link.remote_target.address
             is not None))


def _refused(link: Link) -> str | None:
    condition = link.remote_condition
    return condition.name if condition is not None else None


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("hostile")), "--max-connect-rate",
                         "0", listeners=("--amqp",))
    proc.start()
    yield proc
    proc.stop()


_sentinels = iter(range(1, 1_000_000))


def _quiet_log(broker: BrokerProcess, since: int) -> list[str]:
    """The log lines from ``since`` on with a traceback, at critical level or naming
    an internal error, once the broker has logged all it will about what came before
    (a fresh connection's line follows it: one process, lines in order)."""
    name = f"hs-sentinel-{next(_sentinels)}"
    peer = RawPeer(broker.ports["AMQP"], container=name)
    try:
        assert peer.wait(peer.opened)
        broker.wait_for_line(re.escape(f"container {name},"))
    finally:
        peer.close()
    return [line for line in broker.log[since:] if BAD_LINE.search(line)]


def _still_serves(peer: RawPeer, topic: str) -> None:
    """This connection attaches a receiver and a sender and a message goes through."""
    rcv = peer.receiver(topic, name=f"ok-r-{topic}")
    snd = peer.sender(topic, name=f"ok-s-{topic}")
    assert peer.wait(lambda: snd.credit > 0 and rcv.remote_source.address is not None)
    dlv = snd.delivery(b"ok")
    snd.send(Message(body="fine").encode())
    snd.advance()
    assert peer.wait(lambda: dlv.remote_state == Delivery.ACCEPTED)
    assert peer.wait(lambda: rcv.current is not None and not rcv.current.partial)


# -- the sweep: one field each -----------------------------------------------------------

def _container_id(port: int) -> RawPeer:
    peer = RawPeer(port, container="BADBAD")
    assert peer.wait(lambda: peer.closed or peer.conn.remote_condition is not None)
    assert peer.conn.remote_condition is not None
    assert peer.conn.remote_condition.name == DECODE_ERROR
    return peer


def _hostname(port: int) -> RawPeer:
    peer = RawPeer(port, hostname="BADBAD")    # (not read: nothing to refuse)
    assert peer.wait(peer.opened)
    _still_serves(peer, "hs/hostname")
    return peer


def _link_name(port: int) -> RawPeer:
    peer = RawPeer(port)
    link = peer.receiver("hs/t", name="BADBAD")
    assert peer.wait(_answered(link))
    assert _refused(link) == DECODE_ERROR
    _still_serves(peer, "hs/name")
    return peer


def _source_address(port: int) -> RawPeer:
    peer = RawPeer(port)
    link = peer.receiver("hs/BADBAD")
    assert peer.wait(_answered(link))
    assert _refused(link) == DECODE_ERROR
    _still_serves(peer, "hs/source")
    return peer


def _target_address(port: int) -> RawPeer:
    peer = RawPeer(port)
    link = peer.sender("hs/BADBAD")
    assert peer.wait(_answered(link))
    assert _refused(link) == DECODE_ERROR
    _still_serves(peer, "hs/target")
    return peer


def _capability(port: int) -> RawPeer:
    peer = RawPeer(port)
    link = peer.session.receiver("cap")
    link.source.address = "hs/cap"
    link.source.capabilities.put_array(False, 21)   # (an array of symbols)
    link.source.capabilities.enter()
    link.source.capabilities.put_symbol(symbol("BADBAD"))
    link.source.capabilities.exit()
    link.open()
    assert peer.wait(_answered(link))
    assert _refused(link) is None                   # not the queue capability: a topic
    _still_serves(peer, "hs/cap")
    return peer


def _attach_properties(port: int) -> RawPeer:
    peer = RawPeer(port)
    link = peer.session.receiver("props")
    link.source.address = "$queue/hsq"
    link.properties = {symbol("consumer-group"): "BADBAD"}
    link.open()
    link.flow(1)
    assert peer.wait(_answered(link))
    assert _refused(link) == "amqp:invalid-field"
    _still_serves(peer, "hs/props")
    return peer


def _filter_key(port: int) -> RawPeer:
    peer = RawPeer(port)
    link = peer.session.receiver("sel")
    link.source.address = "hs/sel"
    link.source.filter.put_map()
    link.source.filter.enter()
    link.source.filter.put_symbol(symbol("BADBAD"))
    link.source.filter.put_string("x")
    link.source.filter.exit()
    link.open()
    assert peer.wait(_answered(link))
    assert _refused(link) == "amqp:not-implemented"
    _still_serves(peer, "hs/sel")
    return peer


def _detach_with(condition: Condition, topic: str) -> Callable[[int], RawPeer]:
    def case(port: int) -> RawPeer:
        peer = RawPeer(port)
        link = peer.receiver(topic, name="d")
        assert peer.wait(_answered(link)) and _refused(link) is None
        link.condition = condition
        link.close()
        assert peer.wait(lambda: bool(link.state & Endpoint.REMOTE_CLOSED))
        _still_serves(peer, topic)
        return peer
    return case


def _end_description(port: int) -> RawPeer:
    peer = RawPeer(port)
    link = peer.receiver("hs/end", name="e")
    assert peer.wait(_answered(link))
    peer.session.condition = Condition("app:gone", "BADBAD")
    peer.session.close()
    assert peer.wait(lambda: bool(peer.session.state & Endpoint.REMOTE_CLOSED))
    peer.session = peer.conn.session()
    peer.session.open()
    _still_serves(peer, "hs/end")
    return peer


def _close_description(port: int) -> RawPeer:
    peer = RawPeer(port)
    assert peer.wait(peer.opened)
    peer.conn.condition = Condition("app:gone", "BADBAD")
    peer.conn.close()
    assert peer.wait(lambda: bool(peer.conn.state & Endpoint.REMOTE_CLOSED) or peer.closed)
    assert peer.conn.remote_condition is None      # a clean close of its own
    return peer


def _rejected_description(port: int) -> RawPeer:
    peer = RawPeer(port)
    rcv = peer.receiver("hs/rej", name="rej")
    snd = peer.sender("hs/rej", name="rej-s")
    assert peer.wait(lambda: snd.credit > 0 and rcv.remote_source.address is not None)
    snd.delivery(b"one")
    snd.send(Message(body="reject me").encode())   # unsettled: QoS 1, unsettled to rcv
    snd.advance()
    assert peer.wait(lambda: rcv.current is not None and not rcv.current.partial)
    dlv = rcv.current
    rcv.advance()
    dlv.local.condition = Condition("app:no", "BADBAD")
    dlv.update(Delivery.REJECTED)
    dlv.settle()
    _still_serves(peer, "hs/rej2")
    return peer


def _message(**fields: Any) -> Callable[[int], RawPeer]:
    """A message with one field holding the marker: Accepted or Rejected with
    amqp:decode-error, the link and the connection carrying on."""
    def case(port: int) -> RawPeer:
        peer = RawPeer(port)
        snd = peer.sender(None if "address" in fields else "hs/msg", name="m")
        assert peer.wait(lambda: snd.credit > 0)
        dlv = snd.delivery(b"m")
        snd.send(Message(body="x", **fields).encode())
        snd.advance()
        assert peer.wait(lambda: dlv.remote_state in (Delivery.ACCEPTED, Delivery.REJECTED))
        if dlv.remote_state == Delivery.REJECTED:
            assert dlv.remote.condition is not None
            assert dlv.remote.condition.name in (DECODE_ERROR, "amqp:invalid-field")
        _still_serves(peer, "hs/msg-ok")
        return peer
    return case


def _sasl_user(port: int) -> RawPeer:
    peer = RawPeer(port, user="BADBAD", password="secret")
    assert peer.wait(lambda: peer.closed)
    assert not peer.opened()
    return peer


CASES: dict[str, Callable[[int], RawPeer]] = {
    "container-id": _container_id,
    "hostname": _hostname,
    "link-name": _link_name,
    "source-address": _source_address,
    "target-address": _target_address,
    "source-capability": _capability,
    "attach-properties": _attach_properties,
    "source-filter-key": _filter_key,
    "detach-description": _detach_with(Condition("app:error", "BADBAD"), "hs/dd"),
    "detach-condition-name": _detach_with(Condition("app:BADBAD", "why"), "hs/dn"),
    "end-description": _end_description,
    "close-description": _close_description,
    "rejected-description": _rejected_description,
    "message-to": _message(address="hs/BADBAD"),
    "message-subject": _message(subject="BADBAD"),
    "message-reply-to": _message(reply_to="BADBAD"),
    "application-property": _message(properties={"BADBAD": "v"}),
    "sasl-plain-user": _sasl_user,
}


@pytest.mark.parametrize("field", list(CASES))
def test_a_field_not_utf8_is_refused_cleanly(broker: BrokerProcess, field: str) -> None:
    """Invalid UTF-8 in this field: refused with a condition that says why (or
    harmless), the connection's other work goes on, and the broker logs no
    traceback, critical line or internal error."""
    before = len(broker.log)
    peer = CASES[field](broker.ports["AMQP"])
    peer.close()
    assert _quiet_log(broker, before) == []


def test_a_name_not_utf8_attached_twice_closes_cleanly_once_logged(
        broker: BrokerProcess) -> None:
    """The same link name, not UTF-8, attached twice on one session (proton's own
    error text then quotes the bytes): each connection is closed with proton's
    amqp:invalid-field, not an internal error; five connections doing it make one log
    line for the cause, none at critical level, and no traceback."""
    before = len(broker.log)
    for i in range(5):
        peer = RawPeer(broker.ports["AMQP"], container=f"hs-dup-{i}")
        first = peer.receiver("hs/dup", name="BADBAD")
        second = peer.session.receiver("BADBAD")       # pipelined: one write, two attaches
        second.source.address = "hs/dup"
        second.open()
        assert peer.wait(lambda peer=peer: peer.closed)
        condition = peer.conn.remote_condition
        assert condition is not None and condition.name == "amqp:invalid-field"
        assert condition.description.startswith("link name already attached")
        assert first is not None
        peer.close()
    assert _quiet_log(broker, before) == []
    lines = [line for line in broker.log[before:] if "already attached" in line]
    assert len(lines) == 1, lines
    assert "\\xff\\xfe" in lines[0]          # the bytes, escaped
    good = RawPeer(broker.ports["AMQP"], container="hs-after")
    try:
        assert good.wait(good.opened)
        _still_serves(good, "hs/after")
    finally:
        good.close()
