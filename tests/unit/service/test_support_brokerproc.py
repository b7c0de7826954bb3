"""The integration tests' ``BrokerProcess.wait_for_line``: its timeout bounds the
whole wait, also while the broker keeps logging other lines."""

from __future__ import annotations

import threading

import pytest
from brokerproc import BrokerProcess


def test_wait_for_line_times_out_while_other_lines_keep_coming(tmp_path: object) -> None:
    """A broker logging a line every 20 ms for up to 10 s, none of them the one
    waited for: ``wait_for_line(..., timeout=0.3)`` gives up long before the lines
    stop (it waited per line before, so it never timed out while they came)."""
    broker = BrokerProcess(str(tmp_path))
    stop, done = threading.Event(), threading.Event()

    def chatter() -> None:
        for n in range(500):                      # (bounded: 500 lines, 10 s at most)
            if stop.wait(0.02):
                break
            broker.lines.put(f"reconnecting {n}\n")
        done.set()

    threading.Thread(target=chatter, daemon=True).start()
    try:
        with pytest.raises(TimeoutError):
            broker.wait_for_line("never logged", timeout=0.3)
        assert not done.is_set()                  # (the lines were still coming)
    finally:
        stop.set()
        done.wait(5)
