"""Typed decoding of Kineto traces: msgspec builds only the fields the frames read.

The event array is read in chunks, as by the stream reader (``kineto_stream``), but each chunk is decoded
by msgspec into :class:`Event` structs instead of dicts: keys no frame reads (``Ev Idx``, ``Sequence number``,
``Input Strides``, a flow's ``id`` and ``bp``, an allocator event's fields ...) are skipped while parsing,
nothing is allocated for them, and a struct's fields are read as attributes. The types are strict on purpose:
whatever the stream reader reads differently from the common case (NaN or Infinity, a string or float id, a
null ``ts``, a boolean, a 65-bit integer, a flow or instant event of a tabulated category, damage, truncation,
stray bytes, invalid UTF-8) is rejected with :class:`TypedRejected`, and the caller reads the file again with
the stream reader, which stays the reference: both give the same frames (tests/test_kineto_typed.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
from forensics.parsers.bounded_read import DEFAULT_MAX_RECORD_BYTES
from forensics.parsers.kineto_stream import (
    EVENT_BOUNDARY,
    ReadOutcome,
    StreamReader,
    find_events,
    limit_heap_retention,
)
from msgspec import UNSET, Raw, Struct, UnsetType, field

NULL = -(1 << 63)
"""Integer-buffer stand-in for a missing value (``kineto_extract`` shares it)."""
# Bigger pieces than the stream reader's: msgspec pays a fixed cost per call, and there is no regex pass.
CHUNK_BYTES = 1 << 17
# Boundary candidates tried per chunk: Kineto writes one event per `}` + `,`, so the last is almost always one.
_TRIES = 4


class TypedRejected(Exception):
    """The typed decoder does not read this file the way the stream reader does (reason in the message)."""


class Args(Struct, gc=False):
    """The ``args`` keys any frame reads; every other key is skipped unread. Missing ids read as NULL and a
    missing ``blocks per SM`` as NaN, as the stream reader's buffers hold them; a null one is rejected (the
    stream reader's slow path coerces it)."""

    device: int | None = None  # None: the event's pid
    stream: int | None = None  # None: the event's tid
    correlation: int = NULL
    external_id: int | None = field(default=None, name="External id")
    external_id_legacy: int = field(default=NULL, name="external id")
    grid: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    blocks_per_sm: float = field(default=math.nan, name="blocks per SM")
    graph_id: int = field(default=NULL, name="graph id")
    graph_node_id: int = field(default=NULL, name="graph node id")
    # collective args: taken as written and coerced like the stream reader's (``kineto_extract._arg_value``)
    coll_raw: Any = field(default=UNSET, name="Collective name")
    in_nelems: Any = field(default=UNSET, name="In msg nelems")
    out_nelems: Any = field(default=UNSET, name="Out msg nelems")
    dtype: Any = field(default=UNSET, name="dtype")
    group_size: Any = field(default=UNSET, name="Group size")
    pg_name: Any = field(default=UNSET, name="Process Group Name")
    pg_desc: Any = field(default=UNSET, name="Process Group Description")
    pg_ranks_raw: Any = field(default=UNSET, name="Process Group Ranks")
    seq: Any = field(default=UNSET, name="Seq")
    src_rank: Any = field(default=UNSET, name="Src Rank")
    dst_rank: Any = field(default=UNSET, name="Dst Rank")
    pg_id: Any = field(default=UNSET, name="Process Group ID")
    # shapes of GEMM / attention ops: re-read only for those ops
    input_dims: Raw | UnsetType = field(default=UNSET, name="Input Dims")
    input_type: Raw | UnsetType = field(default=UNSET, name="Input type")


class Event(Struct, gc=False):
    """One trace event, the fields the frames read."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float = math.nan
    args: Args | None = None


EMPTY_ARGS = Args()
CUT_PH = frozenset("sfti")
"""Flow and instant phases: the stream reader cuts such events out of the text unread (when ``ph`` comes first)."""
_EVENTS = msgspec.json.Decoder(list[Event])
_TAIL = msgspec.json.Decoder(dict[str, Raw])
TypedSink = Callable[[list[Event]], None]
TextSink = Callable[[bytearray, bool, bool], tuple[int, bool, int]]
"""The compiled reader's sink: (text, first, final) -> (bytes used, array closed, events read); TypedRejected."""
COMPILED_CHUNK_BYTES = 1 << 17  # below glibc's mmap threshold (limit_heap_retention): no page faults


