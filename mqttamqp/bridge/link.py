"""The ``out`` direction's link to the remote, and what the remote's CONNACK allows.

What it owns: ``BridgeLink``, the ``ClientLink`` of the broker's session
``$bridge/<name>``: each delivery of the session written to the remote as a PUBLISH;
``RemoteLimits``, the limits an MQTT 5 remote announced in its CONNACK (maximum QoS,
retain available, maximum packet size, topic alias maximum; the receive maximum is
the session's window, set by ``bridge``) and how a delivery is fitted to them:

* above the remote's maximum QoS: sent at that QoS (downgraded, as Mosquitto and EMQX
  bridges do); the session's entry is settled here when the remote is done with the
  lower QoS (at once for QoS 0, on PUBACK for a QoS 2 message sent at QoS 1);
* retain while the remote has no retain: sent without it;
* topic aliases: the first ``topic alias maximum`` topics get one, later PUBLISHes of
  them carry the alias and an empty topic;
* loops (a message that went round bridges back here): each message sent to an MQTT 5
  remote carries the user property ``bridge-hops``, the bridges it crossed (one more
  than it came with); one that has crossed ``max-hops`` already is not sent, counted
  and logged (rate-limited), its entry settled as dropped;
* a PUBLISH larger than the remote's maximum packet size: not sent (the remote would
  close the connection, and the resend after the reconnect would close it again);
  the message is dropped here, counted and logged (rate-limited), its session entry
  settled as dropped, as Mosquitto and EMQX drop what a client cannot take.

What it must not do: decide what to send or when (the session does), or touch the
broker other than through its settlement commands.  A 3.1.1 remote announces no
limits: every delivery takes the plain path, with no extra work per message.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock
from mqttamqp.core.message import Message
from mqttamqp.core.sessions.session import Session
from mqttamqp.mqtt.codec import encode_properties, encode_publish
from mqttamqp.mqtt.packets import Properties, Pubrel
from mqttamqp.mqtt.v5 import publish_properties

if TYPE_CHECKING:
    from mqttamqp.bridge.client import BridgeClient

__all__ = ["HOPS", "BridgeLink", "LinkOwner", "RemoteLimits", "hops_of"]

HOPS = "bridge-hops"   # the user property counting the bridges a message crossed


def hops_of(message: Message) -> int:
    """The bridges ``message`` crossed (its ``bridge-hops`` user property; 0 without,
    or when the value is not a count)."""
    props = message.props
    if props is None or not props.user_properties:
        return 0
    for key, value in props.user_properties:
        if key == HOPS:
            # (ASCII digits only: "²" is a digit to str.isdigit, not to int)
            return int(value) if value.isascii() and value.isdigit() and len(value) < 4 else 0
    return 0


def with_hops(props: Properties | None, hops: int) -> Properties:
    """``props`` with ``bridge-hops`` set to ``hops`` (any earlier one replaced)."""
    if props is None:
        return Properties(user_properties=((HOPS, str(hops)),))
    users = (*tuple(p for p in props.user_properties if p[0] != HOPS), (HOPS, str(hops)))
    return replace(props, user_properties=users)


class LinkOwner(Protocol):
    """What the link reads of its bridge (``bridge.Bridge``)."""

    broker: Broker
    clock: Clock
    settings: BridgeSettings
    v5: bool
    sent: int

    @property
    def session(self) -> Session | None: ...

    def remote_topic(self, topic: str) -> str: ...

    def warn(self, cause: str, fmt: str, **kw: Any) -> None: ...


class RemoteLimits:
    """What one connection's remote allows (from its MQTT 5 CONNACK properties)."""

    __slots__ = ("_aliases", "alias_max", "max_packet", "max_qos", "plain", "retain")

    def __init__(self, props: Properties | None) -> None:
        props = props or Properties()
        self.max_qos = 2 if props.maximum_qos is None else props.maximum_qos
        self.retain = props.retain_available != 0
        self.max_packet = props.maximum_packet_size   # None: no limit
        self.alias_max = props.topic_alias_maximum or 0
        self._aliases: dict[str, int] = {}
        # Nothing to fit: a delivery goes out as it is (the fast path).
        self.plain = (self.max_qos == 2 and self.retain and self.max_packet is None
                      and not self.alias_max)

    def describe(self) -> str:
        """The limits that apply, for the log ("" when none does)."""
        parts = []
        if self.max_qos < 2:
            parts.append(f"maximum QoS {self.max_qos}")
        if not self.retain:
            parts.append("no retain")
        if self.max_packet is not None:
            parts.append(f"maximum packet {self.max_packet} bytes")
        if self.alias_max:
            parts.append(f"{self.alias_max} topic aliases")
        return ", ".join(parts)

    def alias(self, topic: str) -> tuple[int | None, bool]:
        """The alias to send ``topic`` with, and whether the topic must go too."""
        alias = self._aliases.get(topic)
        if alias is not None:
            return alias, False
        if len(self._aliases) >= self.alias_max:
            return None, True
        alias = len(self._aliases) + 1
        self._aliases[topic] = alias
        return alias, True

    def forget_alias(self, topic: str) -> None:
        """Take back the alias just handed out for ``topic`` (it was not sent)."""
        if self._aliases.get(topic) == len(self._aliases):
            del self._aliases[topic]


