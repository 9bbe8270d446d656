"""Reading input files within bounds: transparently gunzipped with a cap on the decompressed size (a gzip bomb
stops), line by line with a cap on a line's length, and the head or tail a sniffer looks at."""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"


def _inflate_module() -> ModuleType:
    """zlib-ng's drop-in ``zlib`` (python-zlib-ng) when installed, else the standard library's.

    zlib-ng inflates the simulated 1,024-rank traces in 0.9 ms a trace against zlib's 1.7 (docs/performance.md,
    "Tenth pass, across ranks"), and reads every stream as zlib does: the same bytes out of each call, the same
    end of stream, the same error messages on damaged or truncated data (checked on mutated traces), so what a
    reader says about a damaged file does not depend on which one ran. ``FORENSICS_GUNZIP=zlib`` forces the
    standard library (a platform without zlib-ng's wheels gets it anyway)."""
    if os.environ.get("FORENSICS_GUNZIP", "").lower() != "zlib":
        try:
            from zlib_ng import zlib_ng

            return zlib_ng
        except ImportError:
            pass
    return zlib


INFLATE: ModuleType = _inflate_module()
"""The module whose ``decompressobj`` gunzips traces and file heads (``zlib_ng`` or ``zlib``)."""


def _memory_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# A gzip bomb must not exhaust memory: decompression stops past this many bytes, 64 GiB or half the
# memory available when the run starts (at least 1 GiB), whichever is less. Log parsers hold the text
# whole and the trace frames grow with it, so the cap follows the machine, not only the file.
DEFAULT_MAX_DECOMPRESSED = min(64 * 1024**3, max(1 << 30, (_memory_available() or 128 << 30) // 2))
# A line or event longer than this is not held in memory: it is skipped (or the read stops), and said.
# FORENSICS_MAX_RECORD_BYTES overrides it (tests use a small one).
DEFAULT_MAX_RECORD_BYTES = int(os.environ.get("FORENSICS_MAX_RECORD_BYTES") or 64 << 20)


class DecompressionLimitExceeded(Exception):
    pass


class BoundedReader(io.RawIOBase):
    """A read-only stream over a file, transparently gunzipped, that refuses to yield more than
    ``limit`` bytes. Multi-member gzip files are read whole, as gzip(1) does."""

    def __init__(self, path: Path, limit: int = DEFAULT_MAX_DECOMPRESSED) -> None:
        self._raw: BinaryIO = open(path, "rb")
        self._gz = self._raw.read(2) == GZIP_MAGIC
        self._raw.seek(0)
        self._stream: BinaryIO = gzip.GzipFile(fileobj=self._raw) if self._gz else self._raw  # type: ignore[assignment]
        self._limit = limit
        self._count = 0

    @property
    def compressed(self) -> bool:
        return self._gz

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        data = self._stream.read(len(buffer))
        n = len(data)
        self._count += n
        if self._count > self._limit:
            raise DecompressionLimitExceeded(
                f"decompressed size exceeds the limit of {self._limit} bytes (gzip bomb?)"
            )
        buffer[:n] = data
        return n

    def close(self) -> None:
        try:
            if self._stream is not self._raw:
                self._stream.close()
        finally:
            self._raw.close()
        super().close()


def open_bounded(path: Path, limit: int = DEFAULT_MAX_DECOMPRESSED) -> io.BufferedReader:
    return io.BufferedReader(BoundedReader(path, limit), buffer_size=1 << 20)  # type: ignore[arg-type]


class LongLines:
    """Lines longer than ``cap`` bytes that ``read_lines`` skipped: how many and where, and how
    many lines it read in all (skipped ones included)."""

    def __init__(self, cap: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self.cap = cap
        self.count = 0
        self.first: int | None = None  # line number of the first one skipped
        self.lines = 0

    def note(self, source: str) -> str | None:
        """One line for the source's message; None when no line was skipped."""
        if not self.count:
            return None
        more = f" and {self.count - 1:,} later line(s)" if self.count > 1 else ""
        return (f"{source} line {self.first:,}{more} longer than {self.cap:,} bytes "
                f"(FORENSICS_MAX_RECORD_BYTES): skipped, not read")


def read_lines(fh: BinaryIO, long: LongLines) -> Iterator[tuple[int, bytes]]:
    """(line number, line with its end of line) for every line of ``fh`` up to ``long.cap`` bytes.
    A longer line is read past in 1 MiB pieces, never held whole: it is counted in ``long`` and
    not yielded, so memory stays bounded by the cap whatever the file holds."""
    cap = long.cap
    n = 0
    while raw := fh.readline(cap + 1):
        n += 1
        long.lines = n
        if len(raw) > cap and not raw.endswith(b"\n"):
            del raw
            while (piece := fh.readline(1 << 20)) and not piece.endswith(b"\n"):
                pass
            long.count += 1
            long.first = long.first or n
            continue
        yield n, raw


def read_capped(fh: BinaryIO, long: LongLines) -> bytes:
    """The whole text, each line longer than the cap left empty (its line break kept, so the
    numbers of the lines after it hold): see ``read_lines``."""
    parts: list[bytes] = []
    last = 0
    for n, line in read_lines(fh, long):
        if n > last + 1:
            parts.append(b"\n" * (n - last - 1))
        parts.append(line)
        last = n
    parts.append(b"\n" * (long.lines - last))
    return b"".join(parts)


def read_head(path: Path, size: int) -> tuple[bytes, str | None]:
    """Up to ``size`` decompressed bytes from the start, and an error message when not a byte could
    be decompressed (corrupt gzip). A gzip file cut off mid-write yields what it holds: the
    parser, not the sniffer, reports the truncation."""
    with open(path, "rb") as fh:
        raw = fh.read(max(size, 1 << 16))
        if raw[:2] != GZIP_MAGIC:
            return raw[:size], None
        inflate = INFLATE
        dec = inflate.decompressobj(31)
        out = b""
        try:
            while len(out) < size:
                out += dec.decompress(raw, size - len(out))
                raw = dec.unconsumed_tail
                if dec.eof or not raw:
                    raw = fh.read(1 << 16) if not dec.eof else b""
                    if not raw:
                        break
        except inflate.error as exc:
            if not out:
                return b"", f"corrupt gzip: {exc}"
        if not out and not dec.eof:
            return b"", "corrupt or truncated gzip: no data could be decompressed"
        return out[:size], None


def read_tail(path: Path, size: int) -> bytes:
    """The last ``size`` bytes of an uncompressed file (empty for gzip files)."""
    with open(path, "rb") as fh:
        if fh.read(2) == GZIP_MAGIC:
            return b""
        fh.seek(0, io.SEEK_END)
        end = fh.tell()
        fh.seek(max(0, end - size))
        return fh.read()


def contains(path: Path, pattern: re.Pattern[bytes], limit: int, overlap: int) -> bool:
    """Whether ``pattern`` matches anywhere in the (decompressed, bounded) file, read in 8 MiB blocks; a match may
    span two blocks by up to ``overlap`` bytes."""
    tail = b""
    with open_bounded(path, limit) as fh:
        while block := fh.read(8 << 20):
            if pattern.search(tail + block):
                return True
            tail = block[-overlap:]
    return False