def read_trace_typed(path: Path, limit: int, sink: TypedSink, chunk_bytes: int = CHUNK_BYTES,
                     max_event: int = DEFAULT_MAX_RECORD_BYTES) -> ReadOutcome:
    """Decode ``path``'s events into ``sink`` (lists of :class:`Event`, one per chunk), the metadata into the
    outcome. Raises TypedRejected for anything but a whole, well-typed document (the sink may have taken
    chunks by then: the caller drops them), and TraceReadError as the stream reader would before the events."""
    limit_heap_retention()
    rd = StreamReader(path, limit, max_event)
    bare = find_events(rd)  # the header: read by the stream reader's own code, so errors there are its own
    buf = rd.buf
    buf[0:0] = b"["
    size = chunk_bytes
    while True:
        while len(buf) < size and rd.pull():
            pass
        if rd.stop_reason is not None:
            break
        used = _decode_chunk(buf, sink, rd.out)
        if used:
            del buf[1:used]
            size = chunk_bytes
        elif len(buf) > max_event:
            raise TypedRejected(f"no event boundary within {max_event:,} bytes")
        else:
            size *= 2
    if rd.stop_reason:
        raise TypedRejected(rd.stop_reason)
    _decode_tail(bytes(buf), bare, sink, rd.out)
    return rd.out


def read_trace_compiled(path: Path, limit: int, take: TextSink, chunk_bytes: int = COMPILED_CHUNK_BYTES,
                        max_event: int = DEFAULT_MAX_RECORD_BYTES) -> ReadOutcome:
    """``read_trace_typed`` with the event array read by ``take`` (the compiled reader, parsers/kineto_columns.c)
    instead of msgspec; the header and the metadata after the array are read by the same code. Raises
    TypedRejected for what the compiled reader refuses (the typed reader then reads the file)."""
    limit_heap_retention()
    rd = StreamReader(path, limit, max_event)
    bare = find_events(rd)
    buf = rd.buf
    size, first, done = chunk_bytes, True, False
    while not done:
        while len(buf) < size and rd.pull():
            pass
        if rd.stop_reason:
            raise TypedRejected(rd.stop_reason)
        used, done, events = take(buf, first, rd.stop_reason == "")
        rd.out.events += events
        first = first and not events
        if used:
            del buf[:used]
            size = chunk_bytes
        elif len(buf) > max_event:
            raise TypedRejected(f"no whole event within {max_event:,} bytes")
        else:
            size *= 2
    while rd.pull():
        pass
    if rd.stop_reason:
        raise TypedRejected(rd.stop_reason)
    _decode_tail(b"[]" + bytes(buf), bare, lambda events: None, rd.out)
    return rd.out


def _decode_chunk(buf: bytearray, sink: TypedSink, out: ReadOutcome) -> int:
    """Decode the events of ``buf`` (which starts with ``[``) up to the last verified ``},``; the bytes used, 0
    when no candidate among the last few verifies."""
    pos = len(buf)
    for _ in range(_TRIES):
        brace = buf.rfind(b"}", 1, pos)
        while brace > 0 and (m := EVENT_BOUNDARY.match(buf, brace)) is None:
            brace = buf.rfind(b"}", 1, brace)
        if brace <= 0:
            return 0
        pos = brace
        with memoryview(buf) as view:
            piece = b"".join((view[: brace + 1], b"]"))
        try:
            events = _decode(piece, _EVENTS)
        except msgspec.DecodeError:
            continue  # not a top-level boundary (or damage: then no candidate verifies)
        out.events += len(events)
        sink(events)
        return m.end()
    return 0


def _decode(text: bytes, decoder: msgspec.json.Decoder) -> Any:
    """``decoder.decode(text)``; TypedRejected for what the stream reader would read otherwise. msgspec skips
    the keys it does not read without checking their UTF-8 (orjson rejects the whole piece), and its nesting
    limit (Python's recursion limit) is below orjson's."""
    if not text.isascii():
        try:
            text.decode()
        except UnicodeDecodeError as exc:
            raise TypedRejected(f"not UTF-8: {exc}") from None
    try:
        return decoder.decode(text)
    except msgspec.ValidationError as exc:
        raise TypedRejected(f"typed decoding: {exc}") from None
    except RecursionError:
        raise TypedRejected("nesting too deep for the typed decoder") from None


def _decode_tail(rest: bytes, bare: bool, sink: TypedSink, out: ReadOutcome) -> None:
    """The last events, the array's end and the metadata after it."""
    try:
        if bare:
            events, trailer = _decode(rest, _EVENTS), {}
        else:
            doc = _decode(b'{"traceEvents":' + rest, _TAIL)
            events = _EVENTS.decode(doc.pop("traceEvents"))
            trailer = {key: orjson.loads(bytes(value)) for key, value in doc.items()}
    except (msgspec.DecodeError, orjson.JSONDecodeError, RecursionError) as exc:
        raise TypedRejected(f"typed decoding of the end: {exc}") from None
    out.events += len(events)
    if events:
        sink(events)
    out.meta.update(trailer)
