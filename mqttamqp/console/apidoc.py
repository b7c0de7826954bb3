"""The JSON API's index (``GET /api/``): every route under ``/api/`` the Klein
app has, with its methods, what it does and its parameters.

The list of routes comes from the app's URL map, so a new route is listed even
before it is described here (with an empty description); ``ENDPOINTS`` holds
the descriptions.  docs/console.md, "JSON API", says the same for people.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENDPOINTS", "api_index"]

_LIST = "q (search), sort, dir=asc|desc, page, per_page (25, 50, 100, 200)"

# path -> (description, parameters)
ENDPOINTS: dict[str, tuple[str, str]] = {
    "/api/": ("This index.", ""),
    "/api/overview": ("Counters, rates, listeners, storage and the last five minutes of "
                      "message rates (history).", ""),
    "/api/clients": ("Connected MQTT and AMQP clients, filtered, sorted and paged; each "
                     "with message and byte counters, rates and last activity.",
                     _LIST + ", protocol=mqtt|mqtt3.1|mqtt3.1.1|mqtt5|amqp|"
                     "amqp0-9-1, user (substring; "
                     "- for none), remote (substring), kind=clean|persistent, will=yes|no"),
    "/api/client": ("One client: connection, session, subscriptions, will, in-flight and "
                    "queued messages, AMQP links, sessions and negotiated settings.",
                    "key=<connection key> or session=<client id>"),
    "/api/sessions": ("Persistent sessions, online and offline.",
                      _LIST + ", state=all|online|offline"),
    "/api/retained": ("Retained messages matching a filter, paged.", "filter, page, per_page"),
    "/api/retained/message": ("One retained message with its payload (text, JSON or hex).",
                              "topic, view=auto|text|json|hex"),
    "/api/retained/count": ("How many retained messages match a filter.", "filter"),
    "/api/wills": ("Stored wills (MQTT and AMQP).", ""),
    "/api/topics": ("The topic tree one level below a prefix: messages, rates, subscriber "
                    "counts, retained flag (per-topic counts for at most 10,000 topics).",
                    "prefix"),
    "/api/subscriptions": ("Every session's subscriptions and AMQP receivers, searchable.",
                           "q, page, per_page"),
    "/api/bans": ("Bans in force.", ""),
    "/api/shared": ("Shared subscription groups ($share/<group>/<filter>): members, "
                    "whether online, and how many messages each was given.", ""),
    "/api/queues": ("Durable queues ($queue/) and dead-letter queues ($dlq/): depth, bytes, "
                    "oldest message's age, publish and ack rates, dead-letter queue size, "
                    "groups, lag, retention; with totals.", ""),
    "/api/queues/queue": ("One queue: its figures, its consumer groups (members, mode, "
                          "cursor, lag, pending, redeliveries) and a page of its messages "
                          "from an offset (browse.next: where the next page starts).",
                          "name (queue, or $dlq/<queue>), start (offset), limit (50; at "
                          "most 200)"),
    "/api/queues/message": ("One queue message with its payload (text, JSON or hex) and "
                            "user properties.", "name, offset, view=auto|text|json|hex"),
    "/api/queues/purge": ("Remove every message of a queue (its groups stay).", "name"),
    "/api/queues/delete": ("Delete a queue with its messages and groups (a later message "
                           "or consumer creates it anew).", "name"),
    "/api/queues/requeue": ("Move dead letters back to their origin queue as new "
                            "messages: one (offset) or all.",
                            "name ($dlq/<queue> or <queue>), offset (empty: all)"),
    "/api/exchanges": ("AMQP 0.9.1's exchanges (the default one first): type, durable, "
                       "auto-delete, internal, arguments, bindings out and in.", ""),
    "/api/bridges": ("Each [[bridge]]: state, remote, protocol, last error, connected "
                     "since, attempts and failures, messages out and in, what was dropped "
                     "or refused, and the out backlog (messages, bytes, in flight).", ""),
    "/api/exchanges/exchange": ("One exchange with its bindings either way.",
                                "name (empty: the default exchange)"),
    "/api/exchanges/delete": ("Delete a declared exchange with its bindings (not the "
                              "default or amq.* exchanges).", "name"),
    "/api/exchanges/unbind": ("Remove one binding, as the exchanges list shows it.",
                              "source, destination, destination_kind=queue|exchange, "
                              "routing_key, arguments (a JSON object, or one as text; "
                              "empty: none)"),
    "/api/queues/retention": ("Change a queue's retention (messages beyond it go at "
                              "once) and its priority levels.",
                              "name, max_age (seconds), max_bytes, max_messages (each "
                              "empty or 0: no bound), max_priority (0-255, 0: none; "
                              "empty: unchanged)"),
    "/api/users": ("The users with their roles (never their hashes) and the --acl file "
                   "in force (admins only).", ""),
    "/api/whoami": ("Who is calling, how (session or token), and the CSRF token of a "
                    "browser session.", ""),
    "/api/traffic": ("The traffic report (mqttamqp-report's summary) and archive figures.",
                     ""),
    "/api/events": ("Server-Sent Events: history, then stats every second; logout when "
                    "the login ends.", ""),
    "/api/tail": ("Server-Sent Events: messages routed to a filter from now on (open, "
                  "message, tick with skipped counts); at most 50 a second.",
                  "filter, view=auto|text|json|hex"),
    "/api/clients/force-will": ("Publish a client's will; disconnect it unless "
                                "keep_connected.", "key, keep_connected"),
    "/api/clients/disconnect": ("Disconnect a client, with or without its will.",
                                "key, with_will"),
    "/api/clients/debug": ("Log every MQTT packet (AMQP frame) of a client id, now and "
                           "when it connects, for some minutes.",
                           "client_id, minutes (10; 0 stops; at most 60)"),
    "/api/clients/bulk": ("Disconnect, or clear the persistent sessions of, several "
                          "clients; each one is audited.",
                          "action=disconnect|clear-session, keys (list), with_will"),
    "/api/sessions/clear": ("Delete a session (disconnecting its client).", "client_id"),
    "/api/wills/fire": ("Publish a stored will and delete it.", "owner"),
    "/api/wills/discard": ("Delete a stored will without publishing it.", "owner"),
    "/api/retained/delete": ("Delete one retained message.", "topic"),
    "/api/retained/delete-matching": ("Delete the retained messages matching a filter "
                                      "(refused if the count changed from expected).",
                                      "filter, expected"),
    "/api/publish": ("Publish a message.", "topic, payload, encoding=utf-8|hex|base64, qos, "
                     "retain"),
    "/api/bans/add": ("Ban a client id, user name or address (refused at MQTT CONNECT "
                      "and AMQP open); optionally disconnect matching clients.",
                      "kind=client_id|user|address, value, seconds (empty: for good), "
                      "reason, disconnect"),
    "/api/bans/remove": ("Lift a ban.", "kind, value"),
    "/api/traffic/run-report": ("Start the traffic report job now (a child process; "
                                "refused while one runs).", ""),
    "/api/users/add": ("Add a user to the user store (admins only).",
                       "name, role=admin|read-only|client, password"),
    "/api/users/passwd": ("Change a user's password (admins only).", "name, password"),
    "/api/users/role": ("Change a user's role (admins only; not your own, and the last "
                        "admin stays).", "name, role"),
    "/api/users/delete": ("Delete a user (admins only; not yourself, and the last admin "
                          "stays).", "name"),
}


def api_index(url_map: Any) -> dict[str, Any]:
    """Every ``/api/`` route of ``url_map`` (werkzeug's), described."""
    routes: dict[str, set[str]] = {}
    for rule in url_map.iter_rules():
        if rule.rule.startswith("/api/"):
            routes.setdefault(rule.rule, set()).update(
                m for m in (rule.methods or ()) if m in ("GET", "POST"))
    items = []
    for path in sorted(routes):
        description, params = ENDPOINTS.get(path, ("", ""))
        methods = sorted(routes[path])
        items.append({"path": path, "methods": methods, "description": description,
                      "parameters": params,
                      "kind": "action" if methods == ["POST"] else "read"})
    return {
        "auth": "a console login (cookie; POSTs also send X-CSRF-Token) or "
                "Authorization: Bearer <token> from mqttamqp-admin token (read-only tokens "
                "may only GET)",
        "body": "POST parameters as a JSON object (Content-Type: application/json) or "
                "as form fields",
        "errors": "a JSON object {\"error\": ...} with the HTTP status",
        "endpoints": items,
    }
