"""The console's Queues page and ``/api/queues`` over StubTreq against a real
``Broker`` on a ``task.Clock``: the list with rates, one queue's groups and
messages, payload views, the four actions (audited, durable before they answer,
refused without CSRF or to read-only users) and escaping of what clients sent."""

from __future__ import annotations

import json
from typing import Any

import console_support
import pytest
from console_support import (
    PASSWORD,
    Client,
    audit_text,
    connect,
    fill,
    make_console,
)
from twisted.internet.defer import Deferred

from mqttamqp.core.auth import Identity
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.persistence import DeleteQueue, PutQueue, TrimQueue


@pytest.fixture
def env(tmp_path: Any) -> Any:
    console, service, clock = make_console(tmp_path)
    client = Client(console)
    assert client.login().code == 303
    return console, service, clock, client


def reject_all(broker: Any, link: Any, reason: str = "bad input") -> None:
    """An MQTT 5 member rejects what it was sent: dead letters in $dlq/<queue>."""
    for message in list(link.sent):
        meta = dict(message.props.user_properties)
        users = (("message-id", meta["message-id"]), ("group-id", meta["group-id"]),
                 ("reason", reason))
        result = broker.publish(
            Message(f"$queue/{meta['queue']}/$reject", b"", 1, False, link.client_id,
                    broker.clock.seconds(), props=MessageProperties(user_properties=users)),
            Identity(link.client_id, None, "mqtt5"))
        assert result.refusal is None


def test_list_shows_depth_groups_and_rates_and_refreshes_live(env: Any) -> None:
    """/api/queues lists each queue's depth, groups, members, pending, bytes, rates and
    oldest age."""
    _, service, clock, client = env
    broker = service.broker
    fill(broker, 3)
    connect(broker, "worker-1", subscriptions=("$queue/jobs/#",))   # QoS 1: pending
    first = client.get("/api/queues").json()
    [row] = first["items"]
    assert (row["name"], row["depth"], row["groups"], row["members"]) == ("jobs", 3, 1, 1)
    assert row["pending"] == 3 and row["rates"] is None and row["dlq_depth"] == 0
    assert row["bytes"] == sum(len(b"job %d" % i) for i in range(3))
    assert first["totals"]["queues"] == 1 and first["totals"]["messages"] == 3
    clock.advance(2)
    fill(broker, 4)
    row = client.get("/api/queues").json()["items"][0]
    assert row["rates"] == {"publish": 2.0, "ack": 0.0}
    assert row["oldest_age"] == 2.0
    page = client.get("/queues")
    assert page.code == 200 and 'href="/queues"' in page.text and "class=\"active\"" in page.text
    assert 'data-live-src="/queues?partial=1"' in page.text
    partial = client.get("/queues", partial="1").text
    assert "<html" not in partial and 'id="queue-table"' in partial and ">jobs</a>" in partial


