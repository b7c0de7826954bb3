"""One ``[[bridge]]`` table of the configuration file, read and checked.

What it owns: the table's keys, their defaults and types, the topic rules in
Mosquitto's shape (``"pattern [in|out|both [qos [local-prefix remote-prefix]]]"``),
and the one-line error (``TableKeyError`` naming the key) a bad table stops the
start with.  ``as_table`` writes the settings back for ``--print-config``.

What it must not do: connect anywhere or touch the broker (``bridge`` does).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from mqttamqp.core.topics import validate_topic_filter
from mqttamqp.ops.config import TableKeyError, as_table, table_values

__all__ = ["BridgeSettings", "TopicRule", "DIRECTIONS", "load_client_certificate"]

DIRECTIONS = ("out", "in", "both")
SCHEMES = {"mqtt": 1883, "mqtts": 8883, "ws": 80, "wss": 443, "amqp": 5672, "amqps": 5671}
TLS_SCHEMES = ("mqtts", "wss", "amqps")
EMPTY = '""'   # an empty prefix in a topic rule


@dataclass(frozen=True, slots=True)
class TopicRule:
    """One topic rule: ``pattern`` with its direction, QoS and prefixes (a local
    topic ``local_prefix + t`` is the remote's ``remote_prefix + t``)."""

    pattern: str
    direction: str
    qos: int
    local_prefix: str
    remote_prefix: str

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.pattern

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.pattern

    @property
    def outbound(self) -> bool:
        return self.direction in ("out", "both")

    @property
    def inbound(self) -> bool:
        return self.direction in ("in", "both")

    def text(self) -> str:
        base = f"{self.pattern} {self.direction} {self.qos}"
        if self.local_prefix or self.remote_prefix:
            base += f" {self.local_prefix or EMPTY} {self.remote_prefix or EMPTY}"
        return base


def parse_rule(text: str, local_prefix: str, remote_prefix: str) -> TopicRule:
    """``text`` as Mosquitto's ``topic`` line; ValueError saying what is wrong."""
    words = text.split()
    if not 1 <= len(words) <= 5 or len(words) == 4:
        raise ValueError(f"{text!r}: expected 'pattern [in|out|both [qos [local-prefix "
                         "remote-prefix]]]'")
    pattern = words[0]
    direction = words[1] if len(words) > 1 else "out"
    if direction not in DIRECTIONS:
        raise ValueError(f"{text!r}: direction {direction!r} is not out, in or both")
    qos_text = words[2] if len(words) > 2 else "0"
    if qos_text not in ("0", "1", "2"):
        raise ValueError(f"{text!r}: QoS {qos_text!r} is not 0, 1 or 2")
    if len(words) == 5:
        local_prefix, remote_prefix = ("" if w == '""' else w for w in words[3:5])
    for prefix in (local_prefix, remote_prefix):
        if "+" in prefix or "#" in prefix:
            raise ValueError(f"{text!r}: prefix {prefix!r} holds a wildcard")
    rule = TopicRule(pattern, direction, int(qos_text), local_prefix, remote_prefix)
    for topic_filter in (rule.local_filter, rule.remote_filter):
        problem = validate_topic_filter(topic_filter)
        if problem is not None:
            raise ValueError(f"{text!r}: {topic_filter!r}: {problem}")
    return rule


def load_client_certificate(cert_file: str, key_file: str) -> Any:
    """The ``twisted.internet.ssl.PrivateCertificate`` of ``cert-file`` and
    ``key-file`` (PEM); ``ValueError`` saying which file is wrong and why."""
    from OpenSSL import crypto
    from twisted.internet import ssl

    pems = []
    for path in (cert_file, key_file):
        try:
            with open(path, "rb") as f:
                pems.append(f.read())
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        certificate = ssl.Certificate.loadPEM(pems[0])
    except Exception:   # (OpenSSL's errors: any of several types)
        raise ValueError(f"{cert_file} holds no PEM certificate") from None
    try:
        key = ssl.KeyPair.load(pems[1], crypto.FILETYPE_PEM)
        return ssl.PrivateCertificate.fromCertificateAndKeyPair(certificate, key)
    except Exception:
        raise ValueError(f"{key_file} holds no unencrypted PEM private key of "
                         f"{cert_file}") from None


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    """A bridge as configured (``from_table``); every field has a default but
    ``name``, ``address`` and ``topics``."""

    name: str
    address: str
    topics: tuple[str, ...]
    client_id: str = ""              # default: "<hostname>.<name>", as Mosquitto
    clean_session: bool = False
    protocol: str = "3.1.1"          # or "5"
    username: str | None = None
    password: str | None = None
    keepalive: int = 60
    local_prefix: str = ""
    remote_prefix: str = ""
    try_private: bool = True         # Mosquitto's bridge flag: no echo of our messages
    connect_timeout: float = 10.0
    reconnect_min: float = 1.0
    reconnect_max: float = 60.0
    tls_ca: str | None = None        # mqtts://: a PEM CA bundle (default: the platform's)
    server_name: str | None = None   # mqtts://: the name to verify (default: address host)
    cert_file: str | None = None     # mqtts://: our client certificate (PEM) ...
    key_file: str | None = None      # ... and its private key (PEM, unencrypted)
    max_hops: int = 4                # bridges a message may cross (MQTT 5 user property)
    max_backlog_bytes: int = 32 << 20   # the out backlog's payload bytes ...
    max_backlog_messages: int = 30_000  # ... and messages (queued, not in flight)
    on_full: str = "block"           # at the bound: "block" publishers or "drop" (counted)
    credit: int = 100                # amqp://: unsettled in messages per receiver, at most
    max_resends: int = 10            # amqp://: released/modified sent again, then dropped
    max_full_wait: float = 3600.0    # amqp://: refused for now (full) sent again this long
    rules: tuple[TopicRule, ...] = field(default=(), compare=False)

    @property
    def host(self) -> str:
        return urlsplit(self.address).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.address)
        return parts.port or SCHEMES.get(parts.scheme, 1883)

    @property
    def tls(self) -> bool:
        return urlsplit(self.address).scheme in TLS_SCHEMES

    @property
    def websocket(self) -> bool:
        return urlsplit(self.address).scheme in ("ws", "wss")

    @property
    def amqp(self) -> bool:
        """The remote speaks AMQP 1.0 (``amqp://``, ``amqps://``), not MQTT."""
        return urlsplit(self.address).scheme in ("amqp", "amqps")

    @property
    def session_id(self) -> str:
        """The broker's own session holding the outbound backlog."""
        return f"$bridge/{self.name}"

    @property
    def remote_client_id(self) -> str:
        """``client-id``, else ``<hostname>.<name>`` as Mosquitto's bridges (not the
        local session id: a remote mqttamqp refuses ``$bridge/`` client ids)."""
        return self.client_id or f"{socket.gethostname()}.{self.name}"

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> BridgeSettings:
        """From a ``[[bridge]]`` table; ``TableKeyError`` naming the bad key."""
        values = table_values(cls, table, "rules", lambda k, f, v: _check(k, f.name, v))
        for key in ("name", "address", "topics"):
            if key not in values:
                raise TableKeyError(key, "missing (every bridge needs name, address, topics)")
        settings = cls(**values)
        settings._validate()
        rules = []
        for text in settings.topics:
            try:
                rules.append(parse_rule(text, settings.local_prefix, settings.remote_prefix))
            except ValueError as e:
                raise TableKeyError("topics", str(e)) from None
        object.__setattr__(settings, "rules", tuple(rules))
        return settings

    def _validate(self) -> None:
        if not self.name or "/" in self.name or "+" in self.name or "#" in self.name:
            raise TableKeyError("name", f"{self.name!r}: a non-empty name without / + #")
        parts = urlsplit(self.address)
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise TableKeyError("address", f"{self.address!r} is not an mqtt://, mqtts://, "
                                           "ws://, wss://, amqp:// or amqps://HOST[:PORT] "
                                           "address")
        if parts.path and not self.websocket:
            raise TableKeyError("address", f"{self.address!r}: a path only with ws:// "
                                           "or wss://")
        for key, value in (("tls-ca", self.tls_ca), ("server-name", self.server_name),
                           ("cert-file", self.cert_file), ("key-file", self.key_file)):
            if value is not None and not self.tls:
                raise TableKeyError(key, "only with an mqtts://, wss:// or amqps:// address")
        if self.tls_ca is not None:
            from mqttamqp.net.tls import load_ca_bundle

            try:
                load_ca_bundle(self.tls_ca)
            except ValueError as e:
                raise TableKeyError("tls-ca", str(e)) from None
        if (self.cert_file is None) != (self.key_file is None):
            raise TableKeyError("cert-file" if self.cert_file is None else "key-file",
                                "cert-file and key-file go together")
        if self.cert_file is not None and self.key_file is not None:
            try:
                load_client_certificate(self.cert_file, self.key_file)
            except ValueError as e:
                raise TableKeyError("cert-file", str(e)) from None
        if self.protocol not in ("3.1.1", "5"):
            raise TableKeyError("protocol", f"{self.protocol!r} is not \"3.1.1\" or \"5\"")
        if not self.topics:
            raise TableKeyError("topics", "at least one topic rule")
        if not 0 <= self.keepalive <= 65535:
            raise TableKeyError("keepalive", "0 to 65535 seconds")
        if self.connect_timeout <= 0:
            raise TableKeyError("connect-timeout", "more than 0 seconds")
        if not 0 < self.reconnect_min <= self.reconnect_max:
            raise TableKeyError("reconnect-min", "more than 0 and at most reconnect-max")
        if self.max_backlog_bytes < 1:
            raise TableKeyError("max-backlog-bytes", "at least 1 byte")
        if not 1 <= self.max_backlog_messages <= 30_000:
            raise TableKeyError("max-backlog-messages", "1 to 30000 (each holds an MQTT "
                                "packet id; with on-full = \"block\" twice as many may wait)")
        if self.on_full not in ("drop", "block"):
            raise TableKeyError("on-full", f"{self.on_full!r} is not \"drop\" or \"block\"")
        if not 1 <= self.credit <= 10_000:
            raise TableKeyError("credit", "1 to 10000 unsettled messages per receiver")
        if not 1 <= self.max_resends <= 1000:
            raise TableKeyError("max-resends", "1 to 1000 times a message is sent again")
        if not 1 <= self.max_full_wait <= 604_800:
            raise TableKeyError("max-full-wait", "1 to 604800 seconds (a week) a message a "
                                "remote refuses for now is sent again")
        if not 1 <= self.max_hops <= 255:
            raise TableKeyError("max-hops", "1 to 255 bridges")
        if self.password is not None and self.username is None:
            raise TableKeyError("password", "needs a username")

    def as_table(self) -> dict[str, Any]:
        """The TOML table ``from_table`` reads back to these settings."""
        return as_table(self, "rules")


_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "address": (str,), "protocol": (str,), "client_id": (str,), "username": (str,),
    "password": (str,), "local_prefix": (str,), "remote_prefix": (str,),
    "clean_session": (bool,), "try_private": (bool,), "keepalive": (int,), "max_hops": (int,),
    "max_backlog_bytes": (int,), "max_backlog_messages": (int,), "on_full": (str,),
    "credit": (int,), "max_resends": (int,), "max_full_wait": (int, float),
    "connect_timeout": (int, float), "reconnect_min": (int, float),
    "reconnect_max": (int, float), "tls_ca": (str,), "server_name": (str,),
    "cert_file": (str,), "key_file": (str,),
}


def _check(key: str, name: str, value: Any) -> Any:
    if name == "topics":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TableKeyError(key, "an array of strings ('sensors/# out 1')")
        return tuple(value)
    types = _TYPES[name]
    if isinstance(value, bool) and bool not in types:
        raise TableKeyError(key, f"expected {types[0].__name__}, got a boolean")
    if not isinstance(value, types):
        raise TableKeyError(key, f"expected {types[0].__name__}, got {type(value).__name__}")
    return float(value) if float in types else value  # type: ignore[arg-type]
