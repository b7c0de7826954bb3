"""The Users page in Chromium (issue 10/13): add a client user, see the ACL file,
and the new user connects at once with paho.  Screenshot in ``test-artifacts/``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from chromium import NEEDS_CHROMIUM, WAIT_MS, Watch, expect, login, shot
from console_support import initial_password, web_broker_process
from pahoclient import PahoClient

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(300)]


@pytest.fixture
def broker(tmp_path: Any) -> Iterator[tuple[Any, str]]:
    acl = tmp_path / "acl"
    acl.write_text("user sensor-7\ntopic write plant/<line1>/#\n")
    data = str(tmp_path / "data")
    proc = web_broker_process(data, "--acl", str(acl)).start()
    yield proc, data
    proc.stop()


def test_users_page(browser: Any, broker: Any) -> None:
    """In Chromium an admin adds a client user on the Users page, and paho connects as that
    user at once."""
    proc, data = broker
    base = f"http://127.0.0.1:{proc.ports['WEB']}"
    page = browser.new_page(viewport={"width": 1360, "height": 860})
    watch = Watch(page)
    try:
        login(page, base, initial_password(data))
        page.get_by_role("link", name="Users").click()
        expect(page.get_by_role("heading", name="Users and access")).to_be_visible(
            timeout=WAIT_MS)
        form = page.locator("#user-add")
        form.get_by_label("Name").fill("sensor-7")
        form.get_by_label("Password").fill("sensor password")
        form.get_by_role("button", name="Add").click()
        expect(page.locator(".flash-ok")).to_contain_text("Created user sensor-7 (client)",
                                                          timeout=WAIT_MS)
        expect(page.locator("#user-table")).to_contain_text("sensor-7")
        expect(page.locator("pre.acl")).to_contain_text("topic write plant/<line1>/#")
        shot(page, "10-users-and-access")
        assert watch.errors == [] and watch.alerts == []
    finally:
        page.close()
    client = PahoClient(proc.mqtt_port, "s7", username="sensor-7",
                        password="sensor password", expect_rc=0)
    client.stop()
    PahoClient(proc.mqtt_port, "anon", expect_rc=5).stop()   # client users exist now
