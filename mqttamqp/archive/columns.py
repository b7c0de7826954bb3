"""How a batch of message records travels to the writer process: column by column,
numbers as packed bytes, a string that every row shares once.

The reactor side keeps messages as one flat list (``MESSAGE_VALUES`` values each)
and one ``bytearray`` of their capped payloads (``Archive.message``). The feeding
thread turns that pair into ``Packed`` with ``pack`` before it pickles it:

- numbers become packed ``bytes`` (``struct``: times float64, sizes and counts
  int64) and QoS and retain one byte a message: each pickles as one buffer, and
  the writer process hands that buffer to Arrow without making a Python object
  per value;
- a string column (topic, publisher, user, protocol) whose rows all hold one value
  becomes that value: the publisher, user and protocol of a batch rarely change,
  and often the topic does not either. The pickle then carries it once a batch,
  not once a message; other columns travel as the strings they are.

Why not pickle the list as it is: the writer then had to rebuild a Python object
for every value and convert each column from Python objects (about 0.6 of the
writer's 1.0 µs a message), and the broker's pickler wrote every string again for
every message. Every step here is one C-level pass over a column (a strided
slice, ``struct.pack``, ``bytes``, ``list.count``): no Python-level loop per
message, and packing and pickling cost the GIL no more than pickling the list did.

``writer`` turns ``Packed`` back into Arrow arrays. This module must not import
pyarrow, Twisted or the broker.
"""

from __future__ import annotations

import struct
from typing import Any

from mqttamqp.archive.names import MESSAGE_VALUES

__all__ = ["Packed", "Strings", "pack", "strings", "FLOATS", "INTS"]

# Native byte order, standard sizes ("=", no padding): what the writer hands Arrow.
FLOATS = "d"        # float64: times in seconds
INTS = "q"          # int64: payload sizes, deliveries, dropped

#: A string column: ``(value,)`` when every row holds that one value (None for
#: null), else the list of values as they are.
Strings = tuple[str | None] | list[str | None]

#: ``(count, seconds, topic, qos, retain, payload_size, publisher, user, protocol,
#: deliveries, dropped, payloads)``: the message columns in schema order, each as
#: above (numbers as packed bytes, QoS and retain one byte a row), and the capped
#: payloads joined.
Packed = tuple[Any, ...]


def _packed(code: str, column: list[Any], count: int) -> bytes:
    # struct packs a whole column in one call, about 5 ns a value here: three
    # times less than array(code, column), half of pickling the values one by one.
    return struct.pack(f"={count}{code}", *column)


def strings(column: list[Any]) -> Strings:
    """A column of strings (or None): one value when all rows hold it (a pass of
    comparisons, mostly of the very same object), else the column itself.
    Dictionary-encoding a varied column here (``dict.fromkeys``, then an index per
    row) cost the GIL more than pickling the strings as they are."""
    first = column[0]
    if column.count(first) == len(column):
        return (first,)
    return column


def pack(values: list[Any], payloads: bytes | bytearray) -> Packed:
    """``values`` (``Archive.message``'s, ``MESSAGE_VALUES`` a message, flat) and
    the capped payloads as columns (see the module's docstring)."""
    n = MESSAGE_VALUES
    count = len(values) // n
    return (count,
            _packed(FLOATS, values[0::n], count), strings(values[1::n]),
            bytes(values[2::n]), bytes(values[3::n]), _packed(INTS, values[4::n], count),
            strings(values[5::n]), strings(values[6::n]), strings(values[7::n]),
            _packed(INTS, values[8::n], count), _packed(INTS, values[9::n], count),
            payloads)
