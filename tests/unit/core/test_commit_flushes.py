"""The end-of-batch flushes of ``CommitBatcher`` (``core.commits``): each runs once
when the outermost batch ends, one that raises leaves the others to run, and the
failures are counted and logged a line a minute, not a traceback each."""

from __future__ import annotations

from fakes import ManualStore
from twisted.internet.task import Clock

from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.stats import BrokerStats

_LINE = "writing a connection's output failed"


def _fails() -> None:
    raise RuntimeError("socket gone")


def test_only_the_outermost_batch_says_it_opened_it() -> None:
    """``begin`` is True for the batch that opens the outermost level, False inside it."""
    commits = CommitBatcher(ManualStore())
    assert commits.begin() is True
    assert commits.begin() is False
    commits.end()
    commits.end()
    assert commits.begin() is True
    commits.end()


def test_a_failing_flush_is_counted_and_logged_once_a_minute(log_lines: list[str]) -> None:
    """Three batches whose first flush raises: the second flush of each still runs,
    three failures are counted, one line is logged; a minute later the next line says
    how many were held back."""
    clock, stats = Clock(), BrokerStats()
    commits = CommitBatcher(ManualStore(), stats, clock.seconds)
    ran: list[int] = []
    for i in range(3):
        commits.begin()
        assert commits.after_batch(_fails) and commits.after_batch(lambda i=i: ran.append(i))
        commits.end()
    assert ran == [0, 1, 2] and stats.write_failures == 3
    lines = [line for line in log_lines if _LINE in line]
    assert len(lines) == 1 and "(0 more since the last such line)" in lines[0]
    clock.advance(61)
    commits.begin()
    commits.after_batch(_fails)
    commits.end()
    lines = [line for line in log_lines if _LINE in line]
    assert len(lines) == 2 and "(2 more since the last such line)" in lines[1]
    assert stats.write_failures == 4
