"""Admission: how fast one address may open connections (``ConnectRate``), and how
fast one client may publish (``PublishRate``, optional).

A token bucket per remote address (``Limits.max_connect_rate`` per second, bursts
of ``connect_burst``); loopback addresses are not limited (the machine itself,
trusted as for anonymous access).  The table of addresses is bounded: when full,
the buckets that have been full longest are forgotten (a forgotten address starts
with a full bucket, which is what a quiet address has anyway).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from functools import partial

from mqttamqp.core.auth import Guards, loopback_host
from mqttamqp.core.limits import Limits
from mqttamqp.security.bans import BanList

__all__ = ["ConnectRate", "PublishRate", "guards"]


def guards(seconds: Callable[[], float], limits: Limits) -> Guards:
    """The ban list and the rate limits ``limits`` asks for, for ``Broker``."""
    publish_rate = None
    if limits.max_publish_rate > 0 or limits.max_publish_byte_rate > 0:
        publish_rate = partial(PublishRate, seconds, limits.max_publish_rate,
                               limits.max_publish_byte_rate)
    return Guards(BanList(seconds),
                  ConnectRate(seconds, limits.max_connect_rate, limits.connect_burst),
                  publish_rate)


class ConnectRate:
    def __init__(self, seconds: Callable[[], float], rate: float, burst: int,
                 max_addresses: int = 10_000) -> None:
        self._seconds = seconds
        self.rate = rate
        self.burst = max(1, burst)
        self._max = max_addresses
        self._buckets: dict[str, tuple[float, float]] = {}   # address -> (tokens, at)

    def admit(self, host: str) -> bool:
        """May ``host`` open one more connection now?  (Takes a token if so.)"""
        if self.rate <= 0 or loopback_host(host):
            return True
        host = _plain(host)
        now = self._seconds()
        tokens, at = self._buckets.get(host, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[host] = (tokens, now)
            return False
        if host not in self._buckets and len(self._buckets) >= self._max:
            self._forget(now)
        self._buckets[host] = (tokens - 1.0, now)
        return True

    def refund(self, host: str) -> None:
        """Give back the token ``admit`` took for ``host`` (a connection counted at its
        accept whose next admission must not spend a second one: a WebSocket's MQTT
        connection at the end of its upgrade)."""
        host = _plain(host)
        entry = self._buckets.get(host)
        if entry is not None:
            self._buckets[host] = (min(float(self.burst), entry[0] + 1.0), entry[1])

    def _forget(self, now: float) -> None:
        """Drop the buckets that are full again (or the fullest half)."""
        full = [h for h, (t, at) in self._buckets.items()
                if t + (now - at) * self.rate >= self.burst]
        if len(full) < len(self._buckets) // 2:
            full = sorted(self._buckets, key=lambda h: -(self._buckets[h][0]
                          + (now - self._buckets[h][1]) * self.rate))[:len(self._buckets) // 2]
        for host in full:
            del self._buckets[host]


def _plain(host: str) -> str:
    """``::ffff:10.0.0.1`` (a dual-stack listener's IPv4 peer) as ``10.0.0.1``."""
    if host.startswith("::ffff:"):
        try:
            mapped = ipaddress.IPv6Address(host).ipv4_mapped
        except ValueError:
            return host
        if mapped is not None:
            return str(mapped)
    return host


class PublishRate:
    """One client's publish budget: ``messages`` a second and ``byte_rate`` payload
    bytes a second (0 = no limit for that one), in bursts of one second's worth.

    ``take`` charges one message and returns how long the client should not be
    read (0.0: go on).  The budget may go negative, so that whatever one socket
    read held is paid for by a longer pause: the average holds.
    """

    __slots__ = ("_at", "_bytes", "_messages", "_seconds", "byte_rate", "messages")

    def __init__(self, seconds: Callable[[], float], messages: float, byte_rate: float) -> None:
        self._seconds = seconds
        self.messages = messages
        self.byte_rate = byte_rate
        self._messages = messages
        self._bytes = byte_rate
        self._at = seconds()

    def take(self, size: int) -> float:
        now = self._seconds()
        elapsed = max(0.0, now - self._at)     # (a clock stepped back refills nothing)
        self._at = now
        wait = 0.0
        if self.messages > 0:
            self._messages = min(self.messages, self._messages + elapsed * self.messages) - 1
            if self._messages < 0:
                wait = -self._messages / self.messages
        if self.byte_rate > 0:
            self._bytes = min(self.byte_rate, self._bytes + elapsed * self.byte_rate) - size
            if self._bytes < 0:
                wait = max(wait, -self._bytes / self.byte_rate)
        return wait
