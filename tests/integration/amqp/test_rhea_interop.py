"""Interop with a second AMQP 1.0 client library: rhea on node (``tests/rhea``).

The scripts in ``tests/rhea`` (``send.js``, ``receive.js``, ``responder.js``,
``request.js``) each talk to the broker over 127.0.0.1 with SASL ANONYMOUS, print one
JSON object per line (``{"event": ...}``; bodies described as ``{"type": ..., ...}``, see
``tests/rhea/common.js``) and end by themselves: exit 0 when done, 1 on an AMQP error, 2
at their own ``--timeout``.  Tests wait on those lines (a receiver's ``receiver_open``
before anything is sent to it), never on a clock; paho-mqtt is the MQTT side.

Native AMQP addresses are topic names (docs/amqp.md).  rhea is pinned in
``tests/rhea/package-lock.json`` and installed by ``.ci/setup`` (``npm ci``).  Without
node or ``tests/rhea/node_modules`` these tests are skipped, except under CI (the ``CI``
environment variable set), where that is a failure.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import queue
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from brokerproc import BrokerProcess
from pahoclient import PahoClient

pytestmark = pytest.mark.timeout(60)

RHEA_DIR = Path(__file__).resolve().parents[2] / "support" / "rhea"
NODE = shutil.which("node")
SCRIPT_TIMEOUT = 10      # each script's own deadline, seconds
WAIT = SCRIPT_TIMEOUT + 5.0   # the test's bound on a script (its deadline, and room to exit)
_ids = itertools.count(1)



def uid(prefix: str = "r") -> str:
    """Unique id, usable as MQTT client id (<= 23 characters) and topic level."""
    return f"{prefix}{next(_ids)}-{uuid.uuid4().hex[:8]}"[:23]


def _rhea_missing() -> str | None:
    if NODE is None:
        return "node is not installed (apt-get install nodejs)"
    if not (RHEA_DIR / "node_modules" / "rhea").is_dir():
        return "rhea is not installed (cd tests/rhea && npm ci)"
    return None


@pytest.fixture(scope="module", autouse=True)
def rhea_installed() -> None:
    """Skip without node or rhea, unless under CI, where a missing tool is a failure."""
    missing = _rhea_missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{missing}; CI is set, so this is a failure (run .ci/setup)")
        pytest.skip(missing)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("rhea")), listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


class Script:
    """One running rhea script; its JSON lines are read by a thread into a queue."""

    def __init__(self, port: int, script: str, *args: str) -> None:
        assert NODE is not None
        self.name = script
        cmd = [NODE, str(RHEA_DIR / script), "--host", "127.0.0.1", "--port", str(port),
               "--timeout", str(SCRIPT_TIMEOUT), *args]
        self.proc = subprocess.Popen(cmd, cwd=RHEA_DIR, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.output: list[str] = []
        self.seen: list[dict[str, Any]] = []
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue            # node's own messages (a stack trace) stay in output
            if isinstance(event, dict):
                self.events.put(event)
        self.events.put(None)       # EOF

    def _explain(self, what: str) -> str:
        return f"{self.name}: {what}; its output:\n" + "".join(self.output)

    def wait_for(self, kind: str, timeout: float = WAIT) -> dict[str, Any]:
        """The next ``kind`` event; an error, a timeout or the end first fails the test."""
        while True:
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(self._explain(f"no {kind!r} within {timeout}s")) from None
            if event is None:
                raise AssertionError(self._explain(f"ended before {kind!r}"))
            self.seen.append(event)
            if event["event"] == kind:
                return event
            if event["event"] in ("error", "timeout"):
                raise AssertionError(self._explain(f"{event['event']} before {kind!r}"))

    def finish(self, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Wait for a successful end ("done", exit 0); every event it printed."""
        self.wait_for("done", timeout)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(self._explain("did not exit after done")) from None
        self._pump_thread.join(timeout)
        while (event := self.events.get_nowait()) is not None:
            self.seen.append(event)
        assert rc == 0, self._explain(f"exit status {rc}")
        return self.seen

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.seen if e["event"] == kind]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


Start = Callable[..., Script]


