"""Mosquitto's bridge flag through a gateway (issue #29 §1): a bridge-flagged client's
non-shared subscriptions are no-local at the core, as on a broker.  The gateway
carries the option in AMQP_SUBSCRIBE's ``x-opt-mqtt-subscription-options``
annotation, and names the client its PUBLISH sender acts for (attach property
``x-opt-mqtt-client-id``) so the core knows the message is the client's own; on a
gateway wired to the in-memory core (``gateway_memory``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqp_memory import Net
from gateway_memory import Gateway
from test_gateway_acks import mqtt5_client

from mqttamqp.amqp.codec.contract import subscription_options
from mqttamqp.amqp.publisher import acting_for
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED
from mqttamqp.mqtt.packets import Puback, Publish, Suback, Subscribe


def test_a_bridge_gets_nothing_it_published_itself_back() -> None:
    """A bridge-flagged client subscribed to what it publishes does not receive its
    own messages (QoS 0 and 1); another client's messages it does; a plain client on
    the same gateway still gets its own."""
    net = Net()
    gw = Gateway(net)
    bridge = gw.client("br", bridge=True)
    plain = gw.client("pl")
    bridge.send(Subscribe(1, (("b/#", 1),)))
    plain.send(Subscribe(1, (("b/#", 1),)))
    assert bridge.take(Suback) == [Suback(1, (1,))]
    assert plain.take(Suback) == [Suback(1, (1,))]
    bridge.send(Publish("b/own0", b"zero", 0, False, False, None),
                Publish("b/own1", b"one", 1, False, False, 5))
    assert bridge.take(Puback) == [Puback(5)]
    plain.send(Publish("b/other", b"other", 1, False, False, 6))
    assert [m.payload for m in bridge.take(Publish)] == [b"other"]
    assert [m.payload for m in plain.take(Publish)] == [b"zero", b"one", b"other"]
    assert net.broker.sessions["br"].sub_options == {"b/#": 1 | NO_LOCAL}
    assert "b/#" not in net.broker.sessions["pl"].sub_options


def test_a_bridges_shared_subscription_is_not_no_local() -> None:
    """A bridge's $share/ filter carries no no-local option (MQTT 5 forbids it there),
    as the broker subscribes a bridge."""
    net = Net()
    gw = Gateway(net)
    bridge = gw.client("br2", bridge=True)
    bridge.send(Subscribe(1, (("$share/g/s/#", 0), ("s/#", 0))))
    assert bridge.take(Suback) == [Suback(1, (0, 0))]
    assert net.broker.sessions["br2"].sub_options == {"s/#": NO_LOCAL}


def test_subscription_options_annotation_is_read_per_filter() -> None:
    """The core keeps no local and retain as published of each filter's options
    byte, packed with its QoS; none without the annotation; a malformed one is a
    reason to reject."""
    requests = [("a", 1), ("b", 2)]
    key = "x-opt-mqtt-subscription-options"
    assert subscription_options({}, requests) == []
    assert subscription_options({key: {"a": 0x04 | 0x20 | 0x02}}, requests) == [1 | 0x04, 2]
    assert subscription_options({key: {"b": 0x08}}, requests) == [1, 2 | 0x08]
    for bad in ([1], {"a": 300}, {"a": "4"}, {"a": True}):
        assert isinstance(subscription_options({key: bad}, requests), str)


def _host(holds_will: bool) -> Any:
    gate = SimpleNamespace(may_use_session=lambda identity, client_id: True)
    return SimpleNamespace(broker=SimpleNamespace(gate=gate), identity=None,
                           holds_will=lambda client_id: holds_will)


def test_a_sender_acts_for_a_client_only_where_its_connection_holds_its_will() -> None:
    """The attach property names the publisher only when the same connection holds
    that client's will-service link (whatever the gate would allow); else, or without
    one or with one that is not a string, the container stays the publisher."""
    props = {"x-opt-mqtt-client-id": "dev-1"}
    assert acting_for(_host(True), SimpleNamespace(remote_properties=props)) == "dev-1"
    assert acting_for(_host(False), SimpleNamespace(remote_properties=props)) is None
    assert acting_for(_host(True), SimpleNamespace(remote_properties=None)) is None
    assert acting_for(_host(True), SimpleNamespace(
        remote_properties={"x-opt-mqtt-client-id": 7})) is None


def _hostile_properties(link: Any) -> None:
    """Attach properties proton cannot decode into a dict: a list as a map key."""
    from cproton import pn_link_properties
    from proton import Data

    d = Data(pn_link_properties(link._impl))
    d.put_map()
    d.enter()
    d.put_list()
    d.enter()
    d.put_int(1)
    d.exit()
    d.put_string("x")
    d.exit()


def test_undecodable_attach_properties_on_a_sender_leave_the_connection_open() -> None:
    """A topic sender whose attach properties do not decode claims no client and does
    not end its connection (as undecodable capabilities, attach._capabilities)."""
    net = Net()
    peer = net.amqp("hostile")
    link = peer.session.sender("s-bad")
    link.target.address = link.source.address = "t/x"
    _hostile_properties(link)
    link.open()
    net.pump()
    assert not peer.lost
    assert link.remote_target.address == "t/x"


def test_undecodable_attach_properties_on_a_queue_receiver_refuse_only_the_link() -> None:
    """A queue receiver whose attach properties do not decode is refused with
    amqp:invalid-field; the connection stays."""
    net = Net()
    peer = net.amqp("hostile-q")
    link = peer.session.receiver("r-bad")
    link.source.address = "$queue/q1"
    link.target.address = "r-bad"
    _hostile_properties(link)
    link.open()
    net.pump()
    assert not peer.lost
    assert link.remote_condition is not None
    assert link.remote_condition.name == "amqp:invalid-field"


def test_an_mqtt5_clients_no_local_is_honoured() -> None:
    """MQTT 5 no-local through a gateway: the client does not get its own message,
    and the core keeps the option (with retain as published) for the filter."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    send, take = mqtt5_client(net, gw, "v5nl")
    send(Subscribe(1, (("t", 0), ("u", 1)), options=(0x04, 0x08)))
    (ack,) = [p for p in take() if isinstance(p, Suback)]
    assert ack.return_codes == (0, 1)
    send(Publish("t", b"own", 0, False, False, None))
    assert not [p for p in take() if isinstance(p, Publish)]
    assert net.broker.sessions["v5nl"].sub_options == {"t": 0 | NO_LOCAL,
                                                       "u": 1 | RETAIN_AS_PUBLISHED}


