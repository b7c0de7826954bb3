"""A Twisted stream protocol base without an instance ``__dict__``.

Twisted's ``Protocol`` has no ``__slots__``, so every subclass instance carries a
dict (its pointer, a weak-reference pointer and a values block: about 40 bytes per
MQTT connection, issue 31 §2) even when the subclass declares slots for all it
keeps.  ``SlottedProtocol`` provides what Twisted's transports call
(``IProtocol``: ``makeConnection``, ``dataReceived``, ``connectionLost``; and
``logPrefix``) and declares no slot itself (two bases with slots cannot be
combined): a subclass names ``transport`` and ``factory`` in its ``__slots__``
and ``connected`` there too or as a property of its own (``MQTTProtocol``'s), and
if all its classes declare ``__slots__`` it has no dict.  It owns nothing
else and must not know MQTT (``.importlinter``: ``net`` imports no adapter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import ILoggingContext, IProtocol
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

__all__ = ["SlottedProtocol"]


@implementer(IProtocol, ILoggingContext)
class SlottedProtocol:
    """``twisted.internet.protocol.Protocol``'s behaviour, without a dict."""

    if not TYPE_CHECKING:   # (mypy would see no slot for the three below)
        __slots__ = ()   # (``connected``, ``factory``, ``transport``: the subclass's)

    connected: int
    factory: Any
    transport: Any

    def logPrefix(self) -> str:
        return self.__class__.__name__

    def makeConnection(self, transport: Any) -> None:
        self.connected = 1
        self.transport = transport
        self.connectionMade()

    def connectionMade(self) -> None:
        """Called when the connection is made (see ``IProtocol``)."""

    def dataReceived(self, data: bytes) -> None:
        """Called with the bytes read (see ``IProtocol``)."""

    def connectionLost(self, reason: Failure | None = None) -> None:
        """Called when the connection is gone (see ``IProtocol``)."""
