"""Minimal MQTT 3.1.1 wire encoder and stream parser for the benchmark.

Deliberately independent of the broker's own code (mqttamqp.*), so the harness
measures the broker and not itself.  Only what the load generator needs:
CONNECT, SUBSCRIBE, PUBLISH, the QoS 1/2 acknowledgements, DISCONNECT and a
parser that splits a byte stream into (first_byte, body) packets.
"""

import os
import struct

# MQTT 3.1.1 (4) by default; BENCH_MQTT_LEVEL=5 (run.py --mqtt5) speaks MQTT 5: an
# empty property block in CONNECT, SUBSCRIBE and PUBLISH (PROPS), and a session
# expiry of "never" for clean session 0.
LEVEL = int(os.environ.get("BENCH_MQTT_LEVEL", "4"))
PROPS = b"\x00" if LEVEL == 5 else b""

# packet types (high nibble of the first byte)
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK = 8, 9, 10, 11
PINGREQ, PINGRESP, DISCONNECT = 12, 13, 14

DISCONNECT_PKT = b"\xe0\x00"
PINGREQ_PKT = b"\xc0\x00"

# 2-byte big-endian packet identifiers, pre-built once (index = packet id).
PIDS = [i.to_bytes(2, "big") for i in range(65536)]


def remaining_length(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _str(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("!H", len(b)) + b


def _packet(first, body):
    return bytes([first]) + remaining_length(len(body)) + body


def connect(client_id, clean=True, keepalive=0):
    flags = 0x02 if clean else 0x00
    props = PROPS
    if LEVEL == 5 and not clean:
        # A persistent session in MQTT 5 terms: session expiry "never" (0xFFFFFFFF).
        props = b"\x05\x11\xff\xff\xff\xff"
    body = (_str("MQTT") + bytes([LEVEL, flags]) + struct.pack("!H", keepalive) + props
            + _str(client_id))
    return _packet(0x10, body)


def subscribe(packet_id, filters):
    """filters: list of (topic_filter, qos)."""
    body = struct.pack("!H", packet_id) + PROPS + b"".join(
        _str(t) + bytes([q]) for t, q in filters)
    return _packet(0x82, body)


def publish(topic, payload, qos=0, packet_id=0, retain=False, dup=False):
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    body = _str(topic) + (struct.pack("!H", packet_id) if qos else b"") + PROPS + payload
    return _packet(first, body)


def publish_parts(topic, payload_len, qos):
    """Split a QoS>0 PUBLISH of fixed size into (prefix, suffix_len) so that a
    packet is prefix + PIDS[pid] + PROPS + payload (payload exactly payload_len bytes)."""
    assert qos in (1, 2)
    t = _str(topic)
    rl = len(t) + 2 + len(PROPS) + payload_len
    prefix = bytes([0x30 | (qos << 1)]) + remaining_length(rl) + t
    return prefix


def puback(pid2):
    return b"\x40\x02" + pid2


def pubrec(pid2):
    return b"\x50\x02" + pid2


def pubrel(pid2):
    return b"\x62\x02" + pid2


def pubcomp(pid2):
    return b"\x70\x02" + pid2


class ProtocolError(Exception):
    pass


class Parser:
    """Incremental splitter: feed(bytes) -> list of (first_byte, body_bytes)."""

    __slots__ = ("buf",)

    def __init__(self, initial=b""):
        self.buf = bytearray(initial)

    def feed(self, data):
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        out = []
        append = out.append
        while n - pos >= 2:
            h = buf[pos]
            b = buf[pos + 1]
            if b < 0x80:
                start = pos + 2
                end = start + b
            else:
                rl = b & 0x7F
                shift = 7
                i = pos + 2
                complete = False
                while i < n:
                    b = buf[i]
                    i += 1
                    rl |= (b & 0x7F) << shift
                    shift += 7
                    if b < 0x80:
                        complete = True
                        break
                    if shift > 21:
                        raise ProtocolError("malformed remaining length")
                if not complete:
                    break
                start = i
                end = start + rl
            if end > n:
                break
            append((h, bytes(buf[start:end])))
            pos = end
        if pos:
            del buf[:pos]
        return out
