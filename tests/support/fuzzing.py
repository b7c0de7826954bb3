"""Hostile input for the fuzz tests (and bench/abuse.py): a valid MQTT byte stream and
the bytes a proton client sends over one AMQP connection, mutated in several ways, and
poked at a port on loopback."""

from __future__ import annotations

import random
import socket

from amqp_memory import AmqpPeer, Net
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

READ_TIMEOUT = 0.2     # per socket, after sending


def mqtt_stream() -> bytes:
    will = Will("fz/will", b"gone", 1, False)
    packets = [Connect("MQTT", 4, "fuzz", False, 30, will, "user", b"pw"),
               Subscribe(1, (("fz/#", 1), ("fz/+/x", 2))),
               Publish("fz/a", b"payload", 1, False, False, 2),
               Publish("fz/b", b"x" * 300, 2, True, False, 3),
               Pubrel(3), Puback(9), Pingreq(), Unsubscribe(4, ("fz/#",)), Disconnect()]
    return b"".join(encode(p) for p in packets)


def amqp_stream() -> bytes:
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


def mutate(rng: random.Random, data: bytes, keep: int) -> bytes:
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


def poke(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.settimeout(READ_TIMEOUT)
        try:
            s.sendall(data)
            while s.recv(65536):
                pass
        except OSError:
            pass   # reset, timeout: either is an answer
