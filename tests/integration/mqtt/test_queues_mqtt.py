"""Durable queues (``$queue/``) over MQTT with real clients against the real broker:
paho-mqtt 2.x as MQTT 5 and 3.1.1, mosquitto_pub/mosquitto_sub as -V 5 and 311,
raw sockets for the input a library refuses to send (a wildcard in a publish).

What is proved: groups fan out and share round-robin; a filter is a group of its
own; MQTT 5 members acknowledge with ``$ack``/``$nack``/``$reject`` (metadata user
properties checked) and rejected messages reach ``$dlq/``; an MQTT 3.1.1 member's
PUBACK is its acknowledgement and what it did not acknowledge moves to the other
member when it leaves; a member whose socket dies or whose process is killed hands
its messages on too; streams read from first, an offset and a time; retention
drops the oldest; bad input gets a PUBACK reason code with a reason string (MQTT
5), or a plain PUBACK (3.1.1), and loses nothing; and across a ``kill -9`` of the
broker no message the producer had a PUBACK for is lost and no message whose
``$ack`` was confirmed comes back.

Every wait is an event wait with a timeout (``pahoclient``, ``RawClient``, the
mosquitto processes' output lines); "nothing more" is shown with a marker message
published last, never by waiting for silence.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import paho.mqtt.client as mqtt
import pahoclient
import pytest
from brokerproc import BrokerProcess, RestartableBroker
from mosquitto import Sub, pub
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from rawclient import RawClient

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Properties, Puback, Publish

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 10.0
_ids = itertools.count(1)


def name(prefix: str = "q") -> str:
    """A queue or group name unique to this run, without ``-`` (a 3.1.1 client id
    up to its first ``-`` is its group)."""
    return f"{prefix}{next(_ids)}x{uuid.uuid4().hex[:8]}"


def meta(message: pahoclient.Received) -> dict[str, str]:
    """The user properties of an MQTT 5 delivery."""
    props = message.properties
    assert props is not None and hasattr(props, "UserProperty"), message
    return dict(props.UserProperty)


class QClient(pahoclient.PahoClient):
    """A paho client that also keeps what each PUBACK said (reason code and string),
    subscribes with user properties and acknowledges queue messages."""

    timeout = TIMEOUT

    def __init__(self, port: int, client_id: str, v5: bool = True, manual_ack: bool = False,
                 clean: bool = True) -> None:
        self._acks: dict[int, tuple[int, str | None]] = {}
        self._ack_cv = threading.Condition()
        super().__init__(port, client_id, mqtt.MQTTv5 if v5 else mqtt.MQTTv311, clean)
        self.c.on_publish = self._on_publish
        if manual_ack:   # (PUBACK only when ``ack_transport`` says so)
            self.c.manual_ack_set(True)

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any,
                    properties: Any) -> None:
        reason = getattr(properties, "ReasonString", None) if properties else None
        with self._ack_cv:
            self._acks[mid] = (int(reason_code.value), reason)
            self._ack_cv.notify_all()

    def join(self, topic_filter: str, qos: int = 1, **users: str) -> int:
        """SUBSCRIBE with user properties (``consumer_group="g"`` is sent as
        ``consumer-group``); returns the SUBACK code."""
        props = None
        if users:
            props = PahoProperties(PacketTypes.SUBSCRIBE)
            props.UserProperty = [(k.replace("_", "-"), v) for k, v in users.items()]
        rc, mid = self.c.subscribe([(topic_filter, qos)], properties=props)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        with self._suback_cv:
            assert self._suback_cv.wait_for(lambda: mid in self._subacks, self.timeout), \
                "no SUBACK"
            return self._subacks.pop(mid)[0]

    def send(self, topic: str, payload: bytes = b"", qos: int = 1,
             users: tuple[tuple[str, str], ...] = ()) -> tuple[int, str | None]:
        """Publish at QoS 1 and wait for PUBACK: its (reason code, reason string)."""
        props = None
        if users:
            props = PahoProperties(PacketTypes.PUBLISH)
            props.UserProperty = list(users)
        info = self.c.publish(topic, payload, qos, False, props)
        with self._ack_cv:
            assert self._ack_cv.wait_for(lambda: info.mid in self._acks, self.timeout), \
                f"{self.client_id}: no PUBACK for {topic}"
            return self._acks.pop(info.mid)

    def settle(self, message: pahoclient.Received, action: str = "$ack",
               reason: str | None = None, message_id: str | None = None
               ) -> tuple[int, str | None]:
        """``$ack``/``$nack``/``$reject`` ``message`` (its own metadata names it)."""
        m = meta(message)
        users = [("message-id", message_id or m["message-id"]), ("group-id", m["group-id"])]
        if reason is not None:
            users.append(("reason", reason))
        namespace = "$dlq/" if m["queue"].startswith("$dlq/") else "$queue/"
        queue = m["queue"].removeprefix("$dlq/")
        return self.send(f"{namespace}{queue}/{action}", users=tuple(users))


@pytest.fixture(scope="module")
def qbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module; a message is dead-lettered at its 3rd delivery."""
    proc = BrokerProcess(str(tmp_path_factory.mktemp("qdata")), "--queue-max-deliveries", "3")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def paho(qbroker: BrokerProcess) -> Iterator[Callable[..., QClient]]:
    """``paho(client_id, v5=True, manual_ack=False)`` -> a connected QClient."""
    made: list[QClient] = []

    def open_client(client_id: str, v5: bool = True, manual_ack: bool = False,
                    port: int | None = None) -> QClient:
        c = QClient(port or qbroker.mqtt_port, client_id, v5, manual_ack)
        made.append(c)
        return c

    yield open_client
    for c in made:
        c.stop()


