"""The core's loggers are class attributes, Twisted's ``Logger`` descriptor: an
instance's ``log`` is bound to it (its events' ``log_source``) under the namespace the
class gives, in both builds.  (In the compiled build a ``log = Logger(...)`` without
``ClassVar`` was a field that each instance set to a logger of its own, unbound:
mypyc's "Unsupported default attribute value".)"""

from __future__ import annotations

import pytest
from twisted.logger import Logger

from mqttamqp.core.clients.gate import ClientGate
from mqttamqp.core.clients.live import LiveConnections
from mqttamqp.core.clients.registry import SessionRegistry
from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.routing.router import Router


@pytest.mark.parametrize("cls", [ClientGate, LiveConnections, SessionRegistry, CommitBatcher,
                                 Router])
def test_the_log_is_the_classs_logger(cls: type) -> None:
    log = cls.__dict__.get("log")
    assert isinstance(log, Logger) and log.namespace.startswith("mqttamqp.core.broker")
