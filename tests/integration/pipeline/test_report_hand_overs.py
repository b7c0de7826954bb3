"""The report pairs each CONNECT of a client id with its own DISCONNECT across
hand-overs (a takeover, and a newcomer on the key of a holder still closing), from
events a real broker recorded into the real ``Archive`` writer on a clock that moves
whenever it is read (``takeover_events``)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from pipeline_data import FIXED_NOW, T0
from takeover_events import TickingClock, hand_overs

pytest.importorskip("pyspark")

from mqttamqp.archive import Archive
from mqttamqp.pipeline.report import ReportOptions, build_report

pytest_plugins = ["spark_support"]


def test_sessions_across_hand_overs_end_with_their_own_disconnect(spark: Any,
                                                                 tmp_path: Path) -> None:
    """Two hand-overs give four sessions, each ended by its own DISCONNECT (taken over,
    then clean; clean, clean), none left open and none of zero length."""
    clock = TickingClock()
    clock.advance(T0)
    archive = Archive(str(tmp_path / "archive"), clock, row_group_rows=16)
    archive.start()
    hand_overs(clock, archive)
    archive.close()
    assert archive.stats()["dropped"] == 0 and archive.stats()["errors"] == 0
    out = tmp_path / "report"
    summary = build_report(spark, ReportOptions(archive=str(tmp_path / "archive"),
                                                out=str(out), now=lambda: FIXED_NOW)).summary
    rows = sorted(((r["client_id"], r["connected_at"], r["disconnected_at"], r["cause"])
                   for r in spark.read.parquet(str(out / "tables" / "sessions")).collect()),
                  key=lambda r: (r[0], r[1]))
    assert [(cid, cause) for cid, _, _, cause in rows] == [
        ("x", "taken_over"), ("x", "clean"), ("y", "clean"), ("y", "clean")]
    for (cid, connected, ended, _), (next_cid, next_connected, _, _) in pairwise(rows):
        assert ended is not None and ended > connected, rows
        if cid == next_cid:
            assert ended <= next_connected, rows   # (one ends before the next starts)
    assert rows[-1][2] is not None and rows[-1][2] > rows[-1][1]
    assert summary["sessions"]["count"] == 4
    assert summary["sessions"]["disconnect_causes"] == [
        {"cause": "clean", "count": 3}, {"cause": "taken_over", "count": 1}]
