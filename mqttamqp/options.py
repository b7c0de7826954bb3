"""Command-line options of ``twistd mqttamqp`` (also used by the .tac file)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

from twisted.python import usage

from mqttamqp import __version__
from mqttamqp.core.limits import Limits
from mqttamqp.optiontable import (
    DEFAULT_LISTENERS,
    FLAGS,
    GATEWAY_IGNORES,
    MB,
    PARAMETERS,
    endpoint,
)

__all__ = ["DEFAULT_LISTENERS", "Options", "archive_from", "check_gateway", "limits_from"]



def check_gateway(options: Options) -> None:
    """Gateway mode (--upstream): a UsageError naming every option of
    ``GATEWAY_IGNORES`` that is set (a listener not 'none', a flag on, a table, a
    value other than the default), run before the default listeners are filled in."""
    defaults = {p[0]: p[2] for p in PARAMETERS}
    flags = {f[0] for f in FLAGS}
    given = []
    for name in GATEWAY_IGNORES:
        value = options[name]
        if isinstance(value, list):
            used = any(not (isinstance(v, str) and v.strip().lower() == "none") for v in value)
        elif name in flags:
            used = bool(value)
        else:
            used = value is not None and value != defaults.get(name)
        if used:
            given.append("[[bridge]]" if name == "bridge" else f"--{name}")
    if given:
        raise usage.UsageError(
            "gateway mode (--upstream) keeps no state and does not use "
            f"{', '.join(given)}: remove {'it' if len(given) == 1 else 'them'} "
            "(the core takes them; see docs/gateway.md)")


def _check_ops(options: Options) -> None:
    """Cross-option checks of the block above; the token file is read now, so a
    bad one stops the start with its reason."""
    if options["metrics"].strip().lower() == "none":
        options["metrics"] = None
    path = options["metrics-token-file"]
    options["metrics-token"] = None
    if path is not None:
        from mqttamqp.ops.web import read_token

        if not options["web"]:
            raise usage.UsageError("--metrics-token-file serves /metrics on the console "
                                   "listener, and --web is none")
        try:
            options["metrics-token"] = read_token(path)
        except ValueError as e:
            raise usage.UsageError(f"--metrics-token-file: {e}") from None
    if options["otel-endpoint"]:
        from mqttamqp.ops.otel import otel_available

        if not otel_available():
            raise usage.UsageError("--otel-endpoint needs the OpenTelemetry SDK: "
                                   "pip install 'mqttamqp[otel]'")
        if options["otel-interval"] <= 0:
            raise usage.UsageError("--otel-interval must be more than 0 seconds")



class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Run the mqttamqp broker: MQTT 3.1/3.1.1 (--mqtt) and AMQP 1.0 (--amqp) clients "
        "share one topic space; persistent sessions, wills and retained messages are "
        "stored in ZODB in the data directory (--data); an admin console in the browser "
        "(--web) shows every client and acts on them. By default every listener is on "
        "loopback only (127.0.0.1: MQTT 1883, MQTT over WebSockets 8083, AMQP 5672, "
        "console 8080). Listener options "
        "take Twisted endpoint descriptions (e.g. tcp:1883:interface=127.0.0.1, or "
        "tcp:1883 for every interface), may be given several times, and 'none' turns "
        "one off."
    )
    optFlags: ClassVar[list[list[Any]]] = FLAGS
    optParameters: ClassVar[list[list[Any]]] = PARAMETERS

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self["mqtt"] = []
        self["amqp"] = []
        self["web"] = []
        self["mqtt-ws"] = []
        self["ws-allowed-origin"] = []
        self["archive-include"] = []
        self["archive-exclude"] = []
        self["amqp-queues"] = []
        self["webhook"] = []
        self["bridge"] = []
        self.argv: list[str] = []   # as given, for a reload (SIGHUP) to parse again

    def opt_amqp_queues(self, pattern: str) -> None:
        ("AMQP addresses served as durable queues, for senders and receivers "
         "(repeatable; fnmatch patterns, e.g. '*' for every address without a '/' or "
         "'orders*'; default none): a message sent before any receiver waits.")
        self["amqp-queues"].append(pattern)

    def opt_archive_include(self, topic_filter: str) -> None:
        """Archive only messages on topics matching this filter (repeatable; default #)."""
        self["archive-include"].append(topic_filter)

    def opt_archive_exclude(self, topic_filter: str) -> None:
        """Never archive topics matching this filter (repeatable; default $SYS/#)."""
        self["archive-exclude"].append(topic_filter)

    # Option docstrings are shown by --help as they are: one line each (adjacent
    # literals), so no source indentation ends up inside the text.
    def opt_mqtt(self, description: str) -> None:
        ("MQTT listener, a Twisted endpoint description (repeatable; default "
         "tcp:1883:interface=127.0.0.1, loopback only; tcp:1883 for every interface; "
         "ssl:8883:privateKey=KEY:certKey=CRT for TLS 1.2+; 'none' disables MQTT).")
        self["mqtt"].append(endpoint("mqtt", description))

    def opt_amqp(self, description: str) -> None:
        ("AMQP 1.0 listener (repeatable; default tcp:5672:interface=127.0.0.1; "
         "ssl:5671:privateKey=KEY:certKey=CRT for TLS; 'none' disables AMQP).")
        self["amqp"].append(endpoint("amqp", description))

    def opt_web(self, description: str) -> None:
        ("Admin console listener, HTTP (repeatable; default "
         "tcp:8080:interface=127.0.0.1; ssl:8443:privateKey=KEY:certKey=CRT for HTTPS; "
         "'none' disables it).")
        self["web"].append(endpoint("web", description))

    def opt_mqtt_ws(self, description: str) -> None:
        ("MQTT over WebSockets listener, path /mqtt, subprotocol mqtt or mqttv3.1 "
         "(repeatable; default tcp:8083:interface=127.0.0.1; "
         "ssl:8084:privateKey=KEY:certKey=CRT for wss; 'none' disables it).")
        self["mqtt-ws"].append(endpoint("mqtt-ws", description))

    def opt_ws_allowed_origin(self, origin: str) -> None:
        ("A browser Origin (scheme://host[:port], or *) allowed to open MQTT over "
         "WebSockets (repeatable). Without it, an Origin must name the host the request "
         "was sent to; requests without Origin (clients outside browsers) are accepted.")
        self["ws-allowed-origin"].append(origin)

    def opt_webhook(self, hook: str | dict[str, Any]) -> None:
        ("POST the broker's events as JSON to this URL (repeatable), with every "
         "default; a [[webhook]] table in the --config file sets the rest (events, "
         "topics, batching, retries, secret, TLS).")
        from mqttamqp.ops.config import TableKeyError
        from mqttamqp.ops.webhooks import HookSettings

        try:
            settings = (HookSettings.from_url(hook) if isinstance(hook, str)
                        else HookSettings.from_table(hook))
        except TableKeyError as e:
            if isinstance(hook, str):
                raise usage.UsageError(f"--webhook {e}") from None
            raise
        self["webhook"].append(settings)

    opt_webhook.toml_tables = True  # type: ignore[attr-defined]

    def opt_bridge(self, bridge: str | dict[str, Any]) -> None:
        ("A bridge (MQTT or AMQP 1.0) to another broker: only as a [[bridge]] table in the "
         "--config file (name, address, topics; see docs/bridges.md).")
        from mqttamqp.bridge.config import BridgeSettings

        if isinstance(bridge, str):
            raise usage.UsageError("--bridge: bridges are [[bridge]] tables of the "
                                   "--config file (docs/bridges.md)")
        self["bridge"].append(BridgeSettings.from_table(bridge))

    opt_bridge.toml_tables = True  # type: ignore[attr-defined]

    def opt_version(self) -> None:
        """Print mqttamqp's version (and Twisted's and Python's) and exit."""
        import twisted

        print(f"mqttamqp {__version__} (Twisted {twisted.__version__}, "
              f"{platform.python_implementation()} {platform.python_version()})")
        sys.exit(0)

    def parseOptions(self, options: Sequence[str] | None = None) -> None:
        """As ``usage.Options.parseOptions``, but a bad option stops with its error
        and one hint line (SystemExit, exit status 1), not the whole --help text that
        twistd prints for a ``UsageError``."""
        self.argv = list(sys.argv[1:] if options is None else options)
        try:
            super().parseOptions(options)  # type: ignore[no-untyped-call]
        except usage.UsageError as e:
            raise SystemExit(f"twistd mqttamqp: {e}\n"
                             "(twistd mqttamqp --help lists the options)") from None

    def postOptions(self) -> None:
        if self["config"] is not None:
            from mqttamqp.ops import config

            config.merge_file(self, self["config"],
                              config.given_on_command_line(self, self.argv))
        if self["upstream"]:
            check_gateway(self)
        for kind, default in DEFAULT_LISTENERS.items():
            given = self[kind]
            if not given:
                given = [default]
            self[kind] = [d for d in given if d.strip().lower() != "none"]
        self._check_tls()
        _check_ops(self)
        if self["upstream"]:
            from mqttamqp.gateway.target import parse_upstream

            try:   # (checked here; the gateway connects at start)
                parse_upstream(self["upstream"])
            except ValueError as e:
                raise usage.UsageError(str(e)) from None
        if self["queues"]:
            from mqttamqp.queuesfile import load_queue_rules

            try:
                self["queue-rules"] = load_queue_rules(self["queues"])
            except ValueError as e:
                raise usage.UsageError(f"--queues: {e}") from None
        if self["acl"]:
            from mqttamqp.security.acl import AclError, read_acl

            try:   # (checked only: the service's AclAuthorizer loads it, and says so)
                read_acl(self["acl"])
            except AclError as exc:
                raise usage.UsageError(f"--acl: {exc}") from None
        if self["storage"]:
            from mqttamqp.store.engines import EngineError, resolve

            try:   # (checked here; opened at start, as the file storage is)
                resolve(self["storage"], os.path.abspath(self["data"]))
            except EngineError as exc:
                raise usage.UsageError(str(exc)) from None
        if self["ha"]:
            from mqttamqp.store.engines import resolve as resolve_engine

            kind = resolve_engine(self["storage"], os.path.abspath(self["data"])).kind
            if kind != "postgresql":
                raise usage.UsageError("--ha needs a shared storage: --storage "
                                       f"postgresql://USER@HOST:PORT/DB (not {kind})")
            if self["ha-poll"] <= 0 or self["ha-watch"] <= 0:
                raise usage.UsageError("--ha-poll and --ha-watch must be more than 0 "
                                       "seconds")
        if self["archive"] and self["no-archive"]:
            raise usage.UsageError("--archive and --no-archive contradict each other")
        if self["archive-roll"] <= 0:
            raise usage.UsageError("--archive-roll must be more than 0 seconds")
        if self["report-every"] is not None:
            from mqttamqp.reportjob import parse_duration

            try:   # (checked here; kept as written, so --print-config shows it so)
                parse_duration(self["report-every"])
            except ValueError as exc:
                raise usage.UsageError(f"--report-every: {exc}") from None
        if self["max-inflight"] < 1:
            raise usage.UsageError("--max-inflight must be at least 1")
        if self["amqp-max-sessions"] < 1:
            raise usage.UsageError("--amqp-max-sessions must be at least 1")
        if self["amqp-max-links"] < 1:
            raise usage.UsageError("--amqp-max-links must be at least 1")
        if self["amqp-max-links-total"] < 1:
            raise usage.UsageError("--amqp-max-links-total must be at least 1")
        if self["amqp-max-held-bytes"] < self["max-packet-size"]:
            raise usage.UsageError("--amqp-max-held-bytes must be at least --max-packet-size "
                                   "(one whole message)")
        if self["max-topic-levels"] < 1:
            raise usage.UsageError("--max-topic-levels must be at least 1")
        if self["max-topic-length"] < 1:
            raise usage.UsageError("--max-topic-length must be at least 1")
        if self["max-packet-size"] < 2:
            raise usage.UsageError("--max-packet-size must be at least 2")
        if self["max-queued-messages"] + self["max-inflight"] > 65000:
            raise usage.UsageError(
                "--max-queued-messages plus --max-inflight must stay below 65000: each "
                "queued QoS 1/2 message holds one of the 65535 MQTT packet ids")
        if self["print-config"]:
            print(self.config_text(), end="")
            sys.exit(0)

    def config_text(self) -> str:
        """The effective configuration as a --config file (a listener kind that is
        off is written as ['none'], so that the file turns it off too)."""
        from mqttamqp.ops import config

        return config.dump(self, {kind: self[kind] or ["none"] for kind in DEFAULT_LISTENERS})

    def _check_tls(self) -> None:
        from mqttamqp.net import tls

        if self["tls-ca"] is None:
            for flag in ("tls-require-client-cert", "tls-cert-as-user"):
                if self[flag]:
                    raise usage.UsageError(f"--{flag} needs --tls-ca (the CAs that sign "
                                           "client certificates)")
            return
        try:
            tls.load_ca_bundle(self["tls-ca"])
        except ValueError as e:
            raise usage.UsageError(f"--tls-ca: {e}") from None
        if not any(tls.is_tls(d) for kind in DEFAULT_LISTENERS for d in self[kind]):
            raise usage.UsageError("--tls-ca applies to ssl: listeners, and none is given "
                                   "(e.g. --mqtt ssl:8883:privateKey=KEY:certKey=CRT)")


def archive_from(options: Any) -> dict[str, Any] | None:
    """The archive's settings from the options (None: ``--no-archive``)."""
    if options["no-archive"]:
        return None
    return {"directory": options["archive-dir"],
            "payload_bytes": options["archive-payload-bytes"],
            "roll_seconds": options["archive-roll"],
            "retention_days": options["archive-days"],
            "buffer_limit": options["archive-buffer"],
            "include": tuple(options["archive-include"]) or ("#",),
            "exclude": tuple(options["archive-exclude"]) or ("$SYS/#",)}


def limits_from(options: Any) -> Limits:
    return Limits(
        max_connections=options["max-connections"],
        max_packet_size=options["max-packet-size"],
        max_inflight=options["max-inflight"],
        max_queued_messages=options["max-queued-messages"],
        max_queued_bytes=options["max-queued-bytes"],
        congested_qos0_bytes=options["congested-qos0-bytes"],
        connect_timeout=options["connect-timeout"],
        close_grace=options["close-grace"],
        session_expiry=options["session-expiry"],
        will_grace=options["will-grace"],
        sys_interval=options["sys-interval"],
        stall_timeout=options["stall-timeout"],
        strict_mqtt31=bool(options["strict-mqtt31"]),
        max_topic_levels=options["max-topic-levels"],
        max_topic_length=options["max-topic-length"],
        max_user_properties=options["max-user-properties"],
        max_user_property_bytes=options["max-user-property-bytes"],
        max_subscribe_filters=options["max-subscribe-filters"],
        mqtt_turn=options["mqtt-turn-ms"] / 1000.0,
        allow_control_chars=bool(options["allow-control-chars"]),
        amqp_max_sessions=options["amqp-max-sessions"],
        amqp_max_links=options["amqp-max-links"],
        amqp_max_links_total=options["amqp-max-links-total"],
        amqp_refused_link_grace=options["amqp-refused-link-grace"],
        amqp_max_default_outcomes=options["amqp-max-default-outcomes"],
        amqp_max_held_bytes=options["amqp-max-held-bytes"],
        amqp_max_selector_length=options["amqp-max-selector-length"],
        max_transactions_per_connection=options["max-transactions-per-connection"],
        max_transaction_bytes=options["max-transaction-bytes"],
        share_strategy=options["share-strategy"],
        shared_subscriptions=not options["no-shared-subscriptions"],
        wildcard_subscriptions=not options["no-wildcard-subscriptions"],
        subscription_identifiers=not options["no-subscription-identifiers"],
        max_subscriptions=options["max-subscriptions"],
        max_retained_messages=options["max-retained-messages"],
        max_retained_bytes=options["max-retained-bytes"],
        max_connect_rate=options["max-connect-rate"],
        connect_burst=options["connect-burst"],
        max_publish_rate=options["max-publish-rate"],
        max_publish_byte_rate=options["max-publish-byte-rate"],
        max_keepalive=min(options["max-keepalive"], 65535),
        response_information=options["response-information"],
        queue_visibility_timeout=options["queue-visibility-timeout"],
        queue_max_deliveries=options["queue-max-deliveries"],
        queue_prefetch=max(1, options["queue-prefetch"]),
        queue_max_messages=options["queue-max-messages"],
        queue_max_bytes=options["queue-max-bytes"],
        queue_max_age=options["queue-max-age"],
        queue_max_queues=options["queue-max-queues"],
        max_exchanges=options["max-exchanges"],
        max_bindings=options["max-bindings"],
        queue_memory_budget=options["queue-memory-budget"] * MB,
        queue_max_total_bytes=options["queue-max-total-bytes"],
        disk_free_limit=options["disk-free-limit"] * MB,
        queue_rules=options.get("queue-rules", ()),
        amqp_queues=tuple(options["amqp-queues"]),
    )

