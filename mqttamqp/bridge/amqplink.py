"""The out session's ``ClientLink`` of an AMQP 1.0 bridge (``amqp``): its messages
onto the remote's sender.

What it owns: ``AmqpLink``: each message of the out session handed to the
connection's sender (``AmqpRemote.send``: with its hops count, mapped topic, dropped
above the remote's max-message-size), the window as the sender's credit
(``congested``), the QoS 0 bytes queued in proton without credit
(``backlog_bytes``), and the resend of what the remote released: after a delay
doubling from ``reconnect-min`` to ``reconnect-max`` while the remote accepts none,
only with credit.

What it must not do: decide what an outcome means (``amqpterms``, the bridge's
``outcome``), or touch proton itself (the connection does).
"""

from __future__ import annotations

from typing import Any

from mqttamqp.bridge.link import BridgeLink, RemoteLimits
from mqttamqp.core.message import Message

__all__ = ["AmqpLink"]


class AmqpLink(BridgeLink):
    """The out session's ``ClientLink`` over the remote's sender (see the module)."""

    __slots__ = ("_retries", "_retry_call", "delay", "released", "remote")

    def __init__(self, bridge: Any) -> None:
        super().__init__(bridge)
        self.remote: Any = None   # (the ``AmqpRemote`` while attached)
        self.released = 0       # outcomes released / modified: sent again
        self.delay = 0.0        # the last resend delay (0: none since an accepted)
        self._retries: list[int] = []
        self._retry_call: Any = None

    def attach(self, client: Any, limits: RemoteLimits) -> None:
        super().attach(None, limits)
        self.remote = client
        self._retries.clear()
        self.delay = 0.0
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = None

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

    def retry(self, packet_id: int) -> None:
        """The remote released it (or failed it): sent again after ``delay`` seconds,
        ``reconnect-min`` doubling up to ``reconnect-max`` while the remote accepts
        none (at most the session's window of them wait)."""
        self.released += 1
        self._retries.append(packet_id)
        if self._retry_call is None:
            self._retry_call = self.bridge.clock.callLater(self._next_delay(), self._resend)

    def _next_delay(self) -> float:
        s = self.bridge.settings
        self.delay = min(self.delay * 2, s.reconnect_max) if self.delay else s.reconnect_min
        return self.delay

    def _resend(self) -> None:
        self._retry_call = None
        ids, self._retries = self._retries, []
        session = self.bridge.session
        if session is None or self.remote is None:
            return   # (still in flight in the session: sent on the next connection)
        for i, packet_id in enumerate(ids):
            if self.congested:   # (no credit: the rest wait for the next try)
                self._retries[:0] = ids[i:]
                # the same delay (not a release), never less than reconnect-min: an
                # accept since may have set it to 0, and no credit would spin here
                wait = max(self.delay, self.bridge.settings.reconnect_min)
                self._retry_call = self.bridge.clock.callLater(wait, self._resend)
                return
            entry = session.inflight.get(packet_id)
            if entry is not None:
                self.send_publish(entry.message, entry.qos, packet_id, True, entry.retain)

    def close(self, reason: str) -> None:
        if self.remote is not None:
            self.remote.drop(reason)