def drain(client: QClient, marker: bytes) -> list[pahoclient.Received]:
    """Messages up to (without) the one whose payload is ``marker``."""
    got = []
    while True:
        m = client.get()
        if m.payload == marker:
            return got
        got.append(m)


# -- groups ------------------------------------------------------------------------


def test_groups_fan_out_and_members_share_round_robin(paho) -> None:
    """Two groups of one queue each get every message; within a group of two
    MQTT 5 members each message goes to one member, alternately."""
    q, g = name(), name("g")
    w1, w2, audit = paho(name("w")), paho(name("w")), paho(name("a"))
    assert w1.join(f"$queue/{q}/#", consumer_group=g) == 1
    assert w2.join(f"$queue/{q}/#", consumer_group=g) == 1
    assert audit.join(f"$queue/{q}", consumer_group=name("audit")) == 1
    producer = paho(name("p"), v5=False)
    for i in range(6):
        producer.publish(f"$queue/{q}/job", b"%d" % i, qos=1)
    seen = {c: [c.get() for _ in range(n)] for c, n in ((w1, 3), (w2, 3), (audit, 6))}
    assert sorted(m.payload for m in seen[audit]) == [b"%d" % i for i in range(6)]
    one, two = ({m.payload for m in seen[c]} for c in (w1, w2))
    assert one | two == {b"%d" % i for i in range(6)} and not one & two, (one, two)
    for c, messages in seen.items():
        for m in messages:
            assert m.topic == f"$queue/{q}/job"
            assert c.settle(m) == (0, None)


