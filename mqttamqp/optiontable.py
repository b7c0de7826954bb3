"""The table of ``twistd mqttamqp``'s options: every flag and parameter with its
default, its help text and the check of its value.  ``mqttamqp.options.Options``
reads it and validates across options; the order here is the order of ``--help``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.python import usage

from mqttamqp.core.limits import Limits

__all__ = ["DEFAULT_LISTENERS", "FLAGS", "METRICS_DEFAULT", "PARAMETERS", "endpoint", "MB"]

class _NoReactor:
    """Stands in for the reactor while a description is parsed: parsers only keep it."""




_D = Limits()
MB = 1 << 20
# Loopback only, as Mosquitto 2 without a configuration: opening the broker to other
# machines is a decision (give a listener, e.g. --mqtt tcp:1883, and --users).
DEFAULT_LISTENERS = {"mqtt": "tcp:1883:interface=127.0.0.1",
                     "amqp": "tcp:5672:interface=127.0.0.1",
                     "web": "tcp:8080:interface=127.0.0.1",
                     "mqtt-ws": "tcp:8083:interface=127.0.0.1"}


def _positive(kind: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def check(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise usage.UsageError(f"--{name} must be a number, got {value!r}") from None
        if number < 0:
            raise usage.UsageError(f"--{name} must not be negative")
        return number
    check.coerceDoc = ""  # type: ignore[attr-defined]
    return check


def _within(name: str, low: int, high: int) -> Callable[[str], int]:
    """An integer option from ``low`` to ``high`` (a 0.9.1 tune field's size)."""
    def check(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise usage.UsageError(f"--{name} must be a number, got {value!r}") from None
        if not low <= number <= high:
            raise usage.UsageError(f"--{name} must be from {low} to {high}, got {number}")
        return number
    check.coerceDoc = ""  # type: ignore[attr-defined]
    return check


def _duration(name: str) -> Callable[[str], float]:
    def check(value: str) -> float:
        from mqttamqp.queuesfile import seconds

        try:
            return seconds(value, "--" + name)
        except ValueError as e:
            raise usage.UsageError(str(e)) from None
    check.coerceDoc = ""  # type: ignore[attr-defined]
    return check


def _choice_share(value: str) -> str:
    from mqttamqp.core.routing.shared import STRATEGIES

    if value not in STRATEGIES:
        raise usage.UsageError(f"--share-strategy must be one of {', '.join(STRATEGIES)}, "
                               f"got {value!r}")
    return value


_choice_share.coerceDoc = ""  # type: ignore[attr-defined]


def _example_listener(option: str) -> str:
    """An example description for ``--option`` (its default; metrics has its own)."""
    return DEFAULT_LISTENERS.get(option) or METRICS_DEFAULT


def endpoint(option: str, description: str) -> str:
    """``description`` if Twisted can parse it as a server endpoint (or it is
    'none'); otherwise a ``UsageError`` naming the option.  Parsing opens nothing."""
    if description.strip().lower() == "none":
        return description
    if description.strip().lower().startswith("haproxy:"):
        # Twisted parses it, but every client would be the proxy: admission, bans,
        # --max-connect-rate and loopback-only access key on the client's address,
        # which the PROXY header gives only after the connection was admitted.
        raise usage.UsageError(
            f"--{option} {description!r}: the PROXY protocol (haproxy:) is not supported: "
            "the broker would see every client as the proxy's address; listen with "
            f"tcp: or ssl: (e.g. {_example_listener(option)})")
    from twisted.internet import endpoints

    try:
        endpoints.serverFromString(_NoReactor(), description)
    except Exception as e:
        reason = str(e) or type(e).__name__
        raise usage.UsageError(
            f"--{option} {description!r} is not a Twisted endpoint description: {reason} "
            f"(e.g. {_example_listener(option)})") from None
    return description


# -- operations (issue 14): metrics, health, OpenTelemetry, log format -------------

METRICS_DEFAULT = "tcp:9108:interface=127.0.0.1"


def _metrics_endpoint(description: str) -> str:
    return endpoint("metrics", description)


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.lower() not in choices:
            raise usage.UsageError(f"--{name} must be one of {', '.join(choices)}, "
                                   f"got {value!r}")
        return value.lower()
    check.coerceDoc = ""  # type: ignore[attr-defined]
    return check


_OPS_PARAMETERS: list[list[Any]] = [
    ["metrics", None, METRICS_DEFAULT,
     "Listener for /metrics (Prometheus), /healthz and /readyz, served without a login: "
     "keep it on loopback or a private network ('none' turns it off).",
     _metrics_endpoint],
    ["metrics-token-file", None, None,
     "Also serve /metrics on the console listener (--web), to requests with "
     "'Authorization: Bearer TOKEN', TOKEN being this file's content."],
    ["otel-endpoint", None, None,
     "Also export the metrics through OpenTelemetry's OTLP/HTTP exporter to this URL "
     "(e.g. http://127.0.0.1:4318/v1/metrics); needs pip install '.[otel]'."],
    ["otel-interval", None, 60.0, "Seconds between OpenTelemetry exports.",
     _positive(float, "otel-interval")],
    ["log-format", None, "text", "Log lines as 'text' (twistd's) or 'json' (one object a "
     "line, fields time, level, namespace, event, client, remote, reason).",
     _choice("log-format", ("text", "json"))],
    ["log-level", None, None, "Least level logged: debug, info, warn, error or critical "
     "(default: everything, as twistd logs).",
     _choice("log-level", ("debug", "info", "warn", "error", "critical"))],
]


FLAGS: list[list[Any]] = [
    ["archive", None, "Archive every message and event as Parquet (the default)."],
    ["no-archive", None, "Do not archive messages and events."],
    ["strict-mqtt31", None,
     "Refuse MQTT 3.1 client ids longer than 23 characters (CONNACK 2), as the 3.1 "
     "specification says; by default they are accepted up to MQTT 3.1.1's limits."],
    ["allow-control-chars", None,
     "Accept control characters (U+0001-U+001F, U+007F-U+009F) in MQTT client ids, "
     "user names, will topics, topic names and filters; by default they close the "
     "connection."],
    ["no-shared-subscriptions", None,
     "Refuse $share/<group>/<filter> subscriptions (MQTT 5: 0x9E, and CONNACK says "
     "they are not available; 3.1.1: 0x80)."],
    ["no-wildcard-subscriptions", None,
     "Refuse subscriptions with + or # (MQTT 5: 0xA2, announced in CONNACK; "
     "3.1.1: 0x80)."],
    ["no-subscription-identifiers", None,
     "Refuse MQTT 5 SUBSCRIBEs that carry a subscription identifier (0xA1; "
     "announced in CONNACK)."],
    ["allow-anonymous", None,
     "Accept anonymous clients (no user name) from any address, even when client "
     "users exist (by default: only from loopback and only while there are no "
     "client users, as Mosquitto 2 without a configuration)."],
    ["ha", None,
     "High availability with --storage postgresql://...: start the same command on "
     "two boxes; one serves, the other is the standby (listeners closed, /readyz 503 "
     "'standby') and takes over when the leader's database lock goes. See docs/ha.md."],
    ["tls-require-client-cert", None,
     "With --tls-ca: refuse TLS clients without a valid client certificate (during "
     "the handshake, on every ssl: listener)."],
    ["tls-cert-as-user", None,
     "With --tls-ca: the common name (CN) of an MQTT client's verified certificate is "
     "its user name, and the certificate authenticates it without a password (the "
     "--users file is not consulted for it); clients without a certificate "
     "authenticate as usual."],
    ["print-config", None,
     "Print the effective configuration (the --config file with the command line "
     "applied, defaults filled in) as TOML, and exit."],
]


PARAMETERS: list[list[Any]] = [
    ["config", None, None,
     "TOML file holding any of these options by their long names (lists as arrays, "
     "webhooks as [[webhook]] tables; see mqttamqp.toml). Options on the command "
     "line win. SIGHUP re-reads it and applies what can change live."],
    ["data", "d", "mqttamqp-data",
     "Data directory (ZODB FileStorage mqttamqp.fs lives here); created if missing."],
    ["max-connections", None, _D.max_connections,
     "Refuse sockets beyond this many live connections, counted per protocol "
     "(MQTT and AMQP each; AMQP 1.0 and 0.9.1 together); an MQTT-over-WebSocket "
     "socket counts from its accept, its HTTP upgrade included. The AMQP port's "
     "sockets still waiting for their protocol header are bounded by it too. The "
     "process's descriptor table is grown for it at start (up to ulimit -n).",
     _positive(int, "max-connections")],
    ["max-packet-size", None, _D.max_packet_size,
     "Largest MQTT packet accepted, in bytes; larger ones close the connection.",
     _positive(int, "max-packet-size")],
    ["max-inflight", None, _D.max_inflight,
     "Outbound QoS 1/2 messages in flight per client; the rest wait in order (with "
     "the largest message accepted, it bounds a client's in-flight memory).",
     _positive(int, "max-inflight")],
    ["max-queued-messages", None, _D.max_queued_messages,
     "Messages waiting per session beyond the in-flight window; more are dropped "
     "and counted (a durable queue's message stays in its queue).",
     _positive(int, "max-queued-messages")],
    ["max-queued-bytes", None, _D.max_queued_bytes,
     "Payload bytes waiting per session beyond the in-flight window (a message that "
     "goes straight into the window is never refused, whatever its size); more are "
     "dropped and counted (a durable queue's message stays in its queue, a stream's "
     "reader reads it again, once the window frees).",
     _positive(int, "max-queued-bytes")],
    ["congested-qos0-bytes", None, _D.congested_qos0_bytes,
     "QoS 0 bytes buffered for a client (or link) that stopped reading; more QoS 0 "
     "messages to it are dropped and counted (QoS 1/2 wait in its queue).",
     _positive(int, "congested-qos0-bytes")],
    ["max-subscriptions", None, _D.max_subscriptions,
     "Most topic filters one session may hold; more get SUBACK 0x80 (counted).",
     _positive(int, "max-subscriptions")],
    ["max-retained-messages", None, _D.max_retained_messages,
     "Most retained messages in all; a retained publish beyond it is routed but not "
     "kept (counted).", _positive(int, "max-retained-messages")],
    ["max-retained-bytes", None, _D.max_retained_bytes,
     "Most payload bytes of retained messages in all; beyond it as above.",
     _positive(int, "max-retained-bytes")],
    ["queue-visibility-timeout", None, _D.queue_visibility_timeout,
     "Seconds a durable queue's delivered message stays claimed by its consumer; "
     "unacknowledged by then, it is delivered again (not for AMQP 0.9.1 "
     "consumers: their deliveries stay with the channel).",
     _positive(float, "queue-visibility-timeout")],
    ["queue-max-deliveries", None, _D.queue_max_deliveries,
     "Deliveries of a queue message before it moves to the dead-letter queue "
     "$dlq/<name>.", _positive(int, "queue-max-deliveries")],
    ["queue-prefetch", None, _D.queue_prefetch,
     "Unacknowledged queue messages one consumer may hold (MQTT; an AMQP "
     "consumer's credit counts too).", _positive(int, "queue-prefetch")],
    ["queue-max-messages", None, _D.queue_max_messages,
     "Messages a durable queue keeps; beyond it the oldest go (counted); 0 = no "
     "bound. --queues sets it per queue.", _positive(int, "queue-max-messages")],
    ["queue-max-bytes", None, _D.queue_max_bytes,
     "Payload bytes a durable queue keeps, as above.",
     _positive(int, "queue-max-bytes")],
    ["queue-max-age", None, _D.queue_max_age,
     "Oldest a durable queue's message may be, in seconds (or 30m, 12h, 7d); 0 = "
     "no bound.", _duration("queue-max-age")],
    ["queue-max-queues", None, _D.queue_max_queues,
     "Most durable queues (dead-letter queues included); a publish or consumer "
     "that would create one more is refused.", _positive(int, "queue-max-queues")],
    ["max-exchanges", None, _D.max_exchanges,
     "Most AMQP 0.9.1 exchanges declared (the amq.* ones not counted); a declare "
     "past it is refused (406, counted, logged).", _positive(int, "max-exchanges")],
    ["max-bindings", None, _D.max_bindings,
     "Most AMQP 0.9.1 bindings (queue and exchange-to-exchange) in all; a bind past "
     "it is refused (406, counted, logged).", _positive(int, "max-bindings")],
    ["queue-memory-budget", None, _D.queue_memory_budget // MB,
     "MB of durable queue message bodies held in memory in all; beyond it the "
     "bodies farthest from any consumer stay in storage only and are read back as "
     "consumers reach them; 0 = no budget (every body in memory).",
     _positive(int, "queue-memory-budget")],
    ["queue-max-total-bytes", None, _D.queue_max_total_bytes,
     "Payload bytes all durable queues may store together; at it, publishers to "
     "$queue/ are blocked (MQTT: held; AMQP: no credit; MQTT 5 QoS 1/2: 0x97) until "
     "consumers bring it under 90 %; 0 = no bound.",
     _positive(int, "queue-max-total-bytes")],
    ["disk-free-limit", None, _D.disk_free_limit // MB,
     "MB the storage's file system (the data directory's, or that of the "
     "--storage file or SQLite directory) must keep free; below it publishers to "
     "$queue/ are blocked as above until it has this and a tenth more free "
     "(checked every 2 s); 0 = no watermark.", _positive(int, "disk-free-limit")],
    ["queues", None, None,
     "TOML file of per-queue retention and priority levels: [[queue]] tables with "
     "pattern, max-age, max-bytes, max-messages, max-priority (see docs/queues.md)."],
    ["max-connect-rate", None, _D.max_connect_rate,
     "New connections a second from one address (MQTT and AMQP together; loopback "
     "is not limited); beyond it, after a burst of --connect-burst, sockets are closed "
     "at once (counted; an MQTT-over-WebSocket socket at its accept, one token for its "
     "upgrade and its MQTT connection). 0 = no limit.",
     _positive(float, "max-connect-rate")],
    ["connect-burst", None, _D.connect_burst,
     "How many connections one address may open at once before "
     "--max-connect-rate applies.", _positive(int, "connect-burst")],
    ["max-publish-rate", None, _D.max_publish_rate,
     "Messages a second one client (an MQTT or AMQP connection) may publish; beyond "
     "it the client is not read for a while (counted). 0 = no limit.",
     _positive(float, "max-publish-rate")],
    ["max-publish-byte-rate", None, _D.max_publish_byte_rate,
     "Payload bytes a second one client may publish; as above. 0 = no limit.",
     _positive(float, "max-publish-byte-rate")],
    ["connect-timeout", None, _D.connect_timeout,
     "Seconds a new socket has to send CONNECT.", _positive(float, "connect-timeout")],
    ["close-grace", None, _D.close_grace,
     "Seconds a connection the broker, a gateway or a bridge closes has to read what "
     "was written before and close; then it is cut (counted: "
     "$SYS/broker/limits/close_grace, the gateway's figures; one line a minute).",
     _positive(float, "close-grace")],
    ["session-expiry", None, _D.session_expiry,
     "Seconds after which an offline persistent session is deleted; 0 = never.",
     _positive(float, "session-expiry")],
    ["max-keepalive", None, _D.max_keepalive,
     "MQTT 5: the longest keepalive (seconds) a client may use; a longer one, or "
     "0, is replaced by this in CONNACK (server keep alive). 0 = no limit.",
     _positive(int, "max-keepalive")],
    ["response-information", None, _D.response_information,
     "MQTT 5: the response information (a topic prefix, followed by the client id) "
     "given to clients that request it; empty = none."],
    ["will-grace", None, _D.will_grace,
     "After a restart, seconds to wait for clients that were connected before "
     "publishing their wills.", _positive(float, "will-grace")],
    ["stall-timeout", None, _D.stall_timeout,
     "Longest a publisher is not read while subscribers it feeds catch up; a "
     "subscriber that made no progress in that time stops slowing publishers "
     "(its queue then drops at its limit, counted).",
     _positive(float, "stall-timeout")],
    ["max-topic-levels", None, _D.max_topic_levels,
     "Most levels ('/'-separated parts) in an MQTT topic name or filter; more close "
     "the connection.", _positive(int, "max-topic-levels")],
    ["max-topic-length", None, _D.max_topic_length,
     "Longest MQTT topic name or filter, in UTF-8 bytes; longer ones close the "
     "connection.", _positive(int, "max-topic-length")],
    ["max-user-properties", None, _D.max_user_properties,
     "MQTT 5: most user properties in one packet (a will's properties count apart); "
     "more close the connection with reason code 0x97 (CONNACK 0x97 for a CONNECT).",
     _positive(int, "max-user-properties")],
    ["max-user-property-bytes", None, _D.max_user_property_bytes,
     "MQTT 5: most bytes of user property names and values together (UTF-8) in one "
     "packet; as above.", _positive(int, "max-user-property-bytes")],
    ["max-subscribe-filters", None, _D.max_subscribe_filters,
     "Most topic filters in one SUBSCRIBE (a client with more sends more "
     "SUBSCRIBEs); more close the connection (MQTT 5: reason code 0x97).",
     _positive(int, "max-subscribe-filters")],
    ["mqtt-turn-ms", None, _D.mqtt_turn * 1000,
     "Longest (milliseconds) one MQTT connection's input is handled in one turn of "
     "the event loop; the rest waits for a later turn, after the other connections' "
     "input, and the connection is not read meanwhile. 0 = no bound.",
     _positive(float, "mqtt-turn-ms")],
    ["sys-interval", None, _D.sys_interval,
     "Seconds between $SYS/broker/... bursts (the uptime, and the topics that "
     "changed); 0 = off.", _positive(float, "sys-interval")],
    ["amqp-idle-timeout", None, 60.0,
     "Seconds of silence after which an AMQP peer is closed "
     "(amqp:resource-limit-exceeded); half of it is advertised. 0 = none.",
     _positive(float, "amqp-idle-timeout")],
    ["amqp-max-sessions", None, _D.amqp_max_sessions,
     "Most sessions on one AMQP connection; a peer that begins more is closed.",
     _positive(int, "amqp-max-sessions")],
    ["amqp-max-links", None, _D.amqp_max_links,
     "Most links attached at a time on one AMQP connection (refused ones count "
     "until detached); beyond, the attach is refused with "
     "amqp:resource-limit-exceeded and the connection stays (one that holds more refused "
     "links than this, at least 64, or keeps one attached over "
     "--amqp-refused-link-grace and attaches again, is closed).", _positive(int, "amqp-max-links")],
    ["amqp-refused-link-grace", None, _D.amqp_refused_link_grace,
     "Seconds a link refused for --amqp-max-links may stay attached; the next attach "
     "over the limit after that closes the connection (counted, "
     "$SYS/broker/limits/amqp_refused_links; logged, one line a minute at most).",
     _positive(float, "amqp-refused-link-grace")],
    ["amqp-max-links-total", None, _D.amqp_max_links_total,
     "Most links attached at a time on all AMQP connections together (refused ones "
     "count until detached; 3-5 KB each); beyond, an attach is refused with "
     "amqp:resource-limit-exceeded and the connection stays.",
     _positive(int, "amqp-max-links-total")],
    ["amqp-max-default-outcomes", None, _D.amqp_max_default_outcomes,
     "Failed attempts of one message on a gateway's $mqtt.to.<id>.publish (or of its "
     "AMQP_PUBREL) after which one more settlement without an outcome drops it, "
     "counted as rejected and logged (a peer that never gives an outcome would loop).",
     _positive(int, "amqp-max-default-outcomes")],
    ["amqp-max-held-bytes", None, _D.amqp_max_held_bytes,
     "Most bytes of unfinished (multi-frame) incoming messages the broker holds for "
     "one AMQP connection; a peer that sends more is closed "
     "(amqp:resource-limit-exceeded). At least --max-packet-size.",
     _positive(int, "amqp-max-held-bytes")],
    ["amqp-max-selector-length", None, _D.amqp_max_selector_length,
     "Longest selector (apache.org:selector-filter:string) an AMQP receiver may "
     "attach with, in characters; a longer one refuses that link "
     "(amqp:invalid-field) and the connection stays.",
     _positive(int, "amqp-max-selector-length")],
    ["max-transactions-per-connection", None, _D.max_transactions_per_connection,
     "Most local transactions (AMQP 1.0 coordinator, AMQP 0.9.1 tx) open at a time "
     "on one connection; another declare is refused (AMQP 1.0: "
     "amqp:resource-limit-exceeded) and the connection stays. 0 = no bound.",
     _positive(int, "max-transactions-per-connection")],
    ["max-transaction-bytes", None, _D.max_transaction_bytes,
     "Most bytes of work one transaction holds until its commit (whole message "
     "sizes, properties included, 64 bytes per action); beyond, the work is "
     "refused and the transaction can only roll back. 0 = no bound.",
     _positive(int, "max-transaction-bytes")],
    ["upstream", None, None,
     "Gateway mode: serve the MQTT listeners through the core at this AMQP 1.0 "
     "address (amqp://[USER[:PASSWORD]@]HOST[:PORT], or amqps://... with "
     "?server-name=NAME&ca=FILE to check its certificate), keeping no state here: no "
     "store or AMQP listener is started, the console (--web) and metrics show the "
     "gateway, and the broker's options it does not use are refused (see "
     "docs/gateway.md)."],
    ["upstream-connections", None, 2,
     "Gateway mode: AMQP connections to the core that the MQTT clients share (a "
     "session each; the core's --amqp-max-sessions bounds the clients on one).",
     _positive(int, "upstream-connections")],
    ["upstream-max-clients", None, 150,
     "Gateway mode: most clients on one upstream connection (each takes a session and "
     "up to 6 links: keep it under the core's --amqp-max-links / 6 and "
     "--amqp-max-sessions); with every connection full, CONNECT gets \"server "
     "unavailable\" (counted, logged).", _positive(int, "upstream-max-clients")],
    ["amqp091-channel-max", None, 2047,
     "AMQP 0.9.1: most channels one connection may open (connection.tune's "
     "channel_max, 1 to 65535); a channel over it closes the connection with 504.",
     _within("amqp091-channel-max", 1, 65535)],
    ["amqp091-frame-max", None, 131072,
     "AMQP 0.9.1: largest frame in bytes (connection.tune's frame_max, at least "
     "4096, at most 4294967295); a larger frame closes the connection with 501.",
     _within("amqp091-frame-max", 4096, (1 << 32) - 1)],
    ["amqp091-heartbeat", None, 60,
     "AMQP 0.9.1: heartbeat interval in seconds the broker proposes (the client's "
     "tune-ok decides; 0 = none, at most 65535); a client silent for two intervals "
     "is dropped.", _within("amqp091-heartbeat", 0, 65535)],
    ["amqp091-max-unacked", None, 10000,
     "AMQP 0.9.1: most unacknowledged deliveries on one channel whatever its "
     "prefetch (basic.qos 0 means no prefetch bound); its consumers get no more "
     "until acknowledgements come.", _positive(int, "amqp091-max-unacked")],
    ["amqp091-max-body", None, 16 << 20,
     "AMQP 0.9.1: largest message body in bytes a publisher may send (held whole "
     "while it arrives); a larger one closes the channel with 406 "
     "PRECONDITION_FAILED, the connection stays.", _positive(int, "amqp091-max-body")],
    ["share-strategy", None, "round-robin",
     "How a shared subscription ($share/<group>/<filter>) picks the member for each "
     "message: round-robin, random, sticky (one member while it is online) or "
     "hash-client (by the publisher's client id).", _choice_share],
    ["users", None, None,
     "A users file of earlier versions (one user:scrypt-hash per line), read as "
     "client users beside the user store DATA/users.json (mqttamqp-admin user "
     "add|import). With client users, MQTT CONNECT and AMQP SASL PLAIN must name "
     "one of them and anonymous clients are refused (see --allow-anonymous)."],
    ["acl", None, None,
     "Access control list file (Mosquitto's format: 'user NAME', 'topic "
     "[read|write|readwrite] FILTER', 'pattern ... %u %c'; see docs/security.md). "
     "With it, only what it grants is allowed; it is re-read when it changes."],
    ["tls-ca", None, None,
     "PEM file of the CA certificates that sign client certificates: every ssl: "
     "listener asks TLS clients for a certificate and refuses one that does not "
     "verify against them (see --tls-require-client-cert, --tls-cert-as-user)."],
    ["storage", None, None,
     "Where the durable state lives, as a URI: file://PATH (ZODB FileStorage; the "
     "default is DATA/mqttamqp.fs), sqlite://[/DIR] (RelStorage on SQLite, "
     "history-free; default DIR is DATA/sqlite), postgresql://USER@HOST:PORT/DB "
     "(RelStorage on PostgreSQL, history-free) or memory:// (nothing survives a "
     "restart). See docs/durability.md."],
    ["ha-poll", None, 1.0,
     "With --ha: seconds between the standby's attempts to take the serving lock "
     "(a takeover waits at most this long once the leader's lock is gone).",
     _positive(float, "ha-poll")],
    ["ha-watch", None, 1.0,
     "With --ha: seconds between the leader's checks (SELECT 1) of its lock's "
     "connection; when one fails it stops acknowledging and exits.",
     _positive(float, "ha-watch")],
    ["pack-interval", None, 24.0,
     "Hours between packs of the storage; 0 = never.", _positive(float, "pack-interval")],
    ["pack-growth", None, 24.0,
     "Pack the storage whenever it has grown by this many MB since the last pack "
     "(checked every 2 s), so that it stays near twice its live state in steady "
     "flow; 0 = only every --pack-interval.", _positive(float, "pack-growth")],
    ["archive-dir", None, None,
     "Directory of the Parquet archive (default DATA/archive)."],
    ["archive-payload-bytes", None, 256,
     "Payload bytes archived per message; 0 = none.",
     _positive(int, "archive-payload-bytes")],
    ["archive-roll", None, 60.0,
     "Seconds after which an archive segment is closed (also at 64 MB).",
     _positive(float, "archive-roll")],
    ["archive-days", None, 30,
     "Days of archive kept (older hour partitions are deleted); 0 = forever.",
     _positive(int, "archive-days")],
    ["archive-buffer", None, 65536,
     "Messages, and as many events, the archive buffers for its writer; past it "
     "records are dropped and counted ($SYS/broker/archive/dropped, one log line "
     "a spell).", _within("archive-buffer", 1, 1 << 24)],
    *_OPS_PARAMETERS,
    ["report-every", None, None,
     "Run mqttamqp-report --incremental as a child process this often (30m, 1h, "
     "1d; off by default). The console's Traffic page can also run it now."],
    ["report-command", None, None,
     "The command run instead of 'python -m mqttamqp.pipeline' (split like a "
     "shell would; --archive, --out and --incremental are appended)."],
]

# Options a gateway (--upstream) has no use for: the core's store, queues, bridges,
# AMQP listeners, archive, ACL, rate limits and the rest of what keeps or judges state.
# Given with --upstream (on the command line or in --config), start-up stops with one
# line naming them (``options.check_gateway``) rather than ignoring them silently.
GATEWAY_IGNORES: tuple[str, ...] = (
    "storage", "ha", "ha-poll", "ha-watch", "pack-interval", "pack-growth", "bridge",
    "amqp", "amqp-queues", "queues", "webhook", "acl", "tls-ca",
    "tls-require-client-cert", "tls-cert-as-user", "archive", "archive-dir",
    "archive-include", "archive-exclude", "archive-payload-bytes", "archive-roll",
    "archive-days", "archive-buffer", "report-every", "report-command", "metrics-token-file",
    "otel-endpoint", "otel-interval", "share-strategy", "will-grace", "session-expiry",
    "sys-interval", "response-information", "max-connect-rate", "connect-burst",
    "max-publish-rate", "max-publish-byte-rate", "max-queued-messages",
    "max-queued-bytes", "congested-qos0-bytes", "max-subscriptions",
    "max-retained-messages", "max-retained-bytes", "queue-visibility-timeout",
    "queue-max-deliveries",
    "queue-prefetch", "queue-max-messages", "queue-max-bytes", "queue-max-age",
    "queue-max-queues", "max-exchanges", "max-bindings", "queue-memory-budget",
    "queue-max-total-bytes", "disk-free-limit", "amqp-max-sessions", "amqp-max-links",
    "amqp-max-links-total", "amqp-refused-link-grace", "amqp-max-default-outcomes",
    "amqp-max-held-bytes", "amqp-max-selector-length",
    "max-transactions-per-connection", "max-transaction-bytes", "amqp091-channel-max",
    "amqp091-frame-max", "amqp091-heartbeat", "amqp091-max-unacked", "amqp091-max-body",
)
