"""Python tracebacks, per stream (rank prefix), tolerant of interleaving, glued lines and cuts.

Two processes writing at once interleave their tracebacks line by line (no prefix tells them
apart): a second header that arrives while the first traceback is still receiving frames opens a
second traceback, and each frame line goes to the open one with fewer frames (identical stacks,
printed at once, split evenly). A header that arrives long after the last frame closes the older
traceback as cut off. Frame lines without a header (an excerpt that starts mid-traceback) open an
implicit traceback. Frames are bounded: the first HEAD_FRAMES and the last TAIL_FRAMES are kept and
the rest counted (a 100k-frame recursion costs a counter, not memory).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forensics.parsers.lastwords.errors import classify, oom_numbers
from forensics.parsers.lastwords.text import Line

HEADER = re.compile(r"Traceback \(most recent call last\):\s*$")
FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*?)\s*$')
GLUED_FRAME = re.compile(r'\S\s*(  File "[^"]*", line \d+, in )')
_EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?P<last>[A-Za-z_]\w*))(?::\s?(?P<msg>.*))?$")
_TYPE_WORD = re.compile(r"(?:Error|Exception|Interrupt|Exit|Failure|Timeout|Fault|Abort|Iteration)$")
_CHAIN = re.compile(r"^(?:During handling of the above exception|The above exception was the direct cause)")
_REPEAT = re.compile(r"^\s*\[Previous line repeated (\d+) more times?\]")
_LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python\d|<frozen|^<string>|^/usr/lib/|/torch/|^<")
# the launcher's own frames: its traceback is not a rank's failure
_LAUNCHER = re.compile(r"torch/distributed/(?:run|launch)\.py|elastic/agent|launcher/api\.py|accelerate/commands/launch|"
                       r"deepspeed/launcher|/bin/(?:torchrun|accelerate|deepspeed)$")
HEAD_FRAMES = 8
TAIL_FRAMES = 40
LIVE_LINES = 2  # a header within this many lines of the last frame interleaves instead of cutting
CONTINUATION_LINES = 12
_STOP = re.compile(r"^(?:terminate called|Exception raised from|frame #\d|Traceback|\[?[IWEF]\d{4} |\S+:\d+:\d+ \[\d+\]|"
                   r"Killing subprocess|Sending process|Main process|WARNING:|ERROR:|INFO:|DEBUG:|srun:|slurmstepd:|"
                   r"During handling|The above exception|\[\d{4}-\d\d-\d\d)")

Emit = Callable[[dict[str, Any]], None]


def exception_line(text: str) -> tuple[str, str] | None:
    """(type, message) when ``text`` reads as the last line of a traceback."""
    if not text or text[0].isspace():
        return None
    m = _EXC.match(text.rstrip())
    if not m or not (_TYPE_WORD.search(m["last"]) or m["last"] in ("KeyboardInterrupt", "SystemExit")):
        return None
    return m["type"], (m["msg"] or "").strip()


@dataclass
class Traceback:
    start: Line
    chained: bool = False
    cut_at_start: bool = False
    head: list[list[Any]] = field(default_factory=list)
    tail: deque[list[Any]] = field(default_factory=lambda: deque(maxlen=TAIL_FRAMES))
    n_frames: int = 0
    repeated: int = 0
    last_frame_line: int = 0

    def add_frame(self, m: re.Match[str], n: int) -> None:
        frame = [m["file"], int(m["line"]), m["func"], None]
        self.n_frames += 1
        (self.head if len(self.head) < HEAD_FRAMES else self.tail).append(frame)
        self.last_frame_line = n

    def add_code(self, text: str) -> None:
        last = self.tail[-1] if self.tail else self.head[-1] if self.head else None
        if last is not None and last[3] is None and text.strip() and not set(text.strip()) <= set("^~ "):
            last[3] = text.strip()[:200]

    def frames(self) -> list[list[Any]]:
        return self.head + list(self.tail)

    def user_frame(self) -> str | None:
        for file, line, func, _ in reversed(self.frames()):
            if not _LIBRARY.search(file):
                return f"{file}:{line} in {func}"
        return None

    def text(self, exc: str | None) -> str:
        out = ["Traceback (most recent call last):"] if not self.cut_at_start else ["(traceback cut at its start)"]
        for i, (file, line, func, code) in enumerate(self.frames()):
            if i == len(self.head) and self.n_frames > len(self.head) + len(self.tail):
                out.append(f"  ... {self.n_frames - len(self.head) - len(self.tail):,} frames not shown ...")
            out.append(f'  File "{file}", line {line}, in {func}')
            if code:
                out.append(f"    {code}")
        if self.repeated:
            out.append(f"  [Previous line repeated {self.repeated:,} more times]")
        out.append(exc if exc is not None else "(cut off: no exception line)")
        return "\n".join(out)


@dataclass
class _Pending:
    """The event of a traceback just closed, still taking its message's continuation lines."""

    row: dict[str, Any]
    lines: int = 0


