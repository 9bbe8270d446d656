"""The compiled Kineto reader (parsers/kineto_columns.c, optional: absent when built without a C compiler).

``read(text, pos, first, final, names, intern, comm_ids, shape_ids, g0, c0)`` reads the trace events of
``text[pos:]`` (the inside of the ``traceEvents`` array; ``first``: no event read before it; ``final``: no text
follows) into columns. Names are coded through the extractor's table ``names`` (``intern(name)`` adds a new one);
``comm_ids`` / ``shape_ids``: the codes of collective and shaped ops; ``g0`` / ``c0``: the GPU and host rows
the extractor holds already (the args rows are numbered from them). Returns why it refused the text (a str: the
typed reader reads the file), or ``(used, done, events, skipped, gpu, cpu, gpu_args, comm_ops, shape_ops)``:
``used`` the bytes taken (whole events, and the closing bracket when ``done``), the events read and those not
tabulated, the GPU and host columns as bytes in ``Extractor._GROW`` / ``_CROW`` order and types, and rows (row
first): the GPU and host collective args converted as ``kineto_extract._typed_arg`` converts them, and the shaped
ops' raw ``Input Dims`` / ``Input type`` text (None: absent).
"""

from collections.abc import Callable
from typing import Any

Columns = tuple[bytes, ...]

def read(text: bytes | bytearray, pos: int, first: bool, final: bool, names: dict[str, int],
         intern: Callable[[str], int], comm_ids: set[int], shape_ids: set[int], g0: int, c0: int
         ) -> str | tuple[int, bool, int, int, Columns, Columns, list[tuple[Any, ...]], list[tuple[Any, ...]],
                          list[tuple[int, bytes, bytes | None]]]: ...
