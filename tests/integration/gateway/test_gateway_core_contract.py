"""The core's side of the gateway contract end to end (issue #29 §1): a core broker
process, a gateway-like AMQP peer (``contract_peer``: python-qpid-proton, a session
per client on one connection) or a gateway process, raw MQTT clients, all on
loopback.  A link over ``--amqp-max-links`` is refused alone, a publisher's DUP does
not reach a subscriber, and a ``.publish`` delivery settled without an outcome is
sent again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from contract_peer import ContractPeer
from gateway_proc import uid
from proton import Delivery, Endpoint
from rawclient import RawClient

from mqttamqp.mqtt.packets import Puback, Publish

pytestmark = pytest.mark.timeout(120)

ACCEPTED = int(Delivery.ACCEPTED)
MAX_LINKS = 6


@pytest.fixture
def small_core(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A core that lets one AMQP connection hold ``MAX_LINKS`` links."""
    proc = BrokerProcess(str(tmp_path / "small-core"), "--amqp-max-links", str(MAX_LINKS),
                         "--amqp-max-sessions", "16", listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def mqtt_clients() -> Iterator[Callable[[int], RawClient]]:
    """``mqtt_clients(port)``: raw MQTT clients, closed at the end."""
    made: list[RawClient] = []

    def open_client(port: int) -> RawClient:
        made.append(RawClient(port))
        return made[-1]

    yield open_client
    for client in made:
        client.close()


@pytest.fixture
def peers() -> Iterator[Callable[[int], ContractPeer]]:
    """``peers(amqp_port)``: gateway-like AMQP peers, closed at the end."""
    made: list[ContractPeer] = []

    def open_peer(port: int) -> ContractPeer:
        made.append(ContractPeer(port, uid("gw-like")))
        return made[-1]

    yield open_peer
    for peer in made:
        peer.close()


def test_a_link_over_the_limit_is_refused_and_other_clients_keep_working(
        small_core: BrokerProcess, peers: Callable[[int], ContractPeer],
        mqtt_clients: Callable[[int], RawClient]) -> None:
    """A gateway-like peer holding two clients' links (six, the core's limit): a third
    client's attaches are refused with amqp:resource-limit-exceeded naming the
    option, logged; the connection stays and the first two clients still subscribe
    and receive; once links are detached (four held), a new client's two attach."""
    peer = peers(small_core.ports["AMQP"])
    first, second = peer.client(uid("ga")), peer.client(uid("gb"))
    for client in (first, second):
        assert client.listed() == {}
        client.attach_publish()
    third = peer.client(uid("gc"))
    assert peer.wait(lambda: all(peer.answered(link) for link in third.links))
    for link in third.links:
        refusal = peer.refused(link)
        assert refusal is not None and refusal[0] == "amqp:resource-limit-exceeded"
        assert "--amqp-max-links" in refusal[1]
    assert peer.opened()
    small_core.wait_for_line(r"more than 6 links \(--amqp-max-links\): the attach is refused")
    topic = uid("lim") + "/t"
    for packet_id, client in enumerate((first, second), start=1):
        assert client.subscribe(topic, 1, packet_id) == ACCEPTED
    pub = mqtt_clients(small_core.mqtt_port)
    pub.connect(uid("lp"))
    pub.publish(topic, b"still here", qos=1)
    for client in (first, second):
        assert client.publish is not None
        [(message, dlv)] = peer.take(client.publish, 1)
        assert bytes(message.body) == b"still here"
        dlv.update(Delivery.ACCEPTED)
        dlv.settle()
    for link in [*third.links, first.control, second.control]:
        link.close()
    # (proton writes attaches before detaches in one batch: wait for the core's
    # answer to the last detach before attaching again)
    assert peer.wait(lambda: bool(second.control.state & Endpoint.REMOTE_CLOSED))
    again = peer.client(uid("gd"))
    assert peer.wait(lambda: all(peer.answered(link) for link in again.links))
    assert [peer.refused(link) for link in again.links] == [None, None]
    assert peer.opened()


def test_a_publishers_dup_does_not_reach_a_subscriber_through_a_gateway(
        core: BrokerProcess, gateways: Callable[..., BrokerProcess],
        mqtt_clients: Callable[[int], RawClient]) -> None:
    """A QoS 1 PUBLISH sent with DUP set through a gateway reaches a subscriber on a
    gateway with DUP 0 (its first delivery), both clients on gateways."""
    gw = gateways()
    topic = uid("dup") + "/t"
    sub = mqtt_clients(gw.mqtt_port)
    assert sub.connect(uid("ds")).return_code == 0
    assert sub.subscribe((topic, 1)) == (1,)
    pub = mqtt_clients(gw.mqtt_port)
    assert pub.connect(uid("dp")).return_code == 0
    pub.send(Publish(topic, b"first time", 1, False, True, 1))
    pub.expect(Puback, 1)
    got = sub.receive()
    assert (got.payload, got.qos, got.dup) == (b"first time", 1, False)
    sub.ack(got)


def test_a_publish_delivery_settled_without_outcome_is_sent_again(
        core: BrokerProcess, peers: Callable[[int], ContractPeer],
        mqtt_clients: Callable[[int], RawClient]) -> None:
    """A gateway-like peer settles a QoS 1 ``.publish`` delivery with no outcome: the
    core sends it again with delivery-count 1 (not consumed); Accepted ends it (the
    next message is the next one published)."""
    peer = peers(core.ports["AMQP"])
    client = peer.client(uid("no"))
    client.listed()
    publish = client.attach_publish()
    topic = uid("nout") + "/t"
    assert client.subscribe(topic, 1) == ACCEPTED
    pub = mqtt_clients(core.mqtt_port)
    pub.connect(uid("np"))
    pub.publish(topic, b"keep", qos=1)
    [(first, dlv)] = peer.take(publish, 1)
    assert (bytes(first.body), first.delivery_count) == (b"keep", 0)
    dlv.settle()                                      # no outcome
    [(again, dlv2)] = peer.take(publish, 1)
    assert (bytes(again.body), again.delivery_count, again.first_acquirer) == (
        b"keep", 1, False)
    dlv2.update(Delivery.ACCEPTED)
    dlv2.settle()
    pub.publish(topic, b"next", qos=1)
    [(after, _)] = peer.take(publish, 1)
    assert bytes(after.body) == b"next"
