"""The one place authentication and authorization plug in.

``Authenticator.authenticate`` is asked once per MQTT CONNECT and per AMQP SASL
exchange; ``Authorizer`` is asked for every publish, subscribe, will and retained
write.  The defaults accept everyone (anonymous access); a later user store replaces
them without touching the protocols.

The broker's other guards at the door (the ban list, the connection rate, the
publish rate) are built outside the core (``mqttamqp.security``) and injected as
``Guards``: the core knows them only by the Protocols below.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from twisted.internet.defer import Deferred

from mqttamqp.core.persistence import Op, PutBan
from mqttamqp.native import mypyc_attr

__all__ = ["Credentials", "Identity", "Authenticator", "Authorizer", "AllowAll",
           "LoopbackOnly", "loopback_peer", "loopback_host", "peer_host",
           "Ban", "Bans", "ConnectLimiter", "PublishLimiter", "Guards", "NoBans"]


# Both are frozen dataclasses with their own ``__init__`` (the decorator keeps a
# class's own): ``object.__setattr__(self, name, value)`` is what the generated
# one does in pure Python, and compiled (mypyc) it is a store into the native
# object's field, where the generated ``__init__`` was a Python function calling
# ``object.__setattr__`` through the frozen class's checks, a field at a time
# (~6,000 instructions a ``Credentials``, ~3,800 an ``Identity``: one each per MQTT
# CONNECT; bench/README.md, "connect cost in the compiled build").

@dataclass(frozen=True, slots=True)
class Credentials:
    client_id: str
    username: str | None
    password: bytes | None
    protocol: str          # "mqtt" or "amqp"
    peer: str              # remote address, for logs and rules

    def __init__(self, client_id: str, username: str | None, password: bytes | None,
                 protocol: str, peer: str) -> None:
        object.__setattr__(self, "client_id", client_id)
        object.__setattr__(self, "username", username)
        object.__setattr__(self, "password", password)
        object.__setattr__(self, "protocol", protocol)
        object.__setattr__(self, "peer", peer)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who an accepted connection is; ``username`` None means anonymous."""

    client_id: str
    username: str | None = None
    protocol: str = ""     # "mqtt3.1", "mqtt3.1.1" or "amqp" ("" for the broker's own)

    def __init__(self, client_id: str, username: str | None = None,
                 protocol: str = "") -> None:
        object.__setattr__(self, "client_id", client_id)
        object.__setattr__(self, "username", username)
        object.__setattr__(self, "protocol", protocol)


class Authenticator(Protocol):
    def authenticate(self, credentials: Credentials) -> bool | Deferred[bool]:
        ...


class Authorizer(Protocol):
    def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
        ...

    def may_subscribe(self, identity: Identity, topic_filter: str) -> bool:
        ...

    def may_use_session(self, identity: Identity, client_id: str) -> bool:
        """May ``identity`` act on the session of ``client_id`` from AMQP (the
        subscription service, a ``$mqtt.to.<id>.publish`` receiver)?"""
        ...

    def may_use_resource(self, identity: Identity, kind: str, access: str, name: str
                         ) -> bool:
        """Is ``identity`` granted ``access`` ("configure", "write", "read") on the
        AMQP 0.9.1 ``kind`` ("queue", "exchange") ``name`` by a rule of its own?
        (The 0.9.1 adapter adds what the topic rules imply.)"""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)
class AllowAll:
    """Anonymous access: every client, every topic.  (An authorizer that overrides a
    verdict may subclass it, in the compiled build too: the router asks ``AllowAll``
    itself nothing, ``ALLOWS_ALL``.)"""

    def authenticate(self, credentials: Credentials) -> bool:
        return True

    def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
        return True

    def may_subscribe(self, identity: Identity, topic_filter: str) -> bool:
        return True

    def may_use_session(self, identity: Identity, client_id: str) -> bool:
        return True

    def may_use_resource(self, identity: Identity, kind: str, access: str, name: str
                         ) -> bool:
        return True


def loopback_peer(peer: str) -> bool:
    """Is ``peer`` (``host:port`` as the listeners write it) on this machine?  A
    peer without a host (``?``: a UNIX socket) is."""
    return loopback_host(peer_host(peer))


class _LastPeer:
    """``peer_host``'s last answer, as one pair (read and replaced whole)."""

    __slots__ = ("pair",)

    def __init__(self) -> None:
        self.pair: tuple[str, str] = ("", "")


