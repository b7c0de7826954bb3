"""The ban list: client ids, user names and addresses that may not connect, for a
time or for good.

What it owns: the bans in memory (three dicts, so a check at MQTT CONNECT or AMQP
open costs at most three lookups), the durable ops that record a change
(``PutBan``, ``DeleteBan``; the caller commits them), and the rule that decides
whether a connection is banned (``check``).  A ban on an address matches the
peer's host whatever its port (``::ffff:10.0.0.1`` is ``10.0.0.1``).  An expired
ban stops matching at once and is dropped from memory the next time the list is
read; its record is deleted by the next ``expired_ops``.

What it must not do: log, close connections or talk to the store.  The façade
(``ClientGate.banned``, ``ConsoleCommands.ban``) does that.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from mqttamqp.core.auth import Ban, peer_host
from mqttamqp.core.persistence import DeleteBan, PutBan

__all__ = ["BanList", "BanError", "BAN_KINDS", "MAX_BANS", "normal_value"]

BAN_KINDS = ("client_id", "user", "address")
MAX_BANS = 10_000
MAX_VALUE = 1024
MAX_REASON = 500


class BanError(ValueError):
    """A ban that cannot be set (unknown kind, bad address, list full)."""


def normal_value(kind: str, value: str) -> str:
    """``value`` as bans of ``kind`` are keyed (addresses in their canonical form)."""
    if kind not in BAN_KINDS:
        raise BanError(f"kind must be one of {', '.join(BAN_KINDS)}")
    if kind == "address":
        text = value.strip().strip("[]")
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            raise BanError(f"{value!r} is not an IP address") from None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return str(address)
    if not value:
        raise BanError(f"a {kind} to ban must not be empty")
    if len(value) > MAX_VALUE:
        raise BanError(f"a {kind} to ban is at most {MAX_VALUE} characters")
    return value


def _host(host: str) -> str:
    try:
        return normal_value("address", host)
    except BanError:
        return host


class BanList:
    def __init__(self, seconds: Callable[[], float], max_bans: int = MAX_BANS) -> None:
        self._seconds = seconds
        self._max = max_bans
        self._bans: dict[str, dict[str, Ban]] = {kind: {} for kind in BAN_KINDS}

    def __len__(self) -> int:
        return sum(len(d) for d in self._bans.values())

    def restore(self, records: Iterable[PutBan]) -> None:
        for r in records:
            if r.kind in self._bans:
                self._bans[r.kind][r.value] = Ban(r.kind, r.value, r.until, r.reason,
                                                  r.created, r.by)

    def add(self, kind: str, value: str, until: float | None, reason: str, by: str
            ) -> tuple[Ban, PutBan]:
        """Ban (or re-ban, replacing the old terms); returns the ban and its op."""
        value = normal_value(kind, value)
        now = self._seconds()
        if until is not None and until <= now:
            raise BanError("a ban must end in the future")
        table = self._bans[kind]
        if value not in table and len(self) >= self._max:
            self.purge()
            if len(self) >= self._max:
                raise BanError(f"the ban list is full ({self._max} bans)")
        ban = Ban(kind, value, until, reason[:MAX_REASON], now, by)
        table[value] = ban
        return ban, PutBan(kind, value, until, ban.reason, now, by)

    def remove(self, kind: str, value: str) -> DeleteBan | None:
        value = normal_value(kind, value)
        if self._bans[kind].pop(value, None) is None:
            return None
        return DeleteBan(kind, value)

    def check_peer(self, client_id: str | None, user: str | None, peer: str
                   ) -> Ban | None:
        """``check`` for a peer's ``host:port``: its host is taken only when something
        is banned (a connect asks this once; nothing is banned on most brokers)."""
        bans = self._bans
        if not (bans["client_id"] or bans["user"] or bans["address"]):
            return None
        return self.check(client_id, user, peer_host(peer))

    def check(self, client_id: str | None, user: str | None, host: str | None) -> Ban | None:
        """The ban that refuses this connection, or None."""
        bans = self._bans
        if not (bans["client_id"] or bans["user"] or bans["address"]):
            return None                       # the common case: one truth test each
        now = self._seconds()
        for kind, value in (("client_id", client_id), ("user", user),
                            ("address", _host(host) if host else None)):
            if value:
                ban = bans[kind].get(value)
                if ban is not None and ban.active(now):
                    return ban
        return None

    def purge(self) -> list[DeleteBan]:
        """Forget expired bans; the ops delete their records."""
        now = self._seconds()
        ops = []
        for kind, table in self._bans.items():
            for value in [v for v, b in table.items() if not b.active(now)]:
                del table[value]
                ops.append(DeleteBan(kind, value))
        return ops

    def active(self) -> list[Ban]:
        now = self._seconds()
        return sorted((b for table in self._bans.values() for b in table.values()
                       if b.active(now)), key=lambda b: (b.kind, b.value))
