"""The fenced blocks of README.md and of the pages in docs/, each with the
``<!-- not run: REASON -->`` marker on the line before its fence if it has one: what
the documentation tests run or check."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Every page a user may copy an example from: README, then docs/ in name order.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(\s*)```([\w-]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str              # README.md, docs/queues.md, ...
    line: int              # of the opening fence, 1-based
    lang: str
    text: str              # without the fences' indentation
    not_run: str | None    # the marker's reason


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent = fence.group(1)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1:end]]
        marker = NOT_RUN.match(lines[i - 1]) if i > 0 else None
        blocks.append(Block(page, i + 1, fence.group(2) or "text", "\n".join(body) + "\n",
                            marker.group(1) if marker else None))
        i = end + 1
    return blocks


def page_name(path: Path) -> str:
    """A page's path in the repository (README.md, docs/queues.md)."""
    return path.relative_to(ROOT).as_posix()


BLOCKS = [block for path in PAGES
          for block in readme_blocks(path.read_text(encoding="utf-8"), page_name(path))]
