"""The client side of SCRAM-SHA-256 (RFC 5802/7677) as an MQTT 5 client speaks it, written
here to test the broker's server side (in memory and against the real broker)."""

from __future__ import annotations

import base64
import hashlib
import hmac

METHOD = "SCRAM-SHA-256"


class ScramClient:
    """The client side of SCRAM-SHA-256 (RFC 5802), for the tests."""

    def __init__(self, user: str, password: str, nonce: str = "clientnonce123") -> None:
        self.password = password
        self.bare = f"n={user},r={nonce}"
        self.expected_verifier = ""

    def first(self) -> bytes:
        return ("n,," + self.bare).encode()

    def final(self, server_first: bytes) -> bytes:
        attrs = dict(part.split("=", 1) for part in server_first.decode().split(","))
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(),
                                     base64.b64decode(attrs["s"]), int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored_key = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        self.expected_verifier = "v=" + base64.b64encode(
            hmac.new(server_key, auth_message, hashlib.sha256).digest()).decode()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
