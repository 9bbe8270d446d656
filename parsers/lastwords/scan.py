"""The scanner: every line of a text file offered, in order, to the readers of the job's own words.

Order per line: the torchrun failure table (a block), stack dumps (blocks), tracebacks (per stream),
then one-line messages (launcher, scheduler, pod, CUDA and data-loader errors outside a traceback).
Bounded: at most MAX_ROWS rows of each frame per file (more is counted and said), lines matched on
their first characters only (text.MATCH_CHARS).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import replace
from typing import Any

from forensics.parsers.lastwords.errors import classify, oom_numbers
from forensics.parsers.lastwords.launcher import FailureTable, pod_field, single
from forensics.parsers.lastwords.stacks import Stacks
from forensics.parsers.lastwords.text import MATCH_CHARS, Line, prepare, stamp_only
from forensics.parsers.lastwords.tracebacks import GLUED_FRAME, Tracebacks, exception_line

MAX_ROWS = 20_000
# Anything any reader below could start on; a line without it (outside a block) is read for its time only.
INTERESTING = re.compile(
    r"Traceback|File \"|Error|Exception|error|Interrupt|Exit|Fault|Abort|Timeout|what\(\)|terminate called|CUDA|HIP|"
    r"Assertion|DataLoader|exitcode|exitCode|finishedAt|reason: |signal|Killing subprocess|Main process|Rendezvous|"
    r"Worker group|new nodes|return code|CANCELLED|FAILED|srun: |oom|OOM|Evicted|Preemption|DisruptionTarget|"
    r"low on resource|<defunct>|Thread |most recent call|above exception|=== Rank|^Process \d+: |Fatal "
    r"Python|Failures:|"
    r"Root Cause|^\s+(?:time|host|rank)\s+:")

_TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<t>[^']+)'")
_WHAT = re.compile(r"^\s*what\(\):\s+(?P<m>.*)$")
_RAISED_FROM = re.compile(r"^Exception raised from (?P<f>\S+) at (?P<at>\S+)")
_CUDA_LINE = re.compile(r"(?P<m>(?:CUDA|HIP) error: .*)$")
_ASSERT = re.compile(r"(?P<file>[\w/.\-]+\.(?:cu|cuh|cpp|h)):(?P<line>\d+): (?P<func>.*?): block: \[[\d,]+\], thread: "
                     r"\[[\d,]+\] Assertion `(?P<cond>.*)` failed\.")
_DATALOADER = re.compile(r"DataLoader worker \(pids? ?\(?(?P<pid>\d+)[^)]*\)\)? (?:is killed by signal: (?P<sig>[\w "
                         r"]+)|"
                         r"exited unexpectedly)|Unexpected bus error encountered in worker|DataLoader timed out after")
_PS_LINE = re.compile(r"^\s*\d+\s+\S")
_FATAL = re.compile(r"^Fatal Python error: (?P<m>.+)$")
_WATCHDOG = re.compile(r"watchdog thread terminated with exception|Watchdog caught collective operation timeout")
_PG = re.compile(r"\[PG(?: ID)? (?P<pg>\d+)[ \]]")  # ProcessGroupNCCL's `[PG ID 0 PG GUID 0(default_pg) Rank 3]`
# a file named for its rank (`rank3.log`, `stdout_rank_3.txt`, `rank-3/...`), not one whose name merely says `rank3`
_FILE_RANK = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?=\.|/|$)", re.IGNORECASE)
# torchrun's per-worker files: <log_dir>/<run>/attempt_<n>/<local_rank>/{stdout,stderr}.log
_TORCHRUN_FILE = re.compile(r"attempt_\d+/(\d+)/(?:stdout|stderr)\.log$")


def _pg(text: str) -> str | None:
    m = _PG.search(text, 0, 400) if "[PG" in text else None
    return m["pg"] if m else None


class Scanner:
    def __init__(self, source: str, rank: int | None = None, host: str | None = None) -> None:
        m = _FILE_RANK.search(source)
        t = _TORCHRUN_FILE.search(source)
        self.source, self.rank, self.host = source, rank if rank is not None else (int(m.group(1)) if m else None), host
        self.local_rank = int(t.group(1)) if t else None
        self.events: list[dict[str, Any]] = []
        self.stacks_rows: list[dict[str, Any]] = []
        self.dropped = {"last_words": 0, "stacks": 0}
        self.last_time: int | None = None
        self.last_stamp: str | None = None
        self.terminate: dict[str, tuple[str, int]] = {}
        self.recent: deque[str] = deque(maxlen=512)  # the heads of the last lines (a process listing's start)
        self.tb = Tracebacks(self._emit, self._base)
        self.table = FailureTable(self._base, self._emit)
        self.stacks = Stacks(self._base, self._emit_stack)

    def _base(self, line: Line) -> dict[str, Any]:
        t, stamp, how = self._when(line)
        return {"source": self.source, "host": self.host, "rank": line.rank if line.rank is not None else self.rank,
                "local_rank": line.local_rank if line.local_rank is not None else self.local_rank, "pid": None,
                "line": line.n, "time_ns": t, "stamp": stamp, "time_from": how, "pg": _pg(line.text)}

    def _when(self, line: Line) -> tuple[int | None, str | None, str | None]:
        """(time, year-less stamp, how): the line's own, else the nearest timestamped line's before it."""
        if line.time_ns is not None or line.stamp is not None:
            return line.time_ns, line.stamp, "line"
        if self.last_time is not None or self.last_stamp is not None:
            return self.last_time, self.last_stamp, "before"
        return None, None, None

    def _emit(self, row: dict[str, Any]) -> None:
        if len(self.events) >= MAX_ROWS:
            self.dropped["last_words"] += 1
            return
        prev = self.events[-1] if self.events else None
        if (prev is not None and row.get("event") == "error_line" and prev.get("event") == "error_line"
                and row["line"] == prev["line"] + (prev.get("repeats") or 1)
                and all(prev.get(k) == row.get(k) for k in ("rank", "local_rank", "cls", "message"))):
            prev["repeats"] = (prev.get("repeats") or 1) + 1
            return
        self.events.append(row)

    def _emit_stack(self, row: dict[str, Any]) -> None:
        if len(self.stacks_rows) >= MAX_ROWS:
            self.dropped["stacks"] += 1
            return
        self.stacks_rows.append(row)

    def _busy(self) -> bool:
        """Inside a block (failure table, stack dump, traceback, a message's continuation): every line counts."""
        return bool(self.table.active or self.stacks.pending or self.terminate or self.tb.pending
                    or any(self.tb.open.values()))

    def feed(self, n: int, raw: str) -> None:
        self.recent.append(raw[:64])
        busy = self._busy()
        if not busy and (" NCCL INFO " in raw or " NCCL TRACE " in raw):
            return  # most of a rank's stdout, never last words (and NCCL WARN lines are the NCCL log's)
        if not busy and not INTERESTING.search(raw, 0, MATCH_CHARS):
            t, stamp = stamp_only(raw)  # a line of no interest is read for its time only (most of an NCCL log)
            if t is not None:
                self.last_time, self.last_stamp = t, None
            elif stamp is not None:
                self.last_stamp = stamp
            return
        line = prepare(n, raw)
        glued = GLUED_FRAME.search(line.text) if 'File "' in line.text else None
        if glued:  # two processes' lines run together: read them as two lines
            self._line(replace(line, text=line.text[: glued.start(1)]))
            line = replace(line, text=line.text[glued.start(1):])
        self._line(line)

    def _line(self, line: Line) -> None:
        if self.table.take(line) or self.stacks.take(line) or self.tb.take(line):
            self._clock(line)
            return
        self._single(line)
        self._clock(line)

    def _listing(self, line: Line, row: dict[str, Any]) -> None:
        """A `<defunct>` process of a `ps --forest` listing: which listing (its first line) and how deep."""
        back = 0
        for prev in list(self.recent)[-2::-1]:  # the lines before this one, nearest first
            if not _PS_LINE.match(prev):
                break
            back += 1
        row.update(job=f"process listing at line {line.n - back}", detail=f"depth {line.text.find(chr(92) + '_')}")

    def _clock(self, line: Line) -> None:
        if line.time_ns is not None:
            self.last_time, self.last_stamp = line.time_ns, None
        elif line.stamp is not None:
            self.last_stamp = line.stamp

    def _single(self, line: Line) -> None:
        row = single(line, self._base)
        if row is not None:
            if row["event"] == "worker_exited":
                self._listing(line, row)
            self._emit(row)
            return
        if pod_field(line, self.events):
            return
        if self._cpp(line):
            return
        self._error_line(line)

    def _cpp(self, line: Line) -> bool:
        """`terminate called after throwing ...` / `what():` / `Exception raised from ...` (C++ exceptions)."""
        text = line.text
        m = _TERMINATE.search(text)
        if m:
            self.terminate[line.stream] = (m["t"], line.n)
            return True
        w = _WHAT.match(text)
        if w:
            etype = self.terminate.pop(line.stream, (None, 0))[0]
            msg = w["m"].strip()
            cls = classify(msg)
            if not _WATCHDOG.search(msg) and not cls.startswith("nccl_"):  # timeouts and NCCL's own lines: not ours
                self._emit(self._error(line, etype, msg, cls))
            return True
        r = _RAISED_FROM.match(text)
        if r and self.events and self.events[-1]["line"] >= line.n - 3 and self.events[-1].get("event") == "error_line":
            self.events[-1]["detail"] = f"raised from {r['f']} at {r['at']}"
            return True
        return False

    def _error_line(self, line: Line) -> None:
        text = line.text
        exc = exception_line(text)
        if exc is not None:
            cls = classify(text)
            # an NCCL error on a line of its own is NCCL's or the C++ watchdog's text (nccl_log reads it); ours are
            # the ones Python raised (DistBackendError / RuntimeError)
            python_raised = exc[0].endswith(("DistBackendError", "RuntimeError"))
            if cls != "exception" and (python_raised or not cls.startswith("nccl_")):
                self._emit(self._error(line, exc[0], exc[1], cls, event="exception"))
            return
        for pattern, etype in ((_ASSERT, "device-side assertion"), (_DATALOADER, None), (_FATAL, "Fatal Python error")):
            m = pattern.search(text)
            if m:
                row = self._error(line, etype, text.strip(), "device_assert" if pattern is _ASSERT else classify(text))
                if pattern is _ASSERT:
                    row["detail"] = f"kernel {m['file']}:{m['line']} {m['func']}: assertion `{m['cond']}`"
                if pattern is _DATALOADER and m["pid"]:
                    row["detail"] = f"worker pid {m['pid']}" + (f", signal {m['sig']}" if m["sig"] else "")
                if pattern is _FATAL:
                    row["cls"] = "fatal_signal"
                self._emit(row)
                return
        c = _CUDA_LINE.search(text)
        if c and not line.text.startswith(("Search for", "CUDA kernel errors")):
            etype = "ProcessGroupNCCL watchdog" if _WATCHDOG.search(text) else None
            self._emit(self._error(line, etype, c["m"].strip(), classify(c["m"])))

    def _error(self, line: Line, etype: str | None, msg: str, cls: str, event: str = "error_line") -> dict[str, Any]:
        row = self._base(line)
        row.update(event=event, exc_type=etype, message=msg[:500], cls=cls, role="rank")
        if cls == "cuda_oom":
            row.update(oom_numbers(msg))
        return row

    def finish(self) -> None:
        self.table.finish()
        self.stacks.finish()
        self.tb.finish()
        self.events.sort(key=lambda r: r["line"])
        self.events = attach_tracebacks(self.events)


_ATTACH = frozenset({"device_assert", "illegal_address", "launch_failure", "cuda_error", "dataloader"})


def attach_tracebacks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A traceback cut off right after an error line of the same process (a kernel's assertion printed
    before the Python traceback) is that error's traceback: one event, not two."""
    out: list[dict[str, Any]] = []
    for row in events:
        prev = next((p for p in reversed(out[-4:]) if (p["rank"], p["local_rank"]) == (row["rank"], row["local_rank"])),
                    None)
        if (row.get("cls") == "truncated" and prev is not None and prev.get("cls") in _ATTACH
                and prev.get("traceback") is None and 0 <= row["line"] - prev["line"] <= 3):
            prev.update(traceback=row["traceback"], frames=row["frames"], innermost=row["innermost"],
                        user_frame=row["user_frame"] or prev.get("user_frame"))
            continue
        out.append(row)
    return out
