"""Kernel logs parsed as a batch: lines collected per file into column lists, one frame for all files, then boots
assigned and monotonic stamps placed on the wall clock."""

from __future__ import annotations

import datetime as dt
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from forensics.parsers.bounded_read import LongLines, open_bounded, read_capped
from forensics.parsers.kernel_log.messages import classify, column_values
from forensics.parsers.kernel_log.prefixes import (
    CONTINUATION,
    FILE_HEADER,
    KMSG_DICT,
    STAMP_START,
    WALL_HEADER,
    Rec,
    peel,
)
from forensics.parsers.result import ParseContext, ParseResult
from forensics.parsers.timestamps import MONTHS, epoch_ns

from forensics.base import frames as fr


class KernelLogBatch:
    """Several kernel logs parsed as one: each file's lines are collected on their own (``add``), one
    frame is built for all of them, boots and bus ids worked out per file (``finish``), so many
    small logs (one a node) pay Polars' fixed costs once."""

    def __init__(self) -> None:
        self.files: list[_File] = []

    def add(self, path: Path, ctx: ParseContext) -> ParseResult | None:
        """Read one log: a failed result when it cannot be read, else None (its result comes from ``finish``)."""
        long = LongLines()
        try:
            with open_bounded(path, ctx.max_decompressed_bytes) as fh:
                raw = read_capped(fh, long)
        except (OSError, EOFError, zlib.error) as exc:
            return ParseResult.failed(f"{ctx.rel_path}: unreadable: {exc}")
        except Exception as exc:  # DecompressionLimitExceeded and friends
            return ParseResult.failed(f"{ctx.rel_path}: {exc}")
        text = raw.decode("utf-8", errors="replace")
        bad_bytes = text.count("\ufffd")
        try:
            mtime_ns: int | None = path.stat().st_mtime_ns
        except OSError:
            mtime_ns = None
        self.add_text(text, ctx.rel_path, mtime_ns, bad_bytes, long.note(ctx.rel_path))
        return None

    def add_text(self, text: str, source: str, mtime_ns: int | None = None, bad_bytes: int = 0,
                 long_note: str | None = None) -> None:
        """One log's text (see ``parse_text``); ``long_note`` says which over-long lines were skipped."""
        c = _Collector()
        for lineno, line in enumerate(text.splitlines(), start=1):
            c.feed(lineno, line)
        c.flush()
        c.resolve_year_less(mtime_ns)
        self.files.append(_File(source, c.cols, bad_bytes, long_note))

    def __len__(self) -> int:
        return len(self.files)

    def finish(self) -> tuple[list[ParseResult], dict[str, pl.DataFrame]]:
        """The result of every file ``add`` took (in order) and the frame of them all."""
        return [_file_result(f) for f in self.files], {"kernel_events": _frame(self.files)}


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    """One kernel log (a batch of one)."""
    batch = KernelLogBatch()
    early = batch.add(path, ctx)
    return early if early is not None else _only(batch)


def parse_text(text: str, source: str, mtime_ns: int | None = None, bad_bytes: int = 0) -> ParseResult:
    """Parse kernel-log text; ``mtime_ns`` (the file's mtime) supplies the year of year-less stamps
    when the text has no absolute stamp of its own."""
    batch = KernelLogBatch()
    batch.add_text(text, source, mtime_ns, bad_bytes)
    return _only(batch)


def _only(batch: KernelLogBatch) -> ParseResult:
    results, frames = batch.finish()
    results[0].frames = frames
    return results[0]


@dataclass
class _File:
    """One log's collected records, column by column."""

    source: str
    cols: dict[str, list[Any]]
    bad_bytes: int
    long_note: str | None  # over-long lines skipped (LongLines.note)


_COLUMNS = ("host", "line", "time_text", "time_format", "mono_ns", "wall_ns", "wall_source", "facility",
            "level", "kind", "pci_bus_id", "xid", "pid", "process", "message", "fields", "segment")


