"""The job's own last words: tracebacks, CUDA and NCCL errors raised to Python, the launcher's and the
scheduler's messages, stack dumps. Frames ``last_words`` and ``stacks`` (see forensics/frames.py).

Two entry points, both over one scanner (:mod:`.scan`):

* :func:`parse` for files of kind ``job_log`` (text that no other sniffer claims but that holds such words);
* :func:`scan` for files of another text kind that a rank's stdout also is (``nccl_log``): discovery runs
  it after the file's own parser (see ``registry.ALSO_READ``), adds its frames to the file's and notes in
  the file's message what it found. The file keeps its one row in ``run.sources`` (its kind is the
  primary parser's), so nothing is counted twice.

Bounded: lines are read through ``read_lines`` (a line over the record cap is skipped and said), each
line is matched on its first 4,096 characters, a traceback keeps 48 frames (the rest counted), and each
frame keeps 20,000 rows per file. Bytes that are not UTF-8 are replaced (and counted, the file is then
``partial``). Nothing here raises on bad input.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
from forensics.parsers.bounded_read import LongLines, contains, open_bounded, read_lines
from forensics.parsers.lastwords.scan import MAX_ROWS, Scanner
from forensics.parsers.result import ParseContext, ParseResult

from forensics.base import frames as fr

# What makes text worth reading line by line (a cheap test first: most NCCL logs hold none of it).
TRIGGER = re.compile(
    rb"Traceback \(most recent call|CUDA error|CUDA out of memory|OutOfMemoryError|HIP error|CANCELLED AT|srun: error|"
    rb"exitcode|closing signal|Killing subprocess|OOMKill|Evicted|oom[-_]kill event|ChildFailedError|"
    rb"is killed by signal|bus error encountered in worker|Assertion `|terminate called after|Fatal Python error|"
    rb"\(most recent call first\)|=== Rank \d+ ===|Thread (?:0x[0-9a-fA-F]+|\d+) \((?:idle|active)|<defunct>|"
    rb"death signal|Worker group FAILED|exitCode: \d|DistBackendError|NCCL error in:")


def score_job_log(text: bytes) -> int:
    """Text with the job's own last words scores low (10-30): any other kind's sniffer that claims the file
    wins, and the file is then read for last words beside it (``registry.ALSO_READ``)."""
    hits = 0
    for _ in TRIGGER.finditer(text):
        hits += 1
        if hits >= 20:
            break
    return 10 + hits if hits else 0


def _read(path: Path, ctx: ParseContext, scanner: Scanner) -> tuple[int, LongLines]:
    """Feed every line; the number of lines with bytes that are not UTF-8."""
    long = LongLines()
    bad = 0
    with open_bounded(path, ctx.max_decompressed_bytes) as fh:
        for n, raw in read_lines(fh, long):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                bad += 1
                text = raw.decode("utf-8", errors="replace")
            scanner.feed(n, text.rstrip("\r\n"))
    scanner.finish()
    return bad, long


def _frames(scanner: Scanner) -> dict[str, pl.DataFrame]:
    out: dict[str, pl.DataFrame] = {}
    if scanner.events:
        out["last_words"] = _frame("last_words", scanner.events)
    if scanner.stacks_rows:
        out["stacks"] = _frame("stacks", scanner.stacks_rows)
    return out


def _frame(name: str, rows: list[dict]) -> pl.DataFrame:
    schema = fr.schema(name)
    cols = {c: [r.get(c) for r in rows] for c in schema.names()}
    return pl.DataFrame(cols, schema=schema)


def _notes(scanner: Scanner, bad: int, long: LongLines, source: str) -> list[str]:
    """What was damaged or not kept (each makes the source partial)."""
    notes = []
    if bad:
        notes.append(f"{bad:,} line(s) with bytes that are not UTF-8 (replaced)")
    for name, n in scanner.dropped.items():
        if n:
            notes.append(f"{n:,} {name} row(s) past the first {MAX_ROWS:,} not kept")
    cut = sum(1 for r in scanner.events if r.get("cls") == "truncated")
    if cut:
        notes.append(f"{cut} traceback(s) cut off before their exception line")
    deep = [r for r in scanner.events if (r.get("frames") or 0) > 48]
    if deep:
        notes.append(f"traceback at line {deep[0]['line']:,} has {deep[0]['frames']:,} frames (48 kept)")
    long_note = long.note(source)
    if long_note:
        notes.append(long_note)
    return notes


def _summary(scanner: Scanner) -> str:
    n_ev, n_st = len(scanner.events), len(scanner.stacks_rows)
    parts = []
    if n_ev:
        parts.append(f"{n_ev} last-words event(s)")
    if n_st:
        parts.append(f"{n_st} stack(s)")
    return ", ".join(parts)


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    """A ``job_log`` file: its last words are all it is read for."""
    scanner = Scanner(ctx.rel_path)
    bad, long = _read(path, ctx, scanner)
    frames = _frames(scanner)
    if not frames:
        return ParseResult(status="ignored", message="text with no traceback, launcher, scheduler or stack-dump "
                           "message forensics reads")
    notes = _notes(scanner, bad, long, ctx.rel_path)
    message = "last words: " + _summary(scanner) + ("; " + "; ".join(notes) if notes else "")
    return ParseResult(frames=frames, status="partial" if notes else "ok", message=message, rank=scanner.rank)


def scan(path: Path, ctx: ParseContext, rank: int | None = None, host: str | None = None) -> tuple[
        dict[str, pl.DataFrame], str | None, bool]:
    """A file of another kind read for last words too: (frames, a note for its message, damaged?)."""
    if not contains(path, TRIGGER, ctx.max_decompressed_bytes, 256):
        return {}, None, False
    scanner = Scanner(ctx.rel_path, rank, host)
    bad, long = _read(path, ctx, scanner)
    frames = _frames(scanner)
    if not frames:
        return {}, None, False
    notes = [n for n in _notes(scanner, bad, long, ctx.rel_path) if "not UTF-8" not in n and "longer than" not in n]
    note = "also read for last words: " + _summary(scanner) + ("; " + "; ".join(notes) if notes else "")
    return frames, note, bool(notes)
