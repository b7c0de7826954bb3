"""Plain AMQP 1.0 applications against the real broker (issue 16, "AMQP 1.0 for
native applications"), written as proton's own examples are: hello world with the
blocking API and accept(), request/response with a dynamic reply address (blocking
and the event-driven Container), a map body between two AMQP clients, string
bodies to MQTT and back, and refused features that leave the connection open.

The same rules in memory, with their edge cases: ``test_amqp_native``; rhea (a
second client library): ``test_rhea_interop``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import TIMEOUT, conns, paho, receiver, run_container, take, uid
from brokerproc import BrokerProcess
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import DynamicNodeProperties
from proton.utils import LinkDetached

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns", "paho"]  # fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("amqp-native")),
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def test_hello_world_blocking_with_accept(broker, conns) -> None:
    """proton's helloworld_blocking: send, receive, accept() (an unsettled send without
    `durable` is at least once, so the receiver gets it unsettled)."""
    address = uid("hello")
    conn = conns(broker)
    rcv = conn.create_receiver(address)
    snd = conn.create_sender(address)
    snd.send(Message(body="Hello World!"))
    msg = rcv.receive(timeout=TIMEOUT)
    assert msg.body == "Hello World!"
    rcv.accept()        # failed with "pop from an empty deque" on a pre-settled delivery


def test_map_body_between_two_amqp_clients(broker, conns) -> None:
    """A map body with properties and application properties, from one AMQP client to
    another, arrives as sent."""
    address = uid("map")
    sender_conn, receiver_conn = conns(broker), conns(broker)
    rcv = receiver_conn.create_receiver(address)
    snd = sender_conn.create_sender(address)
    body = {"sensor": "t1", "values": [21.5, 21.7], "ok": True, "raw": b"\x00\x01"}
    snd.send(Message(body=body, subject="reading", correlation_id="c-9",
                     content_type="application/x-reading", properties={"site": "plant-2"}))
    msg = rcv.receive(timeout=TIMEOUT)
    rcv.accept()
    assert msg.body == body and isinstance(msg.body, dict)
    assert (msg.subject, msg.correlation_id, msg.content_type) == (
        "reading", "c-9", "application/x-reading")
    assert msg.properties == {"site": "plant-2"}


def test_string_bodies_to_mqtt_and_back(broker, conns, paho) -> None:
    """An AmqpValue string reaches MQTT as its UTF-8 bytes; an MQTT payload reaches
    AMQP as one Data section; a map reaches MQTT as JSON."""
    topic = uid("str") + "/t"
    sub = paho(broker, uid("s"))
    sub.subscribe((topic, 1))
    conn = conns(broker)
    rcv = receiver(conn, topic)
    snd = conn.create_sender(topic)
    snd.send(Message(body="Grüße aus AMQP"))
    snd.send(Message(body={"n": 1}))
    assert [sub.get().payload for _ in range(2)] == ["Grüße aus AMQP".encode(), b'{"n":1}']
    assert [rcv.receive(timeout=TIMEOUT).body for _ in range(2)] == ["Grüße aus AMQP", {"n": 1}]
    rcv.accept()
    pub = paho(broker, uid("p"))
    pub.publish(topic, "zurück".encode(), qos=1)
    msg, _ = take(conn, rcv)
    rcv.accept()
    assert msg.inferred is True and bytes(msg.body) == "zurück".encode()


def test_request_response_blocking_with_dynamic_receiver(broker, conns) -> None:
    """proton's sync_client against a server: the client's dynamic receiver gets a
    broker-made address; the server replies to reply-to over the anonymous relay."""
    service = uid("svc")
    server_conn, client_conn = conns(broker), conns(broker)
    requests = server_conn.create_receiver(service)
    relay = server_conn.create_sender(None)
    replies = client_conn.create_receiver(None, dynamic=True)
    reply_to = replies.remote_source.address
    assert reply_to and reply_to.startswith("$dynamic/")
    ask = client_conn.create_sender(service)
    for i, text in enumerate(["Twas brillig", "and the slithy toves"]):
        ask.send(Message(body=text, reply_to=reply_to, correlation_id=i))
        req = requests.receive(timeout=TIMEOUT)
        requests.accept()
        relay.send(Message(address=req.reply_to, body=req.body.upper(),
                           correlation_id=req.correlation_id))
        reply = replies.receive(timeout=TIMEOUT)
        replies.accept()
        assert (reply.body, reply.correlation_id) == (text.upper(), i)
    with pytest.raises(LinkDetached) as err:    # nobody else may read the reply address
        server_conn.create_receiver(reply_to)
    assert err.value.condition == "amqp:unauthorized-access"


class _Server(MessagingHandler):  # type: ignore[misc]
    """proton's server.py: answers each request to its reply-to (anonymous relay)."""

    def __init__(self, url: str, address: str, ready: threading.Event, n: int) -> None:
        super().__init__()
        self.url, self.address, self.ready, self.n = url, address, ready, n

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, self.address)
        self.relay = event.container.create_sender(conn, None)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver:
            self.ready.set()

    def on_message(self, event: Any) -> None:
        msg = event.message
        self.relay.send(Message(address=msg.reply_to, body=msg.body.upper(),
                                correlation_id=msg.correlation_id))
        self.n -= 1
        if self.n == 0:
            event.connection.close()


