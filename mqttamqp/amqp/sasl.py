"""The SASL layer in front of the AMQP engine, sans-IO: bytes in, steps out.

What it owns: the protocol header exchange (SASL ``AMQP 3.1.0.0`` or plain
``AMQP 0.1.0.0``), the sasl-mechanisms frame, parsing sasl-init (ANONYMOUS,
PLAIN and EXTERNAL: the TLS client certificate, whose user the listener knows) and
encoding sasl-outcome, with a bound on frame size.  SASL frames are
parsed and built with proton's ``Data`` codec; proton's own SASL (which needs
Cyrus for PLAIN) is not used, so the engine behind this layer sees a plain AMQP
connection.

What it must not do: decide whether credentials are good (the listener asks the
broker's authenticator, off this object, and reports back through ``outcome``),
touch sockets, or keep passwords beyond handing them over.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from proton import Data

__all__ = [
    "AMQP_HEADER", "SASL_HEADER", "SaslServer", "SaslState", "SendBytes", "Authenticate",
    "StartAmqp", "Refuse", "SaslStep", "OUTCOME_OK", "OUTCOME_AUTH", "OUTCOME_SYS",
]

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"

SASL_MECHANISMS = 0x40
SASL_INIT = 0x41
SASL_OUTCOME = 0x44

OUTCOME_OK = 0
OUTCOME_AUTH = 1
OUTCOME_SYS = 2

MAX_SASL_FRAME = 64 * 1024
_frame_header = struct.Struct(">IBBH")


class SaslState(Enum):
    HEADER = "header"                  # waiting for the client's protocol header
    AWAITING_INIT = "awaiting-init"    # sasl-mechanisms sent, waiting for sasl-init
    AUTHENTICATING = "authenticating"  # credentials handed over, waiting for ``outcome``
    DONE = "done"                      # outcome ok (or no SASL): the rest is AMQP
    FAILED = "failed"                  # refused; the connection is to be closed


@dataclass(frozen=True, slots=True)
class SendBytes:
    data: bytes


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Check these credentials, then call ``SaslServer.outcome``."""

    mechanism: str
    username: str | None            # None for ANONYMOUS; EXTERNAL: the authzid, if any
    password: bytes | None


@dataclass(frozen=True, slots=True)
class StartAmqp:
    """SASL is over (or was skipped): ``data`` is the first AMQP input, header included."""

    data: bytes
    anonymous_without_sasl: bool = False


@dataclass(frozen=True, slots=True)
class Refuse:
    """Close the connection after writing ``data``; ``reason`` is for the log."""

    data: bytes
    reason: str


SaslStep = SendBytes | Authenticate | StartAmqp | Refuse


def _encode_frame(descriptor: int, build: Any) -> bytes:
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(descriptor)
    data.put_list()
    data.enter()
    build(data)
    data.exit()
    data.exit()
    body = bytes(data.encode())
    return _frame_header.pack(8 + len(body), 2, 1, 0) + body


def encode_mechanisms(mechanisms: Sequence[str]) -> bytes:
    def build(data: Data) -> None:
        data.put_array(False, Data.SYMBOL)
        data.enter()
        for mechanism in mechanisms:
            data.put_symbol(mechanism)
        data.exit()
    return _encode_frame(SASL_MECHANISMS, build)


def encode_outcome(code: int) -> bytes:
    return _encode_frame(SASL_OUTCOME, lambda data: data.put_ubyte(code))


class SaslError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_frame_body(body: bytes) -> tuple[int, list[Any]]:
    """The descriptor and fields of one SASL frame body (proton's ``Data`` codec)."""
    data = Data()
    try:
        consumed = data.decode(body)
        data.rewind()
        if consumed != len(body) or data.next() != Data.DESCRIBED:
            raise SaslError("SASL frame body is not one described list")
        data.enter()
        data.next()
        if data.type() != Data.ULONG:
            raise SaslError("SASL frame descriptor is not a ulong")
        descriptor = int(data.get_ulong())
        if data.next() != Data.LIST:
            raise SaslError("SASL frame body is not a list")
        fields: list[Any] = []
        count = data.get_list()
        data.enter()
        for _ in range(count):
            data.next()
            value = data.get_object()
            fields.append(bytes(value) if isinstance(value, memoryview) else value)
        data.exit()
        data.exit()
        return descriptor, fields
    except SaslError:
        raise
    except Exception as exc:  # proton's DataException and friends: hostile input
        raise SaslError(f"undecodable SASL frame: {exc}") from None