def test_mosquitto_clients_311_and_5(qbroker: BrokerProcess) -> None:
    """mosquitto_sub 3.1.1 members named ``<group>-1``/``-2`` share the queue (their
    PUBACK acknowledges); a ``-V 5`` member of another group (``-D subscribe
    user-property consumer-group ...``) gets every message with its metadata;
    mosquitto_pub publishes as 3.1.1 and 5."""
    q, group = name(), name("m")
    fmt = ("-F", "MSG|%t|%q|%r|%p|%P")
    subs = [Sub(qbroker.mqtt_port, "mqttv311", "-i", f"{group}-{i}", "-t", f"$queue/{q}/#",
                "-q", "1", "-C", "2", *fmt) for i in (1, 2)]
    five = Sub(qbroker.mqtt_port, "mqttv5", "-i", name("f"), "-t", f"$queue/{q}/#", "-q", "1",
               "-C", "4", "-D", "subscribe", "user-property", "consumer-group", name("five"),
               "-F", "%t|%p|%P")
    try:
        for s in (*subs, five):
            s.wait_subscribed()
        for i, version in enumerate(("mqttv311", "mqttv5", "mqttv311", "mqttv5")):
            done = pub(qbroker, version, f"$queue/{q}/k", "-q", "1", message=f"m{i}")
            assert "PUBACK" in done.stdout, done.stdout
        got = sorted(s.message()[3].split("|")[0] for s in subs for _ in range(2))
        assert got == ["m0", "m1", "m2", "m3"]
        lines = []
        while len(lines) < 4:
            line = five._line(TIMEOUT)
            if line.startswith(f"$queue/{q}/k|"):
                lines.append(line)
        for i, line in enumerate(lines):
            _, payload, users = line.split("|", 2)
            assert payload == f"m{i}"
            assert f"message-id:{q}:{i}" in users and f"offset:{i}" in users, users
            assert "delivery-count:1" in users, users
        for s in (*subs, five):
            assert s.finish() == 0
    finally:
        for s in (*subs, five):
            s.kill()


def test_a_filter_is_a_group_of_its_own(paho) -> None:
    """``$queue/<q>/eu/#`` sees only eu keys; ``$queue/<q>/#`` under the same group
    name is another group and sees both."""
    q, g = name(), name("g")
    eu, every = paho(f"{g}-1", v5=False), paho(f"{g}-2", v5=False)
    assert eu.subscribe((f"$queue/{q}/eu/#", 1)) == [1]
    assert every.subscribe((f"$queue/{q}/#", 1)) == [1]
    producer = paho(name("p"))
    for key in ("eu/1", "us/1", "eu/2"):
        assert producer.send(f"$queue/{q}/{key}", key.encode()) == (0, None)
    producer.send(f"$queue/{q}/eu/end", b"end")
    assert [m.payload for m in drain(eu, b"end")] == [b"eu/1", b"eu/2"]
    assert [m.payload for m in drain(every, b"end")] == [b"eu/1", b"us/1", b"eu/2"]


# -- acknowledgements -----------------------------------------------------------------


def test_mqtt5_ack_nack_reject_and_the_dead_letter_queue(paho) -> None:
    """paho as an MQTT 5 member: $ack, $nack redelivers, $reject sends to the dead-letter
    queue with the metadata and user properties."""
    q, g, dg = name(), name("g"), name("d")
    worker, dead = paho(name("w")), paho(name("d"))
    assert worker.join(f"$queue/{q}/#", consumer_group=g) == 1
    assert dead.join(f"$dlq/{q}/#", consumer_group=dg) == 1
    producer = paho(name("p"))
    assert producer.send(f"$queue/{q}/orders/7", b"order",
                         users=(("tenant", "acme"),)) == (0, None)
    first = worker.get()
    m = meta(first)
    assert (first.topic, first.payload) == (f"$queue/{q}/orders/7", b"order")
    assert (m["message-id"], m["group-id"], m["queue"], m["offset"], m["delivery-count"],
            m["tenant"]) == (f"{q}:0", g, q, "0", "1", "acme")
    # paho PUBACKed the delivery: for an MQTT 5 member that is not the ack.
    assert worker.settle(first, "$nack") == (0, None)
    again = worker.get()
    assert meta(again)["delivery-count"] == "2" and again.payload == b"order"
    assert worker.settle(again, "$reject", reason="cannot parse") == (0, None)
    corpse = dead.get()
    d = meta(corpse)
    assert corpse.topic == f"$dlq/{q}/orders/7" and corpse.payload == b"order"
    assert (d["origin-queue"], d["origin-offset"], d["reason"], d["queue"],
            d["tenant"]) == (q, "0", "cannot parse", f"$dlq/{q}", "acme")
    assert dead.settle(corpse) == (0, None)            # acknowledged in the DLQ too
    # acknowledged already: the same ack again is refused, with why
    code, why = worker.settle(again)
    assert code == 0x80 and why and "not pending" in why, (code, why)
    # nacked until --queue-max-deliveries (3): dead-lettered
    producer.send(f"$queue/{q}/orders/8", b"retry")
    for count in ("1", "2", "3"):
        m8 = worker.get()
        assert meta(m8)["delivery-count"] == count
        assert worker.settle(m8, "$nack") == (0, None)
    corpse = dead.get()
    assert corpse.payload == b"retry" and "nacked after 3" in meta(corpse)["reason"]
    assert dead.settle(corpse) == (0, None)


