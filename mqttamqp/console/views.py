"""The console's renderings: the core's read model (``mqttamqp.core.readmodel``)
as plain dicts, for the HTML pages and the JSON API alike (one shape for both, so
they cannot drift apart).

Everything here reads frozen views; nothing changes broker state.  The values are raw (client
ids, topics and payloads exactly as clients sent them; how a payload is shown is
``mqttamqp.console.payloads``); escaping is the job of
the templates (Jinja2 autoescape) and of ``json.dumps``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from mqttamqp import __version__
from mqttamqp.console.context import ConsoleContext
from mqttamqp.console.payloads import payload_json, payload_preview, payload_view
from mqttamqp.core.auth import Ban
from mqttamqp.core.message import Message
from mqttamqp.core.readmodel import (
    ClientView,
    EntryView,
    ReadModel,
    SessionView,
    SubscriptionView,
    WillView,
)

__all__ = [
    "PROTOCOL_LABELS", "Page", "paginate", "connection_row", "client_detail",
    "session_row", "session_detail", "retained_row", "retained_detail", "will_json",
    "overview", "list_clients", "list_sessions", "list_retained", "CLIENT_SORTS", "SESSION_SORTS",
    "session_json", "ClientFilters", "ClientRates", "ban_json",
    "BAN_DURATIONS", "TopicRates", "topic_tree", "list_subscriptions",
]

PROTOCOL_LABELS = {"mqtt3.1": "MQTT 3.1", "mqtt3.1.1": "MQTT 3.1.1", "mqtt5": "MQTT 5",
                   "amqp": "AMQP 1.0", "amqp0-9-1": "AMQP 0.9.1"}
PAGE_SIZES = (25, 50, 100, 200)

T = TypeVar("T")


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    total: int
    page: int
    pages: int
    per_page: int

    def as_json(self) -> dict[str, Any]:
        return {"items": self.items, "total": self.total, "page": self.page,
                "pages": self.pages, "per_page": self.per_page}


def paginate(rows: Sequence[T], page: int, per_page: int,
             render: Callable[[T], dict[str, Any]]) -> Page:
    """Slice ``rows`` and render only the slice (so 10,000 rows cost one sort)."""
    per_page = per_page if per_page in PAGE_SIZES else 50
    pages = max(1, math.ceil(len(rows) / per_page))
    page = min(max(1, page), pages)
    start = (page - 1) * per_page
    return Page([render(r) for r in rows[start:start + per_page]], len(rows), page, pages,
                per_page)


# -- clients ----------------------------------------------------------------------


def connection_row(client: ClientView) -> dict[str, Any]:
    info = client.info
    session = client.session
    if session is not None:
        subscriptions: int | None = len(session.subscriptions)
        queued: int | None = session.queued_count
        inflight: int | None = session.inflight_count
    else:
        subscriptions = sum(1 for link in info.links if link.role == "sender")
        queued = None
        inflight = sum(link.unsettled for link in info.links) if info.links else None
    return {
        "key": info.key,
        "client_id": info.client_id,
        "protocol": info.protocol,
        "protocol_label": PROTOCOL_LABELS.get(info.protocol, info.protocol),
        "remote": info.remote,
        "user": info.user,
        "connected_since": info.connected_since,
        "keepalive": info.keepalive,
        "clean_session": info.clean_session,
        "session_id": info.session_id,
        "persistent": session.persistent if session is not None else None,
        "subscriptions": subscriptions,
        "queued": queued,
        "inflight": inflight,
        "has_will": bool(info.will_owners) or bool(client.wills),
        "links": len(info.links),
        "counters": {"messages_in": info.messages_in, "messages_out": info.messages_out,
                     "bytes_in": info.bytes_in, "bytes_out": info.bytes_out,
                     "last_activity": info.last_activity or None},
        "rates": None,     # filled by the console (``ClientRates``) for shown rows
    }


def _entry_json(entry: EntryView) -> dict[str, Any]:
    message: Message = entry.message
    return {
        "packet_id": entry.packet_id,
        "topic": message.topic,
        "qos": entry.qos,
        "state": entry.state,
        "dup": entry.dup,
        "retain": entry.retain,
        "size": len(message.payload),
        "preview": payload_preview(message.payload),
        "publisher": message.publisher,
        "timestamp": message.timestamp,
    }


def will_json(view: WillView) -> dict[str, Any]:
    will = view.will
    return {
        "owner": will.owner,
        "origin": will.origin,
        "topic": will.topic,
        "qos": will.qos,
        "retain": will.retain,
        "created": will.created,
        "preview": payload_preview(will.payload),
        "payload": payload_view(will.payload, "auto", 4096),
        "owner_connected": view.owner_connected,
        **payload_json(will.payload),
    }


def session_json(session: SessionView) -> dict[str, Any]:
    return {
        "client_id": session.client_id,
        "persistent": session.persistent,
        "state": session.state,
        "online": session.online,
        "last_seen": session.last_seen,
        "subscriptions": [{"filter": f, "qos": q} for f, q in session.subscriptions],
        "inflight": [_entry_json(e) for e in session.inflight],
        "queued": [_entry_json(e) for e in session.queued],
        "inflight_count": session.inflight_count,
        "queued_count": session.queued_count,
        "queued_bytes": session.queued_bytes,
        "entries_count": session.inflight_count + session.queued_count,
        "dropped": session.dropped,
        "delivered": session.delivered,
        "inbound_qos2": list(session.inbound_qos2),
        "expiry": session.expiry,
        "expires_at": session.expires_at,
        "never_expires": session.never_expires,
    }


def client_detail(client: ClientView) -> dict[str, Any]:
    row = connection_row(client)
    row["session"] = session_json(client.session) if client.session is not None else None
    row["wills"] = [will_json(w) for w in client.wills]
    row["link_list"] = [asdict(link) for link in client.info.links]
    row["amqp"] = asdict(client.info.amqp) if client.info.amqp is not None else None
    row["amqp091"] = (asdict(client.info.amqp091) if client.info.amqp091 is not None
                      else None)
    row["online"] = True
    return row


def session_detail(session: SessionView, will: WillView | None) -> dict[str, Any]:
    """Detail of a session with no live connection (offline persistent session)."""
    return {
        "key": None,
        "client_id": session.client_id,
        "protocol": session.protocol or "",
        "protocol_label": PROTOCOL_LABELS.get(session.protocol, "—"),
        "online": False,
        "session": session_json(session),
        "wills": [will_json(will)] if will is not None else [],
        "link_list": [],
        "links": 0,
        "has_will": will is not None,
        "amqp": None,
        "amqp091": None,
        "counters": None,
        "rates": None,
    }


CLIENT_SORTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "client_id": lambda r: r["client_id"],
    "protocol": lambda r: r["protocol"],
    "remote": lambda r: r["remote"],
    "user": lambda r: r["user"] or "",
    "since": lambda r: r["connected_since"],
    "keepalive": lambda r: r["keepalive"],
    "subscriptions": lambda r: r["subscriptions"] or 0,
    "queued": lambda r: r["queued"] or 0,
    "inflight": lambda r: r["inflight"] or 0,
    "messages_in": lambda r: r["counters"]["messages_in"],
    "messages_out": lambda r: r["counters"]["messages_out"],
    "bytes": lambda r: r["counters"]["bytes_in"] + r["counters"]["bytes_out"],
    "activity": lambda r: r["counters"]["last_activity"] or 0.0,
}


@dataclass(frozen=True)
class ClientFilters:
    """The clients page's filters (all optional; "" means any)."""

    protocol: str = ""       # "mqtt" (3.1, 3.1.1, 5), "mqtt3.1", "mqtt3.1.1", "mqtt5", "amqp",
    #                          "amqp0-9-1"
    user: str = ""           # substring of the user name; "-" for clients without one
    remote: str = ""         # substring of host:port
    kind: str = ""           # "clean" or "persistent" (a session kept across connections)
    will: str = ""           # "yes" or "no"

    def active(self) -> bool:
        return any((self.protocol, self.user, self.remote, self.kind, self.will))

    def as_params(self) -> dict[str, str]:
        return {"protocol": self.protocol, "user": self.user, "remote": self.remote,
                "kind": self.kind, "will": self.will}

    def keep(self, row: dict[str, Any]) -> bool:
        proto = row["protocol"]
        if self.protocol and not (proto == self.protocol or (
                self.protocol == "mqtt" and proto.startswith("mqtt"))):
            return False
        if self.user == "-":
            if row["user"]:
                return False
        elif self.user and self.user.lower() not in (row["user"] or "").lower():
            return False
        if self.remote and self.remote.lower() not in row["remote"].lower():
            return False
        if self.kind and (self.kind == "persistent") != bool(row["persistent"]):
            return False
        if self.will and (self.will == "yes") != row["has_will"]:
            return False
        return True


