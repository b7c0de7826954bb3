"""README.md's fenced blocks, each with the ``<!-- not run: REASON -->`` marker on the line
before its fence if it has one: what the README tests run or check."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


_FENCE = re.compile(r"^(\s*)```([\w-]*)\s*$")


NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    line: int              # of the opening fence, 1-based
    lang: str
    text: str              # without the fences' indentation
    not_run: str | None    # the marker's reason


def readme_blocks(text: str) -> list[Block]:
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
        blocks.append(Block(i + 1, fence.group(2) or "text", "\n".join(body) + "\n",
                            marker.group(1) if marker else None))
        i = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
