"""Enhanced authentication (MQTT 5 AUTH): the pluggable interface and SCRAM-SHA-256.

What it owns: the shape of a challenge/response exchange (``AuthMethod`` starts
one, ``AuthExchange.step`` answers each piece of client data with an ``AuthStep``:
continue with a challenge, success with the final data, or failure), the set of
methods a broker offers (``EnhancedAuthenticator``), and the first method,
SCRAM-SHA-256 (RFC 5802, RFC 7677) on the server side.

What it must not do: know MQTT packets (the protocol turns steps into AUTH and
CONNACK packets) or where credentials live: a SCRAM method is given a lookup
from user name to ``ScramCredentials`` (the user store keeps those, derived once
from the password by ``scram_credentials``, so an exchange costs HMACs, not a
password hash, and may run on the reactor thread).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from typing import Protocol

from mqttamqp.records import record

__all__ = [
    "CONTINUE", "FAILURE", "SUCCESS", "AuthExchange", "AuthMethod", "AuthStep",
    "EnhancedAuthenticator", "ScramCredentials", "ScramSha256", "scram_credentials",
]

CONTINUE = "continue"
SUCCESS = "success"
FAILURE = "failure"


@record
class AuthStep:
    """The server's answer to one piece of client data."""

    outcome: str                  # CONTINUE, SUCCESS or FAILURE
    data: bytes | None = None     # the challenge, or the server's final data
    username: str | None = None   # SUCCESS: who the client proved to be
    reason: str = ""              # FAILURE: why (for the log, never the client's secret)


class AuthExchange(Protocol):
    def step(self, data: bytes | None) -> AuthStep:
        ...


class AuthMethod(Protocol):
    name: str

    def start(self) -> AuthExchange:
        ...


class EnhancedAuthenticator:
    """The methods a broker offers, by name (an unknown one: the client gets 0x8C)."""

    def __init__(self, methods: list[AuthMethod]) -> None:
        self.methods = {m.name: m for m in methods}

    def start(self, method: str) -> AuthExchange | None:
        chosen = self.methods.get(method)
        return None if chosen is None else chosen.start()


# -- SCRAM-SHA-256 --------------------------------------------------------------


@record
class ScramCredentials:
    """What the server keeps for one user (RFC 5802 section 3): never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


_DECOY_KEY = os.urandom(32)


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def scram_credentials(password: str, salt: bytes | None = None,
                      iterations: int = 4096) -> ScramCredentials:
    """Derive a user's SCRAM-SHA-256 credentials from the password (PBKDF2: slow
    on purpose, so run it where a user is created, not per login)."""
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return ScramCredentials(salt, iterations, hashlib.sha256(client_key).digest(),
                            _hmac(salted, b"Server Key"))


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1 or key in out:
            raise ValueError(f"bad SCRAM attribute {part[:20]!r}")
        out[key] = value
    return out


class _ScramExchange:
    """One SCRAM-SHA-256 exchange: client-first, then client-final; any deviation
    is a failure (never an exception)."""

    def __init__(self, lookup: Callable[[str], ScramCredentials | None],
                 nonce: Callable[[], str]) -> None:
        self._lookup = lookup
        self._nonce = nonce
        self._state = "first"
        self._username = ""
        self._nonce_full = ""
        self._auth_message = ""
        self._creds: ScramCredentials | None = None
        self._known = False

    def step(self, data: bytes | None) -> AuthStep:
        try:
            text = (data or b"").decode("utf-8")
            if self._state == "first":
                return self._first(text)
            if self._state == "final":
                return self._final(text)
        except (UnicodeDecodeError, ValueError) as exc:
            self._state = "done"
            return AuthStep(FAILURE, reason=f"SCRAM: {exc}")
        return AuthStep(FAILURE, reason="SCRAM: exchange already over")

    def _first(self, text: str) -> AuthStep:
        gs2, sep, bare = text.partition(",,")
        if not sep or gs2 not in ("n", "y"):
            raise ValueError("client-first-message without a supported GS2 header")
        attrs = _attributes(bare)
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise ValueError("client-first-message lacks n= or r=")
        self._username = attrs["n"].replace("=2C", ",").replace("=3D", "=")
        creds = self._lookup(self._username)
        # An unknown user gets a challenge like any other (no user enumeration): a
        # salt keyed by a secret of this process, stable per name, so nobody can
        # compute it; the proof cannot match.
        self._creds = creds if creds is not None else ScramCredentials(
            _hmac(_DECOY_KEY, self._username.encode())[:16], 4096, os.urandom(32),
            os.urandom(32))
        self._known = creds is not None
        self._nonce_full = attrs["r"] + self._nonce()
        salt = base64.b64encode(self._creds.salt).decode()
        server_first = f"r={self._nonce_full},s={salt},i={self._creds.iterations}"
        self._auth_message = bare + "," + server_first
        self._state = "final"
        return AuthStep(CONTINUE, server_first.encode())

    def _final(self, text: str) -> AuthStep:
        self._state = "done"
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise ValueError("client-final-message without a proof")
        attrs = _attributes(without_proof)
        if attrs.get("r") != self._nonce_full:
            raise ValueError("nonce does not match")
        if attrs.get("c") not in ("biws", "eSws"):      # base64 of "n,," / "y,,"
            raise ValueError("channel binding data does not match")
        creds = self._creds
        assert creds is not None
        auth_message = (self._auth_message + "," + without_proof).encode()
        proof = base64.b64decode(proof_part, validate=True)
        signature = _hmac(creds.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ValueError("proof of the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not self._known or not hmac.compare_digest(
                hashlib.sha256(client_key).digest(), creds.stored_key):
            return AuthStep(FAILURE, reason=f"SCRAM: wrong proof for {self._username!r}")
        verifier = base64.b64encode(_hmac(creds.server_key, auth_message)).decode()
        return AuthStep(SUCCESS, f"v={verifier}".encode(), self._username)


class ScramSha256:
    """The SCRAM-SHA-256 method over a credentials lookup."""

    name = "SCRAM-SHA-256"

    def __init__(self, lookup: Callable[[str], ScramCredentials | None],
                 nonce: Callable[[], str] | None = None) -> None:
        self._lookup = lookup
        self._nonce = nonce or (lambda: base64.b64encode(os.urandom(18)).decode())

    def start(self) -> AuthExchange:
        return _ScramExchange(self._lookup, self._nonce)
