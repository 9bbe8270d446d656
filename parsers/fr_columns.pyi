"""The compiled Flight Recorder reader (parsers/fr_columns.c, optional: absent when built without a C compiler).

``read(data, flat, shape, known)`` reads a data-only pickle (fr_pickle's allowlist and caps; nothing is executed)
straight into columns. ``flat``: "name:kind" of each flat entry field (kind i int64, f float64, b bool, s text);
``shape``: the entry fields keyed per distinct value; ``known``: shape keys already taken (their values are not
converted again). Returns why it refused the dump (a str: the Python reader reads it), or ``(doc, entries)``:
``doc`` the top-level dict without ``entries``; ``entries`` None when there are none, else
``(n, columns, (keys, new_shapes, groups), rows)``: per flat field ``(values, validity bitmap or None,
dictionary or None)`` (int64 / float64 / bit-packed bool / int32 dictionary codes), the distinct shape keys, the
values of the keys not in ``known``, each key's ``process_group`` and each entry's row of ``keys`` (uint32).
"""

from collections.abc import Container, Sequence
from typing import Any

Column = tuple[bytes, bytes | None, list[str] | None]
Entries = tuple[int, dict[str, Column], tuple[list[bytes], dict[bytes, tuple[Any, ...]], list[Any]], bytes]

def read(data: bytes, flat: Sequence[str], shape: Sequence[str], known: Container[bytes]
         ) -> str | tuple[dict[str, Any], Entries | None]: ...
