"""Streaming reader for Kineto / Chrome-trace JSON: the ``traceEvents`` array in chunks, never whole.

The decompressed text is read in blocks; the ``traceEvents`` array is split at top-level event
boundaries and each piece is parsed with orjson on its own (``[`` + piece + ``]``). A boundary is
only a candidate (a ``},`` found by a byte search may sit inside a string or a nested object); it
is accepted when the piece parses, which it cannot do when the cut is not at the top level of the
array (brackets or a string would be left open). Memory stays bounded by the chunk size, and a
trace cut off mid-write falls out of the same loop: everything up to the last complete event is
kept and the byte offset of the cut is reported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from forensics.parsers import bounded_read
from forensics.parsers.bounded_read import DEFAULT_MAX_RECORD_BYTES, GZIP_MAGIC

# Small pieces on purpose: a 32 KB block of JSON and the few hundred event dicts parsed from it
# stay in the CPU's L2 cache from decompression through orjson to the column buffers, and every
# per-chunk buffer is reused from the heap instead of being mapped and page-faulted afresh.
# Measured on a 54 MB trace: 1 MB pieces 0.65 s, 256 KB 0.55 s, 64 KB 0.47 s, 32 KB 0.43 s.
READ_BYTES = 1 << 15
CHUNK_BYTES = 1 << 15
# The text before the traceEvents array (deviceProperties, distributedInfo) is small in practice;
# past this many bytes without finding the array the file is not read further as a stream.
MAX_HEADER_BYTES = 256 << 20
# A window this big without a verified boundary is read event by event (damage, not a big event).
SALVAGE_AFTER = 256 << 10
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
EVENT_BOUNDARY = re.compile(rb"\}\s*,")
_WS = b" \t\r\n"

EventSink = Callable[[list], None]


def limit_heap_retention() -> None:
    """glibc raises its mmap threshold after the first large free, after which every large
    buffer (a chunk window grown for a huge event, a column buffer) comes from the heap and stays
    there; pinning the threshold lets them go back to the OS (measured with 1 MB chunks: about
    17 MB less peak RSS on a 54 MB trace). No-op off glibc."""
    global _HEAP_TUNED
    if _HEAP_TUNED:
        return
    _HEAP_TUNED = True
    try:
        import ctypes  # only on the first streamed trace, on glibc

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 256 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


_HEAP_TUNED = False


class TraceReadError(Exception):
    """The file cannot be read as a trace at all (reason in the message, one line)."""


class _Corrupt(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class ReadOutcome:
    """What the stream reader saw: top-level metadata, event count, and where it stopped."""

    meta: dict = field(default_factory=dict)
    events: int = 0  # every event read, including those cut out unparsed
    flows: int = 0  # flow and instant events cut out before parsing (counted, not tabulated)
    decompressed_bytes: int = 0
    complete: bool = True
    damaged: int = 0  # events skipped because they did not parse
    deep: bool = False  # some text was nested deeper than the JSON parser allows
    # one line saying why the read stopped early; None when the document was read whole
    problem: str | None = None


def decompressed_blocks(path: Path, limit: int) -> Iterator[bytes]:
    """Decompressed content of ``path`` in blocks (gunzipped when gzip, multi-member aware).

    Raises ``_Corrupt`` for corrupt or truncated gzip data and when more than ``limit`` bytes would
    come out (a gzip bomb); every byte decompressed before the problem has been yielded by then.
    """
    with open(path, "rb") as fh:
        gz = fh.read(2) == GZIP_MAGIC
        fh.seek(0)
        yield from _bounded(_gunzip(fh) if gz else iter(lambda: fh.read(READ_BYTES), b""), limit)


def _bounded(blocks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    total = 0
    for block in blocks:
        total += len(block)
        if total > limit:
            yield block[: len(block) - (total - limit)]
            raise _Corrupt(f"decompressed size exceeds the limit of {limit} bytes (gzip bomb?)")
        yield block


def _gunzip(fh: BinaryIO) -> Iterator[bytes]:
    inflate = bounded_read.INFLATE  # zlib-ng's or the standard library's (looked up per file: tests swap it)
    dec = inflate.decompressobj(31)
    consumed = 0  # compressed bytes fed so far
    started = False  # the current member has received input
    while True:
        data = fh.read(READ_BYTES // 4)
        if not data:
            if started and not dec.eof:
                raise _Corrupt(f"gzip stream truncated at compressed byte {consumed:,}")
            return
        consumed += len(data)
        while data:
            started = True
            try:
                out = dec.decompress(data, READ_BYTES)
            except inflate.error as exc:
                raise _Corrupt(f"corrupt gzip data before compressed byte {consumed:,}: {exc}") from None
            if out:
                yield out
            if not dec.eof:
                data = dec.unconsumed_tail
                continue
            data = dec.unused_data
            if data.strip(b"\x00"):
                dec = inflate.decompressobj(31)  # next gzip member
            else:
                data = b""
                started = False


# Flow events (`ac2g`, `fwdbwd`, legacy `async` launch arrows) and instant events (allocator
# `[memory]` records, `Iteration Start`) are a third to a half of a typical trace and no frame reads
# them (kernels carry their correlation id in args): they are cut out of the text before orjson
# sees it, and counted. A flow has no nested object, an instant at most one (`args`).
_SKIPPED_EVENT = re.compile(rb'\{\s*+"ph"\s*+:\s*+"[sfti]"\s*+,(?:[^{}]++|\{[^{}]*+\})*+\}\s*+,')


def _loads(text: bytes) -> Any:
    """orjson, or (only for text holding NaN / Infinity, which PyTorch writes in args) the standard
    library's parser, which reads them as float values. Raises ValueError or RecursionError."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if b"NaN" not in text and b"Infinity" not in text:
            if "depth limit" in str(exc):
                raise _TooDeep() from None
            raise
    try:
        return json.loads(text)
    except RecursionError:
        raise _TooDeep() from None


