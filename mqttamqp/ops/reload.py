"""Reloading the configuration on SIGHUP: named reloaders, each owning some options.

On SIGHUP the command line the broker started with is parsed again, in a thread
(the ``--config`` file is read from disk, a CA file perhaps), and the result is
compared with what runs, option by option (as ``--print-config`` would write them).
Each reloader owning a changed option is called on the reactor thread with the new
options, and the log says what changed; a changed option that no reloader owns is
named in the log as needing a restart (and again at each reload until then).  A
file that does not parse changes nothing: one line says why.

Registering a reloader is one line where the service is assembled (``makeService``
in ``mqttamqp/service.py``)::

    svc.reloaders.register("users", ("users",), lambda options: users.reload(options["users"]))

``apply(options)`` runs on the reactor thread and must not block it: read files or
hash passwords in a thread and return a Deferred (the reload waits for it, and a
failure is logged as that reloader's, the others still apply).

What it must not do: read the file on the reactor thread, or apply a half-parsed
configuration.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from twisted.internet import threads
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.ops.config import effective, option_specs

__all__ = ["Reloader", "Reloaders"]

# Parse the configuration again: the new options (SystemExit or UsageError if bad).
Parse = Callable[[], Any]


@dataclass(frozen=True)
class Reloader:
    name: str
    keys: tuple[str, ...]
    apply: Callable[[Any], Any]


class Reloaders:
    log = Logger()

    def __init__(self, reactor: Any, options: Any, parse: Parse,
                 in_thread: Callable[[Parse], Deferred[Any]] | None = None) -> None:
        """``options``: what runs now; ``parse``: reads the configuration again (in a
        thread: ``in_thread``, by default the reactor's pool)."""
        self.reactor = reactor
        self.parse = parse
        self.in_thread = in_thread or (lambda f: threads.deferToThreadPool(
            reactor, reactor.getThreadPool(), f))
        self.specs = option_specs(options)
        self.running = effective(options, self.specs)
        self.reloaders: list[Reloader] = []
        self.every: list[tuple[str, Callable[[], Any]]] = []
        self._previous_handler: Any = None
        self._busy = False

    def register(self, name: str, keys: Iterable[str], apply: Callable[[Any], Any]) -> None:
        """Call ``apply(new_options)`` when any option in ``keys`` changes."""
        self.reloaders.append(Reloader(name, tuple(keys), apply))

    def register_always(self, name: str, apply: Callable[[], Any]) -> None:
        """Call ``apply()`` at every SIGHUP, changed options or not (a file named by an
        option whose contents may have changed: the ACL file).  It runs on the
        reactor thread and must be quick."""
        self.every.append((name, apply))

    def install(self) -> None:
        """Reload on SIGHUP (main thread only; elsewhere, e.g. in tests, nothing)."""
        try:
            self._previous_handler = signal.signal(signal.SIGHUP, self._on_signal)
        except ValueError:
            self._previous_handler = None

    def uninstall(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGHUP, self._previous_handler)
            self._previous_handler = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        # A signal handler runs between two bytecodes of whatever the main thread
        # was doing: hand the work to the reactor's loop.
        self.reactor.callFromThread(self.reload)

    def reload(self) -> Deferred[list[str]]:
        """Parse again and apply; fires with the changed option names."""
        if self._busy:
            self.log.info("configuration reload already running; this SIGHUP is ignored")
            return succeed([])
        self._busy = True
        self.log.info("SIGHUP: reloading the configuration")
        for name, apply in self.every:
            try:
                apply()
            except Exception as exc:   # one reloader's failure is its own
                self.log.error("reloading {name} failed: {e}", name=name, e=str(exc))
        d = self.in_thread(self.parse)
        d.addCallbacks(self._apply, self._unparsed)

        def done(result: list[str]) -> list[str]:
            self._busy = False
            return result

        return d.addBoth(done)

    def _unparsed(self, failure: Failure) -> list[str]:
        error = failure.value
        text = str(error.code if isinstance(error, SystemExit) else error)
        reason = text.splitlines()[0].removeprefix("twistd mqttamqp: ") if text else "?"
        self.log.error("configuration not reloaded, the running one stays: {reason}",
                       reason=reason)
        return []

    def _apply(self, options: Any) -> Deferred[list[str]]:
        new = effective(options, self.specs)
        changed = sorted(k for k in set(new) | set(self.running)
                         if new.get(k) != self.running.get(k))
        if not changed:
            self.log.info("configuration reloaded: nothing changed")
            return succeed(changed)
        owned: set[str] = set()
        work: list[Deferred[Any]] = []
        for reloader in self.reloaders:
            mine = [k for k in reloader.keys if k in changed]
            if not mine:
                continue
            owned.update(mine)
            work.append(self._run(reloader, mine, options, new))
        restart = [k for k in changed if k not in owned]
        if restart:
            self.log.warn("configuration changed, applied only at a restart: {keys}",
                          keys=", ".join(restart))
        result: Deferred[Any] = DeferredList(work)
        return result.addCallback(lambda _: changed)

    def _run(self, reloader: Reloader, keys: list[str], options: Any,
             new: dict[str, Any]) -> Deferred[Any]:
        d = maybeDeferred(reloader.apply, options)

        def applied(_: object) -> None:
            for k in keys:
                if k in new:
                    self.running[k] = new[k]
                else:
                    self.running.pop(k, None)
            self.log.info("reloaded {name}: {keys} changed", name=reloader.name,
                          keys=", ".join(keys))

        def failed(failure: Failure) -> None:
            self.log.error("reloading {name} failed, it keeps its settings: {reason}",
                           name=reloader.name, reason=failure.getErrorMessage())

        return d.addCallbacks(applied, failed)
