"""AMQP 1.0 §3.2: the bare message is immutable (issue 24, items 4-6).

What an AMQP sender puts in the bare message (properties, application properties,
body) reaches AMQP receivers as it was sent, through a topic address and through a
durable queue (``$queue/...``); the header's ``priority`` and ``durable`` are
carried, ``ttl`` is what is left of it, ``first-acquirer`` is true on a message's
first delivery and false after, ``delivery-count`` counts the failed deliveries.  A
queue's own metadata travels in message annotations (``x-opt-message-id`` and the
rest), never in the sender's sections.

Against the real broker with python-qpid-proton: clients shaped like proton's
python examples (``simple_send``/``simple_recv``, ``db_send``/``db_recv``: integer
ids that the receiver compares) and the header and property cases of Qpid's
interop suite (``jms_hdrs_props_test``: each message-id type, correlation-id,
user-id, subject, reply-to, content type and encoding, the times, group fields,
typed application properties).  The same rules in memory, with redeliveries: the
end of this file.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_clients import TIMEOUT, conns, paho, receiver, run_container, take, uid
from brokerproc import BrokerProcess
from proton import Delivery, Message, byte, float32, int32, short, ulong
from proton.handlers import MessagingHandler
from proton.utils import BlockingConnection

pytestmark = pytest.mark.timeout(120)
__all__ = ["conns", "paho"]  # fixtures

KINDS = ("topic", "queue")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("bare-message")),
                         listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def _address(kind: str) -> str:
    return uid("bare") + "/t" if kind == "topic" else f"$queue/{uid('bare')}"


def _url(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.ports['AMQP']}"


# == proton's examples: simple_send / simple_recv, db_send / db_recv =========================

class _SimpleSend(MessagingHandler):  # type: ignore[misc]
    """Shaped like proton's simple_send.py: ``total`` messages with integer ids
    1..total and bodies ``{'sequence': i}``, sent as credit allows; closes once every
    one is accepted."""

    def __init__(self, url: str, address: str, total: int) -> None:
        super().__init__()
        self.url, self.address, self.total = url, address, total
        self.sent = self.confirmed = 0

    def on_start(self, event: Any) -> None:
        event.container.create_sender(event.container.connect(self.url), self.address)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.total:
            self.sent += 1
            event.sender.send(Message(id=self.sent, body={"sequence": self.sent}))

    def on_accepted(self, event: Any) -> None:
        self.confirmed += 1
        if self.confirmed == self.total:
            event.connection.close()


class _SimpleRecv(MessagingHandler):  # type: ignore[misc]
    """Shaped like proton's simple_recv.py: a message whose id is below the count
    received so far is a duplicate and ignored (the id must compare with an int);
    stops after ``expected``."""

    def __init__(self, url: str, address: str, expected: int,
                 ready: threading.Event | None = None) -> None:
        super().__init__()
        self.url, self.address, self.expected, self.ready = url, address, expected, ready
        self.received = 0
        self.got: list[tuple[Any, Any]] = []

    def on_start(self, event: Any) -> None:
        event.container.create_receiver(event.container.connect(self.url), self.address)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None and self.ready is not None:
            self.ready.set()

    def on_message(self, event: Any) -> None:
        if event.message.id and event.message.id < self.received:
            return  # a duplicate
        if self.received < self.expected:
            self.got.append((event.message.id, event.message.body))
            self.received += 1
            if self.received == self.expected:
                event.receiver.close()
                event.connection.close()


def _send_then_receive(broker: BrokerProcess, kind: str, sender: Any, receiver_: Any) -> None:
    """As proton's test_examples runs them: for a queue the sender first, then the
    receiver; for a topic (nothing kept for later) the receiver must be attached
    before the sender starts."""
    if kind == "queue":
        run_container(sender)
        run_container(receiver_)
        return
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_container(receiver_)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert receiver_.ready.wait(TIMEOUT)
    run_container(sender)
    thread.join(TIMEOUT + 5)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("kind", KINDS)
def test_simple_send_recv(broker, kind: str) -> None:
    """proton's test_simple_send_recv through a topic and a queue address: the
    receiver compares each message-id with an int, and gets every body in order
    with the integer id it was sent with."""
    address, n = _address(kind), 10
    ready = threading.Event()
    recv = _SimpleRecv(_url(broker), address, n, ready)
    _send_then_receive(broker, kind, _SimpleSend(_url(broker), address, n), recv)
    assert recv.got == [(i, {"sequence": i}) for i in range(1, n + 1)]
    assert all(type(message_id) is int for message_id, _ in recv.got)


class _DbSend(MessagingHandler):  # type: ignore[misc]
    """Shaped like proton's db_send.py: records read from a database table, each
    sent with the record's id as message-id; done when every one is accepted."""

    def __init__(self, url: str, address: str, path: str) -> None:
        super().__init__()
        self.url, self.address, self.path = url, address, path
        self.records: list[tuple[int, str]] = []
        self.sent = self.confirmed = 0

    def on_start(self, event: Any) -> None:
        with sqlite3.connect(self.path) as db:
            self.records = list(db.execute("SELECT id, description FROM records ORDER BY id"))
        event.container.create_sender(event.container.connect(self.url), self.address)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < len(self.records):
            record_id, description = self.records[self.sent]
            event.sender.send(Message(id=record_id, body=description))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.confirmed += 1
        if self.confirmed == len(self.records):
            event.connection.close()


