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

import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from forensics.parsers.common import GZIP_MAGIC

# Small pieces on purpose: a 32 KB block of JSON and the few hundred event dicts parsed from it
# stay in the CPU's L2 cache from decompression through orjson to the column buffers, and every
# per-chunk buffer is reused from the heap instead of being mapped and page-faulted afresh.
# Measured on a 54 MB trace: 1 MB pieces 0.65 s, 256 KB 0.55 s, 64 KB 0.47 s, 32 KB 0.43 s.
READ_BYTES = 1 << 15
CHUNK_BYTES = 1 << 15
# The text before the traceEvents array (deviceProperties, distributedInfo) is small in practice;
# past this many bytes without finding the array the file is not read further as a stream.
MAX_HEADER_BYTES = 256 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,")
_WS = b" \t\r\n"

EventSink = Callable[[list], None]


def _limit_heap_retention() -> None:
    """glibc raises its mmap threshold after the first large free, after which every large
    buffer (a chunk window grown for a huge event, a column buffer) comes from the heap and stays
    there; pinning the threshold lets them go back to the OS (measured with 1 MB chunks: about
    17 MB less peak RSS on a 54 MB trace). No-op off glibc."""
    global _HEAP_TUNED
    if _HEAP_TUNED:
        return
    _HEAP_TUNED = True
    try:
        import ctypes

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
    # one line saying why the read stopped early; None when the document was read whole
    problem: str | None = None


def decompressed_blocks(path: Path, limit: int) -> Iterator[bytes]:
    """Decompressed content of ``path`` in blocks (gunzipped when gzip, multi-member aware).

    Raises ``_Corrupt`` for corrupt or truncated gzip data and when more than ``limit`` bytes would
    come out (a gzip bomb); every byte decompressed before the problem has been yielded by then.
    """
    total = 0
    with open(path, "rb") as fh:
        gz = fh.read(2) == GZIP_MAGIC
        fh.seek(0)
        if not gz:
            while block := fh.read(READ_BYTES):
                total += len(block)
                if total > limit:
                    yield block[: len(block) - (total - limit)]
                    raise _Corrupt(f"file exceeds the size limit of {limit} bytes")
                yield block
            return
        dec = zlib.decompressobj(31)
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
                except zlib.error as exc:
                    raise _Corrupt(f"corrupt gzip data before compressed byte {consumed:,}: {exc}") from None
                if out:
                    total += len(out)
                    if total > limit:
                        yield out[: len(out) - (total - limit)]
                        raise _Corrupt(f"decompressed size exceeds the limit of {limit} bytes (gzip bomb?)")
                    yield out
                if dec.eof:
                    data = dec.unused_data
                    if data.strip(b"\x00"):
                        dec = zlib.decompressobj(31)  # next gzip member
                    else:
                        data = b""
                        started = False
                else:
                    data = dec.unconsumed_tail


# Flow events (`ac2g`, `fwdbwd`, legacy `async` launch arrows) and instant events (allocator
# `[memory]` records, `Iteration Start`) are a third to a half of a typical trace and no frame reads
# them (kernels carry their correlation id in args): they are cut out of the text before orjson
# sees it, and counted. A flow has no nested object, an instant at most one (`args`).
_SKIPPED_EVENT = re.compile(rb'\{\s*+"ph"\s*+:\s*+"[sfti]"\s*+,(?:[^{}]++|\{[^{}]*+\})*+\}\s*+,')


def _parse_array_piece(piece: bytes | bytearray | memoryview) -> tuple[list, int] | None:
    """(events, flow/instant events cut out) of ``[`` + piece + ``]``; None when that is not valid JSON."""
    text, flows = _SKIPPED_EVENT.subn(b"", piece)
    try:
        return orjson.loads(b"".join((b"[", text, b"]"))), flows
    except orjson.JSONDecodeError:
        if not flows:
            return None
    # A cut-out match cannot start inside a string (quotes there are escaped), but one could end at
    # a `},` inside a string of an instant event; the text is then invalid, so parse it unabridged.
    try:
        return orjson.loads(b"".join((b"[", piece, b"]"))), 0
    except orjson.JSONDecodeError:
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
    match = _BOUNDARY.match
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
        with memoryview(buf) as view:
            got = _parse_array_piece(view[start : brace + 1])
        if got is not None:
            return got[0], got[1], m.end()
    return None


def _salvage_tail(tail: bytes) -> tuple[list, int, int]:
    """Complete events at the start of ``tail`` (the text after the last verified boundary).

    Tries every ``}`` from the end; the first prefix that parses as an array of events is the
    longest one made of complete events. Returns (events, flow/instant events skipped, bytes used).
    """
    pos = len(tail)
    tries = 0
    while True:
        pos = tail.rfind(b"}", 0, pos)
        if pos < 0 or tries > 4096:
            return [], 0, 0
        tries += 1
        got = _parse_array_piece(tail[: pos + 1])
        if got is not None and all(isinstance(e, dict) for e in got[0]):
            return got[0], got[1], pos + 1


