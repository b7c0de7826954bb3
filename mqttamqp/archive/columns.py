"""How a batch of message records travels to the writer process: column by column,
as typed arrays, the strings dictionary-encoded.

The reactor side keeps messages as one flat list (``MESSAGE_VALUES`` values each)
and one ``bytearray`` of their capped payloads (``Archive.message``). The feeding
thread turns that pair into ``Packed`` with ``pack`` before it pickles it:

- numbers become ``array`` objects (times ``'d'``, sizes and counts ``'q'``) and QoS
  and retain ``bytes`` (one byte a message): each pickles as one buffer, and the
  writer process hands that buffer to Arrow without making a Python object per
  value;
- each string column (topic, publisher, user, protocol) becomes its distinct values
  and, unless there is only one, an array of indexes into them. The publisher,
  user and protocol of a batch rarely change, topics repeat: the pickle carries
  each string once a batch, not once a message.

Why not pickle the list as it is: the writer then had to rebuild a Python object
for every value and convert each column from Python objects (about 0.6 of the
writer's 1.0 µs a message), and the broker's pickler wrote every string again for
every message. Every step here is one C-level pass over a column (a strided
slice, ``array``, ``bytes``, ``dict.fromkeys``, ``map``): no Python-level loop
per message, so it costs the GIL less than the pickling it saves.

``writer`` turns ``Packed`` back into Arrow arrays. This module must not import
pyarrow, Twisted or the broker.
"""

from __future__ import annotations

from array import array
from typing import Any

from mqttamqp.archive.names import MESSAGE_VALUES

__all__ = ["Packed", "Strings", "pack", "FLOATS", "INTS", "SMALL_CODES", "LARGE_CODES"]

FLOATS = "d"        # float64: times in seconds
INTS = "q"          # int64: payload sizes, deliveries, dropped
SMALL_CODES = "H"   # uint16 indexes into a column's distinct strings...
LARGE_CODES = "q"   # ...or int64 when a batch has 65,536 or more of them
_SMALL_LIMIT = 1 << 16
for _code, _size in ((FLOATS, 8), (INTS, 8), (SMALL_CODES, 2), (LARGE_CODES, 8)):
    # The writer reads these buffers as fixed Arrow types.
    assert array(_code).itemsize == _size, f"archive: array({_code!r}) is not {_size} bytes"

#: A string column: its distinct values (None among them for nulls), in order of
#: first appearance, and each row's index into them (None: every row is the first).
Strings = tuple[tuple[str | None, ...], "array[int] | None"]

#: ``(count, seconds, topic, qos, retain, payload_size, publisher, user, protocol,
#: deliveries, dropped, payloads)``: the message columns in schema order, each as
#: above, and the capped payloads joined.
Packed = tuple[Any, ...]


def strings(column: list[Any]) -> Strings:
    """A column of strings (or None) as its distinct values and indexes into them."""
    distinct = tuple(dict.fromkeys(column))
    if len(distinct) == 1:
        return distinct, None
    index = {value: i for i, value in enumerate(distinct)}
    code = SMALL_CODES if len(distinct) < _SMALL_LIMIT else LARGE_CODES
    return distinct, array(code, map(index.__getitem__, column))


def pack(values: list[Any], payloads: bytes | bytearray) -> Packed:
    """``values`` (``Archive.message``'s, ``MESSAGE_VALUES`` a message, flat) and
    the capped payloads as columns (see the module's docstring)."""
    n = MESSAGE_VALUES
    return (len(values) // n,
            array(FLOATS, values[0::n]), strings(values[1::n]),
            bytes(values[2::n]), bytes(values[3::n]), array(INTS, values[4::n]),
            strings(values[5::n]), strings(values[6::n]), strings(values[7::n]),
            array(INTS, values[8::n]), array(INTS, values[9::n]),
            payloads)
