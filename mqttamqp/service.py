"""Assembles the broker process: storage, core, listeners, periodic packing.

``makeService(options)`` is what the twistd plugin and the .tac file call.  The
storage is opened in ``startService`` (not at import or option parsing) and closed
after the listeners stop.  On shutdown, stored wills are kept, not fired: the
clients were connected when the broker stopped, so the grace rule applies at the
next start.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from twisted.application import service
from twisted.internet import reactor as global_reactor
from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp import __version__, logbridge
from mqttamqp.core.auth import Authenticator, Authorizer
from mqttamqp.core.broker import Broker
from mqttamqp.core.limits import Limits
from mqttamqp.datadir import OpenAtStart, lock_holder
from mqttamqp.listeners import ListenerService
from mqttamqp.mqtt.protocol import MQTTFactory
from mqttamqp.native import build
from mqttamqp.net.accept import AcceptRefusals
from mqttamqp.net.dispatch import lean_dispatch
from mqttamqp.net.fdtable import grow_descriptor_table
from mqttamqp.net.tls import TLSSettings
from mqttamqp.ops.recorders import fan_out
from mqttamqp.ops.reload import Reloaders
from mqttamqp.ops.webhooks import HookSettings, WebhookRecorder
from mqttamqp.ops.wiring import OpsWiring
from mqttamqp.options import Options, archive_from, limits_from
from mqttamqp.reportjob import ReportJob, SpawnRunner
from mqttamqp.security.acl import AclAuthorizer
from mqttamqp.security.admission import guards
from mqttamqp.security.storeauth import StoreAuthenticator
from mqttamqp.security.userstore import UserStore

if TYPE_CHECKING:
    from mqttamqp.gateway.service import GatewayService

__all__ = ["BrokerService", "StartupError", "makeService"]


class StartupError(Exception):
    """Why the broker cannot start, in one line.  ``BrokerService.startService``
    logs it (critical), undoes what it had started and raises it; twistd then removes
    its pid file and exits with status 1, and no traceback is printed for it."""


ACL_POLL_SECONDS = 2.0
# Allocations between two young-generation collections (CPython's default is 700).
# A routed message allocates dozens of short-lived containers that refcounting frees;
# at 700 the collector ran every few messages and cost about 9 % of the CPU of an
# AMQP 0.9.1 delivery with confirms (bench/README.md); at 5,000 it runs seven times
# less often over the same survivors.  Cyclic garbage waits at most 5,000 objects.
GC_YOUNG_THRESHOLD = 5000


class BrokerService(service.MultiService):
    log = Logger()

    def __init__(self, data_dir: str, limits: Limits, pack_interval_hours: float = 24.0,
                 reactor: Any = None, authenticator: Authenticator | None = None,
                 archive: dict[str, Any] | None = None,
                 authorizer: Authorizer | None = None,
                 webhooks: Sequence[HookSettings] = (),
                 storage: str | None = None, pack_growth_mb: float = 0.0) -> None:
        """``storage``: the ``--storage`` URI (None: FileStorage in ``data_dir``);
        ``pack_growth_mb``: pack whenever it grew by this much (0: on the clock only).
        ``archive``: the archive's settings (``Archive`` keyword arguments plus
        ``directory``), or None to run without one.  ``webhooks``: the hooks at
        start (a reload may change them; the recorder is there even without any)."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.reactor = reactor if reactor is not None else global_reactor
        self.data_dir = os.path.abspath(data_dir)
        self.store = OpenAtStart(self.data_dir, self.reactor, storage,
                                 limits.queue_memory_budget)
        self.report_dir = os.path.join(self.data_dir, "report")
        self.archive: Any = None
        self.archive_dir: str | None = None
        if archive is not None:
            from mqttamqp.archive import Archive

            settings = dict(archive)
            self.archive_dir = os.path.abspath(
                settings.pop("directory", None) or os.path.join(self.data_dir, "archive"))
            self.archive = Archive(self.archive_dir, self.reactor, **settings)
        self.webhooks = WebhookRecorder(self.reactor, webhooks)
        clock: Any = self.reactor
        self.broker = Broker(self.reactor, self.store, limits, authenticator,
                             authorizer=authorizer,
                             recorder=fan_out(self.archive, self.webhooks),
                             free_space=self.store.free_bytes,
                             guards=guards(clock.seconds, limits))
        self.report_job = ReportJob(
            self.reactor, SpawnRunner(self.reactor),
            self.archive_dir or os.path.join(self.data_dir, "archive"), self.report_dir)
        self._acl_loop: LoopingCall | None = None
        # The --acl file, if the broker's authorizer is one (re-read while it runs).
        self.acl = authorizer if isinstance(authorizer, AclAuthorizer) else None
        self.reloaders: Reloaders | None = None   # SIGHUP, when makeService sets it
        self.mqtt_factory = MQTTFactory(self.broker, self.reactor)
        from mqttamqp.store.packing import PackSchedule

        self.packing = PackSchedule(self.reactor, self.store.size_bytes, self.store.pack,
                                    interval_seconds=pack_interval_hours * 3600.0,
                                    growth_bytes=int(pack_growth_mb * 1e6))
        self.listeners: list[ListenerService] = []
        self.amqp_factory: Any = None
        self.amqp091_factory: Any = None      # AMQP 0.9.1 on the AMQP port (amqp091)
        self.amqp091_settings: Any = None     # --amqp091-* options (None: defaults)
        self._amqp_port: Any = None
        self.mqtt_ws_factory: Any = None
        self.web_site: Any = None
        self.tls: TLSSettings | None = None   # for every ssl: listener added after
        self.ops = OpsWiring(self)            # metrics, health, OTel, log observer
        self.refusals = AcceptRefusals(self.reactor, self._refused_for_resources)
        self.ha: Any = None   # --ha: a HighAvailability (enable_ha)
        self.bridges: Any = None   # [[bridge]] tables: mqttamqp.bridge.service.Bridges

    def enable_ha(self, poll_seconds: float, watch_seconds: float) -> None:
        """Start as the standby of the storage's serving lock (``mqttamqp.ha``): serve
        once it is taken.  The storage must be PostgreSQL (``options`` checks)."""
        from mqttamqp.ha import HighAvailability
        from mqttamqp.store import resolve_engine

        engine = resolve_engine(self.store.storage, self.data_dir)
        self.ha = HighAvailability(self.reactor, engine.dsn, engine.display, poll_seconds,
                                   watch_seconds, self._take_over, self._stop_serving)
        self.broker.stats.ha_role = "standby"

    def add_mqtt_listener(self, description: str) -> ListenerService:
        return self.add_listener("MQTT", description, self.mqtt_factory)

    def add_amqp_listener(self, description: str,
                          idle_timeout: float | None = None) -> ListenerService:
        """(Who may connect is the broker's authenticator's, for SASL as for MQTT.)"""
        from mqttamqp.amqp.listener import AMQPFactory

        if self.amqp_factory is None:
            self.amqp_factory = AMQPFactory(self.broker, self.reactor, idle_timeout)
            self.amqp_factory.cert_as_user = self.tls is not None and self.tls.cert_as_user
            from mqttamqp.amqp091.connection import AMQP091Factory
            from mqttamqp.amqp091.sniff import shared_port

            self.amqp091_factory = AMQP091Factory(self.broker, self.reactor,
                                                  self.amqp091_settings)
            self.amqp091_factory.cert_as_user = self.amqp_factory.cert_as_user
            self._amqp_port = shared_port(self.amqp_factory, self.amqp091_factory,
                                          self.broker, self.reactor)
        return self.add_listener("AMQP", description, self._amqp_port)

    def add_mqtt_ws_listener(self, description: str,
                             allowed_origins: Sequence[str] = ()) -> ListenerService:
        """MQTT over WebSockets (``mqtt.websocket``); one factory for all of them,
        with the Origin rule of the first call."""
        from mqttamqp.mqtt.websocket import MQTTWebSocketFactory, OriginRule

        if self.mqtt_ws_factory is None:
            self.mqtt_ws_factory = MQTTWebSocketFactory(
                self.mqtt_factory, self.reactor, OriginRule.from_options(allowed_origins),
                self.reactor)
        return self.add_listener("MQTT-WS", description, self.mqtt_ws_factory)

    def add_web_listener(self, description: str) -> ListenerService:
        from mqttamqp.console.site import make_site

        if self.web_site is None:
            self.web_site = make_site(self)
            self.ops.mount_on_console(self.web_site)
        return self.add_listener("web", description, self.web_site)

    def add_metrics_listener(self, description: str) -> ListenerService:
        return self.add_listener("metrics", description, self.ops.site())

    def add_listener(self, kind: str, description: str, factory: Any) -> ListenerService:
        access = {"web": "users", "metrics": "open"}.get(kind) or self._access()
        svc = ListenerService(kind, description, factory, self.reactor, access)
        svc.tls, svc.refusals = self.tls, self.refusals
        svc.setServiceParent(self)  # type: ignore[no-untyped-call]
        self.listeners.append(svc)
        return svc

    def _refused_for_resources(self) -> None:
        """A connection a listener could not keep (no descriptor): counted as refused, and
        as ``$SYS/broker/limits/file_descriptors`` (``mqttamqp_limit_hits_total``)."""
        stats = self.broker.stats
        stats.connections_refused += 1
        stats.limit_hit("file_descriptors")

    def _access(self) -> str:
        authenticator = self.broker.authenticator
        if not getattr(authenticator, "allows_anonymous", True):
            return "users"
        anonymous_from = getattr(authenticator, "anonymous_from", None)
        if anonymous_from is not None and not anonymous_from("192.0.2.1:1"):
            return "loopback"
        return "anyone"

    def startService(self) -> None:
        """Start, or stop at the first thing that cannot start, undoing the rest.

        Order: the descriptor table grown for --max-connections of MQTT and of AMQP
        (``net.fdtable``), the data directory, then the store (its lock: a second
        broker on the same data stops here, before its archive removes anything), then
        every listener is bound, and only then is anything else started (state loaded,
        archive, the console's first admin user, "listening for" lines).  A failure
        among these is one critical log line and a ``StartupError``."""
        logbridge.install()
        grow_descriptor_table(self.broker.limits.max_connections * (1 + bool(self._amqp_port)))
        try:
            _prepare_data_dir(self.data_dir)
            if self.ha is not None:   # the console and metrics only, until leader
                self._bind_listeners(lambda x: x.kind in _STANDBY_LISTENERS)
                self._start_running()
                self.ha.start()
                return
            self._open_store()
            self._bind_listeners()
        except StartupError as e:
            self._undo_start()
            self.log.critical("{reason}; not started", reason=str(e))
            _no_traceback_for(StartupError)
            raise
        try:
            self._start()
        except BaseException:
            self._undo_start()
            raise

    def _take_over(self, lock: Any) -> bool:
        """--ha: the serving lock is ours; open the storage (claiming the epoch),
        load the state and open the client listeners.  What fails there is one
        critical line, and the process ends (its lock with it: another standby may
        take over).  True once serving."""
        try:
            self._open_store(lock)
            self.broker.stats.ha_role = "leader"   # (the epoch is ours: $SYS says so)
            self.store.opened.on_fenced = self.ha.lost
            self.ha.epoch = lambda: self.store.opened.epoch
            self._bind_listeners(lambda x: x.kind not in _STANDBY_LISTENERS)
            self._start_serving()
        except Exception as e:
            if not isinstance(e, StartupError):
                self.log.failure("taking over failed", Failure())
            self.broker.stats.ha_role = "fenced"
            self._undo_start()
            lock.close()   # (if the store had not taken it yet)
            self._fail_running(f"{e}; cannot take over")
            return False
        return True

    def _stop_serving(self, reason: str) -> None:
        """--ha, the leadership lost: no commit from now on (nothing more is
        acknowledged), clients (of every protocol) and client listeners closed, the
        process ends with status 1 (a supervisor restarts it: it comes back as the
        standby)."""
        self.broker.stats.ha_role = "fenced"
        _exit_status_after_stop(1)
        reactor: Any = self.reactor
        reactor.callWhenRunning(reactor.stop)
        opened = self.store.opened
        if opened is not None:
            opened.fence(reason)
        for listener in self.listeners:
            if listener.kind not in _STANDBY_LISTENERS:
                listener.close_now()
        # MQTT (and over WebSockets), AMQP 1.0 and 0.9.1, and the AMQP port's sockets
        # that have not sent their protocol header yet (the shared port's own)
        factories = (self.amqp_factory, self.amqp091_factory, self._amqp_port)
        clients: list[Any] = self.mqtt_factory.opened.all()
        for conn in [*clients, *(c for f in factories if f is not None for c in f.connections)]:
            try:
                conn.transport.abortConnection()
            except Exception:   # (best effort: the process ends anyway)
                self.log.failure("closing a client after the leadership was lost")

    def _fail_running(self, reason: str) -> None:
        self.log.critical("{reason}; stopping", reason=reason)
        _exit_status_after_stop(1)
        reactor: Any = self.reactor
        reactor.callWhenRunning(reactor.stop)

    def _open_store(self, lock: Any = None) -> None:
        import zc.lockfile  # type: ignore[import-untyped]

        from mqttamqp.store import (
            DamagedStorage,
            EngineError,
            ServingLockError,
            StorageUnavailable,
        )

        try:
            self.store.open(lock)
        except zc.lockfile.LockError:
            lock = self.store.lock_path()
            where = os.path.dirname(lock)
            raise StartupError(
                f"another mqttamqp is using {where if where != self.data_dir else self.data_dir} "
                f"(lock held by {lock_holder(lock)})") from None
        except (EngineError, ServingLockError, StorageUnavailable) as e:
            raise StartupError(str(e)) from None
        except DamagedStorage as e:
            if not e.recoverable:
                raise StartupError(f"cannot open the storage {e.path}: {e.reason}") from None
            default = os.path.join(self.data_dir, "mqttamqp.fs")
            which = (f"--data {self.data_dir}" if os.path.abspath(e.path) == default
                     else f"--file {e.path}")
            raise StartupError(
                f"the storage {e.path} is damaged ({e.reason}), probably by a crash "
                f"during a commit; nothing was changed. Run 'mqttamqp-admin recover "
                f"{which}' (it keeps a copy of the file and cuts it "
                "after the last good transaction), then start again") from None
        except OSError as e:
            raise StartupError(f"cannot open the storage in {self.data_dir}: "
                               f"{e.strerror or e}") from None

    def _bind_listeners(self, which: Callable[[ListenerService], bool] = lambda x: True
                        ) -> None:
        for listener in self.listeners:
            if not which(listener):
                continue
            failed: list[Failure] = []
            try:
                d = listener.listen()
            except Exception:   # e.g. a key, certificate or CA file gone since parsing
                raise StartupError(listener.failure_reason(Failure())) from None
            d.addErrback(failed.append)
            if failed:
                raise StartupError(listener.failure_reason(failed[0]))
            if not d.called:  # an asynchronous endpoint: its failure comes later
                d.addErrback(self._failed_late, listener)

    def _failed_late(self, failure: Failure, listener: ListenerService) -> None:
        self._fail_running(listener.failure_reason(failure))

    def _undo_start(self) -> None:
        for listener in self.listeners:
            listener.close_now()
        self.broker.shutdown()
        self.store.close()

    def _start(self) -> None:
        self._start_serving()
        self._start_running()

    def _start_serving(self) -> None:
        """The state loaded, and what works on it started (at the start; under --ha
        at the takeover)."""
        # The ZODB writer thread pickles while the reactor serves clients: a 1 ms
        # GIL switch interval (default 5 ms) bounds how long it can hold them off.
        sys.setswitchinterval(0.001)
        lean_dispatch(self.reactor)   # (``net.dispatch``: less work per wake-up)
        # Loading builds a few objects per stored record and frees almost none: the
        # collector's passes over them were a quarter of the load's CPU (10,000 sessions,
        # 100,000 retained; an --ha takeover waits for it).  The one pass: below.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.broker.start()
        finally:
            if collecting:
                gc.enable()
        if self.archive is not None:
            self.archive.start()
            self.log.info("archiving messages and events to {d}", d=self.archive_dir)
        self.report_job.start()
        if self.bridges is not None:
            self.bridges.start()
        # Everything loaded at start-up lives for the whole run: keep it out of the
        # collector's generations so full collections stay short.
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        self.log.info("mqttamqp {v} ({b}): data directory {d}, storage {s}", v=__version__,
                      b=build(), d=self.data_dir, s=self.store.describe())
        if self.store.opened is not None and not self.store.opened.engine.durable:
            self.log.warn("storage {s} keeps nothing across a restart (tests only)",
                          s=self.store.describe())
        self.packing.start()
        if self.acl is not None:
            # The ACL file applies when it changes: a stat every 2 s, no restart.
            self._acl_loop = LoopingCall(self.reload_acl)
            self._acl_loop.clock = self.reactor
            self._acl_loop.start(ACL_POLL_SECONDS, now=False)

    def _start_running(self) -> None:
        """Metrics, health, SIGHUP and the listeners' services (their log lines)."""
        self.ops.start()
        if self.reloaders is not None:
            self.reloaders.install()
        super().startService()  # type: ignore[no-untyped-call]

    def reload_acl(self) -> None:
        """Re-read the ACL file if it changed; then every session's subscriptions are
        checked against the new rules."""
        if self.acl is not None and self.acl.reload():
            self.broker.commands.recheck_subscriptions()

    def setServiceParent(self, parent: Any) -> None:
        """As usual; and on twistd's application, the log observer of --log-format
        and --log-level, which twistd installs once the service is assembled."""
        super().setServiceParent(parent)  # type: ignore[no-untyped-call]
        self.ops.set_log_observer(parent)

    def stopService(self) -> Deferred[None]:
        if self.ha is not None:
            self.ha.stop()
        if self.reloaders is not None:
            self.reloaders.uninstall()
        if self.bridges is not None:
            self.bridges.stop()
        self.broker.shutdown()
        self.ops.stop()
        self.packing.stop()
        self.refusals.stop()
        if self._acl_loop is not None and self._acl_loop.running:
            self._acl_loop.stop()
        d: Deferred[None] = Deferred.fromCoroutine(self._stop())
        return d

    async def _stop(self) -> None:
        await super().stopService()  # type: ignore[no-untyped-call]
        await self.report_job.stop()
        # (every open one: connected, before CONNECT or CONNACK, or closing)
        for conn in self.mqtt_factory.opened.all():
            conn.server_stopping()   # MQTT 5 clients get DISCONNECT 0x8B first
        if self.amqp_factory is not None:
            for amqp_conn in list(self.amqp_factory.connections):
                amqp_conn.transport.abortConnection()
            for amqp091_conn in list(self.amqp091_factory.connections):
                amqp091_conn.transport.abortConnection()
        self.store.close()
        if self.archive is not None:
            # The aborted connections end on the next reactor turn; let them, so their
            # ends are recorded, then close the open segments (renamed into place).
            await task.deferLater(self.reactor, 0, lambda: None)
            await self.archive.close()
        # What the hooks still hold is not sent (their queues are not durable).
        self.webhooks.close()


