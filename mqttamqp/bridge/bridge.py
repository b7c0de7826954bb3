"""One MQTT bridge: the base's out session and connect loop over an MQTT client
connection to the remote.

What it owns: the MQTT side of a bridge (``base.BridgeBase`` has the rest: the out
session, the connect loop, the status, the ``in`` direction's publish here): the
CONNECT it sends (MQTT 5 with a session that never expires unless clean, 3.1.1
with Mosquitto's bridge flag, ``try_private``); on CONNACK the ``in`` rules'
SUBSCRIBE (no-local on ``both`` rules at MQTT 5) and the out session claimed with
the remote's receive maximum as its window, its deliveries going out through
``BridgeLink`` (``link``: the remote's MQTT 5 limits) with the session's packet ids
and removed only on the remote's PUBACK (PUBCOMP for QoS 2); an ``in`` PUBLISH
handed to the base and acknowledged (PUBACK, or PUBREC then PUBCOMP on PUBREL: at
least once) once durable here; one a durable queue here refuses for good
(``amqp.refusals.for_good``) acknowledged at once and dropped (MQTT 5: with the
refusal's reason code and string), one refused for now not at all (the connection
is dropped, the remote keeps it).

What it must not do: store anything itself or bypass the broker's commands, or
parse bytes (``client``).  Loops: toward Mosquitto the bridge flag (``try_private``)
stops the remote echoing our messages back; locally the ``out`` subscriptions are
no-local, so what ``in`` publishes is not sent back out by a ``both`` rule.
"""

from __future__ import annotations

from mqttamqp.amqp.refusals import for_good
from mqttamqp.bridge.base import PROTOCOL, BridgeBase, Connector
from mqttamqp.bridge.client import LEVEL, BridgeClient
from mqttamqp.bridge.link import BridgeLink, RemoteLimits
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Refusal
from mqttamqp.core.sessions.session import NO_LOCAL, Session
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
)
from mqttamqp.mqtt.v5 import message_properties

__all__ = ["Bridge", "BridgeLink", "Connector"]


