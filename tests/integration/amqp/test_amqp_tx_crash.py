"""AMQP 1.0 transactions and ``kill -9`` (issue 30): a broker process killed at every
stage of a transaction that publishes to one durable queue and acknowledges
messages of another; after the restart the transaction is all there or not at all.

Stages: declared (nothing done yet), work done (three transfers held and three
deliveries accepted under the transaction), discharge sent (the kill races the
commit: either outcome is allowed, a mixture is not), discharge answered (all of
it must survive).  No test-only hook in the broker: the third stage asserts
all-or-nothing, whichever side of the commit the kill fell.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from amqp_clients import ACCEPTED, TIMEOUT, outcome
from amqp_tx import Coordinator, accept_in, read_all, send_in
from brokerproc import RestartableBroker
from proton import Message
from proton.utils import BlockingConnection

pytestmark = pytest.mark.timeout(180)

INPUTS = ["in-1", "in-2", "in-3"]
OUTPUTS = ["out-1", "out-2", "out-3"]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _start(data_dir: Path) -> RestartableBroker:
    proc = RestartableBroker(str(data_dir), listeners=("--amqp",))
    proc.start()
    return proc


def _connect(proc: RestartableBroker) -> BlockingConnection:
    return BlockingConnection(f"127.0.0.1:{proc.ports['AMQP']}", timeout=TIMEOUT)


@pytest.fixture
def broker(data_dir: Path) -> Iterator[RestartableBroker]:
    proc = _start(data_dir)
    yield proc
    proc.stop()


def _after_restart(proc: RestartableBroker, data_dir: Path) -> tuple[list[str], list[str]]:
    """Kill -9, restart on the same data; what $queue/in and $queue/out hold."""
    proc.kill()
    again = _start(data_dir)
    try:
        conn = _connect(again)
        try:
            return (sorted(read_all(conn, "$queue/tx-in")),
                    sorted(read_all(conn, "$queue/tx-out")))
        finally:
            conn.close()
    finally:
        again.stop()


@pytest.mark.parametrize("stage", ["declared", "work-done", "discharge-sent",
                                   "discharge-answered"])
def test_kill_at_every_stage_leaves_all_or_nothing(broker: RestartableBroker,
                                                   data_dir: Path, stage: str) -> None:
    """kill -9 at each stage of a transaction: before the discharge is answered
    nothing of it survives (or, racing the commit, all of it); after, all of it."""
    conn = _connect(broker)
    feed = conn.create_sender("$queue/tx-in")
    for body in INPUTS:
        assert outcome(feed.send(Message(body=body), error_states=[]))[0] == ACCEPTED
    rcv = conn.create_receiver("$queue/tx-in", credit=len(INPUTS))
    ctrl = Coordinator(conn)
    txn = ctrl.declare()
    if stage != "declared":
        out = conn.create_sender("$queue/tx-out")
        for body in OUTPUTS:
            assert send_in(conn, out, txn, Message(body=body)).remote_state == 0x34
        assert sorted(str(accept_in(conn, rcv, txn).body) for _ in INPUTS) == INPUTS
    if stage == "discharge-sent":
        ctrl.discharge(txn, wait=False)
    elif stage == "discharge-answered":
        assert outcome(ctrl.discharge(txn)) == (ACCEPTED, None)
    inputs, outputs = _after_restart(broker, data_dir)
    committed = (inputs, outputs) == ([], OUTPUTS)
    nothing = (inputs, outputs) == (INPUTS, [])
    if stage == "discharge-answered":
        assert committed, (inputs, outputs)
    elif stage == "discharge-sent":
        assert committed or nothing, (inputs, outputs)
    else:
        assert nothing, (inputs, outputs)
