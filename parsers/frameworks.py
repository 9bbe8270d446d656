"""Training-framework lines in a rank's output: the checkpoint saves of Megatron-LM, DeepSpeed, PyTorch Lightning
and generic trainers, with their step and time (frame ``checkpoints``).

A rank's stdout is read for them whatever else it is (see ``registry.ALSO_READ``): :func:`scan` runs after the
parser of an NCCL log or a job log, and text that holds checkpoint saves but nothing another sniffer claims is a
``framework_log`` of its own (:func:`parse`). Failed saves and loads are not saves. Bounded as every text parser:
lines through ``read_lines``, the patterns linear and tried only on lines that pass a substring guard.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl
from forensics.parsers.bounded_read import (
    DecompressionLimitExceeded,
    LongLines,
    contains,
    open_bounded,
    read_lines,
)
from forensics.parsers.nccl_log.pytorch import PT_RANK
from forensics.parsers.result import ParseContext, ParseResult

from forensics.base import frames as fr

# Each pattern starts with a literal and has no nested or overlapping quantifiers (linear); they only run on
# lines that passed the substring guard of checkpoint_row.
CK_MEGATRON = re.compile(r"(?:saving|successfully saved) checkpoint (?:from |at )?iteration\s+(?P<it>\d+) to "
                         r"(?P<path>\S+)")
CK_DEEPSPEED = re.compile(r"Saving model checkpoint(?:: (?P<path>\S+))?")
CK_LIGHTNING = re.compile(r"Epoch (?P<ep>\d+), global step (?P<step>\d+): ")
CK_LIGHTNING_TO = re.compile(r"saving model to '?(?P<path>[^'\s]+)")
CK_GENERIC = re.compile(r"(?i)\b(?:checkpoint saved|saved (?:the |a )?checkpoint|finished saving (?:the "
                        r")?checkpoint)\b")
CK_GEN_PATH = re.compile(r"(?i)\b(?:to|at|in|:) '?(?P<path>[/.~][^'\s,;]*)")
CK_STEP = re.compile(r"(?i)(?:global_step|\bstep)[ =_:-]?(?P<step>\d+)")
CK_FAIL = re.compile(r"(?i)fail|error|unable|could not|cannot|skip")
CK_ISO = re.compile(r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[ "
                    r"T](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?")
CK_GLOG = re.compile(r"\[[EWIF](?P<md>\d{4}) (?P<t>\d\d:\d\d:\d\d(?:\.\d{1,9})?)")
# The substrings every save line above holds: a file without them is not read line by line.
_GUARD = re.compile(rb"heckpoint|saving model to")
MAX_ROWS = 20_000  # checkpoint rows kept per file (a save a step for days is still far below)


def checkpoint_row(line: str, n: int) -> dict[str, Any] | None:
    """One checkpoint-save line (line number ``n``) -> a ``checkpoints`` row without source; None otherwise."""
    if "heckpoint" not in line and "saving model to" not in line:  # cheap guard: almost every line stops here
        return None
    if CK_FAIL.search(line):
        return None
    row = _ck_fields(line)
    if row is None:
        return None
    rm = PT_RANK.search(line)
    tm = CK_ISO.search(line)
    gm = None if tm else CK_GLOG.search(line)
    return dict(host=None, line=n, rank=int(rm["r"] or rm["R"]) if rm else None,
                time_ns=_iso_ns(tm) if tm else None, stamp=f"{gm['md']} {gm['t']}" if gm else None, **row)


def _row_or_none(line: str, n: int) -> dict[str, Any] | None:
    try:
        return checkpoint_row(line, n)
    except ValueError:  # a number past int()'s digit limit: not a save line anyone wrote
        return None


def _ck_fields(line: str) -> dict[str, Any] | None:
    """iteration / step / epoch / path / framework of a save line; None when it is not one."""
    m = CK_MEGATRON.search(line)
    if m:
        return dict(iteration=int(m["it"]), step=None, epoch=None, path=m["path"], framework="megatron")
    m = CK_DEEPSPEED.search(line)
    if m:
        sm = CK_STEP.search(m["path"] or "")
        return dict(iteration=None, step=int(sm["step"]) if sm else None, epoch=None, path=m["path"],
                    framework="deepspeed")
    m = CK_LIGHTNING.search(line)
    if m and "saving model to" in line:
        pm = CK_LIGHTNING_TO.search(line, m.end())
        return dict(iteration=None, step=int(m["step"]), epoch=int(m["ep"]), path=pm["path"] if pm else None,
                    framework="lightning")
    if "Saving latest checkpoint" in line:
        return dict(iteration=None, step=None, epoch=None, path=None, framework="lightning")
    m = CK_GENERIC.search(line)
    if m:
        pm = CK_GEN_PATH.search(line, m.end())
        sm = CK_STEP.search(line)
        return dict(iteration=None, step=int(sm["step"]) if sm else None, epoch=None,
                    path=pm["path"] if pm else None, framework="generic")
    return None


def _iso_ns(m: re.Match[str]) -> int | None:
    try:
        t = datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                     tzinfo=timezone.utc)
    except ValueError:  # an impossible date is no time, never a guess
        return None
    return int(t.timestamp()) * 1_000_000_000 + int((m["f"] or "0").ljust(9, "0"))


def score_framework_log(text: bytes) -> int:
    """Checkpoint-save lines score 1-9, below every other text kind (a job log scores 10-30): text another sniffer
    claims is read for them beside its own parser (``registry.ALSO_READ``)."""
    hits = 0
    for m in _GUARD.finditer(text):
        start, end = text.rfind(b"\n", 0, m.start()) + 1, text.find(b"\n", m.end())
        line = text[start:end if end >= 0 else len(text)].decode("utf-8", "replace")
        if _row_or_none(line, 0) is not None:
            hits += 1
            if hits >= 9:
                break
    return hits


class _Read:
    """The checkpoint rows of one file, and what stopped or limited the reading."""

    def __init__(self, source: str, rank: int | None, host: str | None) -> None:
        self.source, self.rank, self.host = source, rank, host
        self.rows: list[dict[str, Any]] = []
        self.dropped = 0
        self.long = LongLines()
        self.error: str | None = None

    def feed(self, line: str, n: int) -> None:
        row = _row_or_none(line, n)
        if row is None:
            return
        if len(self.rows) >= MAX_ROWS:
            self.dropped += 1
            return
        row["source"] = self.source
        row["rank"] = row["rank"] if row["rank"] is not None else self.rank
        row["host"] = self.host
        self.rows.append(row)

    def frame(self) -> pl.DataFrame:
        if not self.rows:
            return fr.empty("checkpoints")
        schema = fr.schema("checkpoints")
        return pl.DataFrame([{k: r.get(k) for k in schema} for r in self.rows], schema=schema, orient="row")

    def notes(self) -> list[str]:
        """What was damaged or not kept (each makes the source partial)."""
        out = [self.error] if self.error else []
        if self.dropped:
            out.append(f"{self.dropped:,} checkpoint row(s) past the first {MAX_ROWS:,} not kept")
        long_note = self.long.note(self.source)
        return out + ([long_note] if long_note else [])

    def summary(self) -> str:
        by = Counter(r["framework"] for r in self.rows)
        return f"{len(self.rows)} checkpoint save(s) (" + ", ".join(f"{k} {v}" for k, v in sorted(by.items())) + ")"


def _read(path: Path, ctx: ParseContext, rank: int | None = None, host: str | None = None) -> _Read:
    got = _Read(ctx.rel_path, rank, host)
    try:
        with open_bounded(path, ctx.max_decompressed_bytes) as fh:
            for n, raw in read_lines(fh, got.long):
                got.feed(raw.decode("utf-8", "replace").rstrip("\r\n"), n)
    except (OSError, EOFError, zlib.error, DecompressionLimitExceeded) as exc:
        got.error = f"{ctx.rel_path}: read stopped after line {got.long.lines}: {exc}"
    return got


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    """A ``framework_log`` file: text whose checkpoint saves are all forensics reads of it."""
    got = _read(path, ctx)
    if not got.rows:
        why = got.error or "no checkpoint-save line"
        return ParseResult(status="failed" if got.error else "ignored", message=why)
    notes = got.notes()
    message = got.summary() + ("; " + "; ".join(notes) if notes else "")
    ranks = {r["rank"] for r in got.rows}
    return ParseResult(frames={"checkpoints": got.frame()}, status="partial" if notes else "ok", message=message,
                       rank=next(iter(ranks)) if len(ranks) == 1 else None)


def scan(path: Path, ctx: ParseContext, rank: int | None = None, host: str | None = None) -> tuple[
        dict[str, pl.DataFrame], str | None, bool]:
    """A file of another kind (an NCCL log, a job log) read for checkpoint saves too: (frames, a note for its
    message, damaged?). The frame is there (maybe empty) for every file read; a row without a rank tag on its
    line takes the file's ``rank``, every row the file's ``host``. Damage the file's own parser reports (a read
    stopped, long lines) is not reported twice."""
    if not contains(path, _GUARD, ctx.max_decompressed_bytes, 32):
        return {"checkpoints": fr.empty("checkpoints")}, None, False
    got = _read(path, ctx, rank, host)
    note = f"also read for checkpoint saves: {got.summary()}" if got.rows else None
    if got.dropped:
        note = f"{note}; {got.dropped:,} checkpoint row(s) past the first {MAX_ROWS:,} not kept"
    return {"checkpoints": got.frame()}, note, bool(got.dropped)
