"""The out session's ``ClientLink`` of an AMQP 1.0 bridge (``amqp``): its messages
onto the remote's sender.

What it owns: ``AmqpLink``: each message of the out session handed to the
connection's sender (``AmqpRemote.send``: with its hops count, mapped topic, dropped
above the remote's max-message-size), the window as the sender's credit
(``congested``), the QoS 0 bytes queued in proton without credit
(``backlog_bytes``), and the resend of what the remote released, per remote
address (``Resends``): after a delay doubling from ``reconnect-min`` to
``reconnect-max`` while the remote accepts none on that address (an accept on
another address is no sign that this one takes messages again), only with credit;
and when the remote first refused each in-flight message for now (``full``,
``refused_for``: the bridge drops one past ``max-full-wait``).

What it must not do: decide what an outcome means (``amqpterms``, the bridge's
``outcome``), or touch proton itself (the connection does).
"""

from __future__ import annotations

from typing import Any

from mqttamqp.bridge.link import BridgeLink, RemoteLimits
from mqttamqp.core.message import Message

__all__ = ["AmqpLink", "Resends"]


class Resends:
    """The resends of one remote address: the released packet ids waiting, the
    timer, and the last delay (0: none since the address accepted one)."""

    __slots__ = ("call", "delay", "ids")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.delay = 0.0
        self.call: Any = None

    def cancel(self) -> None:
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None


class AmqpLink(BridgeLink):
    """The out session's ``ClientLink`` over the remote's sender (see the module)."""

    __slots__ = ("full", "released", "remote", "resends")

    def __init__(self, bridge: Any) -> None:
        super().__init__(bridge)
        self.remote: Any = None   # (the ``AmqpRemote`` while attached)
        self.released = 0       # outcomes released / modified: sent again
        # Remote address -> its resends; an address leaves once it accepts one with
        # nothing waiting, and at most the session's window of them hold a
        # message (the window bounds what is in flight); those that hold none
        # are forgotten past that many, one at a time, those at reconnect-min first
        # (``_forget_one``).
        self.resends: dict[str, Resends] = {}
        # Packet id -> (its entry, when the remote first refused it for now): how
        # long a full queue there has held it (``refused_for``); at most the
        # window's in-flight messages (the rest are forgotten on the next one).
        self.full: dict[int, tuple[Any, float]] = {}

    def attach(self, client: Any, limits: RemoteLimits) -> None:
        super().attach(None, limits)
        self.remote = client
        for r in self.resends.values():
            r.cancel()
        self.resends.clear()

    def delay(self, address: str) -> float:
        """The last resend delay of the remote ``address`` (0: none since it accepted
        one)."""
        r = self.resends.get(address)
        return 0.0 if r is None else r.delay

    @property
    def congested(self) -> bool:
        remote = self.remote
        return remote is None or remote.no_credit

    @property
    def backlog_bytes(self) -> int:
        """Bytes handed to proton without credit (waiting there): with ``congested``,
        the session's QoS 0 bound (``Limits.congested_qos0_bytes``,
        ``--congested-qos0-bytes``) applies to them."""
        remote = self.remote
        return 0 if remote is None else int(remote.backlog())

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        remote = self.remote
        if remote is None:
            return   # (the session keeps it: resent on the next activation)
        bridge = self.bridge
        hops = self._hops(message, packet_id if qos else None)
        if hops is None:
            return
        size = remote.send(bridge.remote_topic(message.topic), message, qos, retain, dup,
                           hops + 1, packet_id if qos else None, bridge.clock.seconds())
        if size:   # (above the remote's max-message-size: it would detach the sender)
            self._too_large(message, size, remote.max_message, packet_id if qos else None)
            return
        bridge.sent += 1

    def send_pubrel(self, packet_id: int) -> None:
        """QoS 2: the remote accepted it (``received``); nothing more goes there."""
        self.settle_later("released", packet_id)

    def retry(self, packet_id: int, address: str) -> None:
        """The remote released it (or failed it) on ``address``: sent again after
        that address's delay, ``reconnect-min`` doubling up to ``reconnect-max``
        while the remote accepts none there (at most the session's window of them
        wait)."""
        self.released += 1
        r = self._resends_of(address)
        r.ids.append(packet_id)
        if r.call is None:
            s = self.bridge.settings
            r.delay = min(r.delay * 2, s.reconnect_max) if r.delay else s.reconnect_min
            r.call = self.bridge.clock.callLater(r.delay, self._resend, address)

    def accepted(self, address: str) -> None:
        """The remote accepted a message on ``address``: its resends start over."""
        r = self.resends.get(address)
        if r is not None:
            r.delay = 0.0
            if r.call is None:
                del self.resends[address]

    def refused_for(self, packet_id: int, entry: Any, now: float) -> float:
        """The remote refused ``entry`` (in flight as ``packet_id``) for now: the
        seconds since its first such refusal (0 the first time; kept over
        reconnects, not over a restart)."""
        full = self.full
        first = full.get(packet_id)
        if first is not None and first[0] is entry:
            return now - first[1]
        if len(full) >= self.bridge.broker.limits.max_inflight:
            session = self.bridge.session
            inflight = session.inflight if session is not None else {}
            for gone in [p for p, (e, _) in full.items() if inflight.get(p) is not e]:
                del full[gone]
        full[packet_id] = (entry, now)
        return 0.0

    def _resends_of(self, address: str) -> Resends:
        """The resends of ``address``, moved to the end of the table (the order is
        that of the last release: the first are those released longest ago)."""
        resends = self.resends
        r = resends.pop(address, None)
        if r is None:
            r = Resends()
            if len(resends) >= max(16, self.bridge.broker.limits.max_inflight):
                self._forget_one()
        resends[address] = r
        return r

    def _forget_one(self) -> None:
        """Make room for one address: forget one with nothing waiting (its delay
        starts over if it is released again), the first one still at
        ``reconnect-min`` (nothing is lost with it), else the one released longest
        ago: a grown back-off is never forgotten while one at the start can be."""
        least = self.bridge.settings.reconnect_min
        oldest = None
        for address, r in self.resends.items():
            if r.call is None:
                if r.delay <= least:
                    del self.resends[address]
                    return
                if oldest is None:
                    oldest = address
        if oldest is not None:
            del self.resends[oldest]

    def _resend(self, address: str) -> None:
        r = self.resends.get(address)
        if r is None:
            return
        r.call = None
        ids, r.ids = r.ids, []
        session = self.bridge.session
        if session is None or self.remote is None:
            return   # (still in flight in the session: sent on the next connection)
        for i, packet_id in enumerate(ids):
            if self.congested:   # (no credit: the rest wait for the next try)
                r.ids[:0] = ids[i:]
                # the same delay (not a release), never less than reconnect-min: an
                # accept since may have set it to 0, and no credit would spin here
                wait = max(r.delay, self.bridge.settings.reconnect_min)
                r.call = self.bridge.clock.callLater(wait, self._resend, address)
                return
            entry = session.inflight.get(packet_id)
            if entry is not None:
                self.send_publish(entry.message, entry.qos, packet_id, True, entry.retain)
        if not r.delay:   # (accepted since: nothing more to remember)
            del self.resends[address]

    def close(self, reason: str) -> None:
        if self.remote is not None:
            self.remote.drop(reason)
