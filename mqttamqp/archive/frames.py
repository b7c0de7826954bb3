"""The frames between the broker's archive and its writer process: a 4-byte
big-endian length and a pickle (protocol 5, no memo) of plain values, and the two
commands.

Apart from ``writer`` (which imports pyarrow) so that the broker's process, which
only pickles tuples and sends them, never loads Arrow: pyarrow is needed in the
writer process only. This module must not import pyarrow, Twisted or the broker.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import struct
import time
from typing import Any

__all__ = ["CLOSE", "FORMAT", "REFUSED", "STEP", "read_frame", "write_frame"]

STEP = "step"
CLOSE = "close"
#: The frames' format, sent in the configuration frame: the writer process refuses a
#: broker that sends another (its code on disk changed under a running broker, an
#: upgrade in place) instead of failing on every frame. Raise it whenever the
#: contents of a frame change (2: events as ``eventbuffer`` batches).
FORMAT = 2
#: The writer process's exit status when it refuses the broker's format.
REFUSED = 3
_HEADER = struct.Struct(">I")


def write_frame(fd: int, value: object) -> None:
    """Send one frame on the file descriptor ``fd`` (blocking; all of it).

    The pickler runs in fast mode (no memo): a batch holds no shared or cyclic
    objects worth remembering (every message brings its own topic string), and
    the memo costs more than the pickling itself (0.65 against 0.15 µs a record).
    ``marshal`` was tried: faster (0.15 against 0.20 µs a record) only while no
    other object holds the record's strings and bytes, and more than twice slower
    when something does (queued QoS 1 messages, retained ones): it then tracks
    every such object for back-references."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    pickler = pickle.Pickler(out, protocol=5)
    pickler.fast = True
    pickler.dump(value)
    data = out.getbuffer()
    data[:_HEADER.size] = _HEADER.pack(len(data) - _HEADER.size)
    view = data
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int, timeout: float | None = None) -> Any:
    """Receive one frame from ``fd``; ``EOFError`` at end of file, ``TimeoutError``
    if a whole frame has not come within ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    size, = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("archive writer: no answer in time")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("archive writer: the other end closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
