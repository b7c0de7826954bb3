"""A broker client closed while far behind (issue #29 §1, the gateway fixes' review,
the same check on the direct broker): the connection is its socket's streaming
producer, and Twisted resumes a registered producer rather than closing once the
socket's buffer drains, so a client taken over while more than 64 KB behind must
still be closed, and leave the broker's connection count."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from brokerproc import BrokerProcess
from rawclient import RawClient
from slow_reader import SIZE, await_metric, beyond_kernel_buffers, read_to_close

pytestmark = pytest.mark.timeout(180)


def test_a_client_taken_over_while_far_behind_is_closed(tmp_path: Path) -> None:
    """A client that has not read more than its socket can hold is taken over: its
    socket is closed (EOF once it read everything, or cut after the grace if it was
    too slow), and the broker counts it gone."""
    count = beyond_kernel_buffers()
    window = str(count + 50)   # every flood message in flight at once: all written
    broker = BrokerProcess(str(tmp_path / "b"), "--max-inflight", window,
                           listeners=("--mqtt", "--metrics"))
    broker.start()
    clients: list[RawClient] = []
    try:
        metrics = broker.ports["METRICS"]
        tag = uuid.uuid4().hex[:8]
        cid, topic = f"behind-{tag}", f"flood-{tag}/t"
        slow = RawClient(broker.ports["MQTT"])
        clients.append(slow)
        assert slow.connect(cid, keepalive=0).return_code == 0
        assert slow.subscribe((topic, 1)) == (1,)
        pub = RawClient(broker.ports["MQTT"])
        clients.append(pub)
        assert pub.connect(f"flooder-{tag}").return_code == 0
        for _ in range(count):
            pub.publish(topic, b"x" * SIZE, qos=1)
        # Every PUBLISH acknowledged, so routed; one not yet written waits because the
        # client's socket paused the connection (the in-flight window has room).
        await_metric(metrics, "mqttamqp_queued_messages", lambda v: v >= 1,
                     "flood messages held for the paused slow client")
        newer = RawClient(broker.ports["MQTT"])
        clients.append(newer)
        assert newer.connect(cid, keepalive=0).return_code == 0   # takes the id over
        got, how = read_to_close(slow.sock)
        assert how is not None, f"read {got} bytes, then the broker kept the socket open"
        await_metric(metrics, 'mqttamqp_connections{protocol="mqtt"}', lambda v: v == 2,
                     "the taken-over client leaving the broker's count")
    finally:
        for client in clients:
            client.close()
        broker.stop()