def test_mqtt311_puback_is_the_ack_and_unacked_move_on(paho) -> None:
    """3.1.1 members: PUBACKed messages are done; a member that leaves without
    PUBACKing has its messages moved to the other member at once."""
    q, g = name(), name("g")
    holder = paho(f"{g}-1", v5=False, manual_ack=True)
    assert holder.subscribe((f"$queue/{q}/#", 1)) == [1]
    producer = paho(name("p"), v5=False)
    for i in range(3):
        producer.publish(f"$queue/{q}/t", b"%d" % i, qos=1)
    held = [holder.get() for _ in range(3)]
    assert [m.payload for m in held] == [b"0", b"1", b"2"]
    other = paho(f"{g}-2", v5=False)
    assert other.subscribe((f"$queue/{q}/#", 1)) == [1]
    holder.disconnect()                        # no PUBACK was sent for any of them
    assert sorted(other.get().payload for _ in range(3)) == [b"0", b"1", b"2"]
    # ``other`` PUBACKed them (paho does): done; only the marker comes next
    late = paho(f"{g}-3", v5=False)
    assert late.subscribe((f"$queue/{q}/#", 1)) == [1]
    other.disconnect()
    producer.publish(f"$queue/{q}/t", b"end", qos=1)
    assert late.get().payload == b"end"


def test_a_member_whose_socket_dies_gives_its_messages_to_another(paho) -> None:
    """An MQTT 5 member's TCP connection is cut (no DISCONNECT): what it had not
    acknowledged goes to the other member, with its delivery count raised."""
    q, g = name(), name("g")
    doomed, survivor = paho(name("w")), paho(name("w"))
    assert doomed.join(f"$queue/{q}/#", consumer_group=g) == 1
    producer = paho(name("p"))
    for i in range(4):
        producer.send(f"$queue/{q}/t", b"%d" % i)
    held = [doomed.get() for _ in range(4)]
    assert doomed.settle(held[0]) == (0, None)  # one done; three pending on it
    assert survivor.join(f"$queue/{q}/#", consumer_group=g) == 1
    doomed.lose_socket()
    moved = sorted((m.payload, meta(m)["delivery-count"]) for m in
                   (survivor.get() for _ in range(3)))
    assert moved == [(b"1", "2"), (b"2", "2"), (b"3", "2")]
    producer.send(f"$queue/{q}/t", b"end")
    assert survivor.get().payload == b"end"


def test_a_member_process_killed_gives_its_messages_to_another(qbroker: BrokerProcess,
                                                               paho) -> None:
    """A ``mosquitto_sub -V 5`` member (it cannot ``$ack``: everything it got stays
    pending on it) is killed with SIGKILL: its messages go to the paho member."""
    q, g = name(), name("g")
    doomed = Sub(qbroker.mqtt_port, "mqttv5", "-i", name("m"), "-t", f"$queue/{q}/#",
                 "-q", "1", "-D", "subscribe", "user-property", "consumer-group", g,
                 "-F", "MSG|%t|%q|%r|%p", "-W", "60")
    try:
        doomed.wait_subscribed()
        producer = paho(name("p"))
        for i in range(3):
            producer.send(f"$queue/{q}/t", b"%d" % i)
        assert sorted(doomed.message()[3] for _ in range(3)) == ["0", "1", "2"]
        survivor = paho(name("w"))
        assert survivor.join(f"$queue/{q}/#", consumer_group=g) == 1
    finally:
        doomed.kill()
    moved = sorted((m.payload, meta(m)["delivery-count"]) for m in
                   (survivor.get() for _ in range(3)))
    assert moved == [(b"0", "2"), (b"1", "2"), (b"2", "2")]


