"""Socket-level fuzzing of the real broker, MQTT and AMQP (issue 10, "Hostile input").

Each case opens a socket on 127.0.0.1, sends a mutation of a valid byte stream
(a CONNECT and the packets after it; an AMQP connection with its session, links
and transfers, recorded from a real proton client), reads until the broker closes
or a short timeout, and closes.  The mutations are seeded, so a failure names the
seed and case that reproduce it.  Bounded twice: a fixed number of cases and a
wall-clock budget per protocol.

After the cases: the broker is alive and a well-behaved client's QoS 1 message
round-trips, and the broker's log has no traceback and nothing at critical level.
"""

from __future__ import annotations

import random
import re
import socket
import time
from collections.abc import Iterator

import pytest
from amqp_memory import AmqpPeer, Net
from brokerproc import BrokerProcess
from pahoclient import PahoClient
from proton import Message

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import (
    Connect,
    Disconnect,
    Pingreq,
    Puback,
    Publish,
    Pubrel,
    Subscribe,
    Unsubscribe,
    Will,
)

pytestmark = pytest.mark.timeout(180)

CASES = 200            # per protocol
BUDGET = 25.0          # seconds per protocol, whatever CASES says
READ_TIMEOUT = 0.2     # per socket, after sending
BAD = re.compile(r"Traceback|#critical\]|Unhandled error")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("fuzz")), "--connect-timeout", "2",
                         "--max-connect-rate", "0", listeners=("--mqtt", "--amqp"))
    proc.start()
    yield proc
    proc.stop()


def _mqtt_stream() -> bytes:
    will = Will("fz/will", b"gone", 1, False)
    packets = [Connect("MQTT", 4, "fuzz", False, 30, will, "user", b"pw"),
               Subscribe(1, (("fz/#", 1), ("fz/+/x", 2))),
               Publish("fz/a", b"payload", 1, False, False, 2),
               Publish("fz/b", b"x" * 300, 2, True, False, 3),
               Pubrel(3), Puback(9), Pingreq(), Unsubscribe(4, ("fz/#",)), Disconnect()]
    return b"".join(encode(p) for p in packets)


def _amqp_stream() -> bytes:
    """What a proton client sends over one connection: open, begin, a receiver and a
    sender, transfers with Data, AmqpValue and annotations, settlement, detach."""
    captured: list[bytes] = []
    net = Net()
    peer = AmqpPeer(net, "fuzz-app")          # not pumped yet: every byte is captured
    peer.mangle = lambda data: (captured.append(data), data)[1]
    net.peers.append(peer)
    net.pump()
    rcv = peer.receiver("fz/#")
    snd = peer.sender("fz/t")
    peer.send(snd, Message(body={"k": [1, 2.5, "s"]}, durable=True, subject="s"))
    peer.send(snd, Message(body=b"\x00\x01", properties={"a": 1}))
    anon = peer.sender(None)
    peer.send(anon, Message(address="fz/u", body="to"), settled=True)
    rcv.link.close()
    peer.close()
    net.pump()
    stream = b"".join(captured)
    assert stream.startswith(b"AMQP\x00\x01\x00\x00")
    return stream


def _mutate(rng: random.Random, data: bytes, keep: int) -> bytes:
    """One of several mutations of ``data``; the first ``keep`` bytes stay intact
    half the time (so the broker gets past the handshake)."""
    head, body = (data[:keep], bytearray(data[keep:])) if rng.random() < 0.5 else (
        b"", bytearray(data))
    for _ in range(rng.randint(1, 8)):
        if not body:
            break
        i = rng.randrange(len(body))
        kind = rng.randrange(7)
        if kind == 6:
            # Inside text (ids, names, addresses, topics): a byte that is not UTF-8.
            letters = [k for k in range(len(body)) if 0x61 <= body[k] <= 0x7A]
            if letters:
                body[rng.choice(letters)] = rng.choice((0xFF, 0xC3, 0xED, 0x80))
        elif kind == 0:
            body[i] ^= 1 << rng.randrange(8)
        elif kind == 1:
            body[i] = rng.choice((0x00, 0xFF, 0x7F, 0x80, 0xC0, 0xA1, 0xB0))
        elif kind == 2:
            del body[i:i + rng.randint(1, 16)]
        elif kind == 3:
            body[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 4:
            j = rng.randrange(len(body))
            body[i:i] = body[j:j + rng.randint(1, 64)]
        else:
            del body[i:]
    return head + bytes(body)


def _poke(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.settimeout(READ_TIMEOUT)
        try:
            s.sendall(data)
            while s.recv(65536):
                pass
        except OSError:
            pass   # reset, timeout: either is an answer


def _fuzz(port: int, seed_data: bytes, keep: int, seed: int) -> int:
    rng = random.Random(seed)
    deadline = time.monotonic() + BUDGET
    done = 0
    while done < CASES and time.monotonic() < deadline:
        _poke(port, _mutate(rng, seed_data, keep))
        done += 1
    return done


def _alive(broker: BrokerProcess) -> None:
    sub = PahoClient(broker.mqtt_port, "fz-sub")
    pub = PahoClient(broker.mqtt_port, "fz-pub")
    try:
        assert sub.subscribe(("fz/alive", 1)) == [1]
        pub.publish("fz/alive", b"still here", qos=1)
        assert sub.get().payload == b"still here"
    finally:
        sub.stop()
        pub.stop()


@pytest.mark.parametrize("protocol", ["mqtt", "amqp"])
def test_fuzzed_sockets_leave_the_broker_well(broker: BrokerProcess, protocol: str) -> None:
    """Mutated MQTT and AMQP byte streams on real sockets leave the broker alive and
    logging no traceback."""
    if protocol == "mqtt":
        data, keep, port = _mqtt_stream(), len(encode(Connect("MQTT", 4, "fuzz", False, 30,
                                                               None))), broker.mqtt_port
    else:
        data, keep, port = _amqp_stream(), 8, broker.ports["AMQP"]
    seed = 16_10 + len(protocol)
    done = _fuzz(port, data, keep, seed)
    assert done >= 50, f"only {done} cases within the budget"
    _alive(broker)
    bad = [line for line in broker.log if BAD.search(line)]
    assert bad == [], f"seed {seed}: the broker logged:\n" + "".join(bad[:40])
