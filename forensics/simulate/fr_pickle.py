"""A protocol-2 pickle writer that emits what PyTorch's C++ pickler emits for a Flight Recorder dump.

Standard library only. The byte layout follows ``torch::jit::Pickler`` as the real dumps show it
(../shared/sample_data/flight_recorder): dicts as EMPTY_DICT MARK ... SETITEMS and lists as
EMPTY_LIST MARK ... APPENDS, even when empty; every string memoized on first use (BINPUT, LONG_BINPUT
past 255) and fetched after (BINGET / LONG_BINGET); 2- and 3-tuples as TUPLE2 / TUPLE3; integers as
the narrowest of BININT1, BININT2, BININT (signed 32 bit), else LONG1 of 8 bytes; floats as BINFLOAT;
the top-level dict memoized after its items; no FRAME, no class opcodes.
"""

from __future__ import annotations

import struct
from typing import Any

_TUPLE = {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.memo: dict[str, int] = {}

    def _put(self) -> None:
        idx = len(self.memo)
        self.out += b"q" + bytes([idx]) if idx < 256 else b"r" + struct.pack("<I", idx)

    def string(self, s: str) -> None:
        idx = self.memo.get(s)
        if idx is not None:
            self.out += b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx)
            return
        raw = s.encode("utf-8")
        self.out += b"X" + struct.pack("<I", len(raw)) + raw
        self._put()
        self.memo[s] = len(self.memo)

    def integer(self, v: int) -> None:
        if 0 <= v < 256:
            self.out += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.out += b"M" + struct.pack("<H", v)
        elif -(1 << 31) <= v < (1 << 31):
            self.out += b"J" + struct.pack("<i", v)
        else:
            self.out += b"\x8a\x08" + struct.pack("<q", v)

    def value(self, v: Any) -> None:
        if v is None:
            self.out += b"N"
        elif v is True or v is False:
            self.out += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            self.integer(v)
        elif isinstance(v, float):
            self.out += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            self.string(v)
        elif isinstance(v, dict):
            self.mapping(v)
        elif isinstance(v, tuple):
            self.tuple(v)
        elif isinstance(v, list):
            self.out += b"]("
            for item in v:
                self.value(item)
            self.out += b"e"
        else:
            raise TypeError(f"cannot write {type(v).__name__} in a Flight Recorder dump")

    def mapping(self, d: dict[str, Any]) -> None:
        self.out += b"}("
        for k, v in d.items():
            self.string(k)
            self.value(v)
        self.out += b"u"

    def tuple(self, t: tuple[Any, ...]) -> None:
        if len(t) > 3:
            self.out += b"("
        for item in t:
            self.value(item)
        self.out += _TUPLE.get(len(t), b"t")


def dumps(doc: dict[str, Any]) -> bytes:
    """``doc`` as the torch pickler writes it (protocol 2)."""
    w = _Writer()
    w.mapping(doc)
    w._put()
    w.out += b"."
    return bytes(w.out)
