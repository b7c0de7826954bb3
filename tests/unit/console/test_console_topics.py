"""The console's Topics and Subscriptions pages over StubTreq against a real ``Broker`` on a
``task.Clock``: the topic tree with rates, subscribers and retained messages per level
(counts capped and cheap), subscriptions across sessions searchable, and the
Subscriptions menu entry."""

from __future__ import annotations

import re
from typing import Any

from console_support import connect

from mqttamqp.core.auth import Identity
from mqttamqp.core.message import Message


def test_topic_counts_are_capped_and_cheap() -> None:
    """Per-topic counts are kept for a bounded number of topics; the rest are counted as
    untracked."""
    from mqttamqp.core.routing.topicstats import TopicStats
    stats = TopicStats(max_topics=2)
    for topic in ("a", "b", "a", "c", "d", "b"):
        stats.note(topic)
    assert stats.counts() == {"a": 2, "b": 2} and stats.untracked == 2


def test_topic_tree_with_rates_subscribers_and_retained(env: Any) -> None:
    """The topic tree gives each level its messages, rate, topics, retained message and
    subscribers."""
    from mqttamqp.core.auth import Identity
    _, broker, clock, client = env
    connect(broker, "watcher", subscriptions=("plant/+/temp",))
    for topic, retain in (("plant/l1/temp", True), ("plant/l1/temp", False),
                          ("plant/l2/temp", False), ("office/door", False)):
        broker.publish(Message(topic, b"1", 0, retain, "p", clock.seconds()), Identity("p"))
    root = client.get("/api/topics").json()
    assert [(n["name"], n["messages"], n["topics"], n["children"]) for n in root["items"]] == [
        ("office", 1, 1, True), ("plant", 3, 2, True)]
    assert (root["tracked"], root["max_tracked"], root["untracked"]) == (3, 10_000, 0)
    level = client.get("/api/topics", prefix="plant/l1").json()
    assert level["items"] == [{"name": "temp", "path": "plant/l1/temp", "messages": 2,
                               "rate": 0.0, "topics": 1, "retained": True,
                               "retained_below": 0, "leaf": True,
                               "children": False, "subscribers": 1}]
    clock.advance(2)
    for _ in range(6):
        broker.publish(Message("plant/l1/temp", b"2", 0, False, "p", clock.seconds()))
    level = client.get("/api/topics", prefix="plant/l1").json()
    assert level["items"][0]["rate"] == 3.0 and level["items"][0]["messages"] == 8
    html = client.get("/topics", prefix="plant").text
    assert "plant/l1" in html and "at most 10,000 topics" in html and 'id="topic-table"' in html
    assert client.get("/api/topics", prefix="a/+").code == 400


def test_subscriptions_across_sessions_are_searchable(env: Any) -> None:
    """Subscriptions of every session and AMQP receiver are listed, searchable, and escaped
    on the page."""
    from mqttamqp.core.auth import Identity
    _, broker, _, client = env
    connect(broker, "dev-<1>", clean=False, subscriptions=("cmd/dev1/#", "all/#"))
    connect(broker, "dev-2", subscriptions=("cmd/dev2/#",))
    broker.add_topic_receiver("amqp:9:rx", "all/#", Identity("app"), 1)
    items = client.get("/api/subscriptions").json()["items"]
    assert [(s["filter"], s["client_id"], s["kind"]) for s in items] == [
        ("all/#", "amqp:9:rx", "amqp receiver"), ("all/#", "dev-<1>", "persistent"),
        ("cmd/dev1/#", "dev-<1>", "persistent"), ("cmd/dev2/#", "dev-2", "clean")]
    found = client.get("/api/subscriptions", q="DEV2").json()
    assert found["total"] == 1 and found["items"][0]["client_id"] == "dev-2"
    html = client.get("/subscriptions", q="dev1").text
    assert "dev-&lt;1&gt;" in html and "dev-<1>" not in html


def test_subscriptions_has_its_own_menu_entry(env: Any) -> None:
    """/subscriptions highlights its own menu entry, not Topics."""
    _, _, _, client = env
    html = client.get("/subscriptions").text
    assert re.search(r'<a href="/subscriptions" class="active" aria-current="page">'
                     r"Subscriptions</a>", html), html[:3000]
    assert re.search(r'<a href="/topics">Topics</a>', html)
    topics = client.get("/topics").text
    assert re.search(r'<a href="/topics" class="active" aria-current="page">Topics</a>', topics)
    assert re.search(r'<a href="/subscriptions">Subscriptions</a>', topics)


def test_topic_levels_say_how_many_retained_messages_they_hold(env: Any) -> None:
    """A level with retained messages below it says how many, linked to the Retained page."""
    _, broker, clock, client = env
    for topic, retain in (("plant/l1/temp", True), ("plant/l2/temp", True),
                          ("plant/l2/hum", False), ("plant", True), ("office/door", False)):
        broker.publish(Message(topic, b"1", 0, retain, "p", clock.seconds()), Identity("p"))
    root = {n["name"]: n for n in client.get("/api/topics").json()["items"]}
    assert (root["plant"]["retained"], root["plant"]["retained_below"]) == (True, 2)
    assert (root["office"]["retained"], root["office"]["retained_below"]) == (False, 0)
    level = {n["name"]: n for n in client.get("/api/topics", prefix="plant").json()["items"]}
    assert level["l1"]["retained_below"] == 1 and level["l2"]["retained_below"] == 1
    leaf = client.get("/api/topics", prefix="plant/l2").json()["items"]
    assert [(n["name"], n["retained"], n["retained_below"]) for n in leaf] == [
        ("hum", False, 0), ("temp", True, 0)]
    html = client.get("/topics").text
    cells = dict(re.findall(r'title="(\w+)">\w+/</a></td>.*?<td class="retained">(.*?)</td>',
                            html, re.S))
    assert set(cells) == {"plant", "office"}
    assert "yes" in cells["plant"] and "2 below" in cells["plant"]
    assert 'href="/retained?filter=plant%2F%23"' in cells["plant"]
    assert "no" in cells["office"] and "—" not in cells["office"]