class _TooDeep(ValueError):
    pass


def _parse_array_piece(piece: bytes | bytearray | memoryview) -> tuple[list, int] | None:
    """(events, flow/instant events cut out) of ``[`` + piece + ``]``; None when that is not valid JSON."""
    text, flows = _SKIPPED_EVENT.subn(b"", piece)
    try:
        return _loads(b"".join((b"[", text, b"]"))), flows
    except _TooDeep:
        raise
    except ValueError:
        if not flows:
            return None
    # A cut-out match cannot start inside a string (quotes there are escaped), but one could end at
    # a `},` inside a string of an instant event; the text is then invalid, so parse it unabridged.
    try:
        return _loads(b"".join((b"[", piece, b"]"))), 0
    except ValueError:
        return None


def _split(buf: bytearray, start: int, end: int) -> tuple[list, int, int] | None:
    """Parse the longest run of whole events in ``buf[start:end]`` ending at a verified ``},``.

    Returns (events, flow/instant events skipped, index just past the comma) or None when no boundary in
    the window verifies.
    """
    # Candidates from the end of the window backwards; the last few are enough in practice. Each
    # `}` is found with rfind and checked in place: listing every `},` of the window with finditer
    # cost more than the rest of the split (measured: ~0.05 s of 0.43 s on a 54 MB trace).
    window_start = max(start, end - (1 << 18))
    match = EVENT_BOUNDARY.match
    pos = end
    tries = 0
    while tries < 64:
        brace = buf.rfind(b"}", window_start, pos)
        if brace < 0:
            return None
        pos = brace
        m = match(buf, brace, end)
        if m is None:
            continue
        tries += 1
        try:
            with memoryview(buf) as view:
                got = _parse_array_piece(view[start : brace + 1])
        except _TooDeep:
            return None  # read event by event, which says so
        if got is not None:
            return got[0], got[1], m.end()
    return None


# Where one event ends and the next begins: `}`, a comma, `{` (also found inside nested args).
_EVENT_GAP = re.compile(rb"\}\s*+,\s*+(?=\{)")
# Pieces merged at most to rebuild one event cut at a nested `}, {`; past that it is damaged.
_MAX_MERGE = 16


@dataclass
class _Salvaged:
    events: list
    flows: int
    damaged: int
    used: int  # bytes of the input consumed (events kept and damaged ones skipped)
    deep: bool = False


def _salvage_events(data: bytes, final: bool) -> _Salvaged:
    """Events of ``data`` one by one, skipping those that do not parse: a damaged event costs that
    event. Linear in ``len(data)``: each candidate piece is parsed with at most ``_MAX_MERGE``
    neighbours. The last piece is left unread unless ``final`` (more text may complete it)."""
    starts = [0, *(m.end() for m in _EVENT_GAP.finditer(data))]
    n = len(starts)
    out = _Salvaged([], 0, 0, 0)
    i, last = 0, n if final else n - 1
    while i < last:
        for j in range(i + 1, min(i + _MAX_MERGE, last) + 1):
            end = starts[j] if j < n else len(data)
            piece = data[starts[i] : end].rstrip(_WS + b",")
            try:
                got = _parse_array_piece(piece)
            except _TooDeep:
                out.deep, got = True, None
            if got is not None and all(isinstance(e, dict) for e in got[0]):
                out.events.extend(got[0])
                out.flows += got[1]
                i = j
                break
        else:
            out.damaged += 1
            i += 1
    out.used = starts[i] if i < n else len(data)
    return out


