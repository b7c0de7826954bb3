"""The real twistd in gateway mode: the broker's options it does not use stop the
start with one line naming them, before anything listens or is written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from brokerproc import TWISTD, assert_refused_before_start


def test_gateway_with_broker_options_is_refused_with_one_line(tmp_path: Path) -> None:
    """--storage and --amqp with --upstream: exit status 1, one line naming both and
    the hint, no data directory made."""
    out = subprocess.run([TWISTD, "-n", "--pidfile=", "mqttamqp", "--data",
                          str(tmp_path / "data"), "--upstream", "amqp://127.0.0.1:1",
                          "--storage", "memory://", "--amqp", "tcp:0:interface=127.0.0.1",
                          "--mqtt", "tcp:0:interface=127.0.0.1"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ),
                         cwd=tmp_path)
    assert_refused_before_start(out, "gateway mode (--upstream) keeps no state and does "
                                "not use --storage, --amqp:", tmp_path)
