"""Line preparation for the job's own words: prefixes peeled, the rank they name kept, and times.

A line of a rank's output may carry, in this order, a wrapper timestamp (`2024-11-20 14:37:16 `),
the rank prefix of PyTorch's excepthook (`[rank3]: `) or torchrun's `--tee` prefix (`[default3]:`),
and then the program's own text. Times are read as UTC (a log line says no zone; the same rule as
the checkpoint lines): dated stamps give ``time_ns``; year-less glog stamps (`E0504 22:44:08.38`)
are kept as text for the detector to place with the job's year.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

# Lines longer than this are matched on their first MATCH_CHARS characters only (a 100 MB line of
# progress bars must not cost a regex pass per pattern).
MATCH_CHARS = 4096

_WRAP_TIME = re.compile(
    r"^(?P<d>\d{4}-\d{2}-\d{2})[ T_](?P<t>\d{2}:\d{2}:\d{2})(?:[.,](?P<f>\d{1,9}))?(?:Z|[+-]\d{2}:?\d{2})?\s+")
_DATED = re.compile(r"(?P<d>\d{4}-\d{2}-\d{2})[ T_](?P<t>\d{2}:\d{2}:\d{2})(?:[.,](?P<f>\d{1,9}))?")
# PyTorch's c10 logging prints the month without its leading zero (`E504 22:44:08.38` is May 4)
_GLOG = re.compile(r"(?:^|\[|\]:\[?)[IWEF](?P<md>\d{3,4}) (?P<s>\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?)\s")
_RANK_PREFIX = re.compile(r"^\[rank(?P<r>\d+)\]:\s?")
_ROLE_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z][\w-]*?)(?P<l>\d+)\]:\s?")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Line:
    """One line: its number, the text after the prefixes, and what the prefixes said."""

    n: int
    text: str
    rank: int | None
    local_rank: int | None
    time_ns: int | None
    stamp: str | None

    @property
    def stream(self) -> str:
        """Which process wrote it, as far as the prefixes say (lines of one stream belong together)."""
        if self.rank is not None:
            return f"r{self.rank}"
        return "" if self.local_rank is None else f"l{self.local_rank}"


def dated_ns(day: str, clock: str, frac: str | None) -> int | None:
    """`YYYY-MM-DD`, `HH:MM:SS`, fraction -> Unix ns read as UTC; None when not a real date."""
    try:
        dt = datetime.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    ns = int(dt.timestamp()) * 1_000_000_000
    return ns + (int(frac.ljust(9, "0")[:9]) if frac else 0)


def prepare(n: int, raw: str) -> Line:
    """Peel a wrapper stamp and a rank or role prefix off ``raw`` (without its line end)."""
    text = raw[:MATCH_CHARS]
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    time_ns = None
    m = _WRAP_TIME.match(text)
    if m:
        time_ns = dated_ns(m["d"], m["t"], m["f"])
        text = text[m.end():]
    rank = local = None
    m = _RANK_PREFIX.match(text) or _ROLE_PREFIX.match(text)
    if m:
        if "r" in m.groupdict():
            rank = int(m["r"])
        else:
            local = int(m["l"])
        text = text[m.end():]
    stamp = None
    if time_ns is None:
        d = _DATED.search(text, 0, 48)
        if d:
            time_ns = dated_ns(d["d"], d["t"], d["f"])
        else:
            g = _GLOG.search(text, 0, 40)
            stamp = f"{g['md'].zfill(4)} {g['s']}" if g else None
    return Line(n, text, rank, local, time_ns, stamp)


_SIZE = re.compile(r"(?P<v>\d+(?:\.\d+)?)\s*(?P<u>bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def size_bytes(text: str | None) -> int | None:
    """`388.00 MiB` -> bytes (PyTorch's format_size uses binary units whatever it prints)."""
    if not text:
        return None
    m = _SIZE.search(text)
    return int(float(m["v"]) * _UNITS[m["u"]]) if m else None


def stamp_only(raw: str) -> tuple[int | None, str | None]:
    """The time a line carries (as :func:`prepare` reads it), without peeling it: for lines read only for
    their time."""
    head = raw[:96]
    d = _DATED.search(head)
    if d:
        return dated_ns(d["d"], d["t"], d["f"]), None
    g = _GLOG.search(head)
    return (None, f"{g['md'].zfill(4)} {g['s']}") if g else (None, None)
