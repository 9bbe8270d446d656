"""Every clock and stamp rule the parsers share: calendar stamps as Unix ns (UTC unless the stamp names a zone),
ISO 8601, ctime (any locale), and year-less glog stamps placed with the job's year.

Times are integer ns since the Unix epoch; a stamp that names an impossible date is None, never a guess.
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime, timezone

MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
DOW = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_CTIME_PARTS = re.compile(
    rf"(?:(?P<dow>{DOW}) )?(?P<mon>{MON}) +(?P<day>\d{{1,2}}) (?P<hms>\d{{1,2}}:\d{{2}}:\d{{2}}) (?P<year>\d{{4}})$"
)
_CTIME_LOCALE = re.compile(r"(?P<mon>\d{1,2})\D+?(?P<day>\d{1,2})\D+?(?P<hms>\d{1,2}:\d{2}:\d{2}) (?P<year>\d{4})$")
# glog prefix of PyTorch lines: `[E0314 09:10:00.205065660 ProcessGroupNCCL.cpp:632]` (month, day, time; no year)
_GLOG = re.compile(r"\[[EWIF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")


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
