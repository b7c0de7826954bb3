"""Unit tests for the listen backlog a listener asks the kernel for: ``LISTEN_BACKLOG``
unless its description names one (Twisted's 50 drops SYNs in a reconnect storm)."""

from __future__ import annotations

from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactor

from mqttamqp.listeners import LISTEN_BACKLOG, with_backlog
from mqttamqp.net.tls import server_endpoint


def listened_backlog(description: str) -> int:
    reactor = MemoryReactor()
    server_endpoint(reactor, with_backlog(description)).listen(Factory.forProtocol(Protocol))
    [(_, _, backlog, _)] = reactor.tcpServers
    return int(backlog)


def test_tcp_listener_gets_the_broker_backlog() -> None:
    """A tcp: description without backlog= listens with LISTEN_BACKLOG."""
    assert listened_backlog("tcp:1883:interface=127.0.0.1") == LISTEN_BACKLOG
    assert listened_backlog("tcp6:1883") == LISTEN_BACKLOG


def test_a_backlog_in_the_description_is_kept() -> None:
    """backlog= given by the operator wins, whatever its case."""
    assert listened_backlog("tcp:1883:backlog=7") == 7
    assert with_backlog("TCP:1883:Backlog=9") == "TCP:1883:Backlog=9"


def test_other_endpoints_are_left_alone() -> None:
    """Only tcp:, tcp6: and ssl: take the option; 'none' and unix: are unchanged."""
    assert with_backlog("none") == "none"
    assert with_backlog("unix:/tmp/s") == "unix:/tmp/s"
    assert with_backlog("ssl:8883:privateKey=k.pem") == (
        f"ssl:8883:privateKey=k.pem:backlog={LISTEN_BACKLOG}")
