"""Scheduled packing of the storage in a running broker process (``--pack-interval``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(120)



def test_storage_is_packed_on_schedule(tmp_path: Path) -> None:
    """--pack-interval (hours) packs the FileStorage periodically, logged each time."""
    proc = BrokerProcess(str(tmp_path / "data"), "--pack-interval", "0.0005")  # 1.8 s
    proc.start()
    try:
        proc.wait_for_line(r"storage packed", timeout=30)
        proc.wait_for_line(r"storage packed", timeout=30)  # and again: it is a schedule
    finally:
        proc.stop()
    assert (tmp_path / "data" / "mqttamqp.fs").is_file()
