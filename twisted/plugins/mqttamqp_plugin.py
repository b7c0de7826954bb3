"""twistd plugin: ``twistd -n mqttamqp [options]`` (see ``twistd mqttamqp --help``)."""

from __future__ import annotations

from typing import Any

from twisted.application.service import IServiceMaker
from twisted.plugin import IPlugin
from zope.interface import implementer


@implementer(IServiceMaker, IPlugin)
class _MQTTAMQPServiceMaker:
    tapname = "mqttamqp"
    description = ("MQTT 3.1/3.1.1 and AMQP 1.0 broker (sessions, wills and retained "
                   "messages in ZODB) with an admin console in the browser.")

    @property
    def options(self) -> Any:
        from mqttamqp.options import Options

        return Options

    def makeService(self, options: Any) -> Any:
        from mqttamqp.service import makeService

        return makeService(options)


serviceMaker = _MQTTAMQPServiceMaker()
