"""Fixtures of the browser tests: one Chromium per test module, and the console's
Traffic page served with its headers from a known report.  Every test under
``tests/browser/`` is marked ``browser`` and ``integration`` (``tests/conftest.py``)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import CHROMIUM, sync_api
from console_support import web_broker_process
from traffic_reports import (
    NOW,
    _FailedJob,
    _Handler,
    make_archive,
    make_summary,
    render,
    source,
    write_summary,
)
from twisted.internet.task import Clock


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the whole test module."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


@pytest.fixture
def served_page(tmp_path: Path) -> Iterator[str]:
    """The Traffic page of a known report and archive, with a failed report job, served
    on loopback as the console serves it (its Content-Security-Policy)."""
    clock = Clock()
    clock.advance(NOW)
    write_summary(tmp_path / "report", make_summary(60))
    make_archive(tmp_path / "archive")
    view = source(tmp_path, clock, lambda: {"records": 123456, "segments": 42,
                                            "dropped": 7, "errors": 0},
                  job=_FailedJob(clock.seconds())).view()
    handler = type("Handler", (_Handler,), {"page": render(view, clock).encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/traffic"
    server.shutdown()
    server.server_close()


@pytest.fixture
def broker(tmp_path: Any) -> Iterator[tuple[Any, str]]:
    """A broker with the console, of this test's own: (process, data directory)."""
    data = str(tmp_path / "data")
    proc = web_broker_process(data).start()
    yield proc, data
    proc.stop()