def test_one_queue_groups_messages_and_payload_views(env: Any) -> None:
    """One queue's page lists its groups and messages page by page, and a message's payload
    as text or bytes."""
    _, service, _, client = env
    broker = service.broker
    fill(broker, 1, payload=b'{"order": 7}')
    fill(broker, 2, payload=b"\x00\x01binary")
    connect(broker, "worker-1", subscriptions=("$queue/jobs/#",))
    detail = client.get("/api/queues/queue", name="jobs", limit="2").json()
    [group] = detail["group_list"]
    assert group["id"] == "worker" and group["members"] == ["worker-1"]
    assert group["mode"] == "classic" and group["pending"] == 3
    assert [m["offset"] for m in detail["messages"]] == [0, 1]
    assert detail["browse"]["next"] == 2
    assert detail["messages"][0]["topic"] == "$queue/jobs/work"
    rest = client.get("/api/queues/queue", name="jobs", start="2").json()
    assert [m["offset"] for m in rest["messages"]] == [2] and rest["browse"]["next"] is None
    message = client.get("/api/queues/message", name="jobs", offset="0").json()
    assert message["view"]["mode"] == "json" and message["payload_text"] == '{"order": 7}'
    hexed = client.get("/api/queues/message", name="jobs", offset="1").json()
    assert hexed["view"]["mode"] == "hex" and hexed["view"]["modes"] == ["hex"]
    assert hexed["payload_text"] is None
    html = client.get("/queues/queue", name="jobs").text
    assert 'id="group-table"' in html and "worker-1" in html and "Set retention" in html
    assert "Requeue" not in html                       # not a dead-letter queue
    assert "&#34;order&#34;: 7" in client.get("/queues/message", name="jobs", offset="0").text
    assert client.get("/queues/queue", name="nope").code == 404
    assert client.get("/api/queues/queue", name="nope").code == 404
    assert client.get("/api/queues/queue").code == 400
    assert client.get("/api/queues/message", name="jobs", offset="9").code == 404
    # The live region (every second) shows figures and groups, and browses nothing.
    browsed: list[Any] = []
    real_browse = broker.queues.browse
    broker.queues.browse = lambda *a: browsed.append(a) or real_browse(*a)
    live = client.get("/queues/queue", name="jobs", partial="1").text
    assert 'id="group-table"' in live and "<html" not in live and browsed == []
    gone = client.get("/queues/queue", name="nope", partial="1")
    assert gone.code == 200 and "no longer exists" in gone.text


def test_dead_letters_are_requeued_one_then_all(env: Any, audit: Any) -> None:
    """Dead letters show their reason and origin, and are requeued one at a time or all at
    once (audited)."""
    _, service, _, client = env
    broker = service.broker
    fill(broker, 3)
    link = connect(broker, "worker-1", protocol="mqtt5")
    broker.subscribe(link.session, Identity("worker-1", None, "mqtt5"),
                     [("$queue/jobs/#", 1)])
    reject_all(broker, link)
    listed = {r["name"]: r for r in client.get("/api/queues").json()["items"]}
    assert listed["jobs"]["dlq_depth"] == 3 and listed["$dlq/jobs"]["dead_letter"]
    dead = client.get("/api/queues/queue", name="$dlq/jobs").json()
    props = dict(dead["messages"][0]["user_properties"])
    assert props["reason"] == "bad input" and props["origin-queue"] == "jobs"
    html = client.get("/queues/queue", name="$dlq/jobs").text
    assert "Requeue all to jobs" in html and html.count(">Requeue</button>") == 3
    one = dead["messages"][1]["offset"]
    reply = client.post_json("/api/queues/requeue", {"name": "$dlq/jobs", "offset": one},
                             {"X-CSRF-Token": client.csrf})
    assert reply.code == 200 and reply.json()["requeued"] == 1
    again = client.post_json("/api/queues/requeue", {"name": "$dlq/jobs", "offset": one},
                             {"X-CSRF-Token": client.csrf})
    assert again.code == 404
    form = client.post("/queues/requeue", name="jobs", back="/queues/queue?name=jobs")
    assert form.code == 303 and form.header("location") == "/queues/queue?name=jobs"
    assert "Requeued 2 message(s) from $dlq/jobs" in client.get("/queues/queue",
                                                                name="jobs").text
    listed = {r["name"]: r for r in client.get("/api/queues").json()["items"]}
    assert listed["$dlq/jobs"]["depth"] == 0 and listed["jobs"]["depth"] == 3
    text = audit_text(audit)
    assert "action=queue-requeue queue='$dlq/jobs' which='offset 1' -> requeued 1" in text
    assert "which='all' -> requeued 2" in text


