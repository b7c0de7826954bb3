"""paho-mqtt 2.x as a test client (no tests here), shared by the MQTT, AMQP and console tests.

``PahoClient`` runs paho's network loop in a thread (``loop_start``) and turns its
callbacks into ``threading.Event``s, a ``Condition`` and a ``queue.Queue``, so every
wait is a bounded event wait, never a sleep.  Messages arrive as ``Received`` records.
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties as PahoProperties

TIMEOUT = 10.0

# paho 2.x reports an MQTT 3.x CONNACK return code as an MQTT 5 reason code; map it back.
_V3_RETURN_CODES = {0x84: 1, 0x85: 2, 0x88: 3, 0x86: 4, 0x87: 5}


class Received:
    """One delivered message, copied out of paho's ``MQTTMessage``."""

    __slots__ = ("dup", "payload", "properties", "qos", "retain", "topic")

    def __init__(self, msg: mqtt.MQTTMessage) -> None:
        self.topic = msg.topic
        self.payload = msg.payload
        self.qos = msg.qos
        self.retain = bool(msg.retain)
        self.dup = bool(msg.dup)
        self.properties: Any = getattr(msg, "properties", None)   # MQTT 5

    def __repr__(self) -> str:
        return (f"Received({self.topic!r}, {self.payload!r}, qos={self.qos}, "
                f"retain={self.retain})")


class PahoClient:
    """A connected paho client on its own loop thread, with its callbacks turned into events.

    ``expect_rc``, when given, is the MQTT 3.x CONNACK return code the connection must get.
    ``timeout`` (a class attribute, so a subclass may change it) bounds every wait.
    With ``protocol=MQTTv5``, ``clean`` is clean start and ``properties`` (paho
    ``Properties`` of CONNECT) and ``will_properties`` are sent; ``connack_properties``
    and ``disconnect_reason`` keep what the broker said.
    """

    timeout = TIMEOUT

    def __init__(self, port: int, client_id: str, protocol: int = mqtt.MQTTv311,
                 clean: bool = True, will: tuple[str, bytes, int, bool] | None = None,
                 keepalive: int = 60, *, username: str | None = None,
                 password: str | None = None, expect_rc: int | None = None,
                 properties: Any = None, will_properties: Any = None,
                 transport: str = "tcp") -> None:
        """``transport="websockets"``: MQTT over WebSockets, at the broker's path."""
        self.client_id = client_id
        v5 = protocol == mqtt.MQTTv5
        # paho refuses clean_session for MQTT 5 (clean start goes with connect()).
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=protocol, clean_session=None if v5 else clean,
                             reconnect_on_failure=False, transport=transport)
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
        self.connack_properties: Any = None
        self.disconnect_reason: Any = None
        self.messages: queue.Queue[Received] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack: Any = None
        self.rc: int | None = None
        self.session_present: bool | None = None
        self._subacks: dict[int, list[int]] = {}
        self._suback_cv = threading.Condition()
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.on_unsubscribe = lambda *a: None
        if username is not None:
            self.c.username_pw_set(username, password)
        if will is not None:
            self.c.will_set(will[0], will[1], will[2], will[3], will_properties)
        if v5:
            self.c.connect("127.0.0.1", port, keepalive, clean_start=clean,
                           properties=properties)
        else:
            self.c.connect("127.0.0.1", port, keepalive)
        self.c.loop_start()
        assert self.connected.wait(self.timeout), f"{client_id}: no CONNACK"
        if expect_rc is not None:
            assert self.rc == expect_rc, f"{client_id}: CONNACK {self.rc}, expected {expect_rc}"

    # callbacks (loop thread)
    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        self.connack = reason_code
        self.connack_properties = properties
        value = int(reason_code.value)
        self.rc = value if value < 128 else _V3_RETURN_CODES.get(value, value)
        self.session_present = bool(flags.session_present)
        self.connected.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        self.disconnect_reason = reason_code
        self.disconnected.set()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self.messages.put(Received(msg))

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, codes: Any,
                      properties: Any) -> None:
        with self._suback_cv:
            self._subacks[mid] = [c.value for c in codes]
            self._suback_cv.notify_all()

    # test API
    def subscribe(self, *filters: tuple[str, int], properties: Any = None) -> list[int]:
        """Subscribe and wait for SUBACK; returns the granted QoS values.
        ``properties``: MQTT 5 SUBSCRIBE properties (``props``)."""
        rc, mid = self.c.subscribe(list(filters), properties=properties)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        with self._suback_cv:
            assert self._suback_cv.wait_for(lambda: mid in self._subacks,
                                            self.timeout), "no SUBACK"
            return self._subacks.pop(mid)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                properties: Any = None) -> None:
        """Publish and wait until paho has finished the flow (PUBACK / PUBCOMP)."""
        info = self.c.publish(topic, payload, qos, retain, properties)
        info.wait_for_publish(self.timeout)
        assert info.is_published(), f"publish to {topic} (QoS {qos}) not completed"

    def get(self, timeout: float | None = None) -> Received:
        """The next message, waiting at most ``timeout`` (default: the client's)."""
        wait = self.timeout if timeout is None else timeout
        try:
            return self.messages.get(timeout=wait)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message within {wait}s") from None

    def until(self, topic: str, timeout: float | None = None) -> list[Received]:
        """Messages up to and including the first one on ``topic`` (a marker)."""
        got: list[Received] = []
        while True:
            msg = self.get(timeout)
            got.append(msg)
            if msg.topic == topic:
                return got

    def disconnect(self) -> None:
        """Send DISCONNECT and wait until the connection is closed."""
        self.c.disconnect()
        assert self.disconnected.wait(self.timeout)
        self.c.loop_stop()

    def lose_socket(self) -> None:
        """Cut the TCP connection under paho without DISCONNECT (socket loss)."""
        sock = self.c.socket()
        assert sock is not None
        # Over WebSockets, paho's socket is a wrapper around the TCP one.
        sock = getattr(sock, "_socket", sock)
        sock.shutdown(socket.SHUT_RDWR)
        assert self.disconnected.wait(self.timeout)
        self.c.loop_stop()

    def stop(self) -> None:
        """Clean up whatever state the client is in: DISCONNECT if still connected."""
        if self.connected.is_set() and not self.disconnected.is_set():
            self.c.disconnect()  # also wakes the loop thread, so loop_stop is quick
            self.disconnected.wait(self.timeout)   # the broker has seen it (bounded)
        self.c.loop_stop()
        try:
            sock = self.c.socket()
            if sock is not None:
                sock.close()
        except OSError:
            pass


class Paho5(PahoClient):
    """A paho client speaking MQTT 5 (its waits bounded at 5 s)."""

    timeout = 5.0

    def __init__(self, port: int, client_id: str, clean: bool = True, **kw: Any) -> None:
        super().__init__(port, client_id, mqtt.MQTTv5, clean, **kw)


def props(kind: int, **values: Any) -> PahoProperties:
    """paho's ``Properties`` of a packet type, set from keyword arguments."""
    p = PahoProperties(kind)
    for name, value in values.items():
        setattr(p, name, value)
    return p
