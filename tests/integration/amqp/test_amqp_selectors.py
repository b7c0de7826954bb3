"""Selectors on AMQP 1.0 receivers (issue 30): ``apache.org:selector-filter:string``.

Against the real broker with python-qpid-proton: clients shaped like proton's
python examples ``colour_send`` / ``selected_recv`` (red and green messages, a
receiver with ``Selector("colour = 'green'")`` gets the green ones) through a
topic (receiver first) and a durable queue (sender first, as proton's
test_examples runs them); the attach echoes the filter; on a queue the messages
a selective consumer does not take stay for the others; a selector that does not
parse is refused with amqp:invalid-field, and the connection carries on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import TIMEOUT, conns, paho, run_container, uid
from brokerproc import BrokerProcess
from proton import Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Selector
from proton.utils import LinkDetached

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns", "paho"]  # fixtures


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("selectors")),
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def _url(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.ports['AMQP']}"


class _ColourSend(MessagingHandler):  # type: ignore[misc]
    """Shaped like proton's colour_send.py: ``total`` messages alternating red and
    green, body ``'<colour> <n>'`` and application property ``colour``; closes once
    every one is accepted."""

    def __init__(self, url: str, address: str, total: int) -> None:
        super().__init__()
        self.url, self.address, self.total = url, address, total
        self.sent = self.confirmed = 0

    def on_start(self, event: Any) -> None:
        event.container.create_sender(event.container.connect(self.url), self.address)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.total:
            colour = ("red", "green")[self.sent % 2]
            number = self.sent // 2 + 1
            event.sender.send(Message(body=f"{colour} {number}",
                                      properties={"colour": colour}))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.confirmed += 1
        if self.confirmed == self.total:
            event.connection.close()


class _SelectedRecv(MessagingHandler):  # type: ignore[misc]
    """Shaped like proton's selected_recv.py: a receiver with
    ``Selector("colour = 'green'")``; stops after ``expected`` messages."""

    def __init__(self, url: str, address: str, expected: int,
                 ready: threading.Event | None = None) -> None:
        super().__init__()
        self.url, self.address, self.expected, self.ready = url, address, expected, ready
        self.got: list[str] = []
        self.echoed: Any = None

    def on_start(self, event: Any) -> None:
        event.container.create_receiver(event.container.connect(self.url), self.address,
                                        options=Selector("colour = 'green'"))

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None:
            data = event.receiver.remote_source.filter
            data.rewind()
            self.echoed = data.get_object() if data.next() is not None else None
            if self.ready is not None:
                self.ready.set()

    def on_message(self, event: Any) -> None:
        self.got.append(event.message.body)
        if len(self.got) == self.expected:
            event.receiver.close()
            event.connection.close()


def _echoed_selector(echoed: Any) -> str:
    assert isinstance(echoed, dict) and len(echoed) == 1
    (value,) = echoed.values()
    assert str(value.descriptor) == "apache.org:selector-filter:string"
    return str(value.value)


def test_selected_recv_from_a_queue(broker) -> None:
    """proton's test_selected_recv through a durable queue: colour_send first, then
    selected_recv gets exactly the green messages, in order; the attach echoes the
    selector it applied."""
    address, n = f"$queue/{uid('sel')}", 20
    run_container(_ColourSend(_url(broker), address, n))
    recv = _SelectedRecv(_url(broker), address, n // 2)
    run_container(recv)
    assert recv.got == [f"green {i}" for i in range(1, n // 2 + 1)]
    assert _echoed_selector(recv.echoed) == "colour = 'green'"


def test_selected_recv_from_a_topic(broker) -> None:
    """The same through a topic: the receiver attached first gets only the green
    messages."""
    address, n = uid("sel") + "/t", 20
    ready = threading.Event()
    recv = _SelectedRecv(_url(broker), address, n // 2, ready)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_container(recv)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(TIMEOUT)
    run_container(_ColourSend(_url(broker), address, n))
    thread.join(TIMEOUT + 5)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    assert recv.got == [f"green {i}" for i in range(1, n // 2 + 1)]
    assert _echoed_selector(recv.echoed) == "colour = 'green'"


def test_queue_consumers_with_selectors_leave_the_rest(broker, conns) -> None:
    """Two consumers of one queue with different selectors each get only what they
    select; what neither selects stays in the queue and a plain consumer gets it."""
    address = f"$queue/{uid('sel')}"
    conn = conns(broker)
    snd = conn.create_sender(address)
    for i, colour in enumerate(["red", "green", "blue", "green", "red", "blue"]):
        snd.send(Message(body=f"{colour} {i}", properties={"colour": colour, "n": i}))
    reds = conn.create_receiver(address, credit=10, name="reds",
                                options=Selector("colour = 'red'"))
    greens = conn.create_receiver(address, credit=10, name="greens",
                                  options=Selector("colour IN ('green') AND n > 1"))
    got_red = [reds.receive(timeout=TIMEOUT).body for _ in range(2)]
    reds.accept()
    reds.accept()
    got_green = [greens.receive(timeout=TIMEOUT).body]
    greens.accept()
    assert got_red == ["red 0", "red 4"]
    assert got_green == ["green 3"]
    rest = conn.create_receiver(address, credit=10, name="rest")
    bodies = []
    for _ in range(3):
        bodies.append(rest.receive(timeout=TIMEOUT).body)
        rest.accept()
    assert bodies == ["green 1", "blue 2", "blue 5"]


def test_selector_on_header_fields_and_mqtt_messages(broker, conns, paho) -> None:
    """JMS header names select on the AMQP header and properties (JMSPriority,
    JMSType), and an MQTT 5 publisher's user properties are application
    properties; a message failing the selector is not delivered."""
    topic = uid("sel") + "/h"
    conn = conns(broker)
    rcv = conn.create_receiver(
        topic, credit=10,
        options=Selector("JMSPriority > 6 OR (JMSType LIKE 'ord%' AND JMSPriority = 4)"))
    snd = conn.create_sender(topic)
    snd.send(Message(body="low", priority=2))
    snd.send(Message(body="high", priority=9))
    snd.send(Message(body="order", subject="order-1"))
    snd.send(Message(body="other", subject="misc"))
    snd.send(Message(body="high-2", priority=7))
    assert [rcv.receive(timeout=TIMEOUT).body for _ in range(3)] == ["high", "order", "high-2"]


def test_bad_selector_refused_connection_stays(broker, conns) -> None:
    """A selector that does not parse is refused with amqp:invalid-field at that
    link, saying why; the connection carries on."""
    address = uid("sel")
    conn = conns(broker)
    with pytest.raises(LinkDetached) as err:
        conn.create_receiver(address, options=Selector("colour = "))
    assert err.value.condition == "amqp:invalid-field"
    rcv = conn.create_receiver(address, name="after-the-refusal")
    conn.create_sender(address).send(Message(body="still open"))
    assert rcv.receive(timeout=TIMEOUT).body == "still open"
    rcv.accept()


def test_retained_messages_are_selected_too(broker, conns) -> None:
    """The retained messages a selective topic receiver gets at attach are only
    those its selector is true of."""
    base = uid("sel")
    conn = conns(broker)
    snd = conn.create_sender(None)
    for colour in ("red", "green"):
        snd.send(Message(address=f"{base}/{colour}", body=colour,
                         properties={"colour": colour},
                         annotations={symbol("x-opt-retain-message"): True}))
    rcv = conn.create_receiver(f"{base}/+", credit=10, options=Selector("colour = 'green'"))
    assert rcv.receive(timeout=TIMEOUT).body == "green"
    snd.send(Message(address=f"{base}/marker", body="marker",
                     properties={"colour": "green"}))
    assert rcv.receive(timeout=TIMEOUT).body == "marker"


def test_selector_on_a_shared_subscription_refused(broker, conns) -> None:
    """A selector on a ``$share/`` source is refused with amqp:not-implemented (the
    group would hand it messages its selector refuses); the connection stays."""
    conn = conns(broker)
    with pytest.raises(LinkDetached) as err:
        conn.create_receiver(f"$share/g/{uid('sel')}/t", options=Selector("a = 1"))
    assert err.value.condition == "amqp:not-implemented"
    topic = uid("sel")
    rcv = conn.create_receiver(topic, name="after-the-refusal")
    conn.create_sender(topic).send(Message(body="still open"))
    assert rcv.receive(timeout=TIMEOUT).body == "still open"
