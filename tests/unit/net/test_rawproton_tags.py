"""The packet ids' ready delivery tags (``net.rawproton``): packed with ``struct``
only where ``pn_bytes_t`` has the layout it packs, set field by field elsewhere,
and never copied at a size other than the block's.

No engine: the blocks are made and read with cffi alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from mqttamqp.net import rawproton
from mqttamqp.net.rawproton import ffi


def _digits(block: Any, chars: Any, index: int) -> None:
    """Every entry of block ``index`` holds its packet id's digits, one after
    another in ``chars``."""
    at = ffi.cast("char *", chars)
    for i in range(1024):
        pid = (index << 10) + i
        entry = block[i]
        assert ffi.unpack(entry.start, entry.size) == b"%d" % pid
        assert entry.start == at
        at += entry.size


def test_the_installed_proton_gets_the_packed_tags() -> None:
    """Here ``pn_bytes_t`` is laid out as ``struct`` packs it, so the fast packer is
    the one in use."""
    assert rawproton._C_LAYOUT == rawproton._PACKED_LAYOUT
    assert rawproton._pack_tags is not None
    chars, block = rawproton._make_tag_block(7)
    _digits(block, chars, 7)


@pytest.mark.parametrize("layout", [
    pytest.param(lambda c: (c[0] + 8, c[1], c[2]), id="larger"),
    pytest.param(lambda c: (c[0], c[2], c[1]), id="fields-swapped"),
])
def test_a_pn_bytes_t_of_another_layout_gets_its_fields_set_one_by_one(
        monkeypatch: pytest.MonkeyPatch, layout: Any) -> None:
    """Where cffi says ``pn_bytes_t`` is not ``size_t`` then a pointer in 16 bytes,
    no packer is used and each tag is still its id's digits."""
    monkeypatch.setattr(rawproton, "_C_LAYOUT", layout(rawproton._C_LAYOUT))
    assert rawproton._tag_packer() is None
    monkeypatch.setattr(rawproton, "_pack_tags", rawproton._tag_packer())
    for index in (0, 1, 63):
        chars, block = rawproton._make_tag_block(index)
        _digits(block, chars, index)


def test_packed_tags_of_another_size_than_the_block_are_never_copied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A packer whose bytes are not exactly the block's size is refused with an
    error, not copied over or short of the block."""
    pack = rawproton._pack_tags
    assert pack is not None
    monkeypatch.setattr(rawproton, "_pack_tags", lambda *fields: pack(*fields) + b"\0" * 8)
    with pytest.raises(RuntimeError, match="bytes for a block of 16384"):
        rawproton._make_tag_block(3)
