"""Kernel-log line prefixes as data: wrapper and timestamp patterns, each with the peeler that strips it and fills
the record, tried in order and chosen by the line's first character."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from forensics.parsers.timestamps import DOW, MON, MONTHS, ctime_ns, epoch_ns, iso_ns

# ---------------------------------------------------------------------------------------------
# Prefixes, peeled repeatedly in this order.
# ---------------------------------------------------------------------------------------------
FILE_HEADER = re.compile(r"^==> (?P<file>.+) <==\s*$")
WALL_HEADER = re.compile(
    rf"^Message from syslogd@(?P<host>\S+) at (?:{DOW} )?(?P<mon>{MON}) +(?P<day>\d{{1,2}}) "
    r"(?P<hms>\d{2}:\d{2}:\d{2})(?: (?P<year>\d{4}))? \.\.\.\s*$"
)
_P_GREP = re.compile(rf"^(?P<srcfile>/[\w./-]+):(?={MON} |\d{{4}}-\d{{2}}-\d{{2}}T|\[|<\d)")
_P_ALERT = re.compile(r"^Xid errors on instance: (?P<host>[^,]+), Error: ")
_P_TALOS = re.compile(
    r"^(?P<host>[\w.:-]+?): (?P<facility>kern|user|daemon): +(?P<level>\w+): \[(?P<iso>[^\]]+)\]: "
)
_P_PDSH = re.compile(
    rf"^(?!kernel: |NVRM: |mce: |Message )(?P<host>[A-Za-z0-9][\w.-]*): "
    rf"(?=\[|{MON} |\d{{4}}-\d{{2}}-\d{{2}}T|kernel:|NVRM:|<\d>|\d+,\d+,\d+,)"
)
_P_KMSG = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),(?P<flags>[^;]*);")
_P_PRIO = re.compile(r"^<(?P<prio>\d{1,3})>")
_P_DECODE = re.compile(
    r"^(?P<facility>kern|user|mail|daemon|auth|syslog|lpr|news)\s*:"
    r"(?P<level>emerg|alert|crit|err|warn|notice|info|debug)\s*: "
)
_P_ISO = re.compile(
    r"^(?P<iso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?) "
    r"(?:(?P<host>[^\s:\[]+) (?=kernel:|[\w.@/-]+\[\d+\]:))?(?:(?P<ident>kernel|[\w.@/-]+\[\d+\]): )?"
)
_P_SHORT_FULL = re.compile(
    rf"^{DOW} (?P<date>\d{{4}}-\d{{2}}-\d{{2}}) (?P<hms>\d{{2}}:\d{{2}}:\d{{2}}(?:\.\d+)?) "
    r"(?P<tz>[A-Z]{2,5}|[+-]\d{2}:?\d{2}) (?:(?P<host>[^\s:]+) )?(?P<ident>kernel|[\w.@/-]+\[\d+\]): "
)
_P_SYSLOG = re.compile(
    rf"^(?P<mon>{MON}) +(?P<day>\d{{1,2}}) (?P<hms>\d{{2}}:\d{{2}}:\d{{2}})(?P<frac>\.\d+)? "
    r"(?:(?P<host>[^\s:]+) )?(?P<ident>kernel|[\w.@/-]+\[\d+\]|[\w.@/-]+):\s?"
)
_P_WALL_KERNEL = re.compile(r"^\s*kernel:\s*(?=\[)")
_P_BARE_KERNEL = re.compile(r"^kernel: ")
_P_FM = re.compile(
    rf"^\[(?P<fmts>{MON} \d{{2}} \d{{4}} \d{{2}}:\d{{2}}:\d{{2}})\] \[(?P<level>[A-Z]+)\] \[tid (?P<tid>\d+)\] "
)
_P_CTIME = re.compile(r"^\[(?P<ctime>[^\]\d+][^\]]*?\d{1,2}:\d{2}:\d{2} \d{4})\] ?")
_P_HUMAN_ABS = re.compile(rf"^\[(?P<mon>{MON}) ?(?P<day>\d{{1,2}}) (?P<hm>\d{{2}}:\d{{2}})(?::(?P<s>\d{{2}}))?\] ?")
_P_HUMAN_REL = re.compile(r"^\[\s*\+\s*(?P<delta>\d+\.\d+)\] ?")
_P_MONO = re.compile(r"^\[\s*(?P<mono>\d+\.\d+)\](?:\[\s*(?P<caller>[TC]\d+)\])? ?")
_P_AFTER_MONO_HOST = re.compile(r"^(?P<host>[A-Za-z0-9][\w.-]*) (?P<ident>kernel|[\w.@/-]+\[\d+\]): ")
CONTINUATION = re.compile(r"^(?:\s{2,}|\t)(?=\S)")
KMSG_DICT = re.compile(r"^ [A-Z_]+=")
STAMP_START = re.compile(r"^\s*(?:\[\s*[\d+]|\d{4}-\d{2}-\d{2}T|" + MON + r" )")


class Rec:
    """The record being assembled; flushed into column lists."""

    __slots__ = ("line", "host", "time_text", "time_format", "mono_ns", "wall_ns", "wall_source",
                 "facility", "level", "message", "year_less", "delta_ns")

    def __init__(self) -> None:
        self.line = 0
        self.host: str | None = None
        self.time_text: str | None = None
        self.time_format = "none"
        self.mono_ns: int | None = None
        self.wall_ns: int | None = None
        self.wall_source: str | None = None
        self.facility: str | None = None
        self.level: str | None = None
        self.message = ""
        # (month, day, hms, frac) of a year-less stamp, resolved once the year is known
        self.year_less: tuple[int, int, str, str | None] | None = None
        self.delta_ns = 0  # dmesg -H: cumulative delta since the last absolute line


_LEVELS = ["emerg", "alert", "crit", "err", "warn", "notice", "info", "debug"]
_FACILITIES = ["kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news"]


# Each peeler matches one wrapper or timestamp prefix at the start of the text, fills the record and returns
# how many characters it consumed (None: not this prefix). Order matters: peel tries them in this order.
_Peeler = Callable[[str, "Rec", dict[str, Any]], "int | None"]


def _peel_grep(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_GREP.match(rest)
    return m.end() if m else None


def _peel_alert(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_ALERT.match(rest)
    if not m:
        return None
    rec.host = m.group("host").strip()
    return m.end()


def _peel_talos(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_TALOS.match(rest)
    if not m:
        return None
    rec.host = m.group("host")
    rec.facility = "kernel" if m.group("facility") == "kern" else m.group("facility")
    rec.level = m.group("level")
    rec.time_text, rec.time_format = m.group("iso"), "talos"
    rec.wall_ns, rec.wall_source = iso_ns(m.group("iso")), "stamp"
    return m.end()


def _peel_pdsh(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_PDSH.match(rest)
    if not m:
        return None
    rec.host = m.group("host")
    return m.end()


def _peel_kmsg(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_KMSG.match(rest)
    if not m:
        return None
    prio = int(m.group("prio"))
    rec.level = _LEVELS[prio & 7]
    fac = prio >> 3
    rec.facility = "kernel" if fac == 0 else (_FACILITIES[fac] if fac < len(_FACILITIES) else str(fac))
    rec.time_text, rec.time_format = m.group("usec"), "kmsg"
    rec.mono_ns = int(m.group("usec")) * 1000
    return m.end()


def _peel_prio(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_PRIO.match(rest)
    if not m:
        return None
    rec.level = _LEVELS[int(m.group("prio")) & 7]
    return m.end()


def _peel_decode(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_DECODE.match(rest)
    if not m:
        return None
    rec.facility = "kernel" if m.group("facility") == "kern" else m.group("facility")
    rec.level = m.group("level")
    return m.end()


def _peel_iso(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_ISO.match(rest)
    if not m:
        return None
    rec.time_text, rec.time_format = m.group("iso"), "iso"
    rec.wall_ns, rec.wall_source = iso_ns(m.group("iso")), "stamp"
    if m.group("host"):
        rec.host = m.group("host")
    if m.group("ident"):
        rec.facility = m.group("ident")
    return m.end()


def _peel_short_full(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_SHORT_FULL.match(rest)
    if not m:
        return None
    rec.time_text, rec.time_format = " ".join(m.group(0).split()[:4]), "syslog"
    off = 0
    tz = m.group("tz")
    if tz[0] in "+-":
        z = tz.replace(":", "")
        off = (1 if z[0] == "+" else -1) * (int(z[1:3]) * 3600 + int(z[3:5]) * 60)
    y, mo, d = (int(x) for x in m.group("date").split("-"))
    hms, _, frac = m.group("hms").partition(".")
    rec.wall_ns, rec.wall_source = epoch_ns(y, mo, d, hms, frac or None, off), "stamp"
    if m.group("host"):
        rec.host = m.group("host")
    rec.facility = m.group("ident")
    return m.end()


def _peel_syslog(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_SYSLOG.match(rest)
    if not m:
        return None
    rec.time_text = f"{m.group('mon')} {m.group('day')} {m.group('hms')}{m.group('frac') or ''}"
    rec.time_format = "syslog"
    rec.year_less = (MONTHS[m.group("mon")], int(m.group("day")), m.group("hms"), m.group("frac"))
    if m.group("host"):
        rec.host = m.group("host")
    rec.facility = m.group("ident")
    return m.end()


def _peel_wall_kernel(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    """`kernel:` after a `wall` header line: the header gave host and time."""
    m = _P_WALL_KERNEL.match(rest)
    if not (m and state.get("wall_header")):
        return None
    host, stamp = state.pop("wall_header")
    rec.host = host
    rec.time_text, rec.time_format, rec.year_less = stamp[0], "syslog", stamp[1]
    rec.facility = "kernel"
    return m.end()


def _peel_bare_kernel(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_BARE_KERNEL.match(rest) or _P_WALL_KERNEL.match(rest)
    if not m:
        return None
    rec.facility = "kernel"
    return m.end()


def _peel_fm(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_FM.match(rest)
    if not m:
        return None
    rec.time_text, rec.time_format = m.group("fmts"), "fabricmanager"
    mon, day, year, hms = m.group("fmts").split()
    rec.wall_ns, rec.wall_source = epoch_ns(int(year), MONTHS[mon], int(day), hms), "stamp"
    rec.facility, rec.level = "fabricmanager", m.group("level").lower()
    return m.end()


def _peel_ctime(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_CTIME.match(rest)
    if not m or (ns := ctime_ns(m.group("ctime"))) is None:
        return None
    rec.time_text, rec.time_format = m.group("ctime"), "ctime"
    rec.wall_ns, rec.wall_source = ns, "stamp"
    return m.end()


def _peel_human_abs(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_HUMAN_ABS.match(rest)
    if not m:
        return None
    rec.time_text, rec.time_format = m.group(0).strip(" []"), "human"
    hms = m.group("hm") + ":" + (m.group("s") or "00")
    rec.year_less = (MONTHS[m.group("mon")], int(m.group("day")), hms, None)
    state["human_base"] = rec.year_less
    state["human_delta_ns"] = 0
    return m.end()


def _peel_human_rel(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    """`dmesg -H` relative lines: a delta from the last absolute line."""
    m = _P_HUMAN_REL.match(rest)
    if not (m and state.get("human_base")):
        return None
    delta = int(round(float(m.group("delta")) * 1e9))
    state["human_delta_ns"] += delta
    rec.time_text, rec.time_format = "+" + m.group("delta"), "human"
    rec.year_less = state["human_base"]
    rec.delta_ns = state["human_delta_ns"]
    return m.end()


def _peel_mono(rest: str, rec: Rec, state: dict[str, Any]) -> int | None:
    m = _P_MONO.match(rest)
    if not m:
        return None
    if rec.time_format in ("none", "syslog"):
        if rec.time_format == "none":
            rec.time_text, rec.time_format = m.group("mono"), "monotonic"
        else:
            rec.time_text = f"{rec.time_text} [{m.group('mono')}]"
    rec.mono_ns = int(round(float(m.group("mono")) * 1e9))
    end = m.end()
    if rec.host is None or rec.facility is None:
        m2 = _P_AFTER_MONO_HOST.match(rest[end:])  # the pattern is anchored with ^: slice, not pos
        if m2:
            rec.host = rec.host or m2.group("host")
            rec.facility = m2.group("ident")
            end += m2.end()
    return end


# Every prefix peeler, in the order they are tried, with the characters its pattern can start with (none
# matches an empty text): a line is offered only to the peelers its first character allows, in this order.
# Most lines start with `[` or a letter, so 1-5 peelers are tried instead of 17 (the calls, not the regexes,
# were the cost).
_PEELER_STARTS: tuple[tuple[_Peeler, str], ...] = (
    (_peel_grep, "/"), (_peel_alert, "X"), (_peel_talos, r"[\w.:-]"), (_peel_pdsh, "[A-Za-z0-9]"),
    (_peel_kmsg, r"\d"), (_peel_prio, "<"), (_peel_decode, "[kumdasln]"), (_peel_iso, r"\d"),
    (_peel_short_full, "[MTWFS]"), (_peel_syslog, "[JFMASOND]"), (_peel_wall_kernel, r"[\sk]"),
    (_peel_bare_kernel, r"[\sk]"), (_peel_fm, r"\["), (_peel_ctime, r"\["), (_peel_human_abs, r"\["),
    (_peel_human_rel, r"\["), (_peel_mono, r"\["),
)


@functools.cache
def _peelers_for(c: str) -> tuple[_Peeler, ...]:
    """The peelers a text starting with the character ``c`` can match, in order (one tuple per character)."""
    return tuple(p for p, first in _PEELER_STARTS if re.match(first, c))


def peel(line: str, rec: Rec, state: dict[str, Any]) -> str:
    """Strip every wrapper and timestamp prefix, filling ``rec``; returns the message text."""
    rest = line
    for _ in range(8):
        if not rest:
            break
        for peeler in _peelers_for(rest[0]):
            end = peeler(rest, rec, state)
            if end is not None:
                rest = rest[end:]
                break
        else:
            break
    return rest
