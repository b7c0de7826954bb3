"""Every bound the broker enforces, with defaults a small site can live with."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    max_connections: int = 10_000
    max_packet_size: int = 1 << 20            # bytes, whole MQTT packet
    max_inflight: int = 32                    # outbound QoS 1/2 per client
    max_queued_messages: int = 1_000          # per session (queued, not in flight)
    max_queued_bytes: int = 16 << 20          # per session, payload bytes
    connect_timeout: float = 10.0             # seconds from accept to CONNECT
    # Seconds a connection being closed (by the broker, a gateway or a bridge) has to
    # read what is left and close; then it is cut (``adapter.grace``).
    close_grace: float = 5.0
    session_expiry: float = 0.0               # seconds offline; 0 = never expire
    will_grace: float = 10.0                  # seconds after a restart before orphan wills fire
    sys_interval: float = 10.0                # $SYS refresh period; 0 = off
    max_client_id_31: int = 23                # MQTT 3.1 rule, enforced only if strict_mqtt31
    strict_mqtt31: bool = False               # else 3.1 ids may be as long as 3.1.1's
    max_topic_levels: int = 200               # levels of a topic name or filter (as Mosquitto)
    max_topic_length: int = 65535             # UTF-8 bytes of a topic name or filter
    allow_control_chars: bool = False         # U+0001-U+001F, U+007F-U+009F in MQTT strings
    # Longest a publisher is not read for the sake of a slow subscriber; one that
    # made no progress in that time stops slowing publishers (it drops at its bound).
    stall_timeout: float = 2.0
    # QoS 0 bytes buffered to a stalled client before dropping
    congested_qos0_bytes: int = 4 << 20
    # One AMQP connection: sessions (channel-max + 1) and links attached at a time;
    # beyond either the connection is closed.
    amqp_max_sessions: int = 32
    amqp_max_links: int = 1_000
    # Links attached to the broker in all (refused ones too, until detached); beyond,
    # an attach is refused.  A link costs 3-5 KB (proton's ~1.4 KB, the broker's
    # objects, a topic receiver's session; ``bench/linkmem.py``): 20,000 stay
    # within ~100 MB, where 10,000 connections of 1,000 links each would not.
    amqp_max_links_total: int = 20_000
    # Seconds a link refused for amqp_max_links may stay attached: the next attach
    # over the limit after that closes the connection (a peer reads a refusal and
    # detaches within a round trip; one that does not is holding links).
    amqp_refused_link_grace: float = 5.0
    # Failed attempts of a message on ``$mqtt.to.<id>.publish`` (settled without an
    # outcome there is Modified(delivery-failed)) before the next such settlement
    # drops it as rejected; the same for its AMQP_PUBREL resent.
    amqp_max_default_outcomes: int = 5
    # Bytes of unfinished (multi-frame) incoming messages one AMQP connection may
    # have the broker hold; beyond, the connection is closed.
    amqp_max_held_bytes: int = 32 << 20
    # Characters of an AMQP receiver's selector (parsed once per attach); a longer
    # one refuses that link.
    amqp_max_selector_length: int = 4096
    # Local transactions (AMQP 1.0 coordinator, AMQP 0.9.1 tx): open at a time on
    # one connection (more are refused), and bytes of work one holds until commit
    # (whole message sizes, properties included, 64 per action; beyond, it can
    # only roll back).  0 = no bound.
    max_transactions_per_connection: int = 16
    max_transaction_bytes: int = 16 << 20
    max_subscriptions: int = 10_000           # filters per session (MQTT or AMQP)
    max_retained_messages: int = 100_000      # retained messages in all ($SYS not counted)
    max_retained_bytes: int = 128 << 20       # their payload bytes in all
    # New connections per second from one address (loopback not limited), in bursts
    # of up to connect_burst; 0 = no limit.
    max_connect_rate: float = 50.0
    connect_burst: int = 200
    # Per client (an MQTT connection, an AMQP connection): messages and payload
    # bytes a second it may publish; beyond, it is not read for a while. 0 = off.
    max_publish_rate: float = 0.0
    max_publish_byte_rate: float = 0.0
    # How a shared subscription's group picks the member for a message
    # (core.routing.shared.STRATEGIES).
    share_strategy: str = "round-robin"
    # MQTT features an operator may turn off (MQTT 5 clients are told in CONNACK
    # and get 0x9E / 0xA1 / 0xA2; 3.1.1 clients get 0x80).
    shared_subscriptions: bool = True
    wildcard_subscriptions: bool = True
    subscription_identifiers: bool = True
    # MQTT 5: the longest keepalive a client may ask for (longer or 0 gets this as
    # the server keep alive in CONNACK); 0 = take the client's.
    max_keepalive: int = 0
    # MQTT 5: what a client that asks for response information gets, followed by
    # its client id ("" = none given).
    response_information: str = ""
    # MQTT 5: user properties in one property block (a packet's, or a will's): how
    # many, and the UTF-8 bytes of their names and values together; beyond either
    # the connection is closed with 0x97 (quota exceeded).
    max_user_properties: int = 128
    max_user_property_bytes: int = 64 << 10
    # MQTT: topic filters in one SUBSCRIBE; beyond it the connection is closed (MQTT
    # 5: 0x97).  A packet's cost grows with its filters, and one SUBSCRIBE is handled
    # in one go: 100,000 filters held every other client up for a second.  A client
    # with more to subscribe sends more SUBSCRIBEs.
    max_subscribe_filters: int = 1_000
    # MQTT: the longest one connection's input is handled in one reactor turn
    # before the other connections get theirs (seconds; 0 = no bound).
    mqtt_turn: float = 0.005
    # Durable queues (core.queues): seconds a delivered message stays claimed by its
    # member before it is visible again; deliveries before it is dead-lettered;
    # deliveries a member may have unacknowledged; and each queue's default
    # retention (0 = no bound of that kind), and how many queues may exist.
    queue_visibility_timeout: float = 30.0
    queue_max_deliveries: int = 5
    queue_prefetch: int = 16
    queue_max_messages: int = 1_000_000
    queue_max_bytes: int = 256 << 20
    queue_max_age: float = 7 * 86400.0
    queue_max_queues: int = 1_000
    # AMQP 0.9.1's exchanges (declared ones, beside the five amq.* ones) and bindings
    # (core.exchanges): a declare or bind past them is refused (406), counted, logged.
    max_exchanges: int = 1_000
    max_bindings: int = 10_000
    # Aggregate bounds of the durable queues (core.queues.budget, docs/queues.md,
    # Options): bytes of message bodies held in memory in all (beyond, durable bodies
    # far from consumers stay in storage only); stored payload bytes in all, and the
    # free space the data directory's file system keeps, below which publishers to
    # queues are blocked.  0 = no bound.
    queue_memory_budget: int = 256 << 20
    queue_max_total_bytes: int = 4 << 30
    disk_free_limit: int = 1 << 30
    # --queues FILE: (pattern, max age, max bytes, max messages, max priority), None =
    # the default (max priority: none; a rule of four fields has none either)
    queue_rules: tuple[tuple[str, float | None, int | None, int | None]
                       | tuple[str, float | None, int | None, int | None, int | None],
                       ...] = ()
    # --amqp-queues: AMQP addresses (fnmatch patterns) served as durable queues
    amqp_queues: tuple[str, ...] = ()
