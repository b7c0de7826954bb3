"""amqps:// toward the core: the core's certificate is checked against the given CA
and name (service-identity); a wrong name keeps the upstream down, so CONNECT gets
"server unavailable"."""

from __future__ import annotations

import uuid
from pathlib import Path

from brokerproc import BrokerProcess
from gateway_proc import start_gateway
from pahoclient import PahoClient
from pki import make_pki


def test_amqps_core_verified_by_name(tmp_path: Path) -> None:
    """A core whose certificate names it: the gateway connects and serves a client,
    whose QoS 1 message reaches a subscriber on the core."""
    pki = make_pki(str(tmp_path))
    core = BrokerProcess(str(tmp_path / "core"), listeners=("--mqtt", "--amqp"),
                         descriptions={"--amqp": pki.ssl()}).start()
    gw = start_gateway(tmp_path, f"amqps://127.0.0.1:{core.ports['AMQP']}"
                       f"?server-name=localhost&ca={pki.ca}")
    try:
        topic = f"tls-{uuid.uuid4().hex[:8]}/t"
        sub = PahoClient(core.mqtt_port, "tls-sub")
        assert sub.subscribe((topic, 1)) == [1]
        pub = PahoClient(gw.mqtt_port, "tls-pub")
        pub.publish(topic, b"over-tls", qos=1)
        assert sub.get().payload == b"over-tls"
        pub.stop()
        sub.stop()
    finally:
        gw.stop()
        core.stop()


def test_amqps_core_with_a_wrong_name_is_refused(tmp_path: Path) -> None:
    """A certificate that does not carry the expected name fails verification: the
    upstream stays down (the reason logged) and CONNECT gets CONNACK 3."""
    pki = make_pki(str(tmp_path))
    core = BrokerProcess(str(tmp_path / "core"), listeners=("--mqtt", "--amqp"),
                         descriptions={"--amqp": pki.ssl()}).start()
    gw = start_gateway(tmp_path, f"amqps://127.0.0.1:{core.ports['AMQP']}"
                       f"?server-name=wrong.example&ca={pki.ca}", wait_open=False)
    try:
        line = gw.wait_for_line(r"upstream connection 0 to \S+ is down", timeout=15)
        assert "wrong.example" in line, line
        PahoClient(gw.mqtt_port, "tls-early", expect_rc=3).stop()
    finally:
        gw.stop()
        core.stop()