def test_purge_retention_and_delete_are_audited_and_stored(env: Any, audit: Any) -> None:
    """Retention changes, purge and delete are audited and stored; bad retention values are
    refused."""
    _, service, _, client = env
    broker, store = service.broker, service.store
    fill(broker, 5)
    headers = {"X-CSRF-Token": client.csrf}
    reply = client.post_json("/api/queues/retention", {"name": "jobs", "max_messages": "2",
                                                       "max_age": "3600", "max_bytes": ""},
                             headers)
    assert reply.code == 200, reply.text
    assert reply.json()["retention"] == {"max_age": 3600.0, "max_bytes": None,
                                         "max_messages": 2, "max_priority": None}
    assert PutQueue("jobs", (3600.0, None, 2)) in store.submitted
    # priority levels: set, kept by a call that does not name them, refused past 255
    levels = client.post_json("/api/queues/retention", {"name": "jobs", "max_messages": "2",
                                                        "max_age": "3600",
                                                        "max_priority": "9"}, headers)
    assert levels.json()["retention"]["max_priority"] == 9
    assert PutQueue("jobs", (3600.0, None, 2, 9)) in store.submitted
    kept = client.post_json("/api/queues/retention", {"name": "jobs", "max_messages": "2",
                                                      "max_age": "3600"}, headers)
    assert kept.json()["retention"]["max_priority"] == 9
    assert broker.queues.queues["jobs"].max_priority == 9
    assert client.post_json("/api/queues/retention", {"name": "jobs", "max_priority": "256"},
                            headers).code == 400
    none = client.post_json("/api/queues/retention", {"name": "jobs", "max_messages": "2",
                                                      "max_age": "3600",
                                                      "max_priority": "0"}, headers)
    assert none.json()["retention"]["max_priority"] is None
    assert broker.queues.queues["jobs"].max_priority == 0
    assert client.get("/api/queues").json()["items"][0]["depth"] == 2
    for bad in ({"max_messages": "1.5"}, {"max_age": "-1"}, {"max_bytes": "lots"},
                {"max_age": "nan"}):
        refused = client.post_json("/api/queues/retention", {"name": "jobs", **bad}, headers)
        error = refused.json()["error"]
        assert refused.code == 400 and ("positive" in error or "whole" in error), bad
    purged = client.post_json("/api/queues/purge", {"name": "jobs"}, headers)
    assert purged.json() == {"ok": True, "message": "Purged 2 message(s) from jobs.",
                             "purged": 2}
    assert TrimQueue("jobs", 5) in store.submitted      # the log's head moves past it all
    assert client.get("/api/queues").json()["items"][0]["depth"] == 0
    form = client.post("/queues/delete", name="jobs", back="/queues")
    assert form.code == 303 and form.header("location") == "/queues"
    assert DeleteQueue("jobs") in store.submitted
    assert client.get("/api/queues").json()["items"] == []
    assert client.post_json("/api/queues/purge", {"name": "jobs"}, headers).code == 404
    assert client.post_json("/api/queues/delete", {}, headers).code == 400
    text = audit_text(audit)
    for line in ("user='admin' action=queue-retention queue='jobs' -> set max_age=3600.0, "
                 "max_bytes=none, max_messages=2",
                 "action=queue-purge queue='jobs' -> purged 2",
                 "action=queue-delete queue='jobs' -> deleted with 0 message(s) and 0 group(s)"):
        assert line in text


def test_an_action_answers_only_once_its_change_is_durable(env: Any) -> None:
    """A queue action answers only once its change is committed."""
    _, service, _, client = env
    broker, store = service.broker, service.store
    fill(broker, 2)
    held: list[Deferred[None]] = []

    def hold(ops: Any) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        held.append(d)
        return d
    store.submit = hold
    d = client.treq.request("POST", console_support.BASE + "/api/queues/purge",
                            data=json.dumps({"name": "jobs"}).encode(),
                            headers={"Content-Type": ["application/json"],
                                     "X-CSRF-Token": [client.csrf]})
    answered: list[Any] = []
    d.addBoth(answered.append)
    client.treq.flush()
    assert held and not answered                      # the purge is not durable yet
    for pending in held:
        pending.callback(None)
    client.treq.flush()
    assert answered and answered[0].code == 200


