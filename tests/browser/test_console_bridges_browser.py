"""The console's Bridges page in Chromium (Playwright, Debian's /usr/bin/chromium)
against a real broker bridged to Mosquitto: reached from the menu, it shows the bridge
connected with its remote and counts the messages sent out.  Screenshots go to
``test-artifacts/``; each step asserts what its screenshot is meant to show."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import NEEDS_CHROMIUM, WAIT_MS, expect, login, shot
from console_support import initial_password, web_broker_process
from mosquitto_server import MosquittoServer
from pahoclient import PahoClient

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(300)]


@pytest.fixture
def bridged(tmp_path: Path) -> Iterator[tuple[Any, str, MosquittoServer]]:
    """A broker with MQTT and the console, bridged to Mosquitto: (process, data, remote)."""
    directory = tmp_path / "mosquitto"
    directory.mkdir()
    remote = MosquittoServer(str(directory)).start()
    config = tmp_path / "mqttamqp.toml"
    config.write_text(f'[[bridge]]\nname = "hq"\naddress = "mqtt://127.0.0.1:{remote.port}"\n'
                      'topics = ["sensors/# out 1"]\n')
    data = str(tmp_path / "data")
    proc = web_broker_process(data, "--config", str(config)).start()
    proc.wait_for_line(r"bridge hq to \S+: connected", timeout=15)
    yield proc, data, remote
    proc.stop()
    remote.stop()


def test_bridges_page_shows_the_connected_bridge(bridged: Any, browser: Any) -> None:
    """From the menu, the Bridges page lists hq as connected to Mosquitto's address,
    with the three messages it sent out."""
    proc, data, remote = bridged
    far = PahoClient(remote.port, "far-browser")
    far.subscribe(("sensors/#", 1))
    near = PahoClient(proc.mqtt_port, "near-browser")
    for i in range(3):
        near.publish("sensors/t", b"%d" % i, qos=1)
    assert [far.get().payload for _ in range(3)] == [b"0", b"1", b"2"]
    page = browser.new_page(viewport={"width": 1360, "height": 860})
    login(page, f"http://127.0.0.1:{proc.ports['WEB']}", initial_password(data))
    page.get_by_role("link", name="Bridges").click()
    expect(page.get_by_role("heading", name="Bridges")).to_be_visible(timeout=WAIT_MS)
    row = page.locator("#bridge-table tbody tr").filter(has_text="hq")
    expect(row.locator("td").nth(1)).to_contain_text("connected")
    expect(row.locator("td").nth(2)).to_contain_text(f"mqtt://127.0.0.1:{remote.port}")
    expect(row.locator("td").nth(5)).to_contain_text("3")
    shot(page, "29-01-bridges")
    near.stop()
    far.stop()