class Bridge(BridgeBase):
    """One configured MQTT bridge on the broker's reactor."""

    remote_max_packet: int | None = None   # the remote's (MQTT 5 CONNACK; None: none)

    def new_client(self) -> BridgeClient:
        s = self.settings
        password = None if s.password is None else s.password.encode()
        if self.v5:   # persistent unless clean: the session never expires there
            connect = Connect("MQTT", 5, s.remote_client_id, s.clean_session, s.keepalive,
                              None, s.username, password,
                              Properties(session_expiry_interval=0 if s.clean_session
                                         else 0xFFFFFFFF,
                                         # (the remote keeps what we could not take)
                                         maximum_packet_size=self.broker.limits.max_packet_size))
        else:
            connect = Connect("MQTT", LEVEL, s.remote_client_id, s.clean_session,
                              s.keepalive, None, s.username, password, bridge=s.try_private)
        return BridgeClient(self, self.clock, connect, s.connect_timeout,
                            self.broker.limits.max_packet_size, 5 if self.v5 else LEVEL,
                            self.close_grace)

    # -- the remote's calls (ClientOwner) -----------------------------------

    def remote_accepted(self, client: BridgeClient, connack: Connack) -> None:
        if not self._running or self._client is not client:   # (stopped meanwhile)
            client.disconnect()
            return
        limits = RemoteLimits(connack.properties if self.v5 else None)
        self.remote_max_packet = limits.max_packet
        fitted = limits.describe()
        self.up(f"session present: {connack.session_present}"
                + (f"; the remote takes {fitted}" if fitted else ""))
        if self.in_rules:
            # MQTT 5: no-local on ``both`` rules, so the remote does not send back
            # what this bridge published there.
            options = (tuple(NO_LOCAL if r.outbound else 0 for r in self.in_rules)
                       if self.v5 else ())
            client.subscribe(tuple((r.remote_filter, min(r.qos, limits.max_qos))
                                   for r in self.in_rules), options)
        if self.out_rules:
            # MQTT 5: the remote's receive maximum bounds what is in flight (absent:
            # 65,535), on each connection anew.
            props = connack.properties
            receive_max = (props.receive_maximum if props is not None else None) or 65535
            self.claim_out(client, min(self.broker.limits.max_inflight, receive_max),
                           lambda session: self._activate(client, session, limits))

    def _activate(self, client: BridgeClient, session: Session, limits: RemoteLimits
                  ) -> None:
        if self._client is not client or self.session is not session:
            return
        self.link.attach(client, limits)
        self.broker.activate(session, self.link, PROTOCOL)
    def remote_too_large(self, client: BridgeClient, topic: str, size: int, maximum: int
                         ) -> None:
        """3.1.1: a message from the remote above --max-packet-size, read past and
        acknowledged (``oversize``): dropped, counted, logged once a minute at most."""
        if self._client is not client:
            return
        self.too_large_in += 1
        self.warn("too-large-in", "bridge {n}: a message from the remote on {t} was "
                  "dropped: {s} bytes, above --max-packet-size {m}; {c} dropped so far",
                  t=topic, s=size, m=maximum, c=self.too_large_in)

    def remote_puback(self, client: BridgeClient, packet_id: int, reason_code: int = 0
                      ) -> None:
        """PUBACK: the message is done.  An MQTT 5 failure code (the remote refused it,
        e.g. 0x87 not authorized) is done too, as a client's would be: counted, and
        logged once a minute per bridge at most."""
        if self._client is not client:   # (a connection stopped or replaced)
            return
        if reason_code >= 0x80:
            self.refused += 1
            self.warn("puback", "bridge {n}: the remote refused a message (PUBACK "
                      "0x{c:02x}); {r} refused so far", c=reason_code, r=self.refused)
        session = self.session
        if session is not None:
            if packet_id in self.link.puback_is_pubrec:   # (a QoS 2 entry sent at QoS 1)
                self.link.puback_is_pubrec.discard(packet_id)
                self.broker.received(session, packet_id)
            else:
                self.broker.acknowledged(session, packet_id)

    def remote_pubrec(self, client: BridgeClient, packet_id: int) -> None:
        if self._client is client and self.session is not None:
            self.broker.received(self.session, packet_id)

    def remote_pubcomp(self, client: BridgeClient, packet_id: int) -> None:
        if self._client is client and self.session is not None:
            self.broker.completed(self.session, packet_id)

    def remote_suback(self, client: BridgeClient, codes: tuple[int, ...]) -> None:
        if self._client is not client:
            return
        refused = [r.remote_filter for r, c in zip(self.in_rules, codes, strict=False)
                   if c >= 0x80]
        if refused:
            self.log.warn("bridge {n}: the remote refused the subscriptions {f}",
                          n=self.settings.name, f=", ".join(refused))
        else:
            self.log.info("bridge {n}: subscribed on the remote to {f}", n=self.settings.name,
                          f=", ".join(r.remote_filter for r in self.in_rules))

    def remote_publish(self, client: BridgeClient, packet: Publish) -> None:
        """A message of an ``in`` rule: published here, acknowledged once durable
        (QoS 2 is taken at least once: PUBREC once durable, PUBCOMP on PUBREL).
        Nothing is taken from a connection that is not the bridge's current one."""
        if self._client is not client:
            return
        message = Message(self.local_topic(packet.topic), packet.payload, packet.qos,
                          packet.retain, self.settings.session_id, self.clock.seconds(),
                          props=message_properties(packet.properties))
        packet_id = packet.packet_id
        if packet.qos == 0 or packet_id is None:
            self.take_in(client, message, None)
            return
        ack: Puback | Pubrec = Puback(packet_id) if packet.qos == 1 else Pubrec(packet_id)

        def answer(refusal: Refusal | None = None) -> bool:
            # (one function for both: the message durable here, or refused here)
            if refusal is None:
                client.send(ack)
                return True
            return self._refused_here(client, ack, refusal)
        self.take_in(client, message, answer, answer)

    def _refused_here(self, client: BridgeClient, ack: Puback | Pubrec, refusal: Refusal
                      ) -> bool:
        """A durable queue here refused an ``in`` message.  For good (``for_good``:
        sent again, it would be refused again, e.g. a message a queue can never
        take): acknowledged all the same (``ack``; MQTT 5: with the refusal's reason
        code, and its reason string where the remote's maximum packet size allows),
        so the remote stops sending it, and True (``take_in`` counts it dropped).
        For now (a full queue): False, nothing sent; the connection is dropped and
        the remote keeps it."""
        if not for_good(refusal):
            return False
        if self.v5:
            props = Properties(reason_string=refusal.reason[:200])
            kind = Puback if isinstance(ack, Puback) else Pubrec
            told = kind(ack.packet_id, refusal.code, props)
            limit = self.remote_max_packet
            # (the encoded packet's own length: its fixed header grows past 127)
            if limit is not None and len(encode(told, 5)) > limit:
                told = kind(ack.packet_id, refusal.code, None)
            ack = told
        client.send(ack)
        return True

    def remote_pubrel(self, client: BridgeClient, packet_id: int) -> None:
        if self._client is client:
            client.send(Pubcomp(packet_id))
