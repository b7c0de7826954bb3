"""In-memory peers for black-box tests of the broker's AMQP side (no tests here).

``Net`` is one broker (``Broker(clock, store, limits)``, started) with its
``AMQPFactory`` and ``MQTTFactory`` on one ``task.Clock``.  Its peers talk to the
broker's own protocol objects through ``StringTransport``:

* ``AmqpPeer`` — a python-qpid-proton client engine (``Connection`` + ``Transport``)
  pumped by hand: its output goes to the broker's ``AMQPConnection.dataReceived``,
  the broker's writes go back into the engine.  ``Receiver`` collects what arrives.
* ``MqttPeer`` — an ``MQTTProtocol`` driven packet by packet with the project's codec.

``Net.pump()`` moves bytes between every peer and the broker, running the Clock's
zero-delay calls (the broker's batched flushes), until nothing moves; ``Net.advance``
moves the Clock forward a step at a time, pumping in between (so heartbeats flow).
When the broker drops a connection, the peer reports ``connectionLost`` as the
reactor would.  Nothing here reads the broker's private state: what a test observes
comes over the wire, or from ``broker.sessions``, ``wills``, ``retained`` and ``stats``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from amqp_messages import annotation, control, drain, publish_message, will_message
from fakes import NullStore
from proton import Collector, Connection, Delivery, Link, Message, Transport, int32, ulong
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.amqp.listener import AMQPFactory
from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.core.persistence import StateStore
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Will,
)
from mqttamqp.mqtt.protocol import MQTTFactory
from mqttamqp.security.admission import guards

__all__ = [
    "ACCEPTED", "FE", "MODIFIED", "REJECTED", "RELEASED", "AmqpPeer", "MqttPeer", "Net",
    "Receiver", "annotation", "control", "outcome", "publish_message", "will_message",
]

ACCEPTED = Delivery.ACCEPTED
REJECTED = Delivery.REJECTED
RELEASED = Delivery.RELEASED
MODIFIED = Delivery.MODIFIED

_names = itertools.count(1)




# -- messages -------------------------------------------------------------------------

class Receiver:
    """A proton receiver link; ``got`` holds (message, delivery) in arrival order."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.got: list[tuple[Message, Delivery]] = []
        self.raw: list[bytes] = []          # the same, as the bytes that arrived
        self._taken = 0

    def collect(self) -> None:
        while True:
            dlv = self.link.current
            if dlv is None or not dlv.readable or dlv.partial:
                return
            data = self.link.recv(dlv.pending)
            self.link.advance()
            message = Message()
            message.decode(data)
            self.got.append((message, dlv))
            self.raw.append(bytes(data))

    def new(self) -> list[tuple[Message, Delivery]]:
        """What arrived since the last call."""
        fresh = self.got[self._taken:]
        self._taken = len(self.got)
        return fresh

    def bodies(self) -> list[bytes]:
        """The payloads of what arrived since the last ``new()``/``bodies()``."""
        return [bytes(m.body) for m, _ in self.new()]


class AmqpPeer:
    """A proton client engine on one in-memory connection to the broker."""

    def __init__(self, net: Net, container: str) -> None:
        self.net = net
        self.server = net.factory.buildProtocol(None)
        self.wire = StringTransport()
        self.server.makeConnection(self.wire)
        self.conn = Connection()
        self.conn.container = container
        self.transport = Transport()
        self.transport.bind(self.conn)
        self.receivers: list[Receiver] = []
        self.lost = False      # the broker saw connectionLost
        self.silent = False    # sends and reads nothing (a hung peer)
        # Applied to the client's bytes on their way to the broker (hostile input).
        self.mangle: Callable[[bytes], bytes] | None = None
        self.mangle_in: Callable[[bytes], bytes] | None = None    # and the broker's
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()

    # plumbing
    def step(self) -> bool:
        """Move bytes once each way; True if any moved."""
        if self.lost or self.silent:
            return False
        self.transport.tick(self.net.clock.seconds())
        moved = False
        out = drain(self.transport)
        if out and self.mangle is not None:
            out = self.mangle(out)
        if out:
            self.server.dataReceived(out)
            moved = True
        back = self.wire.value()
        if back:
            self.wire.clear()
            if self.mangle_in is not None:
                back = self.mangle_in(back)
            while back and self.transport.capacity() > 0:
                n = min(len(back), self.transport.capacity())
                self.transport.push(back[:n])
                back = back[n:]
            moved = True
        for receiver in self.receivers:
            receiver.collect()
        if self.wire.disconnecting:
            self.lost = True
            self.server.connectionLost(Failure(ConnectionDone()))
            moved = True
        return moved

    def kill(self) -> None:
        """The socket dies under the client: no detach, no close."""
        self.lost = True
        self.server.connectionLost(Failure(ConnectionLost()))
        self.net.pump()

    def close(self) -> None:
        """A clean AMQP close."""
        self.conn.close()
        self.net.pump()

    # links
    def receiver(self, address: str | None, credit: int = 10, name: str | None = None,
                 snd_settle_mode: int | None = None, dynamic: bool = False) -> Receiver:
        link = self.session.receiver(name or f"r{next(_names)}")
        link.source.address = address
        link.target.address = address
        link.source.dynamic = dynamic
        if snd_settle_mode is not None:
            link.snd_settle_mode = snd_settle_mode
        link.open()
        if credit:
            link.flow(credit)
        receiver = Receiver(link)
        self.receivers.append(receiver)
        self.net.pump()
        return receiver

    def sender(self, address: str | None, name: str | None = None,
               rcv_settle_mode: int | None = None) -> Link:
        link = self.session.sender(name or f"s{next(_names)}")
        link.target.address = address
        link.source.address = address
        link.snd_settle_mode = Link.SND_UNSETTLED
        if rcv_settle_mode is not None:
            link.rcv_settle_mode = rcv_settle_mode
        link.open()
        self.net.pump()
        return link

    def send(self, link: Link, message: Message, settled: bool = False) -> Delivery:
        """Send one message (within the link's credit) and pump; the delivery carries
        the broker's answer (``remote_state``, ``remote.condition``)."""
        assert link.credit > 0, f"no credit on {link.name}"
        dlv = link.delivery(f"t{next(_names)}")
        link.send(message.encode())
        link.advance()
        if settled:
            dlv.settle()
        self.net.pump()
        return dlv

    def settle(self, dlv: Delivery, state: int, failed: bool = False) -> None:
        if failed:
            dlv.local.failed = True
        dlv.update(state)
        dlv.settle()
        self.net.pump()