def _salvage_last(tail: bytes) -> tuple[list, int]:
    """The complete event(s) at the start of the last piece, which may run on into the array's
    end and the trailing metadata or stop mid-event: tries the last few ``}`` (a bounded number,
    so the cost stays linear)."""
    pos = len(tail)
    for _ in range(64):
        pos = tail.rfind(b"}", 0, pos)
        if pos < 0:
            break
        try:
            got = _parse_array_piece(tail[: pos + 1])
        except _TooDeep:
            continue
        if got is not None and all(isinstance(e, dict) for e in got[0]):
            return got
    return [], 0


class StreamReader:
    """The decompressed text as a growing buffer, pulled block by block."""

    def __init__(self, path: Path, limit: int, max_event: int) -> None:
        self.blocks = decompressed_blocks(path, limit)
        self.buf = bytearray()
        self.out = ReadOutcome()
        self.max_event = max_event
        self.stop_reason: str | None = None  # "" at a clean end of file

    def pull(self) -> bool:
        if self.stop_reason is not None:
            return False
        try:
            block = next(self.blocks)
        except StopIteration:
            self.stop_reason = ""
            return False
        except _Corrupt as exc:
            self.stop_reason = exc.message
            return False
        self.buf.extend(block)
        self.out.decompressed_bytes += len(block)
        return True

    def emit(self, sink: EventSink, events: list, flows: int) -> None:
        self.out.events += len(events) + flows
        self.out.flows += flows
        if events:
            sink(events)


def read_trace(path: Path, limit: int, sink: EventSink, chunk_bytes: int | None = None,
               max_event: int = DEFAULT_MAX_RECORD_BYTES) -> ReadOutcome:
    """Stream ``path``'s trace events into ``sink`` (lists of event dicts, one list per chunk).

    Raises TraceReadError when not a single event could be read (not JSON, wrong shape, empty,
    corrupt before the first event). A read that stops early after some events returns an outcome
    with ``complete=False`` and the reason. No more than about ``max_event`` bytes are held at once.
    """
    limit_heap_retention()
    rd = StreamReader(path, limit, max_event)
    bare = find_events(rd)
    _read_chunks(rd, sink, chunk_bytes or CHUNK_BYTES)
    if rd.stop_reason == "" and _read_end(rd, sink, bare):
        return rd.out
    _salvage_rest(rd, sink, bare)
    return rd.out


def find_events(rd: StreamReader) -> bool:
    """Read up to the start of the event array (header metadata into ``rd.out.meta``); True when
    the document is a bare array of events."""
    m = None
    # Searched again only each time the buffer has doubled, so a long header costs O(its size)
    # in all with small blocks, not a full re-scan per block.
    next_search = 0
    buf = rd.buf
    while True:
        stripped = bytes(buf[:64]).lstrip(b"\xef\xbb\xbf" + _WS)
        if not stripped:
            del buf[:]  # leading whitespace only: nothing to keep (a whitespace bomb stays small)
        elif stripped[:1] == b"[":
            del buf[: buf.index(b"[") + 1]
            return True
        elif stripped[:1] != b"{":
            raise TraceReadError(f"not JSON: starts with {stripped[:12]!r}")
        elif len(buf) >= next_search:
            m = _EVENTS_KEY.search(buf)
            if m:
                break
            next_search = 2 * len(buf)
        if len(buf) > min(MAX_HEADER_BYTES, rd.max_event) or not rd.pull():
            m = _EVENTS_KEY.search(buf)  # the text since the last search
            break
    if m is None:
        _whole_document(buf, rd.stop_reason, rd.out.decompressed_bytes)  # always raises
    assert m is not None
    _read_header(rd, m.end())
    return False


def _read_header(rd: StreamReader, end: int) -> None:
    """The metadata before the event array (``rd.buf[:end]``) into ``rd.out.meta``."""
    buf = rd.buf
    try:
        header = _loads(bytes(buf[:end]) + b"]}")
    except _TooDeep:
        raise TraceReadError("nesting too deep before traceEvents (more levels than the JSON parser allows)") from None
    except ValueError as exc:
        raise TraceReadError(f"malformed JSON before traceEvents: {exc}") from None
    header.pop("traceEvents", None)
    rd.out.meta.update(header)
    del buf[:end]


def _read_chunks(rd: StreamReader, sink: EventSink, chunk_bytes: int) -> None:
    """Whole events in chunks until the text runs out (or the buffer passes the event cap)."""
    base_chunk, buf = chunk_bytes, rd.buf
    while True:
        while len(buf) < chunk_bytes and rd.pull():
            pass
        if rd.stop_reason is not None:
            return
        got = _split(buf, 0, len(buf))
        if got is not None:
            events, flows, used = got
            chunk_bytes = base_chunk  # an event bigger than a chunk widens the window only for itself
        else:
            # No verified boundary near the end: a big event, or a damaged one. Past SALVAGE_AFTER
            # the window is read event by event, so damage costs the damaged event only.
            used, events, flows = 0, [], 0
            if len(buf) >= SALVAGE_AFTER:
                sal = _salvage_events(bytes(buf), final=False)
                events, flows, used = sal.events, sal.flows, sal.used
                rd.out.damaged += sal.damaged
                rd.out.deep |= sal.deep
            if not used:
                if len(buf) > rd.max_event:
                    rd.stop_reason = (f"no event boundary within {rd.max_event:,} bytes (an event larger than "
                                      f"the cap, or not trace events): the rest of the file was not read")
                    return
                chunk_bytes *= 2
                continue
        rd.emit(sink, events, flows)
        del events
        del buf[:used]


