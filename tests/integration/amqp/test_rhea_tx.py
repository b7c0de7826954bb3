"""A transaction from rhea (node), a second AMQP 1.0 client: rhea has no transaction
API (amqp/rhea#333), so ``tests/support/rhea/tx.js`` attaches a coordinator target
and sends declare and discharge by hand, with transfers under
transactional-state(txn-id) between them.  The queue is read back with proton
(``amqp_tx.read_all``: a marker, no timeout waited out).  Skipped without node or
rhea, except under CI (as ``test_rhea_interop.py``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amqp_tx import read_all
from brokerproc import BrokerProcess
from proton.utils import BlockingConnection

pytestmark = pytest.mark.timeout(120)

RHEA_DIR = Path(__file__).resolve().parents[2] / "support" / "rhea"
NODE = shutil.which("node")
SCRIPT_TIMEOUT = 10          # the script's own deadline, seconds


@pytest.fixture(scope="module", autouse=True)
def rhea_installed() -> None:
    """Skip without node or rhea, unless under CI, where a missing tool is a failure."""
    missing = ("node is not installed" if NODE is None
               else None if (RHEA_DIR / "node_modules" / "rhea").is_dir()
               else "rhea is not installed (cd tests/support/rhea && npm ci)")
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{missing}; CI is set, so this is a failure (run .ci/setup)")
        pytest.skip(missing)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(str(tmp_path_factory.mktemp("rhea-tx")), listeners=("--amqp",))
    proc.start()
    yield proc
    proc.stop()


def run_tx(broker: BrokerProcess, *args: str) -> list[dict[str, Any]]:
    """Run tx.js to its end (exit 0); its JSON lines."""
    assert NODE is not None
    done = subprocess.run(
        [NODE, "tx.js", "--port", str(broker.ports["AMQP"]), "--timeout",
         str(SCRIPT_TIMEOUT), *args],
        cwd=RHEA_DIR, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT + 20)
    assert done.returncode == 0, f"tx.js failed:\n{done.stdout}\n{done.stderr}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_rhea_declare_transfer_discharge_commits(broker: BrokerProcess) -> None:
    """rhea's declare is answered declared, its transfers transactional-state, its
    discharge Accepted; the queue then holds the messages, in order."""
    events = run_tx(broker, "--address", "$queue/rhea-tx", "--count", "3",
                    "--prefix", "c")
    kinds = [e["event"] for e in events]
    assert kinds == ["declared", "answered", "answered", "answered", "discharged", "done"]
    assert all(e["state"] == 0x34 for e in events if e["event"] == "answered")
    assert events[4] == {"event": "discharged", "outcome": "accepted", "error": None}
    conn = BlockingConnection(f"127.0.0.1:{broker.ports['AMQP']}", timeout=10)
    try:
        assert read_all(conn, "$queue/rhea-tx") == ["c-0", "c-1", "c-2"]
    finally:
        conn.close()


def test_rhea_discharge_with_fail_rolls_back(broker: BrokerProcess) -> None:
    """A discharge with fail=true from rhea is Accepted and nothing of the
    transaction reaches the queue."""
    events = run_tx(broker, "--address", "$queue/rhea-rb", "--count", "2", "--fail")
    assert [e for e in events if e["event"] == "discharged"] == [
        {"event": "discharged", "outcome": "accepted", "error": None}]
    conn = BlockingConnection(f"127.0.0.1:{broker.ports['AMQP']}", timeout=10)
    try:
        assert read_all(conn, "$queue/rhea-rb") == []
    finally:
        conn.close()