class Tracebacks:
    """Open tracebacks per stream; closed ones become ``last_words`` rows through ``emit``."""

    def __init__(self, emit: Emit, base: Callable[[Line], dict[str, Any]]) -> None:
        self.emit = emit
        self.base = base
        self.open: dict[str, list[Traceback]] = {}
        self.chain: set[str] = set()
        self.pending: dict[str, _Pending] = {}

    def take(self, line: Line) -> bool:
        """True when ``line`` belongs to a traceback (header, frame, code, exception, continuation)."""
        s, text = line.stream, line.text
        if self._continue(line):
            return True
        if HEADER.search(text):
            self._header(line)
            return True
        if _CHAIN.match(text):
            self.chain.add(s)
            return True
        m = FRAME.match(text)
        tbs = self.open.get(s)
        if m:
            self._frame(line, m)
            return True
        if not tbs:
            return False
        return self._inside(line, tbs)

    def _continue(self, line: Line) -> bool:
        p = self.pending.get(line.stream)
        if p is None:
            return False
        text = line.text.strip()
        if (not text or p.lines >= CONTINUATION_LINES or _STOP.match(text) or FRAME.match(line.text)
                or (self.open.get(line.stream) and exception_line(text))):
            self._flush(line.stream)
            return False
        p.lines += 1
        detail = p.row.get("detail")
        p.row["detail"] = f"{detail}\n{text}" if detail else text
        return True

    def _flush(self, stream: str) -> None:
        p = self.pending.pop(stream, None)
        if p is None:
            return
        row = p.row
        if row["cls"] == "exception" and row.get("detail"):
            row["cls"] = classify(row["detail"])
        self.emit(row)

    def _header(self, line: Line) -> None:
        self._flush(line.stream)
        tbs = self.open.setdefault(line.stream, [])
        live = [tb for tb in tbs if line.n - max(tb.last_frame_line, tb.start.n) <= LIVE_LINES]
        for tb in tbs:
            if tb not in live:
                self._close(line.stream, tb, None)
        tbs[:] = live
        tbs.append(Traceback(line, chained=line.stream in self.chain))
        self.chain.discard(line.stream)

    def _frame(self, line: Line, m: re.Match[str]) -> None:
        tbs = self.open.setdefault(line.stream, [])
        if not tbs:
            self._flush(line.stream)
            tbs.append(Traceback(line, chained=line.stream in self.chain, cut_at_start=True))
            self.chain.discard(line.stream)
        min(tbs, key=lambda tb: tb.n_frames).add_frame(m, line.n)

    def _inside(self, line: Line, tbs: list[Traceback]) -> bool:
        text = line.text
        if not text.strip():
            return True
        r = _REPEAT.match(text)
        if r:
            tbs[-1].repeated += int(r.group(1))
            return True
        if text[0].isspace():
            max(tbs, key=lambda tb: tb.last_frame_line).add_code(text)
            return True
        exc = exception_line(text)
        if exc is None:
            return False  # another process's line, interleaved: the traceback stays open
        tb = tbs.pop(0)
        self._close(line.stream, tb, exc, line)
        return True

    def _close(self, stream: str, tb: Traceback, exc: tuple[str, str] | None, at: Line | None = None) -> None:
        row = self.base(at or tb.start)
        row["line"] = tb.start.n if at is None else at.n
        etype, msg = exc if exc is not None else (None, None)
        text = f"{etype}: {msg}" if etype and msg else etype
        row.update(event="exception", exc_type=etype, message=(msg or "")[:500] if exc else
                   f"traceback cut off after {tb.n_frames:,} frame(s): no exception line",
                   cls=classify(text or "") if exc else "truncated", frames=tb.n_frames, user_frame=tb.user_frame(),
                   traceback=tb.text(text), role="chained" if tb.chained else "rank",
                   innermost=(lambda f: f"{f[0]}:{f[1]} in {f[2]}")(tb.frames()[-1]) if tb.n_frames else None)
        if row["cls"] == "cuda_oom":
            row.update(oom_numbers(msg or ""))
        if (etype and etype.endswith("ChildFailedError")) or any(_LAUNCHER.search(f[0]) for f in tb.frames()):
            row.update(role="launcher", cls="launcher")
        if exc is not None:
            self.pending[stream] = _Pending(row)
        else:
            self.emit(row)

    def finish(self) -> None:
        for stream in list(self.pending):
            self._flush(stream)
        for stream, tbs in self.open.items():
            for tb in tbs:
                self._close(stream, tb, None)
        self.open.clear()
