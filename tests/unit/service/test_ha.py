"""``mqttamqp.ha.HighAvailability``: the role's moves (standby → leader when the lock
is taken, → fenced once when it is lost), the figures the console and the metrics
show, and the log line of each side of a takeover.  The lock's thread is not started:
its callbacks are called as the thread would call them (on the reactor thread)."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.logger import LogLevel, globalLogPublisher

from mqttamqp.ha import HighAvailability, LeaderLock


class _Log:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("log_namespace") == "mqttamqp.ha":
            self.events.append(event)

    def __enter__(self) -> _Log:
        globalLogPublisher.addObserver(self)
        return self

    def __exit__(self, *exc: object) -> None:
        globalLogPublisher.removeObserver(self)


def _ha(clock: Clock, served: list[LeaderLock], stopped: list[str]) -> HighAvailability:
    def serve(lock: LeaderLock) -> bool:
        clock.advance(0.25)            # (loading the state takes the reactor's time)
        served.append(lock)
        return True

    ha = HighAvailability(clock, "dbname='x'", "postgresql://x", 0.5, 1.0, serve,
                          stopped.append)
    ha.epoch = lambda: 4
    return ha


def test_standby_becomes_leader_when_the_lock_is_taken() -> None:
    """Taking the lock serves (once), makes the role leader and logs one line with
    the epoch, the wait and the takeover's duration."""
    clock = Clock()
    served: list[LeaderLock] = []
    stopped: list[str] = []
    ha = _ha(clock, served, stopped)
    ha.standby_since = clock.seconds()
    assert ha.figures()["role"] == "standby" and ha.figures()["leader_since"] == 0.0
    clock.advance(10)
    with _Log() as log:
        ha.lock.on_acquired()
        ha.lock.on_acquired()          # (a second call changes nothing)
    assert served == [ha.lock] and not stopped
    f = ha.figures()
    assert f["role"] == "leader" and f["epoch"] == 4 and f["leader_since"] == 10.25
    assert f["last_takeover_seconds"] is not None
    (line,) = log.events
    assert "took over as leader" in line["log_format"] and line["w"] == 10.0


def test_losing_the_lock_stops_serving_once() -> None:
    """A lost lock (the watch or a fenced commit) stops serving once, with one
    critical line naming the reason; the role is fenced."""
    clock = Clock()
    stopped: list[str] = []
    ha = _ha(clock, [], stopped)
    ha.lock.on_acquired()
    clock.advance(60)
    with _Log() as log:
        ha.lost("the serving lock's connection failed (gone)")
        ha.lost("another broker took over the storage (epoch 5, this broker's is 4)")
    assert stopped == ["the serving lock's connection failed (gone)"]
    assert ha.figures()["role"] == "fenced"
    (line,) = log.events
    assert line["log_level"] == LogLevel.critical and line["s"] == 60.0


def test_a_takeover_that_fails_logs_no_takeover() -> None:
    """When serving fails (the service logged why and is stopping), the role is
    fenced and no "took over" line is written."""
    clock = Clock()
    ha = HighAvailability(clock, "dbname='x'", "postgresql://x", 0.5, 1.0,
                          lambda lock: False, lambda reason: None)
    with _Log() as log:
        ha.lock.on_acquired()
    assert ha.figures()["role"] == "fenced" and not log.events


class _Transport:
    def __init__(self) -> None:
        self.aborted = 0

    def abortConnection(self) -> None:
        self.aborted += 1


class _Client:
    """A connection of any protocol, as ``_stop_serving`` sees it: its transport."""

    def __init__(self) -> None:
        self.transport = _Transport()


def test_losing_the_leadership_aborts_the_clients_of_every_protocol(
        tmp_path: Any, monkeypatch: Any) -> None:
    """``BrokerService._stop_serving`` (the lock lost) aborts every MQTT, AMQP 1.0 and
    AMQP 0.9.1 connection (review finding: 0.9.1 clients stayed connected to a fenced
    broker) and every socket on the AMQP port still waiting for its header; the role
    is fenced and the process is set to end with status 1."""
    from twisted.internet.testing import MemoryReactorClock

    from mqttamqp import service
    from mqttamqp.core.limits import Limits

    statuses: list[int] = []
    monkeypatch.setattr(service, "_exit_status_after_stop", statuses.append)
    reactor = MemoryReactorClock()
    svc = service.BrokerService(str(tmp_path / "data"), Limits(sys_interval=0),
                                reactor=reactor)
    svc.add_amqp_listener("tcp:0:interface=127.0.0.1")   # (not bound: never started)
    mqtt, amqp10, amqp091 = _Client(), _Client(), _Client()
    svc.mqtt_factory.opened.unregistered[mqtt] = None  # type: ignore[index]
    svc.amqp_factory.connections.add(amqp10)
    svc.amqp091_factory.connections.add(amqp091)
    # a socket on the shared port that has not sent its protocol header yet
    unsniffed = svc._amqp_port.buildProtocol(None)
    unsniffed.makeConnection(_Transport())
    svc._stop_serving("the serving lock's connection failed (gone)")
    assert [c.transport.aborted for c in (mqtt, amqp10, amqp091, unsniffed)] == [1, 1, 1, 1]
    assert svc.broker.stats.ha_role == "fenced" and statuses == [1]
    assert reactor.whenRunningHooks
