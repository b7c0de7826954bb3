"""``python -m mqttamqp.pipeline``: the same as ``mqttamqp-report``."""

import sys

from mqttamqp.pipeline.cli import main

sys.exit(main())
