"""Reading a Flight Recorder pickle without ever executing it.

PyTorch writes the dump with its C++ pickler (``torch::jit::Pickler``, protocol 2): only builtin
containers and scalars. A pickle can name any importable callable (GLOBAL, STACK_GLOBAL, INST, OBJ)
and call it (REDUCE, BUILD, NEWOBJ), so a dump is only loaded after two checks:

1. every opcode is on an allowlist of data-only opcodes (:data:`ALLOWED`), with a cap on the nesting
   of containers and on every length field (strings, bytes, LONG1). The scan reads runs of
   fixed-width opcodes with one compiled pattern and steps through the rest (strings, marks) itself:
   ``pickletools.genops`` costs ~1 us an opcode, which is minutes for a 4,096-rank job;
2. the load runs an unpickler whose ``find_class`` and ``persistent_load`` refuse everything, so even
   an opcode the scan missed could not reach a callable.

Any refusal is :class:`UnsafeDump` with a one-line reason naming the opcode and its byte offset.
"""

from __future__ import annotations

import functools
import gc
import io
import pickle
import re
import sys
from typing import Any

MAX_DUMP_BYTES = 64 << 20
MAX_STRING_BYTES = 1 << 20
MAX_DEPTH = 12
# The pattern grows with the depth it reads (and its compile time: ~4 ms a level); deeper structures are
# stepped through. A dump nests 5 deep (the top dict, entries, an entry, its sizes, a shape).
MAX_DEPTH_FAST = 6

# Opcodes of fixed width, read by the pattern: containers without a mark, scalars, memo access.
# (name, pattern); the pattern includes the opcode byte. The pattern tries them in this order, so the
# frequent ones of a dump come first (memo gets, puts, small ints: ~60% of a dump's opcodes).
_FIXED: tuple[tuple[str, bytes], ...] = (
    # LONG_BINPUT: indices under 2**22 here; larger ones are checked against the dump's size (_memo_put)
    ("BINGET", rb"h."), ("LONG_BINPUT", rb"r..[\x00-\x3f]\x00"), ("BININT2", rb"M.."), ("EMPTY_LIST", rb"\]"),
    ("APPEND", rb"a"),
    ("LONG1", rb"\x8a(?:\x00|\x01.|\x02..|\x03...|\x04....|\x05.{5}|\x06.{6}|\x07.{7}|\x08.{8}|\x09.{9})"),
    ("BININT1", rb"K."), ("EMPTY_DICT", rb"\}"), ("BININT", rb"J...."), ("NEWFALSE", rb"\x89"), ("NEWTRUE", rb"\x88"),
    ("TUPLE2", rb"\x86"), ("BINFLOAT", rb"G.{8}"), ("LONG_BINGET", rb"j...."), ("BINPUT", rb"q."),
    ("MEMOIZE", rb"\x94"), ("NONE", rb"N"), ("EMPTY_TUPLE", rb"\)"), ("TUPLE1", rb"\x85"), ("TUPLE3", rb"\x87"),
    ("SETITEM", rb"s"),
)
# Short strings (under 64 bytes: most keys and values) are read by the pattern too; longer ones are stepped over.
_SHORT = 64
_SHORT_TEXT = (b"X(?:" + b"|".join(re.escape(bytes([n, 0, 0, 0])) + b".{%d}" % n for n in range(_SHORT)) + b")|"
               + b"\x8c(?:" + b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(_SHORT)) + b")")
_ATOM = b"|".join(p for _, p in _FIXED) + b"|" + _SHORT_TEXT
_CLOSERS = rb"[uetld\x90]"
# Possessive repeats (Python 3.11+) keep no backtracking state: about twice as fast. The parse is the same
# either way: no two alternatives start with the same byte, so each offset has one reading.
_MANY = b"*+" if sys.version_info >= (3, 11) else b"*"


@functools.cache
def _level(depth: int) -> re.Pattern[bytes]:
    """Atoms and MARK ... closer structures nested at most ``depth`` deep (``re`` has no recursion: the
    pattern is unrolled). It stops at anything else: a long string, STOP, a refused opcode, a deeper MARK."""
    pattern = b"(?:" + _ATOM + b")" + _MANY
    for _ in range(depth):
        pattern = b"(?:" + _ATOM + rb"|\(" + pattern + _CLOSERS + b")" + _MANY
    return re.compile(pattern, re.DOTALL)


# Opcodes stepped through one by one: strings (length field), marks and what closes them.
_STRINGS = {ord("X"): ("BINUNICODE", 4), ord("\x8c"): ("SHORT_BINUNICODE", 1), ord("C"): ("SHORT_BINBYTES", 1),
            ord("B"): ("BINBYTES", 4)}
_OPEN = ord("(")
_LONG_BINPUT = ord("r")
_FRAME = 0x95
_CLOSE = {ord("u"): "SETITEMS", ord("e"): "APPENDS", ord("t"): "TUPLE", ord("l"): "LIST", ord("d"): "DICT",
          ord("\x90"): "ADDITEMS"}
_STOP = ord(".")
ALLOWED = frozenset({"PROTO", "STOP", "MARK", "FRAME", *(n for n, _ in _FIXED), *(n for n, _ in _STRINGS.values()),
                     *_CLOSE.values()})