@pytest.fixture
def rhea(broker: BrokerProcess) -> Iterator[Start]:
    """``rhea(script, *args)``: a rhea script against the module broker, killed at the end
    if it is still running.  Each gets a container id of its own (``--id``) unless given
    one: the container id is the AMQP client's MQTT client id."""
    started: list[Script] = []

    def start(script: str, *args: str) -> Script:
        if "--id" not in args:
            args = (*args, "--id", uid(script[0]))
        s = Script(broker.ports["AMQP"], script, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


@pytest.fixture
def paho(broker: BrokerProcess) -> Iterator[Callable[[str], PahoClient]]:
    made: list[PahoClient] = []

    def open_client(client_id: str) -> PahoClient:
        client = PahoClient(broker.mqtt_port, client_id, mqtt.MQTTv311)
        made.append(client)
        return client

    yield open_client
    for client in made:
        client.stop()


def receiver(rhea: Start, address: str, count: int, *args: str) -> Script:
    """A rhea receiver on ``address``, attached (so nothing sent after this is missed)."""
    r = rhea("receive.js", "--address", address, "--count", str(count), *args)
    opened = r.wait_for("receiver_open")
    assert opened["address"] == address, opened
    return r


def string(text: str) -> dict[str, Any]:
    return {"type": "string", "value": text}


def text_of(body: dict[str, Any]) -> str:
    """The text a body carries, whichever way it came: a string, or UTF-8 bytes."""
    if body["type"] == "string":
        return str(body["value"])
    assert body["type"] in ("data", "binary"), body
    return base64.b64decode(body["base64"]).decode()


def messages(receiver: Script) -> list[dict[str, Any]]:
    return [e["message"] for e in receiver.finish() if e["event"] == "message"]


# -- rhea → rhea ----------------------------------------------------------------------


def test_rhea_sender_to_rhea_receiver_all_arrive_in_order(rhea: Start) -> None:
    """N string messages from a rhea sender reach a rhea receiver on the topic, in order."""
    topic = f"rhea/{uid()}/all"
    n = 25
    r = receiver(rhea, topic, n)
    sent = rhea("send.js", "--address", topic, "--count", str(n), "--prefix", "m").finish()
    assert len([e for e in sent if e["event"] == "accepted"]) == n
    got = messages(r)
    assert [text_of(m["body"]) for m in got] == [f"m-{i}" for i in range(n)]


BODIES = [string("hello"), string(""), string("ünïcødé ✓"),
          {"type": "map", "value": {"sensor": "t1", "value": 21.5, "count": 3, "ok": True}},
          string("after the map")]


def test_rhea_to_rhea_body_types_kept(rhea: Start) -> None:
    """String bodies stay strings and a map stays a map between two rhea clients."""
    topic = f"rhea/{uid()}/bodies"
    r = receiver(rhea, topic, len(BODIES))
    specs = json.dumps([{"body": b} for b in BODIES])
    sent = rhea("send.js", "--address", topic, "--messages", specs).finish()
    outcomes = [(e["event"], e["error"]) for e in sent if "index" in e and e["event"] != "sent"]
    assert outcomes == [("accepted", None)] * len(BODIES)
    assert [m["body"] for m in messages(r)] == BODIES


def test_rhea_to_rhea_properties_kept(rhea: Start) -> None:
    """subject, message_id, correlation_id, content_type and application properties
    reach the rhea receiver as sent."""
    topic = f"rhea/{uid()}/props"
    r = receiver(rhea, topic, 1)
    spec = {"body": string("with properties"), "subject": "greeting",
            "message_id": "m-1", "correlation_id": "c-1", "content_type": "text/plain",
            "application_properties": {"colour": "blue", "n": 7}}
    rhea("send.js", "--address", topic, "--messages", json.dumps([spec])).finish()
    (got,) = messages(r)
    for field in ("subject", "message_id", "correlation_id", "content_type",
                  "application_properties"):
        assert got.get(field) == spec[field], (field, got)
    assert got["body"] == spec["body"]


# -- rhea ↔ MQTT ----------------------------------------------------------------------


def test_rhea_sender_to_paho_subscriber(rhea: Start, paho: Callable[[str], PahoClient]) -> None:
    """A string body from rhea reaches an MQTT subscriber as its UTF-8 bytes, on the topic
    that was the AMQP address; a Data section as its bytes."""
    topic = f"rhea/{uid()}/to-mqtt"
    sub = paho(uid("sub"))
    assert sub.subscribe((topic, 1)) == [1]
    specs = [{"body": string("grüße from rhea")},
             {"body": {"type": "data", "base64": base64.b64encode(b"\x00\xffraw").decode()}}]
    sent = rhea("send.js", "--address", topic, "--messages", json.dumps(specs)).finish()
    assert len([e for e in sent if e["event"] == "accepted"]) == 2
    first, second = sub.get(), sub.get()
    assert (first.topic, first.payload) == (topic, "grüße from rhea".encode())
    assert (second.topic, second.payload) == (topic, b"\x00\xffraw")


def test_paho_publisher_to_rhea_receiver(rhea: Start, paho: Callable[[str], PahoClient]) -> None:
    """An MQTT payload reaches a rhea receiver as one Data section (the payload's bytes),
    with the MQTT annotations; QoS 1 unsettled, QoS 0 pre-settled."""
    topic = f"rhea/{uid()}/from-mqtt"
    r = receiver(rhea, topic, 2)
    pub = paho(uid("pub"))
    pub.publish(topic, b"21.5", qos=1)
    pub.publish(topic, "ü".encode(), qos=0)
    got = [e for e in r.finish() if e["event"] == "message"]
    m1, m2 = got[0]["message"], got[1]["message"]
    assert m1["body"] == {"type": "data", "base64": base64.b64encode(b"21.5").decode()}
    assert m2["body"] == {"type": "data", "base64": base64.b64encode("ü".encode()).decode()}
    assert m1["message_annotations"]["x-opt-mqtt-qos"] == 1
    assert m1["message_annotations"]["x-opt-mqtt-client-id"] == pub.client_id
    assert m1["message_annotations"]["x-opt-retain-message"] is False
    assert m2["message_annotations"]["x-opt-mqtt-qos"] == 0
    assert [e["settled"] for e in got] == [False, True]


# -- settlement -----------------------------------------------------------------------


def test_unsettled_sends_accepted_and_received_once(rhea: Start) -> None:
    """Every unsettled send from rhea is Accepted, once; an autoaccept receiver sees each
    message exactly once, then a marker sent after them (so no duplicate hides behind)."""
    topic = f"rhea/{uid()}/once"
    n = 30
    r = receiver(rhea, topic, n + 1)
    sent = rhea("send.js", "--address", topic, "--count", str(n), "--prefix", "u",
                "--durable").finish()
    accepted = [e["index"] for e in sent if e["event"] == "accepted"]
    assert sorted(accepted) == list(range(n))
    assert [e for e in sent if e["event"] in ("rejected", "released", "modified")] == []
    rhea("send.js", "--address", topic, "--count", "1", "--prefix", "marker").finish()
    got = [e for e in r.finish() if e["event"] == "message"]
    assert [text_of(e["message"]["body"]) for e in got] == \
        [f"u-{i}" for i in range(n)] + ["marker-0"]
    assert [e["settled"] for e in got[:n]] == [False] * n   # durable: at least once


@pytest.mark.parametrize("settled", [pytest.param(False, id="unsettled"),
                                     pytest.param(True, id="presettled")])
def test_sender_settlement_decides_the_guarantee(rhea: Start, settled: bool) -> None:
    """Without durable or x-opt-mqtt-qos, an unsettled send reaches the receiver unsettled
    (at least once) and a pre-settled one pre-settled (at most once)."""
    topic = f"rhea/{uid()}/settle"
    r = receiver(rhea, topic, 3)
    rhea("send.js", "--address", topic, "--count", "3",
         *(["--settled"] if settled else [])).finish()
    got = [e for e in r.finish() if e["event"] == "message"]
    assert [e["settled"] for e in got] == [settled] * 3


# -- request / response with a dynamic reply-to --------------------------------------


@pytest.mark.parametrize("via", ["link", "anonymous"])
def test_request_response_with_dynamic_reply_to(rhea: Start, via: str) -> None:
    """Two rhea clients each attach a receiver with a dynamic source, get a distinct
    broker-created address in the attach, send requests with reply_to = that address to a
    rhea responder on a service topic, and each gets exactly its own replies.  The
    responder answers over a sender link to reply_to, or the anonymous relay with ``to``."""
    service = f"rhea/{uid()}/service"
    n = 3
    responder = rhea("responder.js", "--address", service, "--count", str(2 * n),
                     "--via", via)
    assert responder.wait_for("receiver_open")["address"] == service
    clients = {name: rhea("request.js", "--address", service, "--count", str(n),
                          "--id", name)
               for name in (uid("a"), uid("b"))}
    reply_to = {name: c.wait_for("receiver_open")["address"] for name, c in clients.items()}
    for name, c in clients.items():
        assert reply_to[name], c.finish()   # no address: finish() fails with the output
    assert len(set(reply_to.values())) == 2, reply_to
    for name, c in clients.items():
        events = c.finish()
        assert len([e for e in events if e["event"] == "accepted"]) == n
        replies = [e["message"] for e in events if e["event"] == "reply"]
        assert sorted(m["correlation_id"] for m in replies) == [f"{name}-{i}" for i in range(n)]
        for m in replies:
            assert m["body"] == string(f"reply:request-{m['correlation_id']}"), m
    requests = [e["message"] for e in responder.finish() if e["event"] == "request"]
    assert len(requests) == 2 * n
    for m in requests:
        owner = m["message_id"].rsplit("-", 1)[0]
        assert m["reply_to"] == reply_to[owner], m
        assert m["body"] == string(f"request-{m['message_id']}"), m


def test_rhea_queue_consumer_accepts(rhea, paho) -> None:
    """Durable queues (issue 12): a rhea receiver on ``$queue/<name>`` gets MQTT
    publishes with the queue's metadata in the message annotations
    (``x-opt-message-id`` = ``<name>:<offset>``, ``x-opt-queue``), none in the
    message's own sections; its Accepted acknowledges them (a later receiver of the
    group gets the next message only)."""
    name = uid("q")
    first = receiver(rhea, f"$queue/{name}", 2)
    pub = paho(uid("p"))
    for i in range(2):
        pub.publish(f"$queue/{name}/k", f"job {i}".encode(), qos=1)
    got = [e["message"] for e in first.finish() if e["event"] == "message"]
    assert [text_of(m["body"]) for m in got] == ["job 0", "job 1"]
    assert [m["message_annotations"]["x-opt-message-id"] for m in got] == [
        f"{name}:0", f"{name}:1"]
    assert got[0]["message_annotations"]["x-opt-queue"] == name
    assert "message_id" not in got[0] and "application_properties" not in got[0]
    pub.publish(f"$queue/{name}/k", b"job 2", qos=1)
    later = receiver(rhea, f"$queue/{name}", 1)
    [msg] = [e["message"] for e in later.finish() if e["event"] == "message"]
    assert (text_of(msg["body"]), msg["message_annotations"]["x-opt-message-id"]) == (
        "job 2", f"{name}:2")


@pytest.mark.parametrize("kind", ["topic", "queue"])
def test_rhea_receiver_with_a_selector(rhea, kind: str) -> None:
    """Selectors (issue 30): a rhea receiver attaching with rhea's
    ``filter.selector`` gets only the messages it selects, through a topic and a
    durable queue, and the broker echoes the selector in the source's filter."""
    address = f"rhea/{uid()}/sel" if kind == "topic" else f"$queue/{uid('q')}"
    selector = "colour = 'green' AND n >= 2"
    specs = [{"body": string(f"{colour} {n}"),
              "application_properties": {"colour": colour, "n": n}}
             for n in range(4) for colour in ("red", "green")]
    if kind == "queue":
        rhea("send.js", "--address", address, "--messages", json.dumps(specs)).finish()
    r = rhea("receive.js", "--address", address, "--count", "2", "--selector", selector)
    opened = r.wait_for("receiver_open")
    assert opened["selector"] == selector, opened
    if kind == "topic":
        rhea("send.js", "--address", address, "--messages", json.dumps(specs)).finish()
    assert [text_of(m["body"]) for m in messages(r)] == ["green 2", "green 3"]


def test_rhea_drain_on_a_queue_then_a_browser(rhea) -> None:
    """rhea's ``drain_credit`` on a queue receiver attached with 5 credits: the queue's
    3 messages, then the drained flow.  A browser (distribution-mode copy, echoed)
    drained the same way first reads them and leaves them there."""
    address = f"$queue/{uid('q')}"
    specs = [{"body": string(f"m{n}")} for n in range(3)]
    rhea("send.js", "--address", address, "--messages", json.dumps(specs)).finish()
    browser = rhea("receive.js", "--address", address, "--count", "5", "--drain", "--copy")
    assert browser.wait_for("receiver_open")["distribution_mode"] == "copy"
    assert browser.wait_for("drained")["received"] == 3
    browser.finish()
    assert [text_of(e["message"]["body"]) for e in browser.of("message")] == ["m0", "m1", "m2"]
    consumer = rhea("receive.js", "--address", address, "--count", "5", "--drain")
    assert consumer.wait_for("drained")["received"] == 3
    consumer.finish()
    assert [text_of(e["message"]["body"]) for e in consumer.of("message")] == [
        "m0", "m1", "m2"]