def test_an_mqtt5_no_local_on_a_shared_filter_is_refused_for_that_filter() -> None:
    """MQTT-3.8.3-4: no-local on a $share/ filter gets SUBACK 0x8F for that filter,
    as from the broker (mqtt.decisions.subscribe5); the other filters are granted."""
    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    send, take = mqtt5_client(net, gw, "v5sh")
    send(Subscribe(1, (("$share/g/u", 0),), options=(0x04,)))
    (ack,) = [p for p in take() if isinstance(p, Suback)]
    assert ack.return_codes == (0x8F,)
    send(Subscribe(2, (("$share/g/u", 0), ("v", 1)), options=(0x04, 0)))
    (ack,) = [p for p in take() if isinstance(p, Suback)]
    assert ack.return_codes == (0x8F, 1)
    assert "$share/g/u" not in net.broker.sessions["v5sh"].subscriptions


def test_a_claim_without_the_clients_will_link_is_ignored_quietly(
        log_lines: list[str]) -> None:
    """A sender on another connection naming a gateway client in
    ``x-opt-mqtt-client-id`` does not publish as that client (its no-local
    subscriber still gets the message), and nothing is logged about a takeover."""
    from proton import Message, symbol

    net = Net()
    gw = Gateway(net, connections=1, credit=4)
    send, take = mqtt5_client(net, gw, "v5c")
    send(Subscribe(1, (("t", 0),), options=(0x04,)))
    assert [p for p in take() if isinstance(p, Suback)]
    peer = net.amqp("other")
    link = peer.session.sender("claims-v5c")
    link.target.address = link.source.address = "t"
    link.properties = {symbol("x-opt-mqtt-client-id"): "v5c"}
    link.open()
    net.pump()
    peer.send(link, Message(body=b"not yours"), settled=True)
    assert [p.payload for p in take() if isinstance(p, Publish)] == [b"not yours"]
    assert not [line for line in log_lines if "take over" in line]