def outcome(dlv: Delivery) -> tuple[int, str | None]:
    condition = dlv.remote.condition
    return dlv.remote_state, (condition.name if condition is not None else None)


class FE:
    """An AMQP client in the FE role of seed 000 for one client id: will link (named
    after the client id), subscription-service sender, ``.control`` receiver."""

    def __init__(self, net: Net, client_id: str, publish_now: bool = False) -> None:
        self.client_id = client_id
        self.peer = net.amqp(f"fe-{client_id}")
        self.will = self.peer.sender("$mqtt.willservice", name=client_id)
        self.ss = self.peer.sender("$mqtt.subscriptionservice")
        self.control = self.peer.receiver(f"$mqtt.to.{client_id}.control")
        self.publish: Receiver | None = None
        if publish_now:
            self.attach_publish()

    def attach_publish(self, credit: int = 20) -> Receiver:
        self.publish = self.peer.receiver(f"$mqtt.to.{self.client_id}.publish", credit)
        return self.publish

    def send(self, message: Message) -> Delivery:
        return self.peer.send(self.ss, message)

    def list(self) -> dict[str, int]:
        """AMQP_LIST: Accepted, and the AMQP_SUBSCRIPTIONS reply on ``.control``."""
        dlv = self.send(control("list", self.client_id,
                                reply_to=f"$mqtt.to.{self.client_id}.control"))
        assert outcome(dlv) == (ACCEPTED, None)
        replies = self.control.new()
        assert len(replies) == 1, replies
        reply, rdlv = replies[0]
        self.peer.settle(rdlv, ACCEPTED)
        assert reply.subject == "subscriptions"
        assert reply.correlation_id == f"$mqtt.to.{self.client_id}.publish"
        assert isinstance(reply.body, dict)
        assert all(type(v) is int32 for v in reply.body.values())
        return {str(k): int(v) for k, v in reply.body.items()}

    def subscribe(self, filters: dict[str, Any], packet_id: int = 1) -> Delivery:
        return self.send(control("subscribe", self.client_id, body=filters,
                                 message_id=ulong(packet_id)))


# -- MQTT -----------------------------------------------------------------------------