def _matches(query: str, *values: str | None) -> bool:
    return any(v is not None and query in v.lower() for v in values)


def list_clients(model: ReadModel, query: str = "", sort: str = "client_id",
                 desc: bool = False, page: int = 1, per_page: int = 50,
                 filters: ClientFilters | None = None,
                 rates: ClientRates | None = None) -> Page:
    """Filter, sort and page all live connections (MQTT and AMQP) server-side;
    ``rates`` (if given) adds message rates to the rows of the page shown."""
    rows = [connection_row(client) for client in model.clients()]
    if rates is not None:
        rates.forget_all_but({r["key"] for r in rows})
    q = query.strip().lower()
    if q:
        rows = [r for r in rows if _matches(q, r["client_id"], r["remote"], r["user"])]
    if filters is not None and filters.active():
        rows = [r for r in rows if filters.keep(r)]
    key = CLIENT_SORTS.get(sort, CLIENT_SORTS["client_id"])
    rows.sort(key=key, reverse=desc)
    shown = paginate(rows, page, per_page, lambda r: r)
    if rates is not None:
        for row in shown.items:
            row["rates"] = rates.rates(row["key"], row["counters"])
    return shown


class ClientRates:
    """Per-client message rates, from the counters of successive looks at a client
    (the live table refreshes every second).  Costs nothing on the broker's hot
    path: only the rows a page shows are sampled; bounded by the live connections
    (a client that left is forgotten)."""

    def __init__(self, seconds: Callable[[], float], min_interval: float = 1.0) -> None:
        self._seconds = seconds
        self._min = min_interval
        # key -> (at, messages in, messages out, bytes in, bytes out, last rates)
        self._seen: dict[str, tuple[float, int, int, int, int, dict[str, float] | None]] = {}

    def rates(self, key: str, counters: dict[str, Any]) -> dict[str, float] | None:
        now = self._seconds()
        now_counts = (counters["messages_in"], counters["messages_out"],
                      counters["bytes_in"], counters["bytes_out"])
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = (now, *now_counts, None)
            return None
        at, *old, last = seen
        dt = now - at
        if dt < self._min:
            return last                     # too soon: keep the last figures
        names = ("messages_in", "messages_out", "bytes_in", "bytes_out")
        fresh = {n: round(max(0, c - o) / dt, 1) for n, c, o in
                 zip(names, now_counts, old, strict=True)}
        self._seen[key] = (now, *now_counts, fresh)
        return fresh

    def forget_all_but(self, keys: set[str]) -> None:
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)


