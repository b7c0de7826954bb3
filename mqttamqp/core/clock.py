"""The two time operations the core and protocols use, as typing Protocols.

Twisted's reactor and ``twisted.internet.task.Clock`` both satisfy them; typing
against these instead of the zope interfaces keeps ``mypy --strict`` precise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Clock", "DelayedCall"]


class DelayedCall(Protocol):
    def active(self) -> bool: ...

    def cancel(self) -> None: ...

    def reset(self, secondsFromNow: float) -> None: ...


class Clock(Protocol):
    def seconds(self) -> float: ...

    def callLater(self, delay: float, callable: Callable[..., Any], /, *args: Any,
                  **kw: Any) -> DelayedCall: ...
