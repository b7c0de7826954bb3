# twistd -ny tac/mqttamqp.tac — the same broker with its default options.
# Edit the argument list below to change listeners, data directory or limits.
from twisted.application import service

from mqttamqp.options import Options
from mqttamqp.service import makeService

options = Options()
options.parseOptions([])  # e.g. ["--mqtt", "tcp:1883:interface=127.0.0.1", "--data", "/var/lib/mqttamqp"]

application = service.Application("mqttamqp")
makeService(options).setServiceParent(application)
