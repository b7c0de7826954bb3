"""The console's renderings: the core's read model (``mqttamqp.core.readmodel``)
as plain dicts, for the HTML pages and the JSON API alike (one shape for both, so
they cannot drift apart).

Everything here reads frozen views; nothing changes broker state.  The values are raw (client
ids, topics and payloads exactly as clients sent them); escaping is the job of
the templates (Jinja2 autoescape) and of ``json.dumps``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from mqttamqp import __version__
from mqttamqp.core.message import Message
from mqttamqp.core.readmodel import ClientView, EntryView, ReadModel, SessionView, WillView

__all__ = [
    "PROTOCOL_LABELS", "Page", "paginate", "payload_view", "connection_row", "client_detail",
    "session_row", "session_detail", "retained_row", "retained_detail", "will_json",
    "overview", "list_clients", "list_sessions", "list_retained", "CLIENT_SORTS", "SESSION_SORTS",
    "payload_preview", "session_json",
]

PROTOCOL_LABELS = {"mqtt3.1": "MQTT 3.1", "mqtt3.1.1": "MQTT 3.1.1", "mqtt5": "MQTT 5",
                   "amqp": "AMQP 1.0"}
PREVIEW_BYTES = 256
PAGE_SIZES = (25, 50, 100, 200)
MAX_PAYLOAD_VIEW = 256 * 1024

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


# -- payloads ---------------------------------------------------------------------


def _is_text(payload: bytes) -> str | None:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 32 and c not in "\t\r\n" for c in text):
        return None
    return text


def _hex(payload: bytes) -> str:
    """Hex dump: 16 bytes a line, offset, hex and printable ASCII."""
    lines = []
    for i in range(0, len(payload), 16):
        chunk = payload[i:i + 16]
        hexpart = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:08x}  {hexpart:<47}  {text}")
    return "\n".join(lines)


def payload_view(payload: bytes, mode: str = "auto", limit: int = MAX_PAYLOAD_VIEW
                 ) -> dict[str, Any]:
    """How to show ``payload``: mode is text, hex or json ("auto" picks one).

    The result has the mode actually used, the text to show, whether it was cut at
    ``limit`` bytes, and which modes are possible.
    """
    truncated = len(payload) > limit
    shown = payload[:limit]
    text = _is_text(shown)
    pretty: str | None = None
    if text is not None and not truncated:
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False,
                                sort_keys=False)
        except ValueError:
            pretty = None
    modes = ["hex"]
    if text is not None:
        modes.insert(0, "text")
    if pretty is not None:
        modes.insert(1, "json")
    if mode not in modes:
        mode = "json" if pretty is not None else ("text" if text is not None else "hex")
    body = {"text": text, "json": pretty, "hex": _hex(shown)}[mode]
    return {"mode": mode, "body": body or "", "truncated": truncated, "modes": modes,
            "size": len(payload)}


def payload_preview(payload: bytes, limit: int = 80) -> dict[str, Any]:
    """A one-line preview: text if it is text, else hex; cut at ``limit`` chars."""
    text = _is_text(payload[:PREVIEW_BYTES])
    if text is not None:
        one_line = " ".join(text.split())
        return {"kind": "text", "value": one_line[:limit],
                "cut": len(one_line) > limit or len(payload) > PREVIEW_BYTES}
    hexed = binascii.hexlify(payload[:limit // 2], " ").decode()
    return {"kind": "hex", "value": hexed, "cut": len(payload) > limit // 2}


def _payload_json(payload: bytes) -> dict[str, Any]:
    return {"payload_base64": base64.b64encode(payload).decode(),
            "payload_text": _is_text(payload), "size": len(payload)}


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
        **_payload_json(will.payload),
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
    }


def client_detail(client: ClientView) -> dict[str, Any]:
    row = connection_row(client)
    row["session"] = session_json(client.session) if client.session is not None else None
    row["wills"] = [will_json(w) for w in client.wills]
    row["link_list"] = [asdict(link) for link in client.info.links]
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
}


def _matches(query: str, *values: str | None) -> bool:
    return any(v is not None and query in v.lower() for v in values)


def list_clients(model: ReadModel, query: str = "", sort: str = "client_id",
                 desc: bool = False, page: int = 1, per_page: int = 50) -> Page:
    """Filter, sort and page all live connections (MQTT and AMQP) server-side."""
    rows = [connection_row(client) for client in model.clients()]
    q = query.strip().lower()
    if q:
        rows = [r for r in rows if _matches(q, r["client_id"], r["remote"], r["user"])]
    key = CLIENT_SORTS.get(sort, CLIENT_SORTS["client_id"])
    rows.sort(key=key, reverse=desc)
    return paginate(rows, page, per_page, lambda r: r)


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
    row.update(_payload_json(message.payload))
    return row


def list_retained(messages: Iterable[Message], page: int, per_page: int) -> Page:
    return paginate(list(messages), page, per_page, retained_row)


# -- overview ---------------------------------------------------------------------


def overview(context: Any, model: ReadModel, now: float, rates: dict[str, float],
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
            "amqp": c.amqp_connections,
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
            "publish_denied": c.publish_denied,
            "wills_published": c.wills_published,
            "protocol_errors": c.protocol_errors,
        },
        "bytes": {"received": c.bytes_received, "sent": c.bytes_sent},
        "archive": dict(c.archive) or None,
        "health": {"storage": "failing" if c.storage_failing else "ok",
                   "storage_failures": c.storage_failures,
                   "storage_error": c.storage_error if c.storage_failing else ""},
    }
    if include_storage:
        out["listeners"] = context.listeners()
        out["storage"] = context.storage_stats()
    return out
