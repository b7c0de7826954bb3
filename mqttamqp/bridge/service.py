"""The bridges of a broker, together: each started once the broker's state is loaded
(``BrokerService._start_serving``: at the start, or under ``--ha`` at the takeover,
never on a standby), stopped with the service.

What it owns: building each bridge (``Bridge`` toward an MQTT remote, ``amqp.AmqpBridge``
toward an AMQP 1.0 one) with a TCP connector on the reactor, and at
the start and on each reload holding the sessions ``$bridge/<name>`` of bridges no
longer configured, or with no ``out`` rule any more (``hold_orphans``): each is
unsubscribed, so it stops queuing for nobody, but what it holds is kept (a forgotten
``--config``, a table commented out, or an ``--ha`` standby with an older file must not
drop messages acknowledged here).  The backlog goes when the session expires
(``--session-expiry``), when an operator clears the session (console, Sessions), or to
the remote if a bridge of that name comes back.  One log line per such session, at
each start and reload, naming it, what it holds and how to clear it.  What it must not
do: anything of a bridge itself (``bridge``), or delete a session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet.endpoints import TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IReactorTCP
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.bridge.amqp import AmqpBridge
from mqttamqp.bridge.base import BridgeBase
from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.client import BridgeClient
from mqttamqp.bridge.config import BridgeSettings, load_client_certificate
from mqttamqp.bridge.wsremote import connect_websocket
from mqttamqp.core.broker import Broker
from mqttamqp.core.message import Message

__all__ = ["SAMPLE", "Bridges", "figures", "hold_orphans", "sys_topics"]

log = Logger()
PREFIX = "$bridge/"
SAMPLE = 5.0   # seconds between the rate samples (messages/s out and in)


def hold_orphans(broker: Broker, names: Sequence[str]) -> list[str]:
    """Unsubscribe the sessions ``$bridge/<name>`` whose name is not in ``names``,
    keeping what they hold; their ids, each logged once."""
    kept = {PREFIX + n for n in names}
    orphans = sorted(cid for cid in broker.sessions
                     if cid.startswith(PREFIX) and cid not in kept)
    for cid in orphans:
        session = broker.sessions[cid]
        filters = list(session.subscriptions)
        if filters:
            done = broker.unsubscribe(session, filters)
            if done is not None:
                done.addErrback(_failed, cid)
        expiry = broker.limits.session_expiry
        log.warn("bridge {n} is not configured (or has no out rule): its session {c} no "
                 "longer queues, and keeps the {h} messages ({b} bytes) it holds {e}, or "
                 "until cleared (console: Sessions, clear {c}); a bridge named {n} "
                 "again sends them",
                 n=cid[len(PREFIX):], c=cid, h=len(session.queue) + len(session.inflight),
                 b=session.queued_bytes,
                 e=(f"until it expires (--session-expiry {expiry:g} s)" if expiry > 0
                    else "(--session-expiry 0: it does not expire)"))
    return orphans


def figures(bridge: BridgeBase) -> dict[str, Any]:
    """A bridge now: state, remote, last error, connected since, counters, and its
    out backlog (the session's queue and what is in flight)."""
    s = bridge.settings
    session = bridge.broker.sessions.get(s.session_id)
    queued = len(session.queue) if session is not None else 0
    inflight = len(session.inflight) if session is not None else 0
    client = bridge.client
    return {
        "name": s.name, "address": s.address,
        "protocol": "AMQP 1.0" if s.amqp else s.protocol,
        "client_id": s.remote_client_id, "session": s.session_id,
        "rules": [r.text() for r in s.rules], "state": bridge.state,
        "last_error": bridge.last_error, "connected_since": bridge.connected_since,
        "attempts": bridge.attempts, "failures": bridge.failures,
        "sent": bridge.sent, "received": bridge.received,
        "remote_refused": bridge.refused, "refused_here": bridge.refused_here,
        "dropped_in": bridge.dropped_in,
        "too_large": bridge.link.too_large, "too_large_in": bridge.too_large_in,
        "too_many_hops": bridge.link.too_many_hops,
        "downgraded": bridge.link.downgraded,
        "unretained": bridge.link.unretained, "held": bridge.held,
        "released": getattr(bridge.link, "released", 0),   # (AMQP remotes only)
        "full_dropped": getattr(bridge, "full_dropped", 0),
        "echoes": getattr(bridge, "echoes", 0),
        "reading_paused": sorted(client.paused_for) if client is not None else [],
        "backlog_messages": queued + inflight, "inflight": inflight,
        "backlog_bytes": session.queued_bytes if session is not None else 0,
        "backlog_dropped": session.dropped if session is not None else 0,
        "backlog_blocked": bridge.backlog.blocked, "backlog_blocking": bridge.backlog.blocking,
        "max_backlog_bytes": s.max_backlog_bytes, "on_full": s.on_full,
        "rate_out": bridge.rate_out, "rate_in": bridge.rate_in,
    }


def sys_topics(bridge: BridgeBase) -> list[tuple[str, str]]:
    """The bridge's ``$SYS/broker/connection/<client id>/...`` topics beside Mosquitto's
    ``state`` (which ``Bridge`` publishes at each change): messages out and in, the
    rates, and the out backlog."""
    f = figures(bridge)
    p = f"$SYS/broker/connection/{f['client_id']}/"
    return [(p + "messages/sent", str(f["sent"])), (p + "messages/received", str(f["received"])),
            (p + "messages/sent/per-second", f"{f['rate_out']:g}"),
            (p + "messages/received/per-second", f"{f['rate_in']:g}"),
            (p + "backlog/messages", str(f["backlog_messages"])),
            (p + "backlog/bytes", str(f["backlog_bytes"])),
            (p + "backlog/dropped", str(f["backlog_dropped"]))]


def _failed(failure: Failure, client_id: str) -> None:
    log.failure("unsubscribing the session {c}", failure, c=client_id)


def _tls_creator(settings: BridgeSettings) -> Any:
    """TLS toward an mqtts:// remote: its certificate checked against ``tls-ca`` (else
    the platform's CAs) and its name (``server-name``, else the address's host)
    through service-identity; ours (``cert-file``, ``key-file``) when configured."""
    from twisted.internet import ssl

    from mqttamqp.net.tls import load_ca_bundle

    roots: Any = (ssl.trustRootFromCertificates(
        [ssl.Certificate(c) for c in load_ca_bundle(settings.tls_ca)])
        if settings.tls_ca is not None else ssl.platformTrust())
    client = (load_client_certificate(settings.cert_file, settings.key_file)
              if settings.cert_file is not None and settings.key_file is not None else None)
    return ssl.optionsForClientTLS(settings.server_name or settings.host, trustRoot=roots,
                                   clientCertificate=client)


class _Once(Factory):
    """The factory of one connection attempt (quiet: no line per attempt)."""

    noisy = False

    def __init__(self, client: Any) -> None:
        self.client = client

    def buildProtocol(self, addr: Any) -> Any:
        return self.client


class Bridges:
    """Every ``[[bridge]]`` of the configuration."""

    def __init__(self, broker: Broker, reactor: Any, settings: Sequence[BridgeSettings]
                 ) -> None:
        self.broker = broker
        self.reactor = reactor
        self.bridges = [self._bridge(s) for s in settings]
        self.started = False
        self._sampler: Any = None
        self._sampled = self._sys_at = 0.0

    def _bridge(self, settings: BridgeSettings) -> BridgeBase:
        """A bridge of ``settings``: to an MQTT remote, or an AMQP 1.0 one."""
        kind = AmqpBridge if settings.amqp else Bridge
        return kind(self.broker, self.reactor, settings, self._connector(settings))

    def _connector(self, settings: BridgeSettings) -> Any:
        reactor: IReactorTCP = self.reactor

        endpoint: Any = TCP4ClientEndpoint(reactor, settings.host, settings.port,
                                           timeout=max(1, int(settings.connect_timeout)))
        if settings.tls:
            endpoint = wrapClientTLS(_tls_creator(settings), endpoint)
        if settings.websocket:
            max_packet = self.broker.limits.max_packet_size

            def connect_ws(client: BridgeClient) -> Any:
                return connect_websocket(endpoint, settings, max_packet, client)

            return connect_ws

        if settings.amqp:   # (an ``AmqpRemote``: its connection is the gateway's engine)
            def connect_amqp(remote: Any) -> Any:
                return endpoint.connect(_Once(remote.conn))

            return connect_amqp

        def connect(client: BridgeClient) -> Any:
            return endpoint.connect(_Once(client))

        return connect

    def start(self) -> None:
        self.started = True
        hold_orphans(self.broker, [b.settings.name for b in self.bridges if b.out_rules])
        for bridge in self.bridges:
            bridge.start()
        self._sampled = self._sys_at = self.reactor.seconds()
        self._sampler = self.reactor.callLater(self._period(), self._sample)

    def _period(self) -> float:
        interval = self.broker.limits.sys_interval
        return min(SAMPLE, interval) if interval > 0 else SAMPLE

    def _sample(self) -> None:
        """Every ``SAMPLE`` s (or ``--sys-interval`` if shorter): each bridge's rates;
        every ``--sys-interval`` (0: never) those of its ``$SYS`` topics whose value
        changed since the retained copy, retained, as the broker's own messages
        (as ``SysTopics`` does)."""
        now = self.reactor.seconds()
        elapsed, self._sampled = now - self._sampled, now
        for bridge in self.bridges:
            bridge.sample(elapsed)
        interval = self.broker.limits.sys_interval
        if interval > 0 and now - self._sys_at >= interval - 0.001:
            self._sys_at = now
            retained = self.broker.retained
            with self.broker.stats.own_messages():
                for bridge in self.bridges:
                    if bridge.state != "stopped":
                        for topic, payload in sys_topics(bridge):
                            data = payload.encode()
                            if retained.holds(topic, data):
                                continue
                            self.broker.publish(Message(topic, data, 0, True, None, now),
                                                None, wait=False, counted=False)
        self._sampler = self.reactor.callLater(self._period(), self._sample)

    def configure(self, settings: Sequence[BridgeSettings]) -> None:
        """SIGHUP: the ``[[bridge]]`` tables now.  A bridge whose table is unchanged
        runs on untouched; a changed one is stopped and started anew on the same
        session (its backlog kept; its subscriptions follow the new rules); a new one
        starts; a removed one stops and its session is held, as at a start
        (``hold_orphans``)."""
        old = {b.settings.name: b for b in self.bridges}
        names = {s.name for s in settings}
        added: list[str] = []
        changed: list[str] = []
        bridges: list[BridgeBase] = []
        # Every new Bridge is built first (a TLS remote's CA file is read here): if
        # one fails, nothing has been stopped and the running set stays as it was.
        for s in settings:
            bridge = old.get(s.name)
            if bridge is not None and bridge.settings == s:
                bridges.append(bridge)
                continue
            (changed if bridge is not None else added).append(s.name)
            bridges.append(self._bridge(s))
        removed = [name for name in old if name not in names]
        for name in changed + removed:
            old[name].stop()
        self.bridges = bridges
        log.info("bridges reloaded: {a} added, {c} changed, {r} removed, {k} unchanged",
                 a=", ".join(added) or "none", c=", ".join(changed) or "none",
                 r=", ".join(removed) or "none",
                 k=len(bridges) - len(added) - len(changed))
        if not self.started:
            return
        hold_orphans(self.broker, [b.settings.name for b in bridges if b.out_rules])
        for bridge in bridges:
            if bridge.settings.name in added or bridge.settings.name in changed:
                bridge.start()

    def figures(self) -> list[dict[str, Any]]:
        """Each bridge now (``Bridge.figures``), for the console and the metrics."""
        return [figures(bridge) for bridge in self.bridges]

    def stop(self) -> None:
        if self._sampler is not None and self._sampler.active():
            self._sampler.cancel()
        self._sampler = None
        for bridge in self.bridges:
            bridge.stop()
