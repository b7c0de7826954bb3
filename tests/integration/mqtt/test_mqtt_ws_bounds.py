"""--max-connections and MQTT over WebSockets against a real broker process (port 0):
a socket is counted from its accept, not from the end of its HTTP upgrade, and
never twice (``mqtt.websocket.UpgradeSlots``); against a broker and through a
gateway in front of one (the gateway's own count).  Raw sockets (``wsclient``) so
that a test can hold a socket in the middle of its upgrade."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from gateway_proc import broker_or_gateway
from rawclient import RawClient, closed_at_once, uid
from wsclient import BINARY, RawWebSocket, client_frame, request

from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connack, Connect

TIMEOUT = 5.0

pytestmark = pytest.mark.timeout(90)

KINDS = pytest.mark.parametrize("kind", ["direct", "gateway"])
LISTENERS = ("--mqtt", "--mqtt-ws")


def _status(ws: RawWebSocket) -> int:
    """The status of the server's answer to the opening request (0: closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = ws.sock.recv(4096)
        if not chunk:
            return 0
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert not rest, rest
    return int(head.split(b" ", 2)[1])


def _mqtt_connect(ws: RawWebSocket, client_id: str) -> Connack:
    ws.send(client_frame(encode(Connect("MQTT", 4, client_id, True, 60))))
    frame = ws.next_frame()
    assert frame.opcode == BINARY, frame
    decoder = Decoder()
    decoder.feed(frame.payload)
    (packet,) = list(decoder)
    assert isinstance(packet, Connack), packet
    return packet


@KINDS
def test_sockets_in_their_upgrade_count_toward_max_connections(tmp_path: Path,
                                                               kind: str) -> None:
    """With --max-connections 2, two sockets in the middle of their upgrade hold both
    places: a third WebSocket socket and an MQTT one on TCP are closed at their
    accept, with the gate's line.  One of the two then completes its upgrade and
    its MQTT CONNECT is accepted (counted once: still two places, a new socket is
    still refused); the other closes, and its place is a new WebSocket's."""
    with broker_or_gateway(kind, os.path.join(str(tmp_path), "data"), "--max-connections",
                           "2", listeners=LISTENERS) as broker:
        port = broker.ports["MQTT-WS"]
        head = request()
        held = [RawWebSocket(port, timeout=TIMEOUT) for _ in range(2)]
        made = list(held)
        try:
            for ws in held:
                ws.send(head[:30])           # the request line and part of a header
            # (one listener: the kernel hands the sockets over in order, so this one
            # is accepted after the two)
            assert closed_at_once(port, send=head)
            # (the broker's gate and the gateway say it in the same words)
            broker.wait_for_line(r"refusing MQTT over WebSocket connection from "
                                 r"127\.0\.0\.1:\d+: --max-connections \(2\) reached "
                                 r"\(0 more refused since the last line\)")
            assert closed_at_once(broker.mqtt_port)
            if kind == "gateway":   # (the broker's gate logs one line a minute per cause)
                broker.wait_for_line(r"refusing MQTT connection from 127\.0\.0\.1:\d+: "
                                     r"--max-connections \(2\) reached")

            first, second = held
            first.send(head[30:])
            assert _status(first) == 101
            assert _mqtt_connect(first, uid("ws")).return_code == 0
            assert closed_at_once(port, send=head)   # still two: counted once

            # (its end of the socket closed, the server closes its own and gives the
            # place back in that turn: before it accepts the next socket)
            second.sock.shutdown(socket.SHUT_WR)
            assert second.closed_by_peer()
            fresh = RawWebSocket(port, timeout=TIMEOUT)
            made.append(fresh)
            fresh.send(head)
            assert _status(fresh) == 101
            assert _mqtt_connect(fresh, uid("ws")).return_code == 0
            assert closed_at_once(broker.mqtt_port)
        finally:
            for ws in made:
                ws.sock.close()


@KINDS
def test_a_socket_that_leaves_in_its_upgrade_frees_its_place(tmp_path: Path,
                                                             kind: str) -> None:
    """With --max-connections 1: a WebSocket socket refused in its upgrade (a wrong
    path: 404), and one that holds the only place until it times out
    (--connect-timeout 2: meanwhile a WebSocket and an MQTT socket are refused),
    each gives its place back; an MQTT client on TCP then connects."""
    with broker_or_gateway(kind, os.path.join(str(tmp_path), "data"), "--max-connections",
                           "1", "--connect-timeout", "2", listeners=LISTENERS) as broker:
        port = broker.ports["MQTT-WS"]
        refused = RawWebSocket(port, timeout=TIMEOUT)
        try:
            refused.send(request(path="/other"))
            assert _status(refused) == 404
            # (the broker closes it, its place given back in that same turn: before
            # it accepts the next socket)
            assert refused.closed_by_peer()
        finally:
            refused.sock.close()
        head = request()
        silent = RawWebSocket(port, timeout=TIMEOUT)
        try:
            silent.send(head[:30])
            # (one listener: the kernel hands the sockets over in order, so this one
            # is accepted after ``silent``, which holds the place)
            assert closed_at_once(port, send=head)
            assert closed_at_once(broker.mqtt_port)
            # (at --connect-timeout: the server gives the place back in the turn it
            # closes the socket, before it accepts the next one)
            assert silent.closed_by_peer()
        finally:
            silent.sock.close()
        client = RawClient(broker.mqtt_port)
        try:
            assert client.connect(uid("tcp")).return_code == 0, "the place was not given back"
        finally:
            client.close()
