"""The core's side of the gateway contract end to end (issue #29 §1): a core broker
process, a gateway-like AMQP peer (``contract_peer``: python-qpid-proton, a session
per client on one connection) or a gateway process, raw MQTT clients, all on
loopback.  A link over ``--amqp-max-links`` is refused alone (a gateway client whose
link is refused gets "server unavailable"), a publisher's DUP does not reach a
subscriber, and a ``.publish`` delivery settled without an outcome is sent again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from contract_peer import ContractPeer
from gateway_proc import core_with_gateway, uid
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


@pytest.mark.parametrize("level", [4, 5])
def test_a_client_whose_publish_link_is_refused_gets_server_unavailable(
        tmp_path: Path, level: int) -> None:
    """A core that lets one connection hold 9 links and a gateway with one upstream
    connection: the second client's ``.publish`` attach (the tenth link) is refused,
    so its CONNECT is answered CONNACK 3 (MQTT 5: 0x88, server unavailable), logged;
    the first client keeps working, and once it leaves a new client connects."""
    with core_with_gateway(tmp_path, "core9", ("--amqp-max-links", "9"),
                           "--upstream-connections", "1") as (_, gw, clients):
        clients.append(RawClient(gw.mqtt_port, level=level))
        first = clients[-1]
        assert first.connect(uid("ra")).return_code == 0
        clients.append(RawClient(gw.mqtt_port, level=level))
        second = clients[-1]
        assert second.connect(uid("rb")).return_code == (0x88 if level == 5 else 3)
        second.wait_closed()
        gw.wait_for_line(r"refused CONNECT .*: the core detached .*\(CONNACK (3|136)\)")
        assert first.subscribe((uid("still") + "/t", 1)) == (1,)
        first.disconnect()
        clients.append(RawClient(gw.mqtt_port, level=level))
        assert clients[-1].connect(uid("rc")).return_code == 0


def test_a_refused_connect_leaves_no_unhandled_deferred_error(tmp_path: Path) -> None:
    """A core that lets one connection hold 5 links refuses a gateway client's
    attaches while its CONNECT waits on them: the client gets CONNACK 3, and the
    gateway logs the refusal, with no "Unhandled error in Deferred" traceback for the
    attaches it no longer awaits."""
    with core_with_gateway(tmp_path, "core5", ("--amqp-max-links", "5"),
                           "--upstream-connections", "1") as (_, gw, clients):
        for name in ("ua", "ub", "uc"):
            clients.append(RawClient(gw.mqtt_port))
            code = clients[-1].connect(uid(name)).return_code
            if code != 0:
                assert code == 3
                clients[-1].wait_closed()
        gw.wait_for_line(r"refused CONNECT .*: the core detached .*\(CONNACK 3\)")
    assert gw is not None
    assert "Unhandled error in Deferred" not in gw.output()