_LAST_PEER = _LastPeer()


def peer_host(peer: str) -> str:
    """The host of ``host:port`` as the listeners write a peer (IPv6 has colons).
    (A connect asks it of the same string object twice, at the accept's admission
    and at the CONNECT's loopback rule: the last answer is kept for that object,
    which also keeps the host's hash for ``loopback_host``'s cache.)"""
    last = _LAST_PEER.pair
    if last[0] is peer:
        return last[1]
    host = peer.rpartition(":")[0].strip("[]")
    _LAST_PEER.pair = (peer, host)
    return host


@lru_cache(maxsize=4096)
def loopback_host(host: str) -> bool:
    """(Cached: asked once or twice per connection, with few distinct hosts.)"""
    if host == "?":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback   # ::ffff:127.0.0.1 on a dual-stack listener
    return address.is_loopback


class LoopbackOnly(AllowAll):
    """No users configured: clients are accepted from loopback only, as Mosquitto 2
    does without a configuration, unless ``anywhere`` (``--allow-anonymous``)."""

    allows_anonymous = True

    def __init__(self, anywhere: bool = False) -> None:
        self.anywhere = anywhere

    def anonymous_from(self, peer: str) -> bool:
        return self.anywhere or loopback_peer(peer)

    def authenticate(self, credentials: Credentials) -> bool:
        return self.anonymous_from(credentials.peer)


# -- the guards injected from ``mqttamqp.security`` ----------------------------

@dataclass(frozen=True, slots=True)
class Ban:
    kind: str
    value: str
    until: float | None          # None: for good
    reason: str
    created: float
    by: str

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until

    def describe(self) -> str:
        what = {"client_id": "client id", "user": "user", "address": "address"}[self.kind]
        return f"{what} {self.value!r} is banned" + (f" ({self.reason})" if self.reason else "")


class Bans(Protocol):
    """The ban list (``security.bans.BanList``): who may not connect."""

    def check(self, client_id: str | None, user: str | None, host: str | None
              ) -> Ban | None:
        ...

    def check_peer(self, client_id: str | None, user: str | None, peer: str
                   ) -> Ban | None:
        """``check`` with the peer's ``host:port`` (its host taken only when
        something is banned)."""
        ...

    def add(self, kind: str, value: str, until: float | None, reason: str, by: str
            ) -> tuple[Ban, Op]:
        ...

    def remove(self, kind: str, value: str) -> Op | None:
        ...

    def purge(self) -> Sequence[Op]:
        ...

    def restore(self, records: Iterable[PutBan]) -> None:
        ...

    def active(self) -> list[Ban]:
        ...


class ConnectLimiter(Protocol):
    """New connections a second from one address (``security.admission.ConnectRate``)."""

    def admit(self, host: str) -> bool:
        ...

    def refund(self, host: str) -> None:
        """Give back the token the last ``admit`` of ``host`` took."""


class PublishLimiter(Protocol):
    """One client's publish budget (``security.admission.PublishRate``): ``take``
    charges a message of ``size`` bytes and says how long not to read the client."""

    def take(self, size: int) -> float:
        ...


class NoBans:
    """No ban list was given (a core built without ``mqttamqp.security``, in tests):
    nobody is banned, and none can be set."""

    def check(self, client_id: str | None, user: str | None, host: str | None
              ) -> Ban | None:
        return None

    def check_peer(self, client_id: str | None, user: str | None, peer: str
                   ) -> Ban | None:
        return None

    def add(self, kind: str, value: str, until: float | None, reason: str, by: str
            ) -> tuple[Ban, Op]:
        raise ValueError("this broker keeps no ban list")

    def remove(self, kind: str, value: str) -> Op | None:
        return None

    def purge(self) -> Sequence[Op]:
        return ()

    def restore(self, records: Iterable[PutBan]) -> None:
        pass

    def active(self) -> list[Ban]:
        return []


@dataclass(frozen=True, slots=True)
class Guards:
    """What the door checks besides credentials: the ban list, the connection rate
    per address (None: not limited) and a new client's publish budget (None, or a
    factory answering None: not limited).  ``mqttamqp.security.admission.guards``
    builds them from the limits."""

    bans: Bans
    connect_rate: ConnectLimiter | None = None
    publish_rate: Callable[[], PublishLimiter | None] | None = None
