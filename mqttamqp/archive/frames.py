"""The frames between the broker's archive and its writer process: a 4-byte
big-endian length, a kind byte and a ``marshal`` dump (or a pickle) of plain values,
and the two commands.

Apart from ``writer`` (which imports pyarrow) so that the broker's process, which
only pickles tuples and sends them, never loads Arrow: pyarrow is needed in the
writer process only. This module must not import pyarrow, Twisted or the broker.
"""

from __future__ import annotations

import marshal
import os
import pickle
import select
import struct
import time
from typing import Any

__all__ = ["STEP", "CLOSE", "read_frame", "write_frame"]

STEP = "step"
CLOSE = "close"
_HEADER = struct.Struct(">IB")    # body length, body kind
_MARSHAL = 1
_PICKLE = 2
_JOIN_BELOW = 1 << 16              # bodies smaller than this go in one write with the header


def write_frame(fd: int, value: Any) -> None:
    """Send one frame on the file descriptor ``fd`` (blocking; all of it).

    Frames are ``marshal`` data: both ends are this interpreter (the writer process
    is ``sys.executable``), records are tuples of str, bytes, numbers and None, and
    marshal does in 0.10 µs a record what a memo-less pickler did in 0.21 (and the
    writer reads it in 0.38 µs instead of 0.47). Anything marshal refuses (a subclass
    of int or str, say an enum in an event field) goes as a pickle instead; the
    frame's kind byte says which."""
    try:
        body = marshal.dumps(value)
        kind = _MARSHAL
    except ValueError:
        body = pickle.dumps(value, protocol=5)
        kind = _PICKLE
    data = _HEADER.pack(len(body), kind) + body if len(body) < _JOIN_BELOW else None
    if data is not None:
        _write_all(fd, memoryview(data))
    else:   # a big batch: no copy of it just to put the header in front
        _write_all(fd, memoryview(_HEADER.pack(len(body), kind)))
        _write_all(fd, memoryview(body))


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int, timeout: float | None = None) -> Any:
    """Receive one frame from ``fd``; ``EOFError`` at end of file, ``TimeoutError``
    if a whole frame has not come within ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    size, kind = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    body = _read_exact(fd, size, deadline)
    if kind == _MARSHAL:
        return marshal.loads(body)
    if kind == _PICKLE:
        return pickle.loads(body)
    raise ValueError(f"archive writer: unknown frame kind {kind!r}")


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