# -- sessions ---------------------------------------------------------------------


def session_row(session: SessionView) -> dict[str, Any]:
    return {
        "client_id": session.client_id,
        "persistent": session.persistent,
        "online": session.online,
        "state": session.state,
        "last_seen": session.last_seen,
        "subscriptions": len(session.subscriptions),
        "queued": session.queued_count + session.inflight_count,
        "queued_bytes": session.queued_bytes,
        "dropped": session.dropped,
        "has_will": session.has_will,
    }


SESSION_SORTS: dict[str, Callable[[SessionView], Any]] = {
    "client_id": lambda s: s.client_id,
    "last_seen": lambda s: s.last_seen,
    "subscriptions": lambda s: len(s.subscriptions),
    "queued": lambda s: s.queued_count + s.inflight_count,
    "queued_bytes": lambda s: s.queued_bytes,
    "dropped": lambda s: s.dropped,
    "state": lambda s: s.state,
}


def list_sessions(model: ReadModel, query: str = "", sort: str = "client_id",
                  desc: bool = False, page: int = 1, per_page: int = 50,
                  state: str = "all") -> Page:
    """Persistent sessions, online and offline (clean sessions live with their client)."""
    sessions = model.sessions(state)
    q = query.strip().lower()
    if q:
        sessions = [s for s in sessions if q in s.client_id.lower()]
    sessions.sort(key=SESSION_SORTS.get(sort, SESSION_SORTS["client_id"]), reverse=desc)
    return paginate(sessions, page, per_page, session_row)


