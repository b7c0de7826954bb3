"""README.md's and docs/'s pages checked in process: each ``<!-- not run: REASON -->``
marker stands on the line before a fence, relative links name files and headings the
repository has, and docs/configuration.md lists every option with its default (the
blocks themselves run in ``integration/service/test_readme_examples.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from readme_blocks import BLOCKS, NOT_RUN, PAGES, README, ROOT, page_name


@pytest.mark.parametrize("path", PAGES, ids=page_name)
def test_every_not_run_marker_stands_before_a_block(path: Path) -> None:
    """A '<!-- not run: ... -->' marker counts only on the line before a fence: a
    stray one (a block moved away from it) is an error, not a silent skip."""
    page = page_name(path)
    markers = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if NOT_RUN.match(line)]
    assert markers == [b.line - 1 for b in BLOCKS if b.page == page and b.not_run], markers
    if path == README:
        assert any(b.not_run is None for b in BLOCKS if b.page == page)


_LINK = re.compile(r"\]\(([^()\s]+)\)")


def _anchors(text: str) -> set[str]:
    """The heading anchors a Markdown page has, as GitHub makes them."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("path", PAGES, ids=page_name)
def test_links_point_at_what_the_repository_has(path: Path) -> None:
    """Every relative link of the page names a file of the repository, and a heading
    that the page it names has."""
    text = path.read_text(encoding="utf-8")
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue   # (http:, https:, mailto:)
        name, _, fragment = target.partition("#")
        linked = (path.parent / name).resolve() if name else path
        assert linked.exists(), f"{page_name(path)}: {target} names no file"
        if fragment:
            assert fragment in _anchors(linked.read_text(encoding="utf-8")), (
                f"{page_name(path)}: {target}: no such heading")


def test_configurationpage_names_every_option() -> None:
    """docs/configuration.md's table has a row for every option of twistd mqttamqp,
    none for an option that does not exist, and each row gives the option's default."""
    from mqttamqp.ops.config import option_specs
    from mqttamqp.options import Options

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `--([a-z0-9-]+)` \| (.+?) \|", text, re.M))
    specs = option_specs(Options())
    assert set(rows) == set(specs)
    for name, spec in specs.items():
        shown = {"flag": "flag", "list": "(repeatable)"}.get(
            spec.kind, "—" if spec.default is None else f"`{spec.default}`")
        assert rows[name] == shown, (name, rows[name], shown)