# The listeners a --ha standby opens (the console and /readyz say it is the standby).
_STANDBY_LISTENERS = ("web", "metrics")


def _prepare_data_dir(path: str) -> None:
    """The data directory exists (created if missing, but not its parents) and is
    writable, or a ``StartupError`` says which of these is not so."""
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        pass
    elif os.path.lexists(path):
        raise StartupError(f"the data directory {path} is not a directory (give --data "
                           "a directory, or a path to create one)")
    elif not os.path.isdir(parent):
        raise StartupError(f"cannot create the data directory {path}: {parent} "
                           + ("is not a directory" if os.path.lexists(parent)
                              else "does not exist") + " (create it first)")
    else:
        try:
            os.mkdir(path)
        except OSError as e:
            raise StartupError(f"cannot create the data directory {path}: "
                               f"{e.strerror or e}") from None
    probe = os.path.join(path, f".write-test-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise StartupError(f"cannot write to the data directory {path}: "
                           f"{e.strerror or e}") from None


def _no_traceback_for(kind: type[BaseException]) -> None:
    """At the top of twistd, an uncaught ``kind`` (already logged in one line) ends the
    process with status 1 and no traceback; any other exception is printed as usual."""
    previous = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException,
             tb: TracebackType | None) -> None:
        if not issubclass(exc_type, kind):
            previous(exc_type, exc, tb)

    sys.excepthook = hook


