"""README.md's ``<!-- not run: REASON -->`` markers, in process: each stands on the line
before a fence (the blocks themselves run in ``integration/service/test_readme_examples.py``)."""

from __future__ import annotations

from readme_blocks import BLOCKS, NOT_RUN, README


def test_every_not_run_marker_stands_before_a_block() -> None:
    """A '<!-- not run: ... -->' marker counts only on the line before a fence: a
    stray one (a block moved away from it) is an error, not a silent skip."""
    markers = [n for n, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1)
               if NOT_RUN.match(line)]
    assert markers == [b.line - 1 for b in BLOCKS if b.not_run], markers
    assert any(b.not_run is None for b in BLOCKS)