def test_actions_need_csrf_and_an_admin(env: Any, tmp_path: Any) -> None:
    """Queue actions need the CSRF token and an admin; a read-only user may look, anonymous
    users log in first."""
    console, service, _, client = env
    fill(service.broker, 1)
    assert client.post("/queues/purge", csrf=False, name="jobs").code == 403
    assert client.post_json("/api/queues/purge", {"name": "jobs"}).code == 403
    console.users.set_password("viewer", PASSWORD, role="read-only", **console_support.CHEAP)
    viewer = Client(console)
    assert viewer.login("viewer").code == 303
    assert viewer.get("/queues").code == 200
    refused = viewer.post_json("/api/queues/delete", {"name": "jobs"},
                               {"X-CSRF-Token": viewer.csrf})
    assert refused.code == 403 and "read-only" in refused.json()["error"]
    anonymous = Client(console)
    assert anonymous.get("/api/queues").code == 401
    assert anonymous.get("/queues").header("location") == "/login?next=%2Fqueues"
    assert service.broker.queues.views()[0].depth == 1


def test_what_clients_sent_is_escaped(env: Any) -> None:
    """Queue names and payloads that clients sent are escaped on every queue page."""
    _, service, _, client = env
    broker = service.broker
    evil = "<img src=x onerror=alert(1)>"
    fill(broker, 1, queue=evil, payload=b"<script>alert(2)</script>")
    for path, params in (("/queues", {}), ("/queues", {"partial": "1"}),
                         ("/queues/queue", {"name": evil}),
                         ("/queues/message", {"name": evil, "offset": "0"})):
        html = client.get(path, **params).text
        assert evil not in html and "<script>alert" not in html, path
        assert "&lt;img src=x onerror=alert(1)&gt;" in html, path
    assert client.get("/api/queues").json()["items"][0]["name"] == evil


def test_rates_are_kept_only_for_queues_that_exist(env: Any) -> None:
    """Rates are kept only for queues that exist, and given only after a second of history."""
    console, service, clock, client = env
    fill(service.broker, 1, queue="a")
    fill(service.broker, 1, queue="b")
    client.get("/api/queues")
    assert len(console.queues.rates) == 2
    clock.advance(0.5)
    fill(service.broker, 1, queue="a")
    rows = {r["name"]: r for r in client.get("/api/queues").json()["items"]}
    assert rows["a"]["rates"] is None           # under a second: no figure yet
    service.broker.queues.delete("b")
    clock.advance(1)
    rows = {r["name"]: r for r in client.get("/api/queues").json()["items"]}
    assert list(rows) == ["a"] and len(console.queues.rates) == 1
    assert rows["a"]["rates"] == {"publish": round(1 / 1.5, 1), "ack": 0.0}


def test_queue_messages_are_live_and_an_empty_queue_names_its_next_offset(env: Any) -> None:
    """The Messages card is a live region: once a consumer took every message it says
    the queue is empty and which offset comes next, not the offset it was loaded at."""
    _, service, _, client = env
    broker = service.broker
    fill(broker, 12)
    page = client.get("/queues/queue", name="jobs").text
    assert 'data-live-src="/queues/queue?name=jobs&amp;partial=messages"' in page
    assert "offsets 0 to 11" in page
    worker = connect(broker, "worker")
    broker.subscribe(worker.session, Identity("worker"), [("$queue/jobs/#", 0)])
    assert len(worker.sent) == 12                        # QoS 0: acknowledged as sent
    live = client.get("/queues/queue", name="jobs", partial="messages").text
    assert "<html" not in live and 'id="message-table"' in live
    assert "The queue is empty; the next message gets offset 12." in live
    assert "offset 0" not in live and "offset 11" not in live
    page = client.get("/queues/queue", name="jobs").text
    assert "The queue is empty; the next message gets offset 12." in page
    # A page further on is a look at the past: not refreshed, and says where it starts.
    broker.end_session(worker, worker.session, clean=True, reason="bye")
    broker.unregister_connection(worker.key, worker)
    fill(broker, 3)
    later = client.get("/queues/queue", name="jobs", start="13").text
    assert "partial=messages" not in later and "offsets 13 to 14" in later
    beyond = client.get("/queues/queue", name="jobs", start="99").text
    assert "No messages from offset 15 (the next one)." in beyond
