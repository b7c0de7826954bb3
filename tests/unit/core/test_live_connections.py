"""The table of live connections: MQTT ones kept by client id, read by the
console's ``"mqtt:" + client id`` key, beside the AMQP adapters' own keys."""

from __future__ import annotations

from twisted.internet.task import Clock

from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.live import LiveConnections
from mqttamqp.core.limits import Limits


class _Conn:
    """A live connection as the table sees it (only its identity matters here)."""

    def __init__(self, client_id: str, label: str = "mqtt3.1.1") -> None:
        self.client_id = client_id
        self.protocol_label = label

    def event_fields(self) -> tuple[str, str, None, bool, int]:
        return (self.client_id, "127.0.0.1:1", None, True, 60)

    def info(self) -> object:
        raise NotImplementedError

    def close(self, reason: str) -> None:
        pass


def _broker() -> Broker:
    from fakes import NullStore
    return Broker(Clock(), NullStore(), Limits(sys_interval=0))


def test_an_mqtt_connection_is_read_by_its_console_key() -> None:
    """A client registered by client id is found, listed and counted under
    ``"mqtt:" + client id``, as the console and its commands ask for it."""
    broker = _broker()
    conn = _Conn("dev-1")
    broker.registry.register_client("dev-1", conn, "mqtt3.1.1")  # type: ignore[arg-type]
    table = broker.connections
    assert table.get("mqtt:dev-1") is conn and table["mqtt:dev-1"] is conn
    assert "mqtt:dev-1" in table and "dev-1" not in table
    assert list(table) == ["mqtt:dev-1"] and len(table) == 1
    assert table.values() == [conn]
    assert table == {"mqtt:dev-1": conn}


def test_the_table_keeps_no_key_string_per_mqtt_client() -> None:
    """The MQTT table's key is the client id object the connection holds: no
    ``"mqtt:" + client id`` string is kept per connection."""
    broker = _broker()
    client_id = "".join(["dev-", "2"])   # (a string of its own, not an interned one)
    conn = _Conn(client_id)
    broker.registry.register_client(client_id, conn, "mqtt3.1.1")  # type: ignore[arg-type]
    [kept] = list(broker.connections.mqtt)
    assert kept is client_id
    broker.registry.unregister_client(client_id, conn)  # type: ignore[arg-type]
    assert len(broker.connections) == 0 and not broker.connections.mqtt


def test_an_mqtt_client_id_that_looks_like_an_amqp_key_does_not_collide() -> None:
    """An MQTT client id ``amqp:1`` and the AMQP connection keyed ``amqp:1`` are two
    connections, each unregistered on its own, each counted under its protocol."""
    broker = _broker()
    mqtt, amqp = _Conn("amqp:1"), _Conn("container", "amqp")
    broker.registry.register_client("amqp:1", mqtt, "mqtt3.1.1")  # type: ignore[arg-type]
    broker.register_connection("amqp:1", amqp, "amqp")  # type: ignore[arg-type]
    assert broker.connections.get("mqtt:amqp:1") is mqtt
    assert broker.connections.get("amqp:1") is amqp
    assert sorted(broker.connections) == ["amqp:1", "mqtt:amqp:1"]
    broker.registry.unregister_client("amqp:1", amqp)  # type: ignore[arg-type]
    assert len(broker.connections) == 2          # (not that key's connection: no-op)
    broker.unregister_connection("amqp:1", amqp)  # type: ignore[arg-type]
    assert list(broker.connections) == ["mqtt:amqp:1"]


def test_register_connection_with_an_mqtt_key_is_register_client() -> None:
    """``register_connection("mqtt:" + id)`` (as tests and older callers do) lands
    in the same table as ``register_client(id)``: a takeover's newcomer replaces it."""
    broker = _broker()
    old, new = _Conn("dev-3"), _Conn("dev-3")
    broker.register_connection("mqtt:dev-3", old, "mqtt3.1.1")  # type: ignore[arg-type]
    broker.registry.register_client("dev-3", new, "mqtt3.1.1")  # type: ignore[arg-type]
    assert broker.connections == {"mqtt:dev-3": new}
    broker.unregister_connection("mqtt:dev-3", old)  # type: ignore[arg-type]
    assert broker.connections.get("mqtt:dev-3") is new


def test_an_empty_table() -> None:
    """An empty table reads as an empty mapping."""
    table = _broker().connections
    assert isinstance(table, LiveConnections)
    assert len(table) == 0 and list(table) == [] and table.get("mqtt:x") is None
    assert table == {} and 3 not in table