class _DbRecv(MessagingHandler):  # type: ignore[misc]
    """Shaped like proton's db_recv.py: ``int(message.id)`` is the record id; a
    message at or below the last id stored is a duplicate; each one is stored, then
    accepted."""

    def __init__(self, url: str, address: str, path: str, expected: int,
                 ready: threading.Event | None = None) -> None:
        super().__init__(auto_accept=False)
        self.url, self.address, self.path = url, address, path
        self.expected, self.ready = expected, ready
        self.last_id: int | None = None
        self.received = 0

    def on_start(self, event: Any) -> None:
        event.container.create_receiver(event.container.connect(self.url), self.address)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None and self.ready is not None:
            self.ready.set()

    def on_message(self, event: Any) -> None:
        record_id = int(event.message.id)
        if self.last_id is None or record_id > self.last_id:
            with sqlite3.connect(self.path) as db:
                db.execute("INSERT INTO records (id, description) VALUES (?, ?)",
                           (record_id, event.message.body))
            self.last_id = record_id
            self.received += 1
        self.accept(event.delivery)
        if self.received == self.expected:
            event.receiver.close()
            event.connection.close()


@pytest.mark.parametrize("kind", KINDS)
def test_db_send_recv(broker, kind: str, tmp_path) -> None:
    """proton's test_db_send_recv through a topic and a queue address: the records
    arrive in the receiver's database under the ids they were sent with."""
    src, dst = str(tmp_path / "src.db"), str(tmp_path / "dst.db")
    rows = [(i, f"sample-{i}") for i in range(1, 11)]
    for path in (src, dst):
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, description TEXT)")
    with sqlite3.connect(src) as db:
        db.executemany("INSERT INTO records VALUES (?, ?)", rows)
    address = _address(kind)
    recv = _DbRecv(_url(broker), address, dst, len(rows), threading.Event())
    _send_then_receive(broker, kind, _DbSend(_url(broker), address, src), recv)
    with sqlite3.connect(dst) as db:
        assert list(db.execute("SELECT id, description FROM records ORDER BY id")) == rows


# == Qpid interop: header and property cases ==================================================

