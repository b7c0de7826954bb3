"""The archive wired into the broker, end to end: paho clients through a running
broker, the Parquet archive read back after a clean stop, and the PySpark report
built from it (one Spark session for the run, ``spark_support``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from brokerproc import BrokerProcess
from pahoclient import PahoClient

pytest_plugins = ["spark_support"]


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A broker run with known traffic, stopped cleanly; its archive directory."""
    data = tmp_path_factory.mktemp("archived")
    proc = BrokerProcess(str(data), "--sys-interval", "1").start()
    try:
        port = proc.mqtt_port
        sub = PahoClient(port, "dev-sub", clean=False)
        sub.subscribe(("plant/#", 1))
        pub = PahoClient(port, "dev-pub")
        for i in range(5):
            pub.publish("plant/1/temp", b"%d" % (20 + i), qos=1)
        pub.publish("plant/2/hum", b"40", qos=0, retain=True)
        got = [sub.get() for _ in range(6)]
        assert sorted(m.topic for m in got) == ["plant/1/temp"] * 5 + ["plant/2/hum"]
        gone = PahoClient(port, "dev-gone", will=("plant/status/dev-gone", b"offline", 1, False))
        gone.lose_socket()     # the socket dies without DISCONNECT: its will is published
        assert sub.get().payload == b"offline"
        pub.disconnect()       # DISCONNECT: a clean end
        sub.disconnect()
        stay = PahoClient(port, "dev-stay")   # still connected when the broker stops
    finally:
        proc.stop()            # SIGTERM: a clean stop closes the open segments
    stay.stop()
    return data / "archive"


def _rows(directory: Path) -> list[dict[str, Any]]:
    return ds.dataset(str(directory), format="parquet", partitioning="hive").to_table(
    ).to_pylist()


def test_messages_are_archived_with_publisher_protocol_and_deliveries(traffic: Path) -> None:
    """Each routed message is one row: topic, QoS, retain, payload, publisher, protocol
    and how many sessions took it; $SYS updates are not archived."""
    rows = _rows(traffic / "messages")
    assert not any(r["topic"].startswith("$SYS/") for r in rows)
    temp = [r for r in rows if r["topic"] == "plant/1/temp"]
    assert [r["payload"] for r in temp] == [b"20", b"21", b"22", b"23", b"24"]
    assert {(r["qos"], r["retain"], r["publisher"], r["protocol"], r["deliveries"],
             r["dropped"]) for r in temp} == {(1, False, "dev-pub", "mqtt3.1.1", 1, 0)}
    [hum] = [r for r in rows if r["topic"] == "plant/2/hum"]
    assert (hum["qos"], hum["retain"], hum["payload_size"]) == (0, True, 2)
    [will] = [r for r in rows if r["topic"] == "plant/status/dev-gone"]
    assert (will["publisher"], will["qos"], will["deliveries"]) == ("dev-gone", 1, 1)


def test_events_are_archived_with_their_causes(traffic: Path) -> None:
    """Connects, subscribes, session creation, a clean, a lost and a shutdown
    disconnect, and the will published for the lost one are events with the right
    columns."""
    rows = _rows(traffic / "events")
    by = {(r["kind"], r["client_id"]) for r in rows}
    for client in ("dev-sub", "dev-pub", "dev-gone"):
        assert ("connect", client) in by and ("session_created", client) in by
    assert ("subscribe", "dev-sub") in by
    reasons = {r["client_id"]: r["reason"] for r in rows if r["kind"] == "disconnect"}
    assert reasons["dev-pub"] == "clean" and reasons["dev-gone"] == "lost"
    assert reasons["dev-stay"] == "shutdown"   # recorded before the archive closed
    [will] = [r for r in rows if r["kind"] == "will_published"]
    assert (will["client_id"], will["topic"], will["reason"]) == (
        "dev-gone", "plant/status/dev-gone", "lost")
    [connect] = [r for r in rows if r["kind"] == "connect" and r["client_id"] == "dev-sub"]
    assert (connect["protocol"], connect["clean_session"]) == ("mqtt3.1.1", False)
    assert connect["address"].startswith("127.0.0.1:") and connect["keepalive"] > 0
    assert connect["user"] is None     # (anonymous, from loopback)


def test_report_from_real_broker_traffic(spark: Any, traffic: Path, tmp_path: Path) -> None:
    """The PySpark report over what the broker archived counts exactly that traffic."""
    from mqttamqp.pipeline.report import ReportOptions, build_report

    out = tmp_path / "report"
    build_report(spark, ReportOptions(archive=str(traffic), out=str(out)))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["messages"] == 7
    tops = {t["topic"]: t["messages"] for t in summary["top_topics"]}
    assert tops == {"plant/1/temp": 5, "plant/2/hum": 1, "plant/status/dev-gone": 1}
    assert os.path.isdir(out / "tables")


def test_no_archive_writes_nothing(tmp_path: Path) -> None:
    """--no-archive: the broker runs without an archive directory."""
    with BrokerProcess(str(tmp_path / "d"), "--no-archive") as proc:
        c = PahoClient(proc.mqtt_port, "x")
        c.publish("t", b"1", qos=1)
        c.disconnect()
    assert not (tmp_path / "d" / "archive").exists()