def read_trace(path: Path, limit: int, sink: EventSink, chunk_bytes: int | None = None) -> ReadOutcome:
    """Stream ``path``'s trace events into ``sink`` (lists of event dicts, one list per chunk).

    Raises TraceReadError when not a single event could be read (not JSON, wrong shape, empty,
    corrupt before the first event). A read that stops early after some events returns an outcome
    with ``complete=False`` and the reason.
    """
    _limit_heap_retention()
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    out = ReadOutcome()
    buf = bytearray()
    blocks = decompressed_blocks(path, limit)
    stop_reason: str | None = None

    def pull() -> bool:
        nonlocal stop_reason
        if stop_reason is not None:
            return False
        try:
            block = next(blocks)
        except StopIteration:
            stop_reason = ""
            return False
        except _Corrupt as exc:
            stop_reason = exc.message
            return False
        buf.extend(block)
        out.decompressed_bytes += len(block)
        return True

    # 1. Find the start of the event array.
    bare = False
    m = None
    # Searched again only each time the buffer has doubled, so a long header costs O(its size)
    # in all with small blocks, not a full re-scan per block.
    next_search = 0
    while True:
        stripped = bytes(buf[:64]).lstrip(b"\xef\xbb\xbf" + _WS)
        if stripped:
            if stripped[:1] == b"[":
                bare = True
                break
            if stripped[:1] != b"{":
                raise TraceReadError(f"not JSON: starts with {stripped[:12]!r}")
            if len(buf) >= next_search:
                m = _EVENTS_KEY.search(buf)
                if m:
                    break
                next_search = 2 * len(buf)
        if len(buf) > MAX_HEADER_BYTES or not pull():
            if stripped:
                m = _EVENTS_KEY.search(buf)  # the text since the last search
            break
    if not bare and m is None:
        _whole_document(buf, stop_reason, out.decompressed_bytes)  # always raises
    if bare:
        array_start = buf.index(b"[") + 1
    else:
        assert m is not None
        try:
            header = orjson.loads(bytes(buf[: m.end()]) + b"]}")
        except orjson.JSONDecodeError as exc:
            raise TraceReadError(f"malformed JSON before traceEvents: {exc}") from None
        header.pop("traceEvents", None)
        out.meta.update(header)
        array_start = m.end()
    del buf[:array_start]

    # 2. Whole events in chunks.
    base_chunk = chunk_bytes
    while True:
        while len(buf) < chunk_bytes and pull():
            pass
        at_end = stop_reason is not None
        if not at_end:
            got = _split(buf, 0, len(buf))
            if got is None:
                # No verified boundary near the end of this window: read more and try again.
                chunk_bytes *= 2
                continue
            events, flows, used = got
            chunk_bytes = base_chunk  # an event bigger than a chunk widens the window only for itself
            out.events += len(events) + flows
            out.flows += flows
            sink(events)
            del events
            del buf[:used]
            continue
        break

    # 3. The rest: last events, the closing bracket and the trailing metadata.
    rest = bytes(buf)
    buf = bytearray()
    if stop_reason == "":
        try:
            text, flows = _SKIPPED_EVENT.subn(b"", rest)
            opening = b"[" if bare else b'{"traceEvents":['
            try:
                doc = orjson.loads(opening + text)
            except orjson.JSONDecodeError:
                if not flows:
                    raise
                doc, flows = orjson.loads(opening + rest), 0  # see _parse_array_piece
            if bare:
                events, trailer = doc, {}
            else:
                events = doc.pop("traceEvents")
                trailer = doc
            if not isinstance(events, list) or (
                out.events == 0 and events and not any(isinstance(e, dict) for e in events)
            ):
                raise TraceReadError("traceEvents is not a list of event objects")
            out.events += len(events) + flows
            out.flows += flows
            if events:
                sink(events)
            out.meta.update(trailer)
            return out
        except orjson.JSONDecodeError:
            pass
    # Cut off (or damaged) somewhere in the rest: keep every complete event before the cut.
    used_total = 0
    while True:
        got = _split(bytearray(rest), used_total, len(rest)) if len(rest) - used_total > (1 << 16) else None
        if got is None:
            break
        events, flows, used = got
        out.events += len(events) + flows
        out.flows += flows
        sink(events)
        used_total = used
    events, flows, used = _salvage_tail(rest[used_total:].lstrip(_WS))
    out.events += len(events) + flows
    out.flows += flows
    if events:
        sink(events)
    cut = out.decompressed_bytes
    why = stop_reason or "the JSON document ends before the traceEvents array closes"
    if stop_reason == "":
        # Clean end of file but the array or the object around it is incomplete.
        why = "the JSON document ends before it is complete (file cut off mid-write?)"
    out.complete = False
    out.problem = (
        f"truncated at byte {cut:,} of the JSON text ({why}); kept {out.events:,} complete events"
    )
    if not bare and "baseTimeNanoseconds" not in out.meta:
        out.problem += " (metadata written after the events, e.g. baseTimeNanoseconds, is lost)"
    if out.events == 0 and stop_reason and "gzip" in stop_reason:
        raise TraceReadError(stop_reason)  # corrupt before the first event: nothing to salvage
    return out


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