_NAMES = {0x63: "GLOBAL", 0x93: "STACK_GLOBAL", 0x52: "REDUCE", 0x62: "BUILD", 0x69: "INST", 0x6F: "OBJ",
          0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x50: "PERSID",
          0x51: "BINPERSID", 0x8B: "LONG4", 0x8D: "BINUNICODE8", 0x8E: "BINBYTES8", 0x96: "BYTEARRAY8",
          0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER", 0x49: "INT", 0x4C: "LONG", 0x53: "STRING", 0x56: "UNICODE",
          0x46: "FLOAT", 0x54: "BINSTRING", 0x55: "SHORT_BINSTRING", 0x67: "GET", 0x70: "PUT", 0x30: "POP",
          0x31: "POP_MARK", 0x32: "DUP", 0x61: "APPEND", 0x73: "SETITEM", 0x8F: "EMPTY_SET", 0x91: "FROZENSET"}


class UnsafeDump(ValueError):
    """The pickle uses an opcode outside the allowlist, or exceeds a cap; the message says which and where."""


def _op_name(code: int) -> str:
    return _NAMES.get(code, f"opcode 0x{code:02x}")


def scan(data: bytes) -> None:
    """Raise :class:`UnsafeDump` unless ``data`` is a data-only pickle within the caps."""
    if len(data) > MAX_DUMP_BYTES:
        raise UnsafeDump(f"{len(data)} bytes, above the {MAX_DUMP_BYTES}-byte cap")
    if len(data) < 3 or data[0] != 0x80 or data[1] not in (2, 3, 4, 5):
        raise UnsafeDump("not a pickle of protocol 2 to 5 (no PROTO opcode at offset 0)")
    pos, depth, n = 2, 0, len(data)
    while True:
        pos = _level(min(MAX_DEPTH_FAST, MAX_DEPTH - depth)).match(data, pos).end()  # type: ignore[union-attr]
        if pos >= n:
            raise UnsafeDump(f"truncated: no STOP opcode before the end ({n} bytes)")
        code = data[pos]
        if code == _STOP:
            if pos != n - 1:
                raise UnsafeDump(f"{n - pos - 1} bytes after STOP at offset {pos}")
            return
        pos, depth = _step(data, pos, code, depth)


def _step(data: bytes, pos: int, code: int, depth: int) -> tuple[int, int]:
    """One opcode the pattern stopped at: a long string, a MARK or its closer, a memo put past the pattern's
    index range; anything else is refused."""
    if code in _STRINGS:
        return _skip_string(data, pos), depth
    if code == _LONG_BINPUT:
        return _memo_put(data, pos), depth
    if code == _FRAME:
        return _frame(data, pos), depth
    if code == _OPEN:
        if depth + 1 > MAX_DEPTH:
            raise UnsafeDump(f"containers nested deeper than {MAX_DEPTH} at offset {pos}")
        return pos + 1, depth + 1
    if code in _CLOSE:
        if depth == 0:
            raise UnsafeDump(f"{_CLOSE[code]} without MARK at offset {pos}")
        return pos + 1, depth - 1
    raise UnsafeDump(f"{_op_name(code)} opcode at offset {pos} is not allowed (data-only pickles are read)")


def _memo_put(data: bytes, pos: int) -> int:
    """A LONG_BINPUT whose index the pattern does not take (4,194,304 and above). The C unpickler grows its memo
    to twice the index at once: one flipped byte asked for 32 GB and took 52 s to fail. Writers number their
    puts from 0, so an index past the dump's own size is refused (the compiled reader's rule too)."""
    if pos + 5 > len(data):
        raise UnsafeDump(f"LONG_BINPUT at offset {pos} runs past the end of the file")
    index = int.from_bytes(data[pos + 1:pos + 5], "little")
    if index > len(data):
        raise UnsafeDump(f"LONG_BINPUT memo index {index} at offset {pos} is past the dump's size ({len(data)} bytes)")
    return pos + 5


def _frame(data: bytes, pos: int) -> int:
    """FRAME (protocol 4+): its length must fit in the file; the unpickler would allocate it before reading (a
    flipped byte asked for 8 EB: MemoryError)."""
    if pos + 9 > len(data) or int.from_bytes(data[pos + 1:pos + 9], "little") > len(data) - pos - 9:
        raise UnsafeDump(f"FRAME at offset {pos} runs past the end of the file")
    return pos + 9


def _skip_string(data: bytes, pos: int) -> int:
    name, width = _STRINGS[data[pos]]
    length = int.from_bytes(data[pos + 1:pos + 1 + width], "little")
    if length > MAX_STRING_BYTES:
        raise UnsafeDump(f"{name} of {length} bytes at offset {pos}, above the {MAX_STRING_BYTES}-byte cap")
    end = pos + 1 + width + length
    if end > len(data):
        raise UnsafeDump(f"{name} at offset {pos} runs past the end of the file")
    return end


class _NoClasses(pickle.Unpickler):
    """Refuses every class and persistent id: the second lock behind :func:`scan`."""

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeDump(f"refused to load class {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeDump("refused a persistent id")


def loads(data: bytes) -> Any:
    """The object a data-only pickle holds; :class:`UnsafeDump` when it is anything else."""
    scan(data)
    # A buffered reader lets the C unpickler read ahead (on a bare BytesIO it asks for every opcode's bytes);
    # the cyclic collector is paused while thousands of acyclic containers are made (it would run every 700).
    reader = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)
    paused = gc.isenabled()
    gc.disable()
    try:
        return _NoClasses(reader).load()
    except UnsafeDump:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            OverflowError) as exc:  # OverflowError: a FRAME length past 2**63 (found by tests/test_fr_columns.py)
        raise UnsafeDump(f"not a valid pickle: {type(exc).__name__}: {exc}") from None
    finally:
        if paused:
            gc.enable()
