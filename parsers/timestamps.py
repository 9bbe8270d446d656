"""Every clock and stamp rule the parsers share: calendar stamps as Unix ns (UTC unless the stamp names a zone),
ISO 8601, ctime (any locale), and year-less glog stamps placed with the job's year.

Times are integer ns since the Unix epoch; a stamp that names an impossible date is None, never a guess.
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime, timezone

import polars as pl

MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
DOW = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_CTIME_PARTS = re.compile(
    rf"(?:(?P<dow>{DOW}) )?(?P<mon>{MON}) +(?P<day>\d{{1,2}}) (?P<hms>\d{{1,2}}:\d{{2}}:\d{{2}}) (?P<year>\d{{4}})$"
)
_CTIME_LOCALE = re.compile(r"(?P<mon>\d{1,2})\D+?(?P<day>\d{1,2})\D+?(?P<hms>\d{1,2}:\d{2}:\d{2}) (?P<year>\d{4})$")
# glog prefix of PyTorch lines: `[E0314 09:10:00.205065660 ProcessGroupNCCL.cpp:632]` (month, day, time; no year)
_GLOG = re.compile(r"\[[EWIF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
# wall-clock times a log line can carry in front: a launcher's ISO prefix (`2019-06-02T16:13:44.884Z: `) and
# NCCL_DEBUG_TIMESTAMP_FORMAT's default `[2026-01-01 12:08:32] ` in front of the NCCL envelope (2.26+)
LINE_STAMP = re.compile(r"^\s*(?:(?P<d>\d{4}-\d\d-\d\d)T(?P<t>\d\d:\d\d:\d\d(?:\.\d{1,9})?)(?P<z>Z|[+-]\d\d:?\d\d)?:?"
                        r"|\[(?P<d2>\d{4}-\d\d-\d\d) (?P<t2>\d\d:\d\d:\d\d(?:\.\d{1,9})?)\])\s")


def epoch_ns(y: int, mo: int, d: int, hms: str, frac: str | None = None, offset_s: int = 0) -> int | None:
    """A calendar date and ``HH:MM:SS`` (fraction ``.123`` or ``,123`` optional; ``offset_s``: the stamp's
    zone east of UTC) as Unix ns; None for an impossible date."""
    try:
        h, mi, s = (int(x) for x in hms.split(":"))
        t = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) - offset_s
    except (ValueError, OverflowError):
        return None
    ns = t * 1_000_000_000
    if frac:
        digits = frac.lstrip(".,")[:9]
        ns += int(digits.ljust(9, "0")) if digits else 0
    return ns


def iso_ns(text: str) -> int | None:
    """``YYYY-MM-DDTHH:MM:SS[.frac][Z|+hh:mm]`` as Unix ns (no zone: UTC); None when it is not one."""
    m = re.match(
        r"(\d{4})-(\d{2})-(\d{2})T(\d{2}:\d{2}:\d{2})([.,]\d+)?(Z|[+-]\d{2}:?\d{2})?$", text.strip()
    )
    if not m:
        return None
    off = 0
    if m.group(6) and m.group(6) != "Z":
        z = m.group(6).replace(":", "")
        off = (1 if z[0] == "+" else -1) * (int(z[1:3]) * 3600 + int(z[3:5]) * 60)
    return epoch_ns(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5), off)


def ctime_ns(text: str) -> int | None:
    """A ctime stamp (``Thu Mar 20 21:01:25 2025``, also with localised month names) as Unix ns (read as UTC)."""
    t = " ".join(text.split())
    m = _CTIME_PARTS.search(t)
    if m:
        return epoch_ns(int(m.group("year")), MONTHS[m.group("mon")], int(m.group("day")), m.group("hms"))
    m = _CTIME_LOCALE.search(t)  # localised month names: "四 3月 20 21:01:25 2025"
    if m:
        return epoch_ns(int(m.group("year")), int(m.group("mon")), int(m.group("day")), m.group("hms"))
    return None


def earliest_glog_ns(messages: list[str], year: int | None) -> int | None:
    """Earliest glog stamp of ``messages`` as Unix ns (read as UTC), when the job's year is known (glog omits it)."""
    if year is None:
        return None
    times = []
    for msg in messages:
        m = _GLOG.search(msg)
        if m:
            mo, d, hh, mi, ss, frac = m.groups()
            try:
                t = datetime(year, int(mo), int(d), int(hh), int(mi), int(ss), tzinfo=timezone.utc)
            except ValueError:
                continue
            times.append(int(t.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0")))
    return min(times) if times else None


def glog_stamp(line: str) -> str | None:
    """The year-less glog stamp of ``line`` as written, ``MMDD HH:MM:SS[.frac]`` (``[E0314 09:10:00.205 ...``);
    None when the line has none. :func:`glog_ns` places it once the job's year is known."""
    m = _GLOG.search(line)
    if m is None:
        return None
    mo, d, hh, mi, ss, frac = m.groups()
    return f"{mo}{d} {hh}:{mi}:{ss}" + (f".{frac}" if frac else "")


def glog_ns(stamp: str | None, year: int | None) -> int | None:
    """A :func:`glog_stamp` (``MMDD HH:MM:SS[.frac]``) placed in ``year``, as Unix ns read as UTC; None without a
    year or for an impossible date."""
    return None if stamp is None else earliest_glog_ns([f"[I{stamp}"], year)


def glog_ns_expr(stamp: pl.Expr, year: int) -> pl.Expr:
    """:func:`glog_ns` as a Polars expression over a column of :func:`glog_stamp` texts (null where none or where
    the date is impossible in ``year``)."""
    return (pl.lit(str(year)) + stamp).str.strptime(pl.Datetime("ns", "UTC"), "%Y%m%d %H:%M:%S%.f",
                                                    strict=False).dt.epoch("ns")


def iso_utc_ns(day: str, clock: str, zone: str | None) -> int | None:
    """Epoch ns of `YYYY-mm-dd` `HH:MM:SS[.f]` [`Z`/`+hh:mm`]; a time without a zone is read as UTC (the logs
    of one job share a zone, so order and gaps hold)."""
    z = "+00:00" if zone in (None, "Z") else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
    whole, _, frac = clock.partition(".")
    try:
        t = datetime.fromisoformat(f"{day}T{whole}{z}")
    except ValueError:
        return None
    return int(t.timestamp()) * 1_000_000_000 + int((frac + "000000000")[:9])


def line_stamp_ns(line: str) -> int | None:
    """Epoch ns of a launcher's ISO timestamp or NCCL's `[date time]` at the start of ``line``
    (:data:`LINE_STAMP`), else None."""
    m = LINE_STAMP.match(line)
    if m is None:
        return None
    return iso_utc_ns(m["d"], m["t"], m["z"]) if m["d"] else iso_utc_ns(m["d2"], m["t2"], None)
