"""The console's AMQP 0.9.1 parts over StubTreq against a real ``Broker`` on a
``task.Clock``: the Exchanges page and ``/api/exchanges`` (exchanges with their
bindings in and out), its delete and unbind actions (audited, stored, refused for
the standard exchanges and to read-only users), and the Queues pages showing a
0.9.1 queue's declared arguments and its 0.9.1 consumers beside MQTT members."""

from __future__ import annotations

import json
from typing import Any

import pytest
from console_support import PASSWORD, Client, FakeLink, audit_text, connect, make_console

from mqttamqp.core.auth import Identity
from mqttamqp.core.clients.connections import LinkInfo
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import DeleteExchange


@pytest.fixture
def env(tmp_path: Any) -> Any:
    console, service, clock = make_console(tmp_path)
    client = Client(console)
    assert client.login().code == 303
    return console, service, clock, client


def declare(broker: Any) -> None:
    """A durable direct exchange ``orders-x`` routing to the durable queue ``orders``
    (with arguments, an unknown one too), an exchange-to-exchange binding from
    amq.topic, and a fanout exchange with no bindings."""
    ex = broker.exchanges
    ex.declare_exchange("orders-x", "direct", durable=True, arguments={"x-note": "hi"})
    ex.declare_exchange("fan", "fanout")
    ex.declare_queue("orders", "amqp091:9", durable=True,
                     arguments={"x-max-length": 10, "x-custom": "kept"})
    ex.bind_queue("orders", "orders-x", "new")
    ex.bind_exchange("orders-x", "amq.topic", "plant.#")


def test_exchanges_list_shows_types_flags_arguments_and_bindings(env: Any) -> None:
    """/api/exchanges and the page list every exchange with type, flags, arguments and
    bindings both ways; names and keys are escaped."""
    _, service, _, client = env
    declare(service.broker)
    service.broker.exchanges.bind_queue("orders", "fan", "<b>key</b>")
    data = client.get("/api/exchanges").json()
    rows = {r["name"]: r for r in data["items"]}
    assert data["items"][0]["name"] == "" and data["items"][0]["implicit_bindings"] == 1
    assert {"amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"} <= set(rows)
    x = rows["orders-x"]
    assert (x["type"], x["durable"], x["auto_delete"], x["internal"], x["standard"]) == (
        "direct", True, False, False, False)
    assert x["arguments"] == {"x-note": "hi"}
    assert [(b["destination"], b["destination_kind"], b["routing_key"])
            for b in x["bindings_out"]] == [("orders", "queue", "new")]
    assert [(b["source"], b["routing_key"]) for b in x["bindings_in"]] == [
        ("amq.topic", "plant.#")]
    assert rows["amq.topic"]["bindings_out"][0]["destination_kind"] == "exchange"
    assert data["totals"]["bindings"] == 3 and data["totals"]["declared_queues"] == 1
    one = client.get("/api/exchanges/exchange", name="orders-x").json()
    assert one["name"] == "orders-x" and len(one["bindings_out"]) == 1
    assert client.get("/api/exchanges/exchange", name="nope").code == 404
    page = client.get("/exchanges")
    assert page.code == 200 and 'href="/exchanges"' in page.text
    assert "orders-x" in page.text and "plant.#" in page.text and "x-note=hi" in page.text
    assert "&lt;b&gt;key&lt;/b&gt;" in page.text and "<b>key</b>" not in page.text
    # The standard exchanges have no delete button; declared ones do.
    assert page.text.count('action="/exchanges/delete"') == 2


def test_delete_and_unbind_are_audited_stored_and_refused_where_they_must(
        env: Any, audit: Any) -> None:
    """Deleting a declared exchange and removing a binding are audited and stored; the
    standard exchanges cannot be deleted, bad input gets 400/404, no CSRF gets 403."""
    _, service, _, client = env
    broker, store = service.broker, service.store
    declare(broker)
    headers = {"X-CSRF-Token": client.csrf}
    refused = client.post_json("/api/exchanges/delete", {"name": "amq.topic"}, headers)
    assert refused.code == 403 and "ACCESS_REFUSED" in refused.json()["error"]
    assert client.post_json("/api/exchanges/delete", {"name": ""}, headers).code == 400
    assert client.post_json("/api/exchanges/delete", {"name": "nope"}, headers).code == 404
    assert client.post("/exchanges/delete", csrf=False, name="fan").code == 403
    # The unbind form posts the binding as the page shows it.
    page = client.get("/exchanges").text
    assert "value='{}'" in page
    form = client.post("/exchanges/unbind", source="amq.topic", destination="orders-x",
                       destination_kind="exchange", routing_key="plant.#", arguments="{}",
                       back="/exchanges")
    assert form.code == 303 and form.header("location") == "/exchanges"
    rows = {r["name"]: r for r in client.get("/api/exchanges").json()["items"]}
    assert rows["amq.topic"]["bindings_out"] == [] and rows["orders-x"]["bindings_in"] == []
    missing = client.post_json("/api/exchanges/unbind", {
        "source": "orders-x", "destination": "orders", "destination_kind": "queue",
        "routing_key": "old", "arguments": ""}, headers)
    assert missing.code == 404
    bad = client.post_json("/api/exchanges/unbind", {
        "source": "orders-x", "destination": "orders", "destination_kind": "topic"}, headers)
    assert bad.code == 400
    ex = broker.exchanges
    ex.declare_exchange("hx", "headers")
    ex.bind_queue("orders", "hx", "", {"x-match": "any", "kind": "refund"})
    by_object = client.post_json("/api/exchanges/unbind", {
        "source": "hx", "destination": "orders", "destination_kind": "queue",
        "routing_key": "", "arguments": {"x-match": "any", "kind": "refund"}}, headers)
    assert by_object.code == 200, by_object.text
    assert client.post_json("/api/exchanges/unbind", {
        "source": "hx", "destination": "orders", "destination_kind": "queue",
        "arguments": "[1"}, headers).code == 400
    deleted = client.post_json("/api/exchanges/delete", {"name": "orders-x"}, headers)
    assert deleted.code == 200 and deleted.json()["bindings"] == 1
    assert DeleteExchange("orders-x") in store.submitted
    rows = {r["name"]: r for r in client.get("/api/exchanges").json()["items"]}
    assert "orders-x" not in rows
    text = audit_text(audit)
    assert ("user='admin' action=exchange-unbind exchange='amq.topic' "
            "destination='exchange:orders-x' routing_key='plant.#' -> unbound") in text
    assert "action=exchange-delete exchange='orders-x' -> deleted with 1 binding(s)" in text


