"""The console's AMQP 0.9.1 parts in Chromium (Playwright, Debian's /usr/bin/chromium)
against a real broker with pika: the Exchanges page lists what pika declared and
removes a binding and an exchange after the confirm dialog; the worker's client page
shows its channel and consumer with the prefetch, and the queue page its 0.9.1
consumer. Screenshots go to ``test-artifacts/``; each step asserts what its
screenshot is meant to show."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pytest
from chromium import NEEDS_CHROMIUM, WAIT_MS, Watch, expect, login, shot
from console_support import initial_password, web_broker_process
from pikaparams import parameters

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(300)]


@pytest.fixture
def broker091(tmp_path: Any) -> Iterator[tuple[Any, str]]:
    """A broker with MQTT, AMQP (0.9.1 and 1.0) and the console: (process, data dir)."""
    data = str(tmp_path / "data")
    proc = web_broker_process(data, listeners=("--mqtt", "--amqp", "--web")).start()
    yield proc, data
    proc.stop()


def test_exchanges_page_unbind_delete_and_091_consumer_pages(
        broker091: Any, browser: Any) -> None:
    """In Chromium the Exchanges page shows pika's exchange and bindings, unbinds and
    deletes after a confirm; the client and queue pages show the 0.9.1 consumer."""
    proc, data = broker091
    base = f"http://127.0.0.1:{proc.ports['WEB']}"
    conn = pika.BlockingConnection(parameters(proc, heartbeat=0, client_properties={
        "connection_name": "invoice-worker"}))
    try:
        ch = conn.channel()
        ch.exchange_declare("billing", "topic", durable=True)
        ch.queue_declare("invoices", durable=True, arguments={"x-max-length": 1000,
                                                               "x-team": "finance"})
        ch.queue_bind("invoices", "billing", "invoice.*")
        ch.queue_bind("invoices", "billing", "refund.#")
        ch.basic_qos(prefetch_count=7)
        ch.basic_consume("invoices", lambda *a: None, consumer_tag="inv-1")
        conn.process_data_events(time_limit=0)

        page = browser.new_page(viewport={"width": 1360, "height": 860})
        watch = Watch(page)
        login(page, base, initial_password(data))
        page.get_by_role("link", name="Exchanges").click()
        expect(page.get_by_role("heading", name="Exchanges")).to_be_visible(timeout=WAIT_MS)
        billing = page.locator("#exchange-table tbody tr").filter(has_text="billing")
        expect(billing.locator("td").nth(1)).to_have_text("topic")
        expect(billing.locator("td").nth(6)).to_have_text("2")          # bindings out
        bindings = page.locator("#binding-table tbody tr").filter(has_text="billing")
        expect(bindings).to_have_count(2)
        shot(page, "13-01-exchanges")

        bindings.filter(has_text="refund.#").get_by_role("button", name="Unbind").click()
        expect(page.locator(".flash")).to_contain_text("Removed the binding",
                                                       timeout=WAIT_MS)
        expect(page.locator("#binding-table tbody tr").filter(has_text="billing")
               ).to_have_count(1)
        assert watch.confirms == ["Remove the binding billing → invoices?"]
        shot(page, "13-02-unbound")

        page.get_by_role("link", name="invoices").first.click()
        expect(page.locator("#queue-declared")).to_contain_text("x-team=finance",
                                                                timeout=WAIT_MS)
        consumer = page.locator("#consumer-table tbody tr").filter(has_text="inv-1")
        expect(consumer).to_contain_text("AMQP 0.9.1")
        expect(consumer.locator("td").nth(6)).to_have_text("7")          # prefetch
        shot(page, "13-03-queue-091-consumer")

        consumer.get_by_role("link", name="invoice-worker").click()
        expect(page.locator("#amqp091-channels tbody tr")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#amqp091-consumers tbody tr")).to_contain_text("inv-1")
        shot(page, "13-04-client-091")

        page.get_by_role("link", name="Exchanges").click()
        page.locator("#exchange-table tbody tr").filter(has_text="billing").get_by_role(
            "button", name="Delete").click()
        expect(page.locator(".flash")).to_contain_text("Deleted exchange billing",
                                                       timeout=WAIT_MS)
        expect(page.locator("#exchange-table tbody tr").filter(has_text="billing")
               ).to_have_count(0)
        assert watch.confirms[-1] == "Delete exchange billing with its bindings?"
        assert not watch.errors and not watch.alerts
        page.close()
    finally:
        if conn.is_open:
            conn.close()
