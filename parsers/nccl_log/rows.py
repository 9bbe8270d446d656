"""The rows one NCCL log file gives, collected per frame (turned into frames once), and what the file's lines told
about the NCCL release that wrote it."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from forensics.parsers.timestamps import glog_stamp, line_stamp_ns


class Acc:
    """Row accumulators for one file (plain lists of dicts, turned into frames once)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.counts: Counter[str] = Counter()
        self.unknown_sample: str | None = None
        self.version: str | None = None
        self.tuning_table = -1
        self.tuning_last = -10
        self.tuning_cols: list[tuple[str, str]] = []
        self.tuning_algos: list[str] = []
        self.tuning_nthreads: list[int] = []
        self.ras = False
        self.ras_error: str | None = None
        self.perf: str | None = None
        self.lo: tuple[int, ...] = (0,)
        self.hi: tuple[int, ...] = (99,)
        self.tails: list[dict[str, Any]] = []
        self.tail_lines = 0
        self.nt_seen = False
        self.launcher: dict[tuple[str, int | None, int | None], int] = {}
        self.current = ""  # the line being read

    def add(self, frame: str, **row: Any) -> None:
        row["source"] = self.source
        if frame == "nccl_events":  # every event carries its own line's stamp (a grammar may have read one already)
            if row.get("time_ns") is None:
                row["time_ns"] = line_stamp_ns(self.current)
            if row["time_ns"] is None:
                row["stamp"] = glog_stamp(self.current[:96])
        self.rows[frame].append(row)


VERSION_HINTS = {
    "tuning_op": lambda g: ("2.24", None) if g["lo"] is not None else (("2.23", "2.23") if g["func"] and g["time"]
                                                                       else ("2.20", "2.22") if g["time"] else (None,
                                                                                                                None)),
    "init_timings": lambda g: ("2.23", None) if g["func"] else ("2.22", "2.22"),
    "channels_summary": lambda g: ("2.20", None) if g["collnet"] is not None
    else (("2.17", "2.19") if g["nvls"] is not None else ("2.7", "2.16")),
    "check_p2p": lambda g: ("2.24", "2.26") if g["p2p"] is not None else ("2.27", None),
    "connected": lambda g: ("2.24", None) if g["gdr"] is not None else (None, None),
    "bootstrap": lambda g: (None, None),
    "comm_layout": lambda g: ("2.20", None),
    "tuning_hdr_old": lambda g: ("2.5", "2.17"),
    "tuning_hdr_new": lambda g: ("2.18", None),
}


def note_version(acc: Acc, lo: str | None = None, hi: str | None = None) -> None:
    """Narrow the version range the line formats allow (research/nccl.md §A.5)."""
    if lo:
        acc.lo = max(acc.lo, tuple(int(x) for x in lo.split(".")))
    if hi:
        acc.hi = min(acc.hi, tuple(int(x) for x in hi.split(".")))


def to_int(v: str | None) -> int | None:
    return int(v) if v not in (None, "") else None


def to_float(v: str | None) -> float | None:
    if v in (None, "", "N/A"):
        return None
    return float(v)
