"""The unit tests against the mypyc-compiled build (``bench/mypyc_build.py``; the
last section of ``bench/README.md``): what tells the two apart, and the ways the
tests reach a compiled class without patching its instances (a compiled instance's
methods are read-only, and compiled code calls a compiled function directly, past
a patched module name)."""

from __future__ import annotations

import pytest
from twisted.python.failure import Failure

import mqttamqp.mqtt.protocol
from mqttamqp.core.auth import AllowAll, Credentials, Identity
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


class AllowsAll:
    """``AllowAll``'s verdicts in an interpreted class: the base of a test's
    authorizer that overrides one, where ``AllowAll`` cannot be one (a compiled native
    class has no interpreted subclasses)."""

    def authenticate(self, credentials: Credentials) -> bool:
        return True

    def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
        return True

    def may_subscribe(self, identity: Identity, topic_filter: str) -> bool:
        return True

    def may_use_session(self, identity: Identity, client_id: str) -> bool:
        return True

    def may_use_resource(self, identity: Identity, kind: str, access: str,
                         name: str) -> bool:
        return True


# The base for a test's authorizer that overrides a verdict: ``AllowAll`` itself
# where it can be subclassed (pure Python), else its interpreted stand-in.
ALLOW_ALL_BASE: type = AllowsAll if COMPILED else AllowAll
