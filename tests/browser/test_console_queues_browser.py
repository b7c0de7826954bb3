"""The Queues page in Chromium (Playwright, Debian's /usr/bin/chromium) against a
real broker with MQTT and the console: a paho producer fills ``$queue/jobs``, an
MQTT 5 paho member holds some messages and rejects three to ``$dlq/jobs``; the
page shows it live, a dead letter is requeued and retention set from the page.
Screenshots go to ``test-artifacts/`` as in ``test_console_operator``; each step asserts
what its screenshot is meant to show."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from chromium import (
    NEEDS_CHROMIUM,
    WAIT_MS,
    Watch,
    expect,
    login,
    shot,
)
from console_support import initial_password
from paho.mqtt.client import MQTTv5, MQTTv311
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pahoclient import PahoClient

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(300)]


@pytest.fixture
def clients() -> Iterator[list[PahoClient]]:
    made: list[PahoClient] = []
    yield made
    for c in made:
        c.stop()


def _reject(worker: PahoClient, message: Any, reason: str) -> None:
    users = dict(message.properties.UserProperty)
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("message-id", users["message-id"]),
                          ("group-id", users["group-id"]), ("reason", reason)]
    worker.publish(f"$queue/{users['queue']}/$reject", b"", 1, properties=props)


def test_queues_page_live_dead_letters_requeue_and_retention(
        broker: Any, browser: Any, clients: list[PahoClient]) -> None:
    """In Chromium the Queues page follows real queues live, shows dead letters, requeues
    them and changes retention."""
    proc, data = broker
    base = f"http://127.0.0.1:{proc.ports['WEB']}"
    producer = PahoClient(proc.mqtt_port, "producer", MQTTv311)
    clients.append(producer)
    for i in range(30):
        producer.publish(f"$queue/jobs/resize/{i % 3}",
                         json.dumps({"job": i, "image": f"img-{i}.png"}).encode(), 1)
    for i in range(4):
        producer.publish("$queue/orders/eu", f"order {i}".encode(), 1)
    # An MQTT 5 member acknowledges explicitly: what it was sent stays pending.
    worker = PahoClient(proc.mqtt_port, "worker-1", MQTTv5)
    clients.append(worker)
    worker.subscribe(("$queue/jobs/#", 1))
    held = [worker.get() for _ in range(16)]            # the prefetch (16 by default)
    for message in held[:3]:
        _reject(worker, message, "image is corrupt")

    page = browser.new_page(viewport={"width": 1360, "height": 860})
    watch = Watch(page)
    login(page, base, initial_password(data))
    page.get_by_role("link", name="Queues").click()
    expect(page.get_by_role("heading", name="Queues")).to_be_visible(timeout=WAIT_MS)
    rows = page.locator("#queue-table tbody tr")
    expect(rows).to_have_count(3, timeout=WAIT_MS)
    jobs = rows.filter(has=page.get_by_role("link", name="jobs", exact=True))
    expect(jobs.locator("td").nth(1)).to_have_text("27")          # depth: 30 - 3 dead
    expect(jobs.locator("td").nth(6)).to_have_text("3")           # DLQ size
    # Pending: the prefetch again (the three rejected freed credit for three more).
    expect(jobs.locator("td").nth(10)).to_have_text("16")
    expect(page.locator(".live-dot.on")).to_have_count(1, timeout=WAIT_MS)
    # Live: more messages show up without a reload, with a publish rate.
    for i in range(6):
        producer.publish("$queue/jobs/resize/0", json.dumps({"job": 100 + i}).encode(), 1)
    expect(jobs.locator("td").nth(1)).to_have_text("33", timeout=WAIT_MS)
    expect(jobs.locator("td").nth(4)).not_to_have_text("—", timeout=WAIT_MS)
    shot(page, "12-01-queues")

    jobs.get_by_role("link", name="jobs", exact=True).click()
    expect(page.get_by_role("heading", name=re.compile("^jobs"))).to_be_visible()
    group = page.locator("#group-table tbody tr").first
    expect(group).to_contain_text("worker-1")
    expect(group.locator("td").nth(6)).to_have_text("16")        # pending
    expect(page.locator("#message-table tbody tr")).to_have_count(33)
    shot(page, "12-02-queue-jobs")

    page.get_by_role("link", name="3 messages").click()
    expect(page.get_by_role("heading", name="$dlq/jobs")).to_be_visible()
    dead = page.locator("#message-table tbody tr")
    expect(dead).to_have_count(3)
    dead.first.get_by_role("link").first.click()
    expect(page.locator("#payload")).to_contain_text('"image": "img-0.png"')
    expect(page.get_by_text("image is corrupt")).to_be_visible()
    shot(page, "12-03-dead-letter")
    page.go_back()
    page.locator("#message-table tbody tr").first.get_by_role(
        "button", name="Requeue").click()
    expect(page.locator(".flash-ok")).to_have_text(
        "Requeued 1 message(s) from $dlq/jobs to their origin queue.")
    expect(page.locator("#message-table tbody tr")).to_have_count(2)
    assert watch.confirms == ["Move this message back to jobs?"]

    page.get_by_role("link", name="jobs", exact=True).click()
    # Retention by count counts ready messages only (as RabbitMQ's x-max-length):
    # of the 34, the 16 worker-1 holds stay, and 10 of the 18 ready ones.
    page.get_by_label("Max messages").fill("10")
    page.get_by_role("button", name="Set retention").click()
    expect(page.locator(".flash-ok")).to_contain_text("max_messages=10")
    expect(page.locator("#queue-facts")).to_contain_text("max 10 messages")
    expect(page.locator("#message-table tbody tr")).to_have_count(26)
    shot(page, "12-04-retention")
    assert watch.errors == [] and watch.alerts == []
    page.close()
