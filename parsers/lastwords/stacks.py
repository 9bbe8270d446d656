"""Stack dumps taken while a job hung: py-spy `dump`, faulthandler, torch.distributed's debug-server
stack files (`=== Rank N ===`), and gdb thread dumps (`thread apply all bt` / `py-bt`).

One ``stacks`` row per thread, frames innermost first as `func (file:line)`. A group of py-spy
thread headers followed by one stack (how people paste identical stacks once) gives every thread
of the group that stack. ``where`` says what the innermost meaningful frame is doing: a collective,
the data loader, checkpoint I/O, a lock (only when nothing more specific is on the stack), else
compute.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forensics.parsers.lastwords.text import Line

MAX_FRAMES = 256

_PYSPY_PROCESS = re.compile(r"^Process (?P<pid>\d+): ")
_PYSPY_THREAD = re.compile(r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<status>idle|active|active\+gil|gil)\)(?:: "(?P<name>[^"]*)")?\s*$')
_PYSPY_FRAME = re.compile(r"^\s{2,}(?P<func>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")
_FAULT_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):\s*$")
_FAULT_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
_FAULT_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_RANK_HEADER = re.compile(r"^=== Rank (?P<rank>\d+) ===\s*$")
_GDB_THREAD = re.compile(r'^Thread (?P<n>\d+) \(Thread (?P<tid>0x[0-9a-f]+) \(LWP (?P<lwp>\d+)\)(?: "(?P<name>[^"]*)")?\):\s*$')
_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(?P<func>[^\s(]+) \(.*?\)(?: (?:at|from) (?P<file>\S+?)(?::(?P<line>\d+))?)?\s*$")
_GDB_PY = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.+?)\s*$')

_WHERE: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("collective", re.compile(r"distributed_c10d\.py|\b(?:all_reduce|allreduce|broadcast|barrier|all_gather\w*|"
                              r"reduce_scatter\w*|all_to_all\w*|isend|irecv|_recv|recv|send) \(.*(?:distributed|p2p|comm)|"
                              r"ProcessGroupNCCL|nccl", re.IGNORECASE)),
    ("data_loader", re.compile(r"torch/utils/data/|dataloader|_next_data|_try_get_data|datasets?/|MPD|data_?pipe",
                               re.IGNORECASE)),
    ("checkpoint_io", re.compile(r"serialization\.py|save_checkpoint|load_checkpoint|distributed/checkpoint|safetensors|"
                                 r"\bcheckpoint(?:ing)?/", re.IGNORECASE)),
)
_LOCK = re.compile(r"threading\.py|\block\b|acquire|Condition|futex|pthread_cond", re.IGNORECASE)


def where(frames: list[str]) -> str:
    """What a stack (innermost first) is doing: the first frame that names a collective, the data loader
    or checkpoint I/O; else a lock when the innermost frames wait on one; else compute."""
    for frame in frames:
        for name, pattern in _WHERE:
            if pattern.search(frame):
                return name
    return "lock" if frames and _LOCK.search(frames[0]) else "compute"


@dataclass
class _Thread:
    line: Line
    dump: str
    tid: str
    name: str | None
    status: str | None
    rank: int | None
    process: str | None


@dataclass
class Stacks:
    """State of the dump being read; ``emit`` gets each finished thread's row."""

    base: Callable[[Line], dict[str, Any]]
    emit: Callable[[dict[str, Any]], None]
    pending: list[_Thread] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)
    depth: int = 0
    process: str | None = None
    rank: int | None = None

    def take(self, line: Line) -> bool:
        text = line.text
        if self._header(line):
            return True
        if not self.pending:
            return self._orphan(line)
        frame = self._frame(text)
        if frame is not None:
            self.depth += 1
            if len(self.frames) < MAX_FRAMES:
                self.frames.append(frame)
            return True
        if not text.strip() and not self.frames:
            return True
        if text.strip() in ("...", "<no Python frame>", "Garbage-collecting") or text.startswith("Traceback (most recent call first)"):
            return True
        self._close()
        return False

    def _header(self, line: Line) -> bool:
        text = line.text
        r = _RANK_HEADER.match(text)
        if r:
            self._close()
            self.rank, self.process = int(r["rank"]), None
            return True
        p = _PYSPY_PROCESS.match(text)
        if p and not self.pending:
            self.process, self.rank = p["pid"], None
            return True
        for dump, pattern in (("py-spy", _PYSPY_THREAD), ("faulthandler", _FAULT_THREAD), ("gdb", _GDB_THREAD)):
            m = pattern.match(text)
            if m:
                if self.frames:
                    self._close()
                g = m.groupdict()
                self.pending.append(_Thread(line, dump, g.get("lwp") or g["tid"], g.get("name"), g.get("status"),
                                            self.rank if self.rank is not None else line.rank, self.process))
                return True
        if _FAULT_STACK.match(text):
            self._close()
            self.pending.append(_Thread(line, "faulthandler", "", None, None, self.rank, self.process))
            return True
        return False

    def _orphan(self, line: Line) -> bool:
        """faulthandler frames with no header above them (an excerpt): a stack of an unknown thread."""
        m = _FAULT_FRAME.match(line.text)
        if not m:
            return False
        self.pending.append(_Thread(line, "faulthandler", "", None, None, line.rank, self.process))
        self.depth, self.frames = 1, [f"{m['func']} ({m['file']}:{m['line']})"]
        return True

    def _frame(self, text: str) -> str | None:
        dump = self.pending[-1].dump
        pattern = {"py-spy": _PYSPY_FRAME, "faulthandler": _FAULT_FRAME}.get(dump)
        if dump == "gdb":
            m = _GDB_PY.match(text) or _GDB_FRAME.match(text)
        else:
            m = pattern.match(text) if pattern else None
        if not m:
            return None
        loc = m["file"] or "?"
        return f"{m['func']} ({loc}{':' + m['line'] if m['line'] else ''})"

    def _close(self) -> None:
        if not self.pending:
            return
        frames = self._python_first(self.frames) if self.pending[-1].dump == "gdb" else self.frames
        for t in self.pending:
            row = self.base(t.line)
            main = (t.name == "MainThread") or any(f.startswith("<module> (") for f in frames) or (
                t.process is not None and t.tid == t.process)
            row.update(rank=t.rank, process=t.process or t.tid or None, thread=t.name, status=t.status, main=main,
                       dump=t.dump, frames=frames, depth=self.depth, innermost=frames[0] if frames else None,
                       where=where(frames) if frames else None, tid=t.tid or None)
            self.emit(row)
        self.pending, self.frames, self.depth = [], [], 0

    @staticmethod
    def _python_first(frames: list[str]) -> list[str]:
        """gdb's py-bt frames (`file.py:N`) when the thread has any, else its C frames."""
        py = [f for f in frames if ".py:" in f]
        return py if py and len(py) != len(frames) else frames

    def finish(self) -> None:
        self._close()
