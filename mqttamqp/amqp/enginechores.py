"""The chores every proton engine under Twisted does at the end of a pump, whichever
end of the connection it is: the broker's (``pump.EnginePump``) and the client
connections of gateway mode and the AMQP 1.0 bridges (``gateway/engine.py``'s
``UpstreamConnection``).

What it owns: ``EngineChores``, a mixin of three steps on the engine its class
holds (``ptrans``, ``pconn``): proton's timers on the injected clock (``_tick``:
re-armed only when the deadline moves earlier), all of the engine's output in one
write (``_write_output``), and freeing the links and sessions closed at both ends
(``_free_closed``: proton keeps them until the connection ends otherwise).

Freeing a session: proton frees the links the session still has with it, and when
the session ended with links attached it leaves them looking bound (proton's
transport does not reset their handles when it processes the end, in 0.39/0.40).  If
the last reference to such a session is then a link's (a Python wrapper a channel
still holds, a delivery held across a commit, an event), dropping it makes proton
finalize the link, hand it to the session, finalize the session, and free the link
from under its own release: "double free or corruption".  So the engine takes a
reference to each session it frees and gives it back only when it is the last one
(``_release_sessions``, probed with ``pn_incref``/``pn_decref``, whose answer is the
count left), at the end of the first pump after its last other holder went (an idle
connection keeps it until its next pump or its end): by then no link of the session
is held by anyone, and the session's end frees its links cleanly.  When the
transport is unbound (``_release_all_sessions`` at the connection's end) nothing
looks bound any more and every reference is given back at once.

What it must not do: pump the engine or decide what an event means (its users do),
write to the socket itself (``_write`` is theirs), or import the core's broker (a
gateway keeps no state: import rules).
"""

from __future__ import annotations

from typing import Any, ClassVar

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.native import mypyc_attr
from mqttamqp.net.rawproton import decref, free_link, incref, lib, output, tick

__all__ = ["EngineChores"]

_session_free = lib.pn_session_free

# Ended sessions held at once on one connection past which one line says so (a
# session is held while something keeps an object of it or of its links: normally
# one, until the next pump; giving one back earlier would bring the double free
# back, so this is a line to find what keeps them, not a limit).
HELD_SESSIONS_LOGGED = 64


@mypyc_attr(native_class=False, allow_interpreted_subclasses=True)   # (``EnginePump``'s mixin)
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
    # Raw ``pn_session_t`` freed, each with one reference of ours until it is the last
    # (the module's docstring); at most the sessions freed while something else still
    # holds them or a link of theirs.
    _held_sessions: list[Any]
    _held_logged = False          # (``HELD_SESSIONS_LOGGED`` said, once a connection)
    log: ClassVar[Any]            # the class mixing it in's ``Logger``

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
        written), and give back the sessions held that nothing else holds now.  Links
        first: freeing a session frees the links it still has."""
        links, self._free_links = self._free_links, []
        sessions, self._free_sessions = self._free_sessions, []
        if self.pconn is None:
            return
        for impl in links:
            free_link(impl)
        if sessions:
            held = self._held_sessions
            for impl in sessions:
                incref(impl)   # (ours, until it is the last: the module's docstring)
                _session_free(impl)
                held.append(impl)
        if self._held_sessions:
            self._release_sessions()

    def _release_sessions(self) -> None:
        """Give back our reference to each freed session that nothing else holds (no
        wrapper, delivery or event of it or of a link of it): its end frees it and
        its links.  The others wait for a later pump."""
        kept: list[Any] = []
        for impl in self._held_sessions:
            incref(impl)
            if decref(impl) == 1:   # (the count left: ours alone)
                decref(impl)
            else:
                kept.append(impl)
        self._held_sessions = kept
        if len(kept) >= HELD_SESSIONS_LOGGED and not self._held_logged:
            self._held_logged = True
            self.log.warn("{n} ended AMQP sessions of one connection are still held by "
                          "objects of their links; they are let go when those go or "
                          "when the connection ends", n=len(kept))

    def _release_all_sessions(self) -> None:
        """The transport is unbound (the connection ended): proton sees no endpoint
        as bound any more, so every held session is given back, whoever else still
        holds it or its links."""
        held, self._held_sessions = self._held_sessions, []
        for impl in held:
            decref(impl)
