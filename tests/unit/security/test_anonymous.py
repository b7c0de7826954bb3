"""Who may connect without users configured (issue 10, item 5): clients on this
machine only, as Mosquitto 2 without a configuration, unless --allow-anonymous.

In memory: the broker's own protocol objects on ``StringTransport``, whose peer is
192.168.1.1 unless a test says otherwise.
"""

from __future__ import annotations

import pytest
from amqp_memory import Net
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from mqttamqp.core.auth import Credentials, LoopbackOnly, loopback_peer, peer_host
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connack, Connect


@pytest.mark.parametrize(("peer", "local"), [
    ("127.0.0.1:5000", True), ("127.8.9.10:1", True), ("::1:5000", True),
    ("[::1]:5000", True), ("192.168.1.1:5000", False), ("::ffff:10.0.0.1:1", False),
    ("::ffff:127.0.0.1:5000", True),    # a dual-stack listener's IPv4 loopback peer
    ("?:?", True), ("", False)])   # ?: a UNIX socket
def test_loopback_peer(peer: str, local: bool) -> None:
    """Which peer addresses count as this machine: IPv4 and IPv6 loopback, a dual-stack
    IPv4 loopback, a UNIX socket."""
    assert loopback_peer(peer) is local


def test_a_peer_asked_again_has_its_own_host() -> None:
    """``peer_host`` keeps its last answer for the string object it was asked of (the
    admission's and then the loopback rule's): every other peer, equal or not, one
    asked in between or the same text in another object, gets its own host."""
    first = "".join(["10.0.0.1", ":5000"])
    again = "".join(["10.0.0.1", ":5000"])     # the same text, another object
    other = "".join(["127.0.0.1", ":5001"])
    assert peer_host(first) == "10.0.0.1" and peer_host(first) == "10.0.0.1"
    assert peer_host(other) == "127.0.0.1" and loopback_peer(other)
    assert peer_host(again) == "10.0.0.1" and not loopback_peer(again)
    assert not loopback_peer(first) and peer_host("[::1]:1") == "::1"
    assert peer_host("") == "" and peer_host(first) == "10.0.0.1"


def test_loopback_only_unless_anywhere() -> None:
    """Without users only clients on this machine are let in, named or not, unless --allow-
    anonymous lets anyone."""
    def creds(peer: str, user: str | None = None) -> Credentials:
        return Credentials("c", user, None, "mqtt", peer)

    assert LoopbackOnly().authenticate(creds("127.0.0.1:1"))
    assert LoopbackOnly().authenticate(creds("127.0.0.1:1", "someone"))
    assert not LoopbackOnly().authenticate(creds("10.0.0.1:1"))
    assert not LoopbackOnly().authenticate(creds("10.0.0.1:1", "someone"))
    assert LoopbackOnly(anywhere=True).authenticate(creds("10.0.0.1:1"))


def _mqtt_connect(net: Net, host: str) -> Connack:
    proto = net.mqtt_factory.buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", host, 40000))
    proto.makeConnection(transport)
    proto.dataReceived(encode(Connect("MQTT", 4, "c-" + host, True, 0, None)))
    net.pump()
    decoder = Decoder()
    decoder.feed(transport.value())
    [connack] = list(decoder)
    assert isinstance(connack, Connack)
    return connack


@pytest.mark.parametrize(("anywhere", "host", "code"), [
    (False, "127.0.0.1", 0), (False, "192.168.1.1", 5), (True, "192.168.1.1", 0)])
def test_mqtt_from_another_machine_is_refused_without_users(anywhere: bool, host: str,
                                                            code: int) -> None:
    """An MQTT client from another machine gets CONNACK 5 without users configured, unless
    anonymous clients are allowed from anywhere."""
    net = Net(authenticator=LoopbackOnly(anywhere))
    assert _mqtt_connect(net, host).return_code == code


@pytest.mark.parametrize("anywhere", [False, True])
def test_amqp_from_another_machine_is_refused_without_users(anywhere: bool) -> None:
    """The in-memory AMQP peer is 192.168.1.1: refused (no SASL, so anonymous)
    unless --allow-anonymous."""
    net = Net(authenticator=LoopbackOnly(anywhere))
    peer = net.amqp()
    assert peer.lost is (not anywhere)