class _Collector:
    """The records of one kernel-log text, column by column, built line by line."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
        self.year_less: list[tuple[int, tuple[int, int, str, str | None], int]] = []  # (row, stamp, extra delta ns)
        self.state: dict[str, Any] = {}
        self.cur: Rec | None = None
        self.file_host: str | None = None
        self.segment = 0  # `==> file <==` headers (tail/head over several files) start a new segment
        self.years: list[int] = []

    def flush(self) -> None:
        cur = self.cur
        if cur is None:
            return
        kind, f = classify(cur.message)
        if kind == "unknown" and cur.facility == "fabricmanager" and cur.level in ("error", "warning", "fatal"):
            kind, f = "fabric_manager", {"what": "error"}
        if kind == "unknown" and cur.facility and cur.facility != "kernel" and cur.facility != "fabricmanager":
            kind, f = "benign", {"what": "not_kernel"}  # systemd[1] & co. interleaved in a journal
        bdf, xid, pid, proc = column_values(kind, f)
        cols = self.cols
        if cur.year_less is not None:
            self.year_less.append((len(cols["line"]), cur.year_less, cur.delta_ns))
        if cur.wall_ns is not None and cur.wall_source == "stamp":
            self.years.append(dt.datetime.fromtimestamp(cur.wall_ns / 1e9, dt.timezone.utc).year)
        for k, v in (("host", cur.host or self.file_host), ("line", cur.line), ("time_text", cur.time_text),
                     ("time_format", cur.time_format), ("mono_ns", cur.mono_ns), ("wall_ns", cur.wall_ns),
                     ("wall_source", cur.wall_source), ("facility", cur.facility), ("level", cur.level),
                     ("kind", kind), ("pci_bus_id", bdf), ("xid", xid), ("pid", pid), ("process", proc),
                     ("message", cur.message), ("fields", orjson.dumps(f).decode() if f else "{}"),
                     ("segment", self.segment)):
            cols[k].append(v)
        self.cur = None

    def feed(self, lineno: int, line: str) -> None:
        cur = self.cur
        if not line.strip():
            return
        if cur is not None and (KMSG_DICT.match(line) and cur.time_format == "kmsg"):
            return  # /dev/kmsg dictionary (" SUBSYSTEM=pci") belongs to the record; not message text
        if cur is not None and CONTINUATION.match(line) and not STAMP_START.match(line):
            piece = line.strip()
            piece = piece[6:] if piece.startswith("NVRM: ") and cur.message.lstrip().startswith("NVRM:") else piece
            cur.message = f"{cur.message.rstrip()} {piece}"
            return
        if FILE_HEADER.match(line):
            self.flush()
            self.segment += 1
            self.file_host = None
            self.state.clear()
            return
        m = WALL_HEADER.match(line)
        if m:
            self.flush()
            ts = f"{m.group('mon')} {m.group('day')} {m.group('hms')}"
            self.state["wall_header"] = (m.group("host"),
                                         (ts, (MONTHS[m.group("mon")], int(m.group("day")), m.group("hms"), None)))
            return
        self.flush()
        cur = self.cur = Rec()
        cur.line = lineno
        cur.message = peel(line, cur, self.state)
        if cur.facility is None and cur.time_format in ("monotonic", "ctime", "human", "kmsg", "iso", "none"):
            cur.facility = "kernel" if cur.time_format != "none" or cur.message.startswith("NVRM") else None

    def resolve_year_less(self, mtime_ns: int | None) -> None:
        """Year-less stamps: the year of the file's own absolute stamps, else the file's mtime year;
        a date after the reference moment (Dec -> Jan rollover) belongs to the previous year."""
        years = self.years
        mtime_year = dt.datetime.fromtimestamp(mtime_ns / 1e9, dt.timezone.utc).year if mtime_ns else None
        ref_year = max(years) if years else mtime_year
        if ref_year is None:
            return
        for row, (mo, d, hms, frac), delta in self.year_less:
            ns = epoch_ns(ref_year, mo, d, hms, frac)
            # a log is written before its file's mtime: a later date means last year (Dec -> Jan)
            if ns is not None and not years and mtime_ns is not None and ns > mtime_ns + 86_400 * 10**9:
                ns = epoch_ns(ref_year - 1, mo, d, hms, frac)
            if ns is not None and self.cols["wall_ns"][row] is None:
                self.cols["wall_ns"][row] = ns + delta
                self.cols["wall_source"][row] = "stamp_year_from_file"


def _frame(files: list[_File]) -> pl.DataFrame:
    """The kernel_events rows of every file, in file then line order; ``_f`` (the file's index) keys
    every window, so each file is worked out as if parsed alone."""
    cols: dict[str, list[Any]] = {k: [] for k in (*_COLUMNS, "_f", "source")}
    for i, f in enumerate(files):
        n = len(f.cols["line"])
        for k in _COLUMNS:
            cols[k].extend(f.cols[k])
        cols["_f"].extend([i] * n)
        cols["source"].extend([f.source] * n)
    if not cols["line"]:
        return fr.empty("kernel_events")
    df = pl.DataFrame(cols, schema_overrides={
        "mono_ns": pl.Int64, "wall_ns": pl.Int64, "xid": pl.Int32, "pid": pl.Int64, "line": pl.Int64, "_f": pl.Int64,
    }, strict=False)
    df = _assign_boots_and_place(_carry_gpu_bus_ids(df)).drop("segment", "_f")
    return fr.conform("kernel_events", df)


def _file_result(f: _File) -> ParseResult:
    """Status, message and host of one file (counted from its collected columns: no queries); ties
    by name, so the message is the same bytes on every run."""
    cols, n = f.cols, len(f.cols["line"])
    if n == 0:
        result = ParseResult(status="ok", message="no kernel-log records")
    else:
        counts = Counter(cols["kind"])
        summary = ", ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        hosts = list({h for h in cols["host"] if h is not None})
        msg = f"{n} records ({summary}); {counts['unknown']} unknown"
        status = "ok"
        if f.bad_bytes:
            status = "partial"
            msg += f"; {f.bad_bytes} undecodable byte(s) replaced"
        result = ParseResult(status=status, message=msg, host=hosts[0] if len(hosts) == 1 else None)
    if f.long_note:
        result.status = "partial"
        result.message = f"{result.message}; {f.long_note}"
    return result


def _carry_gpu_bus_ids(df: pl.DataFrame) -> pl.DataFrame:
    """A driver message printed as several stamped records ("The NVIDIA GPU <bdf>", "(PCI ID: ...) installed
    in this system has", "fallen off the bus ...") names its GPU only in the first: a fallen-off-the-bus or
    init-failure record without a bus id takes the one named at most 3 lines before it (same host, file)."""
    if df.height == 0:
        return df
    key = [pl.col("_f"), pl.col("host").fill_null(""), pl.col("segment")]
    named = (pl.col("kind") == "nvrm_other") & pl.col("pci_bus_id").is_not_null()
    bus = pl.when(named).then(pl.col("pci_bus_id")).forward_fill().over(*key, order_by="line")
    at = pl.when(named).then(pl.col("line")).forward_fill().over(*key, order_by="line")
    fill = (pl.col("kind").is_in(["fallen_off_bus", "gpu_init_failed"]) & pl.col("pci_bus_id").is_null()
            & ((pl.col("line") - at) <= 3)).fill_null(False)
    return df.with_columns(pl.when(fill).then(bus).otherwise(pl.col("pci_bus_id")).alias("pci_bus_id"))


def _assign_boots_and_place(df: pl.DataFrame) -> pl.DataFrame:
    """Number boots per host and derive wall time for monotonic-only records where a boot time is known."""
    if df.height == 0:
        return df.with_columns(pl.lit(None, pl.Int32).alias("boot"))
    hkey = [pl.col("_f"), pl.col("host").fill_null(""), pl.col("segment")]
    mono = pl.col("mono_ns")
    prev = mono.forward_fill().shift(1).over(*hkey, order_by="line")
    new_boot = (
        (pl.col("kind") == "boot")
        | (mono.is_not_null() & prev.is_not_null() & ((prev - mono) > 10_000_000_000))
    ).fill_null(False)
    df = df.with_columns(new_boot.cast(pl.Int32).cum_sum().over(*hkey, order_by="line").alias("boot"))
    # boot time = wall - mono on lines carrying both (syslog with an embedded dmesg stamp, dmesg -T
    # is itself boot+mono). Median per (file, host, boot); only whole-second precision is claimed.
    both = (pl.col("wall_ns") - mono)
    boot_ns = both.median().over(*hkey, "boot")
    return df.with_columns(
        pl.when(pl.col("wall_ns").is_null() & mono.is_not_null() & boot_ns.is_not_null())
        .then(boot_ns.cast(pl.Int64) + mono)
        .otherwise(pl.col("wall_ns")).alias("wall_ns"),
        pl.when(pl.col("wall_ns").is_null() & mono.is_not_null() & boot_ns.is_not_null())
        .then(pl.lit("boot_time")).otherwise(pl.col("wall_source")).alias("wall_source"),
    )