def _deliver(broker: BrokerProcess, conns: Any, kind: str, messages: list[Message]
             ) -> list[Message]:
    """Send ``messages`` (unsettled) through a fresh topic or queue address and
    return them as one receiver gets them (each accepted)."""
    address = _address(kind)
    conn = conns(broker)
    rcv = receiver(conn, address, credit=len(messages)) if kind == "topic" else None
    snd = conn.create_sender(address)
    for message in messages:
        assert snd.send(message).remote_state == Delivery.ACCEPTED
    if rcv is None:
        rcv = receiver(conn, address, credit=len(messages))
    got = []
    for _ in messages:
        message, dlv = take(conn, rcv)
        dlv.update(Delivery.ACCEPTED)
        dlv.settle()
        got.append(message)
    return got


_TYPED = {"bool": True, "byte": byte(-7), "short": short(300), "int": int32(-70000),
          "long": 2**40, "float": float32(1.5), "double": 2.25, "string": "text",
          "char-free": "ünïcode",
          # the names of a queue's metadata: the sender's own, kept as sent
          "message-id": "mine", "queue": "mine too", "delivery-count": 99}


@pytest.mark.parametrize("kind", KINDS)
def test_properties_and_application_properties_arrive_as_sent(broker, conns,
                                                              kind: str) -> None:
    """Every field of the properties section (an integer message-id, user-id,
    subject, reply-to, correlation-id, content type and encoding, absolute expiry
    and creation time, group id, sequence and reply-to group) and typed application
    properties arrive unchanged; ``to`` is the topic on a topic address and stays
    unset through a queue."""
    sent = Message(id=ulong(7), user_id=b"guest", subject="JMSType", reply_to="reply/here",
                   correlation_id="corr-1", content_type="application/json",
                   content_encoding="identity", expiry_time=2_000_000_000.25,
                   creation_time=1_700_000_000.5, group_id="grp", group_sequence=3,
                   reply_to_group_id="rgrp", properties=dict(_TYPED),
                   body={"sequence": 1})
    [got] = _deliver(broker, conns, kind, [sent])
    want = _as_proton_reads(sent)
    for field in ("id", "user_id", "subject", "reply_to", "correlation_id", "content_type",
                  "content_encoding", "expiry_time", "creation_time", "group_id",
                  "group_sequence", "reply_to_group_id", "body"):
        assert _plain(getattr(got, field)) == _plain(getattr(want, field)), field
    assert got.properties == _TYPED
    assert {k: type(v) for k, v in got.properties.items()} == {
        k: type(v) for k, v in _TYPED.items()}
    assert (got.address is None) if kind == "queue" else got.address.endswith("/t")


def _as_proton_reads(message: Message) -> Message:
    """``message`` as proton decodes it straight from its own encoding (what a
    receiver gets when nothing between changed it)."""
    got = Message()
    got.decode(message.encode())
    return got


def _plain(value: Any) -> Any:
    """A value and its Python type as proton hands it out (binary as bytes)."""
    if isinstance(value, memoryview):
        value = bytes(value)
    return type(value), value


_IDS = [ulong(2**40 + 3), uuid.UUID("4e6b1c6a-5f3d-4c1e-9a57-0d1f2a3b4c5d"),
        b"\x00binary\xff", "string-id"]


@pytest.mark.parametrize("kind", KINDS)
def test_message_and_correlation_ids_of_every_type_arrive_as_sent(broker, conns,
                                                                  kind: str) -> None:
    """message-id and correlation-id as ulong, UUID, binary and string: the same
    type and value at the receiver."""
    sent = [Message(id=value, correlation_id=value, body=str(i)) for i, value in enumerate(_IDS)]
    got = _deliver(broker, conns, kind, sent)
    want = [_as_proton_reads(m) for m in sent]
    assert [_plain(m.id) for m in got] == [_plain(m.id) for m in want]
    assert [_plain(m.correlation_id) for m in got] == [_plain(m.correlation_id) for m in want]
    assert [_plain(m.id)[0] for m in got] == [int, uuid.UUID, bytes, str]