# -- retained ---------------------------------------------------------------------


def retained_row(message: Message) -> dict[str, Any]:
    return {
        "topic": message.topic,
        "qos": message.qos,
        "size": len(message.payload),
        "publisher": message.publisher,
        "timestamp": message.timestamp,
        "preview": payload_preview(message.payload),
    }


def retained_detail(message: Message, mode: str = "auto") -> dict[str, Any]:
    row = retained_row(message)
    row["view"] = payload_view(message.payload, mode)
    row.update(payload_json(message.payload))
    return row


def list_retained(messages: Iterable[Message], page: int, per_page: int) -> Page:
    return paginate(list(messages), page, per_page, retained_row)


# -- overview ---------------------------------------------------------------------


def overview(context: ConsoleContext, model: ReadModel, now: float, rates: dict[str, float],
             include_storage: bool = True) -> dict[str, Any]:
    """The overview page's numbers (also what the live feed sends every tick)."""
    c = model.counters()
    out: dict[str, Any] = {
        "version": __version__,
        "now": now,
        "started": c.started,
        "uptime_seconds": max(0.0, now - c.started) if c.started else 0.0,
        "clients": {
            "connected": c.connected,
            "mqtt31": c.by_protocol.get("mqtt3.1", 0),
            "mqtt311": c.by_protocol.get("mqtt3.1.1", 0),
            "mqtt5": c.by_protocol.get("mqtt5", 0),
            "amqp": c.amqp_connections,
            "amqp091": c.by_protocol.get("amqp0-9-1", 0),
            "maximum": c.clients_maximum,
            "total": c.clients_total,
            "refused": c.connections_refused,
        },
        "sessions": {"total": c.sessions, "persistent": c.persistent_sessions,
                     "offline": c.offline_sessions},
        "retained": {"count": c.retained, "bytes": c.retained_bytes, "sys": c.retained_sys},
        "wills": c.wills,
        "subscriptions": c.subscriptions,
        "rates": rates,
        "messages": {
            "received": c.messages_received,
            "sent": c.messages_sent,
            "dropped": c.messages_dropped,
            "queued": c.messages_queued,
            "publish_denied": c.publish_denied,
            "wills_published": c.wills_published,
            "protocol_errors": c.protocol_errors,
        },
        "bytes": {"received": c.bytes_received, "sent": c.bytes_sent},
        "archive": dict(c.archive) or None,
        "health": {"storage": "failing" if c.storage_failing else "ok",
                   "storage_failures": c.storage_failures,
                   "storage_error": c.storage_error if c.storage_failing else ""},
        # The durable queues' aggregate bounds (docs/queues.md).
        "queues": {"state": "blocked" if c.queues_blocked else "ok",
                   "blocked": c.queues_blocked, "stored_bytes": c.queue_bytes,
                   "memory_bytes": c.queue_memory_bytes},
        # Local transactions (AMQP 1.0 coordinator, AMQP 0.9.1 tx).
        "transactions": context.broker.transactions.counts(),
    }
    out["ha"] = context.ha() if context.ha is not None else None
    if include_storage:
        out["listeners"] = context.listeners()
        out["storage"] = context.storage_stats()
    return out


# -- bans -------------------------------------------------------------------------

BAN_DURATIONS = (("600", "10 minutes"), ("3600", "1 hour"), ("86400", "1 day"),
                 ("604800", "7 days"), ("", "for good"))


def ban_json(ban: Ban, now: float) -> dict[str, Any]:
    return {"kind": ban.kind, "value": ban.value, "until": ban.until,
            "remaining": None if ban.until is None else max(0.0, ban.until - now),
            "reason": ban.reason, "created": ban.created, "by": ban.by}


