"""Chromium through Playwright for the browser tests: where it is, how long to wait,
what a page did that it should not (``Watch``), screenshots to ``test-artifacts/``
for a human to look at, and the console's login."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api")


expect = sync_api.expect


CHROMIUM = "/usr/bin/chromium"


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


WAIT_MS = 15_000


NEEDS_CHROMIUM = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                    reason="Debian's chromium is not installed")


class Watch:
    """Records what the page does that it should not: dialogs other than our confirms,
    JavaScript errors, console errors (a CSP violation shows up there)."""

    def __init__(self, page: Any) -> None:
        self.alerts: list[str] = []
        self.confirms: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

    def _dialog(self, dialog: Any) -> None:
        (self.confirms if dialog.type == "confirm" else self.alerts).append(dialog.message)
        dialog.accept()


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def login(page: Any, base: str, password: str) -> None:
    page.goto(base + "/login")
    page.get_by_label("User name").fill("admin")
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible(timeout=WAIT_MS)