@pytest.mark.parametrize("kind", KINDS)
def test_header_priority_durable_ttl_first_acquirer(broker, conns, kind: str) -> None:
    """Header cases: priority (0, 7, 9 and the default 4) and durable arrive as sent;
    ttl arrives as what is left of it; first-acquirer is true and delivery-count 0 on
    the first delivery (sent true, or left false)."""
    cases = [(7, True, True), (0, False, False), (9, True, False), (4, False, True)]
    sent = []
    for priority, durable, first in cases:
        m = Message(body=f"p{priority}", priority=priority, durable=durable, ttl=60.0)
        m.first_acquirer = first
        sent.append(m)
    got = _deliver(broker, conns, kind, sent)
    assert [(m.body, m.priority, m.durable) for m in got] == [
        (f"p{p}", p, d) for p, d, _ in cases]
    assert all(55.0 < m.ttl <= 60.0 for m in got), [m.ttl for m in got]
    assert [(m.first_acquirer, m.delivery_count) for m in got] == [(True, 0)] * len(cases)


def test_queue_metadata_is_in_message_annotations(broker, conns, paho) -> None:
    """A queue's metadata reaches an AMQP receiver as message annotations
    (``x-opt-message-id`` = ``<queue>:<offset>``, ``x-opt-queue``, ``x-opt-offset``,
    ``x-opt-group``, ``x-opt-topic``), for an AMQP sender's message and an MQTT
    publisher's; the sender's application properties are all it gets there."""
    name = uid("meta")
    conn = conns(broker)
    snd = conn.create_sender(f"$queue/{name}/eu")
    assert snd.send(Message(id=1, body="amqp", properties={"k": "v"})).remote_state \
        == Delivery.ACCEPTED
    paho(broker, uid("p")).publish(f"$queue/{name}/us", b"mqtt", qos=1)
    rcv = receiver(conn, f"$queue/{name}", credit=2)
    got = []
    for _ in range(2):
        message, dlv = take(conn, rcv)
        dlv.update(Delivery.ACCEPTED)
        dlv.settle()
        got.append(message)
    amqp_msg, mqtt_msg = got
    assert (amqp_msg.id, amqp_msg.address, amqp_msg.properties) == (1, None, {"k": "v"})
    assert (mqtt_msg.id, mqtt_msg.properties, bytes(mqtt_msg.body)) == (None, None, b"mqtt")
    for offset, (message, key) in enumerate(((amqp_msg, "eu"), (mqtt_msg, "us"))):
        ann = {str(k): v for k, v in message.annotations.items()}
        assert {k: ann[k] for k in ("x-opt-message-id", "x-opt-queue", "x-opt-offset",
                                    "x-opt-group", "x-opt-topic")} == {
            "x-opt-message-id": f"{name}:{offset}", "x-opt-queue": name,
            "x-opt-offset": offset, "x-opt-group": name,
            "x-opt-topic": f"$queue/{name}/{key}"}


def test_priority_of_a_queued_message_survives_a_crash(tmp_path) -> None:
    """A queued message's priority is stored with it: after ``kill -9`` and a
    restart it is delivered with the priority it was sent with."""
    name = uid("crash")
    broker = BrokerProcess(str(tmp_path), listeners=("--amqp",))
    broker.start()
    try:
        conn = BlockingConnection(_url(broker), timeout=TIMEOUT)
        snd = conn.create_sender(f"$queue/{name}")
        assert snd.send(Message(id=5, body="urgent", priority=8, durable=True)).remote_state \
            == Delivery.ACCEPTED
        conn.close()
        broker.kill()
        broker = BrokerProcess(str(tmp_path), listeners=("--amqp",))
        broker.start()
        conn = BlockingConnection(_url(broker), timeout=TIMEOUT)
        rcv = receiver(conn, f"$queue/{name}", credit=1)
        message, dlv = take(conn, rcv)
        dlv.update(Delivery.ACCEPTED)
        dlv.settle()
        conn.close()
        assert (message.id, message.body, message.priority, message.durable) == (
            5, "urgent", 8, True)
    finally:
        broker.stop()


# == in memory: redeliveries, and records stored before priority was kept ====================