# -- streams and retention ----------------------------------------------------------------


def test_stream_reads_from_first_an_offset_and_a_time(paho) -> None:
    """Stream readers over MQTT start at first, at an offset, or at a time given as a
    number or ISO 8601."""
    q = name()
    producer = paho(name("p"))
    for i in range(2):
        producer.send(f"$queue/{q}/t", b"%d" % i)
    between = time.time()    # after message 1's PUBACK, before message 2 is published
    for i in range(2, 5):
        producer.send(f"$queue/{q}/t", b"%d" % i)
    iso = datetime.fromtimestamp(between, UTC).isoformat()
    starts = {"first": 0, "3": 3, f"@{between!r}": 2, iso: 2}
    readers = {}
    for start in starts:
        reader = paho(name("s"))
        assert reader.join(f"$queue/{q}/#", consumer_group=name("sg"),
                           consumer_mode="stream", stream_offset=start) == 1
        readers[start] = reader
    # a classic group still gets all five: the streams claimed none
    worker = paho(name("w"), v5=False)
    assert worker.subscribe((f"$queue/{q}/#", 1)) == [1]
    producer.send(f"$queue/{q}/t", b"end")
    for start, first in starts.items():
        got = [m.payload for m in drain(readers[start], b"end")]
        assert got == [b"%d" % i for i in range(first, 5)], start
    assert len(drain(worker, b"end")) == 5
    refused = paho(name("s"))
    assert refused.join(f"$queue/{q}/#", consumer_mode="stream",
                        stream_offset="yesterday") == 0x80


def test_retention_keeps_the_newest(tmp_path) -> None:
    """--queue-max-messages 3: of five messages the oldest two go."""
    with BrokerProcess(str(tmp_path / "data"), "--queue-max-messages", "3") as proc:
        q = name()
        producer = QClient(proc.mqtt_port, name("p"), v5=False)
        reader = QClient(proc.mqtt_port, name("r"))
        try:
            for i in range(5):
                producer.publish(f"$queue/{q}/t", b"%d" % i, qos=1)
            assert reader.join(f"$queue/{q}/#", consumer_mode="stream") == 1
            assert [reader.get().payload for _ in range(3)] == [b"2", b"3", b"4"]
            producer.publish(f"$queue/{q}/t", b"end", qos=1)
            assert reader.get().payload == b"end"
        finally:
            producer.stop()
            reader.stop()


# -- bad input ----------------------------------------------------------------------------


