"""An archive directory read back for the tests: its Parquet datasets, its hidden
(unfinished) files, and whether its writer process is alive."""

from __future__ import annotations

import calendar
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds


def hidden(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.is_file()]


def read(root: Path, dataset: str = "messages") -> pa.Table:
    return ds.dataset(str(root / dataset), format="parquet", partitioning="hive").to_table()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


T0 = calendar.timegm((2026, 11, 24, 7, 59, 30))  # 2026-11-24 07:59:30 UTC
