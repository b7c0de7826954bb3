"""Fixtures of the console's in-process tests."""

from __future__ import annotations

from typing import Any

import pytest
from console_support import logged_in


@pytest.fixture
def env(tmp_path: Any) -> Any:
    """A console on a fresh broker, its admin logged in: (console, broker, clock,
    client).  test_console_app and test_console_queues have their own."""
    return logged_in(tmp_path)