def test_bad_input_gets_a_clear_refusal_and_loses_nothing(qbroker: BrokerProcess,
                                                          paho) -> None:
    """Malformed acks, acks from outside the group and nameless queue publishes get reason
    codes with why, and the message stays."""
    q, g = name(), name("g")
    worker, outsider = paho(name("w")), paho(name("o"))
    assert worker.join(f"$queue/{q}/#", consumer_group=g) == 1
    producer = paho(name("p"))
    producer.send(f"$queue/{q}/t", b"keep")
    pending = worker.get()
    # a malformed message-id, an ack from outside the group, a foreign queue's id
    code, why = worker.settle(pending, message_id=f"{q}-0")
    assert code == 0x80 and why and "malformed" in why, why
    code, why = worker.settle(pending, message_id="other:0")
    assert code == 0x80 and why and "not of queue" in why, why
    code, why = outsider.settle(pending)
    assert code == 0x80 and why and "not a member" in why, why
    # a queue publish with no name: 0x90 with why
    code, why = producer.send("$queue/", b"x")
    assert code == 0x90 and why and "names no queue" in why, why
    # wildcards (paho will not send them: a raw MQTT 5 socket does)
    raw = RawClient(qbroker.mqtt_port, 5)
    try:
        assert raw.connect(name("raw")).return_code == 0
        raw.send(Publish(f"$queue/{q}/+", b"x", 1, False, False, 1))
        ack = raw.expect(Puback, 1)
        assert isinstance(ack, Puback) and ack.reason_code == 0x90
        assert ack.properties == Properties(reason_string=ack.properties.reason_string)
        assert "wildcards" in (ack.properties.reason_string or "")
        # 3.1.1 cannot be told why: a plain PUBACK, and the connection stays open
        old = RawClient(qbroker.mqtt_port, 4)
        assert old.connect(name("old")).return_code == 0
        old.send(Publish(f"$queue/{q}/#", b"x", 1, False, False, 2))
        assert old.expect(Puback, 2) == Puback(2)
        old.publish(f"$queue/{q}/t", b"after", 1)        # still connected
        old.close()
    finally:
        raw.close()
    # mosquitto_pub -V 5 is told too
    done = pub(qbroker, "mqttv5", "$queue/", "-q", "1", message="x", check=False)
    assert "PUBACK" in done.stdout and "144" in done.stdout, done.stdout
    # nothing was lost: the pending message is still the worker's to acknowledge
    assert worker.settle(pending) == (0, None)
    assert worker.get().payload == b"after"


# -- kill -9 ------------------------------------------------------------------------------


class Acker:
    """An MQTT 5 member that ``$ack``s every delivery from paho's loop thread and
    records what it got (by message-id) and which acknowledgements the broker
    confirmed (PUBACK 0)."""

    def __init__(self, port: int, client_id: str, queue: str, group: str) -> None:
        self.client = QClient(port, client_id)
        self.delivered: dict[str, tuple[bytes, int]] = {}   # message-id: payload, count
        self.confirmed: set[str] = set()                     # message-ids
        self._sent: dict[int, str] = {}
        self.lock = threading.Lock()
        self.got_end = threading.Event()     # the marker ``end`` arrived
        self.client.c.on_message = self._on_message
        self.client.c.on_publish = self._on_publish
        assert self.client.join(f"$queue/{queue}/#", consumer_group=group) == 1

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        m = dict(msg.properties.UserProperty)
        props = PahoProperties(PacketTypes.PUBLISH)
        props.UserProperty = [("message-id", m["message-id"]), ("group-id", m["group-id"])]
        info = client.publish(f"$queue/{m['queue']}/$ack", b"", 1, False, props)
        with self.lock:
            self.delivered[m["message-id"]] = (msg.payload, int(m["delivery-count"]))
            self._sent[info.mid] = m["message-id"]
        if msg.payload == b"end":
            self.got_end.set()

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any,
                    properties: Any) -> None:
        with self.lock:
            message_id = self._sent.pop(mid, None)
            if message_id is not None and int(reason_code.value) == 0:
                self.confirmed.add(message_id)


