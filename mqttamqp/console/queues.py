"""The console's Queues page: the durable queues (``$queue/``, ``$dlq/``) as plain
dicts for the pages and ``/api/queues`` alike, their publish and acknowledgement
rates, and the operator's commands on them (purge, delete, requeue dead letters,
retention), each audited and answered once durable.

It reads only the façade's frozen views (``Broker.queue_views``, ``browse_queue``)
and acts only through its commands; it imports no more of ``core.queues`` than
its value types.  Names, topics and payloads are raw here, as clients sent them:
the templates escape them (autoescape) and the API is ``json.dumps``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred

from mqttamqp.console.actions import ActionError, ActionResult
from mqttamqp.console.exchanges import declared_queue_json
from mqttamqp.console.payloads import payload_json, payload_preview, payload_view
from mqttamqp.console.views import PROTOCOL_LABELS
from mqttamqp.core.broker import Broker
from mqttamqp.core.queues.addresses import DLQ_PREFIX
from mqttamqp.core.queues.admin import GroupView, QueueMessageView, QueueView
from mqttamqp.core.queues.model import Retention

__all__ = ["QueueRates", "QueueActions", "queue_row", "queue_list", "queue_detail",
           "message_detail", "MAX_BROWSE", "find_queue", "queue_consumers"]

MAX_BROWSE = 200          # messages one browse shows at most
BROWSE_DEFAULT = 50


class QueueRates:
    """Publish and acknowledgement rates per queue from the counters of successive
    looks (the page and its live region read every second).  One instance serves
    every viewer; figures are recomputed at most every ``min_interval`` seconds;
    bounded by the queues that exist (a deleted queue is forgotten)."""

    def __init__(self, seconds: Callable[[], float], min_interval: float = 1.0) -> None:
        self._seconds = seconds
        self._min = min_interval
        # name -> (at, published, acknowledged, last rates)
        self._seen: dict[str, tuple[float, int, int, dict[str, float] | None]] = {}

    def update(self, views: Sequence[QueueView], every: bool = True
               ) -> dict[str, dict[str, float] | None]:
        """Rates of each of ``views`` (None until a second look); with ``every`` the
        views are all the queues there are, and the others are forgotten."""
        now = self._seconds()
        out: dict[str, dict[str, float] | None] = {}
        for view in views:
            seen = self._seen.get(view.name)
            if seen is None:
                self._seen[view.name] = (now, view.published, view.acknowledged, None)
                out[view.name] = None
                continue
            at, published, acked, last = seen
            dt = now - at
            if dt < self._min:
                out[view.name] = last
                continue
            fresh = {"publish": round(max(0, view.published - published) / dt, 1),
                     "ack": round(max(0, view.acknowledged - acked) / dt, 1)}
            self._seen[view.name] = (now, view.published, view.acknowledged, fresh)
            out[view.name] = fresh
        if every:
            for name in [n for n in self._seen if n not in out]:
                del self._seen[name]
        return out

    def __len__(self) -> int:
        return len(self._seen)


def _retention(r: Retention) -> dict[str, Any]:
    return {"max_age": r.max_age, "max_bytes": r.max_bytes, "max_messages": r.max_messages,
            "max_priority": r.max_priority or None}


def _group(g: GroupView) -> dict[str, Any]:
    return {"id": g.id, "name": g.name, "filter": g.filter, "mode": g.mode,
            "members": list(g.members), "cursor": g.cursor, "lag": g.lag,
            "pending": g.pending, "redeliveries": g.redeliveries,
            "acknowledged": g.acknowledged}


def queue_row(view: QueueView, rates: dict[str, float] | None,
              declared: dict[str, Any] | None = None) -> dict[str, Any]:
    """One queue as the list shows it (and ``/api/queues`` returns it); ``declared``:
    what an AMQP 0.9.1 ``queue.declare`` said of it (flags and arguments), if any."""
    dead = view.name.startswith(DLQ_PREFIX)
    return {
        "name": view.name,
        "dead_letter": dead,
        "origin": view.name[len(DLQ_PREFIX):] if dead else None,
        "dlq": None if dead else DLQ_PREFIX + view.name,
        "depth": view.depth,
        "bytes": view.bytes,
        "oldest_age": view.oldest_age,
        "rates": rates,
        "published": view.published,
        "acknowledged": view.acknowledged,
        "dead_lettered": view.dead_lettered,
        "expired": view.expired,
        "dlq_depth": view.dlq_depth,
        "groups": len(view.groups),
        "members": sum(len(g.members) for g in view.groups),
        "lag": max((g.lag for g in view.groups), default=0),
        "pending": sum(g.pending for g in view.groups),
        "retention": _retention(view.retention),
        "first_offset": view.first,
        "next_offset": view.next,
        "in_storage_only": view.in_storage_only,   # bodies past --queue-memory-budget
        "declared": declared,
    }


def _declared(broker: Broker) -> dict[str, dict[str, Any]]:
    """The queues AMQP 0.9.1 declared, by name, as ``declared_queue_json``."""
    return {q.name: declared_queue_json(q) for q in broker.exchanges.views()[2]}


# Who a group member is, by the key its protocol gave its session: AMQP 0.9.1
# consumers "amqp091:<n>:<channel>:<tag>", AMQP 1.0 receivers "amqp:…", MQTT
# sessions their client id.
def _member_protocol(member: str) -> str:
    if member.startswith("amqp091:"):
        return "amqp0-9-1"
    if member.startswith("amqp:"):
        return "amqp"
    return "mqtt"


# (what only an AMQP 0.9.1 consumer has: None for the others)
_NO_DETAIL: dict[str, Any] = dict.fromkeys(
    ("connection", "client_id", "user", "channel", "tag", "prefetch", "unacked",
     "delivered", "ack"))


def queue_consumers(broker: Broker, view: QueueView) -> list[dict[str, Any]]:
    """Every member of the queue's groups with its protocol; AMQP 0.9.1 consumers
    with their connection, channel, consumer tag, prefetch, unacknowledged and
    delivered counts (read from the live connections' consumer lists)."""
    amqp091: dict[str, dict[str, Any]] = {}
    # (only the connections of this queue's 0.9.1 members are read, by their keys)
    # ("amqp091:<serial>:<channel>:<tag>": a tag may hold colons, the rest do not)
    keys = {":".join(m.split(":", 2)[:2]) for g in view.groups for m in g.members
            if m.startswith("amqp091:")}
    for key in sorted(keys):
        client = broker.view.client(key, 0)
        if client is None:
            continue
        info = client.info
        for link in info.links:
            amqp091[f"{info.key}:{link.session}:{link.name}"] = {
                "connection": info.key, "client_id": info.client_id,
                "user": info.user, "channel": link.session, "tag": link.name,
                "prefetch": link.credit, "unacked": link.unsettled,
                "delivered": link.delivered,
                "ack": "none (no-ack)" if link.snd_settle_mode == "settled" else "manual"}
    rows = []
    for g in view.groups:
        for member in g.members:
            protocol = _member_protocol(member)
            row: dict[str, Any] = {"member": member, "group": g.name, "protocol": protocol,
                                   "protocol_label": PROTOCOL_LABELS.get(protocol, protocol),
                                   **_NO_DETAIL}
            row.update(amqp091.get(member, {}))
            rows.append(row)
    return rows


def queue_list(broker: Broker, rates: QueueRates) -> dict[str, Any]:
    """Every queue with its rates, and the totals the page's head shows."""
    views = broker.queues.views()
    per_queue = rates.update(views)
    declared = _declared(broker)
    rows = [queue_row(v, per_queue.get(v.name), declared.get(v.name)) for v in views]
    # A dead-letter queue right below its origin queue.
    rows.sort(key=lambda r: (r["origin"] or r["name"], r["dead_letter"]))
    plain = [r for r in rows if not r["dead_letter"]]
    return {"items": rows, "totals": {
        "queues": len(plain), "dead_letter_queues": len(rows) - len(plain),
        "messages": sum(r["depth"] for r in plain),
        "dead_letters": sum(r["depth"] for r in rows if r["dead_letter"]),
        "bytes": sum(r["bytes"] for r in rows)}}


def find_queue(broker: Broker, name: str) -> QueueView | None:
    for view in broker.queues.views():
        if view.name == name:
            return view
    return None


def _message_row(m: QueueMessageView) -> dict[str, Any]:
    # (a body in storage only, past --queue-memory-budget, is not read back to show it)
    return {"offset": m.offset, "topic": m.topic,
            "size": m.size if m.in_storage_only else len(m.payload),
            "timestamp": m.timestamp, "qos": m.qos, "publisher": m.publisher,
            "user_properties": [list(kv) for kv in m.user_properties],
            "in_storage_only": m.in_storage_only,
            "preview": "(in storage only: not read back to show it)" if m.in_storage_only
            else payload_preview(m.payload)}


def queue_detail(broker: Broker, view: QueueView, rates: QueueRates, start: int,
                 limit: int, browse: bool = True) -> dict[str, Any]:
    """One queue: its figures, groups and a page of its messages from ``start``
    (without ``browse`` no messages: the figures' live region refreshes every second
    and shows none, and a browse deep into a long log is not free).

    ``browse.head``: the page starts at the oldest message, so the page refreshes it
    live (a browse from the head reads ``limit`` messages, whatever the log's
    length); a page further on stays as loaded."""
    row = queue_row(view, rates.update([view], every=False).get(view.name),
                    _declared(broker).get(view.name))
    row["consumers"] = queue_consumers(broker, view)
    limit = min(max(1, limit), MAX_BROWSE)
    head = start <= view.first
    start = min(max(start, view.first), view.next)
    messages = broker.queues.browse(view.name, start, limit) if browse else []
    row["group_list"] = [_group(g) for g in view.groups]
    row["messages"] = [_message_row(m) for m in messages]
    more = bool(messages) and len(messages) == limit and messages[-1].offset + 1 < view.next
    row["browse"] = {"start": start, "limit": limit, "head": head,
                     "next": messages[-1].offset + 1 if more else None}
    return row


def message_detail(broker: Broker, name: str, offset: int, mode: str) -> dict[str, Any] | None:
    """One message of a queue, with its payload as text, JSON or hex (as retained)."""
    found = broker.queues.browse(name, offset, 1)
    if not found or found[0].offset != offset:
        return None
    m = found[0]
    row = _message_row(m)
    row["queue"] = name
    row["view"] = payload_view(m.payload, mode)
    row.update(payload_json(m.payload))
    return row


# -- actions ----------------------------------------------------------------------------


def _bound(raw: str, what: str) -> float | None:
    """A retention bound from a form: empty, ``none`` or 0 is no bound; else a
    positive number."""
    raw = raw.strip()
    if raw in ("", "none", "0"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ActionError(400, f"{what} must be a positive number (empty: no bound)")
    return value


def _whole(raw: str, what: str) -> int | None:
    value = _bound(raw, what)
    if value is not None and value != int(value):
        raise ActionError(400, f"{what} must be a whole number (empty: no bound)")
    return None if value is None else int(value)


def _levels(raw: str, current: int | None) -> int | None:
    """Priority levels from a form: empty keeps ``current`` (a caller that does not
    send it changes nothing), 0 or ``none`` is none, else 1 to 255."""
    raw = raw.strip()
    if not raw:
        return current
    if raw == "none":
        return None
    if not raw.isdigit() or int(raw) > 255:
        raise ActionError(400, "max priority must be a whole number from 0 (none) to 255")
    return int(raw) or None


async def _durable(d: Deferred[None] | None) -> None:
    if d is not None:
        await d


class QueueActions:
    """Purge, delete, requeue dead letters and set retention, audited with the
    console user (``audit`` is ``ConsoleActions.audit``)."""

    def __init__(self, broker: Broker, audit: Callable[..., None]) -> None:
        self.broker = broker
        self.audit = audit

    def _existing(self, name: str) -> QueueView:
        if not name:
            raise ActionError(400, "no queue name given")
        view = find_queue(self.broker, name)
        if view is None:
            raise ActionError(404, f"no queue {name!r}")
        return view

    async def purge(self, user: str, name: str) -> ActionResult:
        view = self._existing(name)
        await _durable(self.broker.queues.purge(name))
        self.audit(user, "queue-purge", f"purged {view.depth}", queue=name)
        return ActionResult(f"Purged {view.depth} message(s) from {name}.",
                            {"purged": view.depth})

    async def delete(self, user: str, name: str) -> ActionResult:
        view = self._existing(name)
        await _durable(self.broker.queues.delete(name))
        self.audit(user, "queue-delete", f"deleted with {view.depth} message(s) and "
                   f"{len(view.groups)} group(s)", queue=name)
        return ActionResult(f"Deleted queue {name} ({view.depth} message(s), "
                            f"{len(view.groups)} group(s)).", {"deleted": True,
                                                               "messages": view.depth})

    async def requeue(self, user: str, name: str, offset: str) -> ActionResult:
        """Dead letters of ``name`` (``$dlq/<q>``, or ``<q>`` for its dead-letter
        queue) back to their origin: the one at ``offset``, or all of them."""
        dlq = name if name.startswith(DLQ_PREFIX) or not name else DLQ_PREFIX + name
        self._existing(dlq)
        one: int | None = None
        if offset.strip():
            if not offset.strip().isdigit():
                raise ActionError(400, "offset must be a whole number (empty: all)")
            one = int(offset)
        moved, d = self.broker.queues.requeue(dlq, one)
        if one is not None and moved == 0:
            raise ActionError(404, f"no message at offset {one} in {dlq!r}")
        await _durable(d)
        which = f"offset {one}" if one is not None else "all"
        self.audit(user, "queue-requeue", f"requeued {moved}", queue=dlq, which=which)
        return ActionResult(f"Requeued {moved} message(s) from {dlq} to their origin queue.",
                            {"requeued": moved})

    async def retention(self, user: str, name: str, max_age: str, max_bytes: str,
                        max_messages: str, max_priority: str = "") -> ActionResult:
        """Retention bounds and priority levels (``core.queues.priority``)."""
        view = self._existing(name)
        retention = Retention(_bound(max_age, "max age (seconds)"),
                              _whole(max_bytes, "max bytes"),
                              _whole(max_messages, "max messages"),
                              _levels(max_priority, view.retention.max_priority))
        await _durable(self.broker.queues.set_retention(name, retention))
        shown = ", ".join(f"{k}={'none' if v is None else v}"
                          for k, v in _retention(retention).items())
        self.audit(user, "queue-retention", "set " + shown, queue=name)
        return ActionResult(f"Retention of {name}: {shown}.", {"retention":
                                                               _retention(retention)})