class MqttPeer:
    """One MQTTProtocol on a StringTransport, driven packet by packet (MQTT 3.1.1, or
    ``level`` 5 with ``properties`` on its CONNECT)."""

    def __init__(self, net: Net, client_id: str, clean: bool = True,
                 will: Will | None = None, level: int = 4,
                 properties: Properties | None = None) -> None:
        self.net = net
        self.level = level
        self.proto = net.mqtt_factory.buildProtocol(None)
        self.transport = StringTransport()
        self.decoder = Decoder(protocol_level=level)
        self.proto.makeConnection(self.transport)  # type: ignore[no-untyped-call]
        self.packet_ids = 0
        self.inbox: list[Packet] = []
        self.send(Connect("MQTT", level, client_id, clean, 0, will, properties=properties))
        acks = self.take(Connack)
        assert len(acks) == 1, acks
        self.connack: Connack = acks[0]
        assert self.connack.return_code == 0

    def send(self, *packets: Packet) -> None:
        self.proto.dataReceived(b"".join(encode(p, self.level) for p in packets))
        self.net.pump()

    def take(self, *kinds: type) -> list[Any]:
        """The packets of ``kinds`` received so far and not yet taken, in order."""
        self.net.pump()
        self.decoder.feed(self.transport.value())
        self.transport.clear()
        self.inbox.extend(self.decoder)
        taken = [p for p in self.inbox if isinstance(p, kinds)]
        self.inbox = [p for p in self.inbox if not isinstance(p, kinds)]
        return taken

    def publishes(self) -> list[Publish]:
        """The PUBLISH packets received and not yet taken."""
        return self.take(Publish)

    def subscribe(self, *filters: tuple[str, int]) -> tuple[int, ...]:
        self.packet_ids += 1
        self.send(Subscribe(self.packet_ids, tuple(filters)))
        acks = self.take(Suback)
        assert len(acks) == 1, acks
        return tuple(acks[0].return_codes)

    def ack(self, messages: list[Publish]) -> None:
        """PUBACK these QoS 1 messages."""
        self.send(*[Puback(m.packet_id) for m in messages if m.packet_id is not None])

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        """PUBLISH, and for QoS 2 PUBREL; the broker's answers are taken and dropped."""
        packet_id = None
        if qos:
            self.packet_ids += 1
            packet_id = self.packet_ids
        self.send(Publish(topic, payload, qos, retain, False, packet_id))
        if packet_id is not None and qos == 2:
            self.send(Pubrel(packet_id))
        self.take(Puback, Pubrec, Pubcomp)

    def disconnect(self) -> None:
        self.send(Disconnect())
        assert self.transport.disconnecting
        self.proto.connectionLost(Failure(ConnectionDone()))


# -- the broker ------------------------------------------------------------------------

class Net:
    """A started broker with its AMQP and MQTT factories on one Clock."""

    def __init__(self, store: StateStore | None = None, idle_timeout: float = 60.0,
                 authenticator: Any = None, authorizer: Any = None, **limits: Any) -> None:
        limits.setdefault("sys_interval", 0)
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.store = store if store is not None else NullStore()
        self.broker = Broker(self.clock, self.store, Limits(**limits), authenticator,
                             authorizer, guards=guards(self.clock.seconds, Limits(**limits)))
        self.broker.start()
        self.factory = AMQPFactory(self.broker, self.clock, idle_timeout=idle_timeout)
        self.mqtt_factory = MQTTFactory(self.broker, self.clock)
        self.peers: list[AmqpPeer] = []

    def amqp(self, container: str | None = None) -> AmqpPeer:
        peer = AmqpPeer(self, container or f"app{next(_names)}")
        self.peers.append(peer)
        self.pump()
        return peer

    def fe(self, client_id: str, publish_now: bool = False) -> FE:
        return FE(self, client_id, publish_now)

    def mqtt(self, client_id: str, clean: bool = True, will: Will | None = None,
             level: int = 4, properties: Properties | None = None) -> MqttPeer:
        return MqttPeer(self, client_id, clean, will, level, properties)

    def pump(self, max_rounds: int = 10_000) -> None:
        """Run zero-delay calls and move bytes until nothing moves."""
        for _ in range(max_rounds):
            self.clock.advance(0)
            moved = False
            for peer in self.peers:
                moved = peer.step() or moved
            if not moved and not any(c.getTime() <= self.clock.seconds()
                                     for c in self.clock.getDelayedCalls()):
                return
        raise AssertionError("the in-memory wire never went quiet")

    def advance(self, seconds: float, step: float = 1.0) -> None:
        """Move the Clock ``seconds`` forward in steps of at most ``step``, pumping."""
        left = seconds
        while left > 1e-9:
            dt = min(step, left)
            self.clock.advance(dt)
            left -= dt
            self.pump()


class ListenerPeer:
    """A proton client engine wired to an AMQPConnection through StringTransport."""

    def __init__(self, idle: float = 4.0) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.broker = Broker(self.clock, NullStore(), Limits(sys_interval=0,
                                                            connect_timeout=5))
        self.factory = AMQPFactory(self.broker, self.clock, idle_timeout=idle)
        self.server = self.factory.buildProtocol(None)
        self.wire = StringTransport()
        self.server.makeConnection(self.wire)
        self.conn = Connection()
        self.conn.container = "unit"
        self.transport = Transport()
        self.transport.bind(self.conn)
        self.col = Collector()
        self.conn.collect(self.col)

    def exchange(self, rounds: int = 4) -> None:
        for _ in range(rounds):
            out = drain(self.transport)
            if out:
                self.server.dataReceived(out)
            self.clock.advance(0)      # scheduled flushes
            back = self.wire.value()
            self.wire.clear()
            if back:
                self.transport.push(back)

    def events(self) -> list[Any]:
        out = []
        while (ev := self.col.peek()) is not None:
            out.append(ev.type)
            self.col.pop()
        return out