class Producer:
    """A raw 3.1.1 publisher at QoS 1 with at most ``window`` publishes awaiting
    PUBACK (so it is still sending when the broker dies)."""

    def __init__(self, port: int, queue: str, payload: dict[int, bytes],
                 window: int = 64) -> None:
        self.raw = RawClient(port, 4)
        assert self.raw.connect(name("prod")).return_code == 0
        self.queue = queue
        self.payload = payload
        self.todo = sorted(payload)
        self.window = window
        self.waiting: set[int] = set()
        self.promised: set[bytes] = set()

    def _fill(self) -> None:
        frames = []
        while self.todo and len(self.waiting) < self.window:
            pid = self.todo.pop(0)
            self.waiting.add(pid)
            frames.append(encode(Publish(f"$queue/{self.queue}/t", self.payload[pid], 1,
                                         False, False, pid), 4))
        if frames:
            self.raw.send(b"".join(frames))

    def run_until(self, done: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        self._fill()
        while not done():
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"producer: {len(self.promised)} PUBACKs so far"
            packet = self.raw.expect(Puback, timeout=remaining)
            assert isinstance(packet, Puback)
            self.waiting.discard(packet.packet_id)
            self.promised.add(self.payload[packet.packet_id])
            self._fill()


def test_kill_9_loses_no_promised_message_and_brings_back_no_confirmed_ack(tmp_path) -> None:
    """A producer streams N QoS 1 messages to a queue; two MQTT 5 ``$ack``-ers and a
    3.1.1 PUBACK-er (one group) consume; the broker is killed -9 mid-flow and
    restarted on the same data directory; the producer re-sends what it had no
    PUBACK for and a new member drains.  Every message the producer had a PUBACK
    for before the kill is delivered at least once in all; no message whose
    ``$ack`` was confirmed comes back; a message delivered before the kill and again
    after it shows a raised delivery-count; in the end all N were delivered."""
    n = 2000
    data = str(tmp_path / "data")
    q, g = name("jobs"), name("k")
    payload = {pid: b"m%04d" % pid for pid in range(1, n + 1)}
    made: list[QClient] = []
    proc = RestartableBroker(data).start()
    try:
        ackers = [Acker(proc.mqtt_port, f"{g}-{i}", q, g) for i in (1, 2)]
        old = QClient(proc.mqtt_port, f"{g}-3", v5=False)   # group g by its client id
        made += [a.client for a in ackers] + [old]
        assert old.subscribe((f"$queue/{q}/#", 1)) == [1]
        producer = Producer(proc.mqtt_port, q, payload)
        producer.run_until(lambda: len(producer.promised) >= n // 3
                           and sum(len(a.confirmed) for a in ackers) >= 20)
        proc.kill()
        producer.raw.close()
        for c in made:
            assert c.disconnected.wait(TIMEOUT)
        promised = set(producer.promised)
        sent = n - len(producer.todo)
        before: dict[str, tuple[bytes, int]] = {}
        for a in ackers:
            with a.lock:
                before.update(a.delivered)
        before_311 = set()
        while not old.messages.empty():
            before_311.add(old.messages.get().payload)
        confirmed = set().union(*(a.confirmed for a in ackers))

        proc = RestartableBroker(data).start()
        drainer = Acker(proc.mqtt_port, f"{g}-9", q, g)
        made.append(drainer.client)
        again = Producer(proc.mqtt_port, q, {pid: payload[pid] for pid in payload
                                             if payload[pid] not in promised})
        again.run_until(lambda: not again.todo and not again.waiting)
        again.raw.close()
        end = QClient(proc.mqtt_port, name("end"), v5=False)
        made.append(end)
        end.publish(f"$queue/{q}/t", b"end", qos=1)
        assert drainer.got_end.wait(60), (
            f"drain incomplete: {len(drainer.delivered)} delivered after the restart")
        with drainer.lock:
            after = {k: v for k, v in drainer.delivered.items() if v[0] != b"end"}
        bodies = {b for b, _ in before.values()} | before_311 | {b for b, _ in after.values()}
        lost = sorted(promised - bodies)
        back = sorted(confirmed & set(after))
        not_raised = sorted(k for k in set(after) & set(before)
                            if after[k][1] <= before[k][1])
        missing = sorted(set(payload.values()) - bodies)
        figures = (f"N={n}, sent before the kill={sent}, PUBACKed before the kill="
                   f"{len(promised)}, delivered before={len(before)} MQTT 5 + "
                   f"{len(before_311)} 3.1.1, confirmed $acks={len(confirmed)}, re-sent "
                   f"after the restart={len(again.promised)}, delivered after={len(after)} "
                   f"(of them delivered before too: {len(set(after) & set(before))})")
        print(figures)
        assert not lost, f"PUBACKed but never delivered: {lost[:10]} ({figures})"
        assert not back, f"confirmed $ack but delivered again: {back[:10]} ({figures})"
        assert not not_raised, (f"redelivered without a raised delivery-count: "
                                f"{not_raised[:10]} ({figures})")
        assert not missing, f"never delivered: {missing[:10]} ({figures})"
    finally:
        for c in made:
            c.stop()
        proc.stop()