def _exit_status_after_stop(status: int) -> None:
    """A failure after the reactor started (an asynchronous listener): twistd returns
    0 once the reactor stops, so end with ``status`` at interpreter exit instead."""

    def end() -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)

    atexit.register(end)


def makeService(options: Options) -> BrokerService | GatewayService:
    if options["upstream"]:   # gateway mode: no store, no core (docs/gateway.md)
        from mqttamqp.gatewayweb import make_gateway_process

        return make_gateway_process(options, limits_from(options))
    # The one user store (DATA/users.json) checks MQTT CONNECT, AMQP SASL PLAIN and
    # the console; a --users file is a second, read-only source of client users.
    legacy = None
    if options["users"]:
        from mqttamqp.security.users import UserFile

        legacy = UserFile(options["users"], global_reactor)
    users = UserStore(os.path.abspath(options["data"]))
    authenticator: Authenticator = StoreAuthenticator(
        users, bool(options["allow-anonymous"]), legacy, global_reactor)
    archive = archive_from(options)
    authorizer: Authorizer | None = None
    if options["acl"]:
        authorizer = AclAuthorizer(options["acl"])
    svc = BrokerService(options["data"], limits_from(options), options["pack-interval"],
                        authenticator=authenticator, archive=archive, authorizer=authorizer,
                        webhooks=options["webhook"], storage=options["storage"],
                        pack_growth_mb=options["pack-growth"])
    _reloaders(svc, options)
    if options["ha"]:
        svc.enable_ha(options["ha-poll"], options["ha-watch"])
    # MQTT 5 enhanced authentication: SCRAM-SHA-256 against the same user store.
    from mqttamqp.security.enhanced_auth import EnhancedAuthenticator, ScramSha256
    svc.mqtt_factory.enhanced_auth = EnhancedAuthenticator([ScramSha256(users.scram)])
    if options["tls-ca"]:
        svc.tls = TLSSettings(options["tls-ca"], bool(options["tls-require-client-cert"]),
                              bool(options["tls-cert-as-user"]))
        svc.mqtt_factory.cert_as_user = svc.tls.cert_as_user
    if options["report-every"] is not None:
        from mqttamqp.reportjob import parse_duration

        svc.report_job.every = parse_duration(options["report-every"])
    if options["report-command"]:
        import shlex

        svc.report_job.set_command(shlex.split(options["report-command"]))
    for description in options["mqtt"]:
        svc.add_mqtt_listener(description)
    from mqttamqp.amqp091.handshake import Settings

    svc.amqp091_settings = Settings(
        options["amqp091-channel-max"], max(4096, options["amqp091-frame-max"]),
        options["amqp091-heartbeat"], max(1, options["amqp091-max-unacked"]),
        max(1, options["amqp091-max-body"]))
    for description in options["amqp"]:
        svc.add_amqp_listener(description, options["amqp-idle-timeout"])
    svc.ops.configure(options)
    for description in options["mqtt-ws"]:
        svc.add_mqtt_ws_listener(description, options["ws-allowed-origin"])
    for description in options["web"]:
        svc.add_web_listener(description)
    if options["metrics"]:
        svc.add_metrics_listener(options["metrics"])
    # (built with no [[bridge]] too: the sessions of removed bridges are held (no
    # longer queuing, their backlog kept) at start, and SIGHUP may add bridges)
    from mqttamqp.bridge.service import Bridges

    svc.bridges = Bridges(svc.broker, svc.reactor, options["bridge"])
    return svc


def _reloaders(svc: BrokerService, options: Options) -> None:
    """What SIGHUP applies live (``mqttamqp.ops.reload``: one ``register`` line each)."""

    def parse() -> Options:
        fresh = Options()
        fresh.parseOptions(options.argv)
        return fresh

    svc.reloaders = reloaders = Reloaders(svc.reactor, options, parse)
    if svc.acl is not None:
        # (the file is also polled every 2 s; SIGHUP asks at once)
        reloaders.register_always("ACL file", svc.reload_acl)
    reloaders.register("webhooks", ("webhook",),
                       lambda new: svc.webhooks.configure(new["webhook"]))
    reloaders.register("log level", ("log-level",), svc.ops.reload_log_level)
    reloaders.register("bridges", ("bridge",),
                       lambda new: svc.bridges.configure(new["bridge"]))