class _Client(MessagingHandler):  # type: ignore[misc]
    """proton's client.py: a dynamic receiver, then one request per line."""

    def __init__(self, url: str, address: str, lines: list[str]) -> None:
        super().__init__()
        self.url, self.address, self.lines = url, address, lines
        self.replies: list[str] = []
        self.reply_to: str | None = None

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(conn, self.address)
        self.receiver = event.container.create_receiver(
            conn, None, dynamic=True, options=DynamicNodeProperties({"x-test": True}))

    def on_link_opened(self, event: Any) -> None:
        if event.receiver == self.receiver:
            self.reply_to = event.receiver.remote_source.address
            for i, line in enumerate(self.lines):
                self.sender.send(Message(body=line, reply_to=self.reply_to, correlation_id=i))

    def on_message(self, event: Any) -> None:
        self.replies.append(event.message.body)
        if len(self.replies) == len(self.lines):
            event.connection.close()


def test_request_response_event_driven_container(broker) -> None:
    """proton's client.py and server.py, both on the event-driven Container."""
    url = f"127.0.0.1:{broker.ports['AMQP']}"
    service = uid("esvc")
    lines = ["one", "two", "three"]
    ready = threading.Event()
    server = _Server(url, service, ready, len(lines))
    thread = threading.Thread(target=run_container, args=(server,), daemon=True)
    thread.start()
    assert ready.wait(TIMEOUT)
    client = _Client(url, service, lines)
    run_container(client)
    thread.join(TIMEOUT)
    assert client.reply_to is not None and client.reply_to.startswith("$dynamic/")
    assert client.replies == ["ONE", "TWO", "THREE"]


def test_other_source_filters_refused_at_the_link_connection_stays(broker, conns) -> None:
    """A source filter other than a JMS selector (here a legacy topic binding) is
    refused with amqp:not-implemented at that link; the connection carries on."""
    from proton import Described, symbol
    from proton.reactor import Filter

    address = uid("sel")
    conn = conns(broker)
    binding = Described(symbol("apache.org:legacy-amqp-topic-binding:string"), "a.*")
    with pytest.raises(LinkDetached) as err:
        conn.create_receiver(address, options=Filter({symbol("topic"): binding}))
    assert err.value.condition == "amqp:not-implemented"
    # (a new link name: proton keeps the refused link's name attached on its side)
    rcv = conn.create_receiver(address, name="after-the-refusal")
    conn.create_sender(address).send(Message(body="still open"))
    assert rcv.receive(timeout=TIMEOUT).body == "still open"
    rcv.accept()