# -- topics -------------------------------------------------------------------------


class TopicRates:
    """Per-topic message rates from successive reads of the broker's topic counts
    (the Topics page refreshes every second).  Bounded by the core's cap on
    tracked topics; one instance serves every viewer."""

    def __init__(self, seconds: Callable[[], float], min_interval: float = 1.0) -> None:
        self._seconds = seconds
        self._min = min_interval
        self._at = 0.0
        self._prev: dict[str, int] = {}
        self.rates: dict[str, float] = {}

    def update(self, counts: dict[str, int]) -> dict[str, float]:
        now = self._seconds()
        dt = now - self._at
        if not self._prev:
            self._at, self._prev = now, dict(counts)
        elif dt >= self._min:
            prev = self._prev
            self.rates = {t: (n - prev.get(t, 0)) / dt for t, n in counts.items()
                          if n != prev.get(t, 0)}
            self._at, self._prev = now, dict(counts)
        return self.rates


MAX_TREE_ROWS = 500


def topic_tree(model: ReadModel, prefix: str, rates: TopicRates) -> dict[str, Any]:
    """The level below ``prefix`` ("" is the root): one row per child with the
    messages and rate of everything under it, how many topics it holds, whether it
    is itself a retained topic, how many retained topics lie below it and how many
    subscribers a message on it reaches."""
    counts_view = model.topic_counts()
    counts = dict(counts_view.counts)
    per_topic_rate = rates.update(counts)
    base = prefix + "/" if prefix else ""
    retained = {m.topic for m in model.retained_matching(base + "#" if base else "#")}
    if prefix and model.retained(prefix) is not None:
        retained.add(prefix)
    nodes: dict[str, dict[str, Any]] = {}
    for topic in set(counts) | retained:
        if base and not topic.startswith(base):
            continue
        if not base and topic.startswith("$"):
            continue                              # $SYS and $dynamic: not traffic
        name, sep, _ = topic[len(base):].partition("/")
        node = nodes.get(name)
        if node is None:
            if len(nodes) >= MAX_TREE_ROWS:
                continue
            node = nodes[name] = {"name": name, "path": base + name, "messages": 0,
                                  "rate": 0.0, "topics": 0, "retained": False,
                                  "retained_below": 0, "leaf": False, "children": False}
        node["messages"] += counts.get(topic, 0)
        node["rate"] += per_topic_rate.get(topic, 0.0)
        node["topics"] += 1
        if sep:
            node["children"] = True
            if topic in retained:
                node["retained_below"] += 1
        else:
            node["leaf"] = True
            node["retained"] = topic in retained
    rows = sorted(nodes.values(), key=lambda n: n["name"])
    for row in rows:
        row["rate"] = round(row["rate"], 1)
        row["subscribers"] = model.subscriber_count(row["path"])
    crumbs = []
    if prefix:
        parts = prefix.split("/")
        crumbs = [{"name": p, "path": "/".join(parts[:i + 1])} for i, p in enumerate(parts)]
    return {"prefix": prefix, "crumbs": crumbs, "items": rows,
            "cut": len(nodes) >= MAX_TREE_ROWS,
            "tracked": counts_view.tracked, "max_tracked": counts_view.max_tracked,
            "untracked": counts_view.untracked,
            "self": {"messages": counts.get(prefix, 0),
                     "subscribers": model.subscriber_count(prefix),
                     "retained": prefix in retained} if prefix else None}


def subscription_row(s: SubscriptionView) -> dict[str, Any]:
    return {"client_id": s.client_id, "filter": s.topic_filter, "qos": s.qos,
            "kind": s.kind, "online": s.online}


def list_subscriptions(model: ReadModel, query: str, page: int, per_page: int) -> Page:
    """Every session's subscriptions, searched in client ids and filters."""
    q = query.strip().lower()
    subs = [s for s in model.subscriptions()
            if not q or q in s.topic_filter.lower() or q in s.client_id.lower()]
    subs.sort(key=lambda s: (s.topic_filter, s.client_id))
    return paginate(subs, page, per_page, subscription_row)
