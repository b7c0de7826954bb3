"""A gateway client closed while far behind (issue #29 §1, the gateway fixes' review):
the gateway is the client socket's streaming producer, and Twisted resumes a
registered producer rather than closing once the socket's buffer drains, so a client
taken over while more than 64 KB behind must still get everything then EOF, and
leave the gateway's client count (--max-connections)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gateway_proc import core_with_gateway, uid
from rawclient import RawClient
from slow_reader import SIZE, await_metric, beyond_kernel_buffers, read_to_close

from mqttamqp.mqtt.packets import Disconnect

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("ending", ["takeover", "disconnect"])
def test_a_client_taken_over_while_far_behind_gets_eof(tmp_path: Path, ending: str) -> None:
    """A client that has not read more than its socket can hold is taken over (or
    sends DISCONNECT): its socket is closed (EOF once it read everything, or cut
    after the grace if it was too slow), and the gateway counts it gone."""
    count = beyond_kernel_buffers()
    window = str(count + 50)   # every flood message in flight at once: all written
    with core_with_gateway(tmp_path, "core", ("--max-inflight", window), "--max-inflight",
                           window, listeners=("--mqtt", "--metrics")) as (_, gw, clients):
        metrics = gw.ports["METRICS"]
        cid, topic = uid("behind"), uid("flood") + "/t"
        slow = RawClient(gw.mqtt_port)
        clients.append(slow)
        assert slow.connect(cid, keepalive=0).return_code == 0
        assert slow.subscribe((topic, 1)) == (1,)
        pub = RawClient(gw.mqtt_port)
        clients.append(pub)
        assert pub.connect(uid("flooder")).return_code == 0
        for _ in range(count):
            pub.publish(topic, b"x" * SIZE, qos=1)
        written = await_metric(metrics, 'mqttamqp_gateway_messages_total{direction='
                                '"to_clients"}', lambda v: v >= count,
                                "flood messages written to the slow client")
        assert written >= count
        if ending == "takeover":
            newer = RawClient(gw.mqtt_port)
            clients.append(newer)
            assert newer.connect(cid, keepalive=0).return_code == 0   # takes the id over
        else:
            slow.send(Disconnect())
        got, how = read_to_close(slow.sock)
        assert how is not None, f"read {got} bytes, then the gateway kept the socket open"
        assert how == "reset" or got >= count * SIZE
        await_metric(metrics, "mqttamqp_gateway_clients",
                     lambda v: v == (2 if ending == "takeover" else 1),
                     "the taken-over client leaving the gateway's count")