def _read_end(rd: StreamReader, sink: EventSink, bare: bool) -> bool:
    """At a clean end of file: the last events, the closing bracket and the trailing metadata in
    one parse. False when that text is not a valid end of the document."""
    rest = bytes(rd.buf)
    text, flows = _SKIPPED_EVENT.subn(b"", rest)
    opening = b"[" if bare else b'{"traceEvents":['
    try:
        try:
            doc = _loads(opening + text)
        except ValueError:
            if not flows:
                raise
            doc, flows = _loads(opening + rest), 0  # see _parse_array_piece
    except _TooDeep:
        rd.out.deep = True
        return False
    except ValueError:
        return False
    if bare:
        events, trailer = doc, {}
    else:
        events = doc.pop("traceEvents")
        trailer = doc
    if not isinstance(events, list) or (
        rd.out.events == 0 and events and not any(isinstance(e, dict) for e in events)
    ):
        raise TraceReadError("traceEvents is not a list of event objects")
    rd.emit(sink, events, flows)
    rd.out.meta.update(trailer)
    if rd.out.damaged:
        rd.out.complete = False
        deep = " (nesting too deep: more levels than the JSON parser allows)" if rd.out.deep else ""
        rd.out.problem = f"{rd.out.damaged:,} damaged event(s) skipped{deep}; kept {rd.out.events:,} events"
    return True


def _salvage_rest(rd: StreamReader, sink: EventSink, bare: bool) -> None:
    """Cut off (or damaged) somewhere in the rest: keep every complete event before the cut."""
    rest = bytes(rd.buf)
    rd.buf = bytearray()
    sal = _salvage_events(rest, final=False)
    rd.emit(sink, sal.events, sal.flows)
    out = rd.out
    out.damaged += sal.damaged
    out.deep |= sal.deep
    tail = rest[sal.used :].lstrip(_WS)
    if rd.stop_reason == "" and tail:
        rd.buf = bytearray(tail)
        if _read_end(rd, sink, bare):
            return
    events, flows = _salvage_last(tail)
    rd.emit(sink, events, flows)
    cut = out.decompressed_bytes
    why = rd.stop_reason or "the JSON document ends before the traceEvents array closes"
    if rd.stop_reason == "":
        # Clean end of file but the array or the object around it is incomplete.
        why = "the JSON document ends before it is complete (file cut off mid-write?)"
        if out.deep:
            why = "nesting too deep: more levels than the JSON parser allows"
    out.complete = False
    out.problem = f"truncated at byte {cut:,} of the JSON text ({why}); kept {out.events:,} complete events"
    if out.deep and rd.stop_reason == "":
        out.problem = f"{why}; kept {out.events:,} complete events"
    if out.damaged:
        out.problem += f"; {out.damaged:,} damaged event(s) skipped"
    if not bare and "baseTimeNanoseconds" not in out.meta:
        out.problem += " (metadata written after the events, e.g. baseTimeNanoseconds, is lost)"
    if out.events == 0 and rd.stop_reason and "gzip" in rd.stop_reason:
        raise TraceReadError(rd.stop_reason)  # corrupt before the first event: nothing to salvage


def _whole_document(buf: bytearray, stop_reason: str | None, size: int) -> None:
    """No traceEvents array found while streaming: say precisely what the document is instead."""
    if stop_reason:
        raise TraceReadError(stop_reason)
    if not bytes(buf).strip():
        raise TraceReadError("empty file")
    if len(buf) > MAX_HEADER_BYTES:
        raise TraceReadError(f"no traceEvents array in the first {MAX_HEADER_BYTES:,} bytes")
    try:
        doc = orjson.loads(bytes(buf))
    except orjson.JSONDecodeError as exc:
        raise TraceReadError(f"not valid JSON ({size:,} bytes): {exc}") from None
    if isinstance(doc, dict):
        if "traceEvents" in doc:
            raise TraceReadError(f"traceEvents is a {type(doc['traceEvents']).__name__}, not a list of events")
        raise TraceReadError("JSON object without a traceEvents array: not a Kineto/Chrome trace")
    raise TraceReadError(f"JSON {type(doc).__name__} is not a trace (expected an object with traceEvents)")
