"""The chores every proton engine under Twisted does at the end of a pump, whichever
end of the connection it is: the broker's (``pump.EnginePump``) and the client
connections of gateway mode and the AMQP 1.0 bridges (``gateway/engine.py``'s
``UpstreamConnection``).

What it owns: ``EngineChores``, a mixin of three steps on the engine its class
holds (``ptrans``, ``pconn``): proton's timers on the injected clock (``_tick``:
re-armed only when the deadline moves earlier), all of the engine's output in one
write (``_write_output``), and freeing the links and sessions closed at both ends
(``_free_closed``: proton keeps them until the connection ends otherwise).

What it must not do: pump the engine or decide what an event means (its users do),
write to the socket itself (``_write`` is theirs), or import the core's broker (a
gateway keeps no state: import rules).
"""

from __future__ import annotations

from typing import Any

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.net.rawproton import free_link, lib, output, tick

__all__ = ["EngineChores"]

_session_free = lib.pn_session_free


class EngineChores:
    """The end-of-pump steps of a proton engine; the class mixing it in holds the
    engine and says how bytes are written and what a closed output means."""

    clock: Clock
    pconn: Any                    # proton ``Connection`` (None: not started or gone)
    ptrans: Any                   # proton ``Transport`` (None: gone)
    _timer: DelayedCall | None    # the engine's next timer, on ``clock``
    _timer_deadline: float
    _free_links: list[Any]        # raw ``pn_link_t``, closed at both ends
    _free_sessions: list[Any]     # raw ``pn_session_t``, the same

    # -- what the class mixing it in says ----------------------------------------------

    def _on_timer(self) -> None:
        """The engine's timer is due: pump it."""
        raise NotImplementedError

    def _write(self, data: bytes) -> None:
        """Write ``data`` (the engine's output) to the socket."""
        raise NotImplementedError

    def _output_closed(self) -> None:
        """The engine closed its output (close sent, or a transport error)."""
        raise NotImplementedError

    # -- the chores ---------------------------------------------------------------------

    def _tick(self) -> None:
        """Run the engine's timers and arm one call at its next deadline; a call
        already armed for no later is kept (it re-arms when it fires)."""
        clock = self.clock
        now = clock.seconds()
        deadline = tick(self.ptrans._impl, now)
        if deadline <= 0:
            return
        timer = self._timer
        if timer is not None and timer.active():
            if self._timer_deadline <= deadline:
                return
            timer.cancel()
        self._timer_deadline = deadline
        self._timer = clock.callLater(max(0.0, deadline - now), self._on_timer)

    def _write_output(self) -> None:
        """All the engine's output in one write: it hands out at most its buffer
        (8 KiB) at a time, and each write can wake the peer."""
        impl = self.ptrans._impl
        chunks: list[bytes] = []
        data: bytes | None = b""
        for _ in range(100_000):   # (bounded: each round takes what the engine made)
            data = output(impl)
            if not data:
                break
            chunks.append(data)
        if chunks:
            self._write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if data is None:
            self._output_closed()

    def _free_closed(self) -> None:
        """Free the links and sessions closed at both ends (their last frames are
        written).  Links first: freeing a session frees the links it still has."""
        links, self._free_links = self._free_links, []
        sessions, self._free_sessions = self._free_sessions, []
        if self.pconn is None:
            return
        for impl in links:
            free_link(impl)
        for impl in sessions:
            _session_free(impl)