def parse_plain(response: bytes) -> tuple[str, bytes]:
    """``[authzid] NUL authcid NUL passwd`` (RFC 4616) → (username, password)."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise SaslError("PLAIN response is not authzid NUL authcid NUL password")
    _authzid, authcid, password = parts
    try:
        username = authcid.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslError("PLAIN username is not UTF-8") from None
    if not username:
        raise SaslError("PLAIN username is empty")
    return username, password


class SaslServer:
    """One connection's SASL exchange.  Feed it bytes; act on the steps it returns."""

    def __init__(self, mechanisms: Sequence[str], allow_no_sasl: bool,
                 max_frame: int = MAX_SASL_FRAME) -> None:
        self.mechanisms = tuple(mechanisms)
        self.allow_no_sasl = allow_no_sasl
        self.max_frame = max_frame
        self.state = SaslState.HEADER
        self.mechanism = ""
        self.username: str | None = None
        self._buffer = b""

    def feed(self, data: bytes) -> list[SaslStep]:
        if self.state in (SaslState.DONE, SaslState.FAILED):
            return []
        self._buffer += data
        steps: list[SaslStep] = []
        if self.state is SaslState.HEADER:
            if len(self._buffer) < 8:
                if not b"AMQP".startswith(self._buffer[:4]):
                    return [self._refuse("not an AMQP protocol header")]
                return steps
            header, self._buffer = self._buffer[:8], self._buffer[8:]
            if header == SASL_HEADER:
                self.state = SaslState.AWAITING_INIT
                steps.append(SendBytes(SASL_HEADER + encode_mechanisms(self.mechanisms)))
            elif header == AMQP_HEADER:
                if not self.allow_no_sasl:
                    return [self._refuse("client skipped SASL but anonymous access is off")]
                self.state = SaslState.DONE
                rest, self._buffer = self._buffer, b""
                return [StartAmqp(header + rest, anonymous_without_sasl=True)]
            else:
                return [self._refuse(f"unsupported protocol header {header!r}")]
        if self.state is SaslState.AWAITING_INIT:
            if len(self._buffer) < 8:
                return steps
            size, doff, frame_type, _channel = _frame_header.unpack_from(self._buffer, 0)
            if frame_type != 1 or doff < 2 or size < doff * 4 or size > self.max_frame:
                return [*steps, self._refuse(f"bad SASL frame (size {size}, type {frame_type})")]
            if len(self._buffer) < size:
                return steps
            body = self._buffer[doff * 4:size]
            self._buffer = self._buffer[size:]
            try:
                step = self._on_init(body)
            except SaslError as exc:
                return [*steps, self._refuse(exc.reason, OUTCOME_SYS)]
            steps.append(step)
        return steps

    def _on_init(self, body: bytes) -> SaslStep:
        descriptor, fields = decode_frame_body(body)
        if descriptor != SASL_INIT:
            raise SaslError(f"expected sasl-init, got SASL frame 0x{descriptor:x}")
        mechanism = str(fields[0]) if fields and fields[0] is not None else ""
        response = fields[1] if len(fields) > 1 else None
        if response is not None and not isinstance(response, bytes):
            raise SaslError("sasl-init initial-response is not binary")
        if mechanism not in self.mechanisms:
            raise SaslError(f"mechanism {mechanism!r} is not offered")
        self.mechanism = mechanism
        self.state = SaslState.AUTHENTICATING
        if mechanism == "ANONYMOUS":
            return Authenticate(mechanism, None, None)
        if mechanism == "EXTERNAL":
            # The initial response is an optional authorization identity.
            try:
                authzid = (response or b"").decode("utf-8")
            except UnicodeDecodeError:
                raise SaslError("EXTERNAL authorization identity is not UTF-8") from None
            return Authenticate(mechanism, authzid or None, None)
        username, password = parse_plain(response or b"")
        self.username = username
        return Authenticate(mechanism, username, password)

    def outcome(self, ok: bool) -> list[SaslStep]:
        """The authenticator's answer: the sasl-outcome, then AMQP or a close."""
        if self.state is not SaslState.AUTHENTICATING:
            return []
        if not ok:
            self.state = SaslState.FAILED
            return [Refuse(encode_outcome(OUTCOME_AUTH),
                           f"authentication failed ({self.mechanism}"
                           + (f", user {self.username!r})" if self.username else ")"))]
        self.state = SaslState.DONE
        rest, self._buffer = self._buffer, b""
        return [SendBytes(encode_outcome(OUTCOME_OK)), StartAmqp(rest)]

    def _refuse(self, reason: str, code: int | None = None) -> Refuse:
        self.state = SaslState.FAILED
        self._buffer = b""
        # Answer with the header we do speak (AMQP 1.0 §2.2), or an outcome mid-SASL.
        data = SASL_HEADER if code is None else encode_outcome(code)
        return Refuse(data, reason)
