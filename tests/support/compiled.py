"""The tests against the mypyc-compiled build (``bench/mypyc_build.py``; the
last section of ``bench/README.md``): what tells the two apart, and the ways the
tests reach a compiled class without patching its instances (a compiled instance's
methods are read-only, and compiled code calls a compiled function directly, past
a patched module name)."""

from __future__ import annotations

import pytest
from twisted.python.failure import Failure

import mqttamqp.mqtt.protocol
from mqttamqp.core.commits import CommitBatcher

# True when the hot modules are the compiled ones (a ``.so`` beside each ``.py``).
COMPILED = not mqttamqp.mqtt.protocol.__file__.endswith(".py")

# For what a test cannot observe in the compiled build (say why at each use).
not_compiled = pytest.mark.skipif(COMPILED, reason="observes a call inside compiled code")


def logged_failures(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each failure nobody waits for is handed to ``CommitBatcher.log_failure``
    as (its ``what``), in place of logging it.  Patched on the class: every caller
    hands ``log_failure`` on as a bound method looked up on the instance (compiled
    code too) and none calls it itself."""
    logged: list[str] = []

    def log_failure(self: CommitBatcher, failure: Failure, what: str) -> None:
        logged.append(what)

    monkeypatch.setattr(CommitBatcher, "log_failure", log_failure)
    return logged