class BridgeLink:
    """The out session's ``ClientLink``: its deliveries written to the remote."""

    __slots__ = ("_settle_call", "_settles", "bridge", "client", "downgraded", "limits",
                 "local_pubrel", "puback_is_pubrec", "too_large", "too_many_hops",
                 "unretained")

    def __init__(self, bridge: LinkOwner) -> None:
        self.bridge = bridge
        self.client: BridgeClient | None = None
        self.limits = RemoteLimits(None)
        self.too_large = 0       # not sent: above the remote's maximum packet size
        self.too_many_hops = 0   # not sent: it crossed max-hops bridges already (a loop)
        self.downgraded = 0      # sent at the remote's maximum QoS
        self.unretained = 0      # sent without retain (the remote has none)
        self._settles: list[tuple[str, int]] = []   # (``settle_later``)
        self._settle_call: Any = None
        # Packet ids of QoS 2 entries sent at a lower QoS: their PUBREL is not sent
        # but completes the entry here; those sent at QoS 1 whose PUBACK is their PUBREC.
        self.local_pubrel: set[int] = set()
        self.puback_is_pubrec: set[int] = set()

    def attach(self, client: BridgeClient | None, limits: RemoteLimits) -> None:
        self.client = client
        self.limits = limits
        self.local_pubrel.clear()
        self.puback_is_pubrec.clear()

    @property
    def congested(self) -> bool:
        client = self.client
        return client is None or client.paused

    @property
    def backlog_bytes(self) -> int:
        return 0

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        client = self.client
        if client is None:
            return   # (the session keeps it: resent on the next activation)
        bridge = self.bridge
        hops = self._hops(message, packet_id if qos else None)
        if hops is None:
            return
        if not self.limits.plain:
            self._send_fitted(client, message, qos, packet_id, dup, retain, hops)
            return
        bridge.sent += 1
        props = (encode_properties(with_hops(publish_properties(
            message, bridge.clock.seconds(), None, ()), hops + 1)) if bridge.v5 else None)
        client.publish(bridge.remote_topic(message.topic), message.payload, qos,
                       packet_id if qos else None, dup, retain, props)

    def _send_fitted(self, client: BridgeClient, message: Message, qos: int,
                     packet_id: int | None, dup: bool, retain: bool, hops: int) -> None:
        """A delivery fitted to the remote's limits (see the module's paragraph)."""
        bridge = self.bridge
        limits = self.limits
        sent_qos = qos if qos <= limits.max_qos else limits.max_qos
        if retain and not limits.retain:
            retain = False
            self.unretained += 1
        topic = bridge.remote_topic(message.topic)
        alias, with_topic = limits.alias(topic) if limits.alias_max else (None, True)
        props = encode_properties(with_hops(publish_properties(
            message, bridge.clock.seconds(), alias, ()), hops + 1))
        data = encode_publish(topic.encode() if with_topic else b"", message.payload,
                              sent_qos, retain, dup and sent_qos > 0,
                              packet_id if sent_qos else None, props)
        if limits.max_packet is not None and len(data) > limits.max_packet:
            if alias is not None and with_topic:
                limits.forget_alias(topic)
            self._too_large(message, len(data), limits.max_packet,
                            packet_id if qos else None)
            return
        bridge.sent += 1
        client.write(data)
        if sent_qos < qos and packet_id is not None:
            self.downgraded += 1
            if qos == 2:
                self.local_pubrel.add(packet_id)
                if sent_qos == 1:
                    self.puback_is_pubrec.add(packet_id)
                    return
            self.settle_later("sent", packet_id)   # (QoS 0: done once written)

    def send_pubrel(self, packet_id: int) -> None:
        if packet_id in self.local_pubrel:
            self.local_pubrel.discard(packet_id)
            self.settle_later("released", packet_id)
        elif self.client is not None:
            self.client.send(Pubrel(packet_id))

    # -- entries settled here ---------------------------------------------------

    def _too_large(self, message: Message, size: int, maximum: int,
                   packet_id: int | None) -> None:
        """A PUBLISH above the remote's maximum packet size: dropped, counted,
        logged once a minute at most; its session entry settled as dropped."""
        self.too_large += 1
        self.bridge.warn("too-large", "bridge {n}: a message on {t} was dropped: {s} "
                         "bytes, above the remote's maximum packet size {m}; {c} dropped "
                         "so far", t=message.topic, s=size, m=maximum, c=self.too_large)
        if packet_id is not None:
            self.settle_later("dropped", packet_id)

    def _hops(self, message: Message, packet_id: int | None) -> int | None:
        """The bridges ``message`` crossed, or None when that reached ``max-hops``
        (then it is not sent: ``_looped``)."""
        hops = 0 if message.props is None else hops_of(message)
        if hops >= self.bridge.settings.max_hops:
            self._looped(message, hops, packet_id)
            return None
        return hops

    def _looped(self, message: Message, hops: int, packet_id: int | None) -> None:
        """A message that crossed ``max-hops`` bridges already: not sent (a loop of
        bridges would send it round for ever), counted, logged once a minute at
        most; its session entry settled as dropped."""
        self.too_many_hops += 1
        self.bridge.warn("hops", "bridge {n}: a message on {t} was not forwarded: it "
                         "crossed {h} bridges already (max-hops {m}; a loop of bridges?); "
                         "{c} so far", t=message.topic, h=hops,
                         m=self.bridge.settings.max_hops, c=self.too_many_hops)
        if packet_id is not None:
            self.settle_later("looped", packet_id)

    def settle_later(self, kind: str, packet_id: int) -> None:
        """Settle a session entry once the current delivery pass is over (the
        session is pumping now): ``sent`` (sent at QoS 0 below its QoS), ``released``
        (a QoS 2 entry's PUBREL, not sent), ``dropped``, ``looped``.  (At most the session's
        window of them: each is an entry in flight.)"""
        self._settles.append((kind, packet_id))
        if self._settle_call is None:
            self._settle_call = self.bridge.clock.callLater(0, self._settle)

    def _settle(self) -> None:
        self._settle_call = None
        settles, self._settles = self._settles, []
        session = self.bridge.session
        if session is None:
            return   # (the entries stay in the session: sent again on the next connection)
        broker = self.bridge.broker
        for kind, packet_id in settles:
            entry = session.inflight.get(packet_id)
            if entry is None:
                continue
            if kind == "dropped":
                broker.rejected(session, packet_id, "above the remote's maximum packet size")
            elif kind == "looped":
                broker.rejected(session, packet_id, "crossed max-hops bridges (a loop)")
            elif kind == "released":
                broker.completed(session, packet_id)
            elif entry.qos == 1:
                broker.acknowledged(session, packet_id)
            else:
                broker.received(session, packet_id)   # (its PUBREL: ``released``)

    def close(self, reason: str) -> None:
        """The broker takes the session away (the console, a takeover)."""
        if self.client is not None:
            self.client.drop(reason)