def test_read_only_user_sees_exchanges_but_cannot_act(env: Any) -> None:
    """A read-only user sees the Exchanges page and gets 403 for its actions."""
    console, service, _, _ = env
    declare(service.broker)
    console.users.set_password("viewer", PASSWORD, role="read-only",
                               n=2 ** 10, r=8, p=1)
    viewer = Client(console)
    assert viewer.login("viewer").code == 303
    assert viewer.get("/exchanges").code == 200
    reply = viewer.post_json("/api/exchanges/delete", {"name": "fan"},
                             {"X-CSRF-Token": viewer.csrf})
    assert reply.code == 403
    assert "fan" in {r["name"] for r in viewer.get("/api/exchanges").json()["items"]}


def consume_091(broker: Any, queue: str, tag: str = "ctag-1") -> FakeLink:
    """A fake AMQP 0.9.1 connection with one consumer on ``queue``, joined to the
    queue's default group under the key the adapter gives it."""
    link = FakeLink(broker, "pika-app", protocol="amqp0-9-1", key_override="amqp091:1",
                    user="worker", links=(LinkInfo(tag, "sender", queue, "unsettled",
                                                   "first", 10, 2, 5, 1),))
    broker.register_connection(link.key, link, link.protocol)
    topic_filter, consumer = broker.exchanges.consumer_filter(queue)
    session = broker.add_topic_receiver(f"{link.key}:1:{tag}", topic_filter,
                                        Identity("pika-app", "worker", "amqp0-9-1"), 1,
                                        consumer=consumer)
    assert session is not None
    broker.start_topic_receiver(session, link)
    broker.exchanges.consumer_added(queue)
    return link


def test_queue_pages_show_declared_arguments_and_091_consumers(env: Any) -> None:
    """A 0.9.1-declared queue shows its flags and arguments (unknown ones too) in the
    list and its page, and its 0.9.1 consumer (channel, tag, prefetch, unacked) beside
    an MQTT member."""
    _, service, _, client = env
    broker = service.broker
    declare(broker)
    consume_091(broker, "orders")
    connect(broker, "device-1", subscriptions=("$queue/orders/#",))
    row = client.get("/api/queues").json()["items"][0]
    assert row["name"] == "orders" and row["declared"]["durable"] is True
    assert row["declared"]["arguments"] == {"x-max-length": 10, "x-custom": "kept"}
    detail = client.get("/api/queues/queue", name="orders").json()
    consumers = {c["protocol"]: c for c in detail["consumers"]}
    assert set(consumers) == {"amqp0-9-1", "mqtt"}
    c = consumers["amqp0-9-1"]
    assert (c["connection"], c["channel"], c["tag"], c["prefetch"], c["unacked"],
            c["ack"]) == ("amqp091:1", 1, "ctag-1", 10, 2, "manual")
    assert consumers["mqtt"]["member"] == "device-1"
    html = client.get("/queues/queue", name="orders").text
    assert "AMQP 0.9.1" in html and "ctag-1" in html and "x-custom" in html
    assert json.dumps(detail)   # (the API answer is plain JSON)


def test_deleting_a_091_queue_from_the_console_drops_its_bindings(env: Any, audit: Any
                                                                  ) -> None:
    """A 0.9.1-declared queue purged and deleted from the Queues page loses its messages,
    its declaration and its bindings; both actions are audited."""
    _, service, _, client = env
    broker = service.broker
    declare(broker)
    routed, _ = broker.exchanges.publish(
        Message("", b"order", 1, False, "app", broker.clock.seconds()), "orders-x", "new")
    assert routed
    headers = {"X-CSRF-Token": client.csrf}
    assert client.get("/api/queues").json()["items"][0]["depth"] == 1
    purged = client.post_json("/api/queues/purge", {"name": "orders"}, headers)
    assert purged.code == 200 and purged.json()["purged"] == 1
    deleted = client.post_json("/api/queues/delete", {"name": "orders"}, headers)
    assert deleted.code == 200, deleted.text
    data = client.get("/api/exchanges").json()
    assert data["totals"]["declared_queues"] == 0
    rows = {r["name"]: r for r in data["items"]}
    assert rows["orders-x"]["bindings_out"] == []
    text = audit_text(audit)
    assert "action=queue-purge queue='orders' -> purged 1" in text
    assert "action=queue-delete queue='orders'" in text


def test_default_exchange_counts_queues_mqtt_made(env: Any) -> None:
    """The default exchange's implicit bindings count every queue a routing key can
    name, a ``$queue/`` queue an MQTT member made too, but no ``$dlq/`` queue."""
    _, service, _, client = env
    declare(service.broker)
    connect(service.broker, "device-1", subscriptions=("$queue/jobs/#",))
    assert "jobs" in service.broker.exchanges.queues.queues
    data = client.get("/api/exchanges").json()
    assert data["items"][0]["implicit_bindings"] == 2
