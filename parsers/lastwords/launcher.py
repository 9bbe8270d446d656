"""What the launcher and the scheduler said: torchrun / torch.distributed.elastic (and the older
torch.distributed.launch, DeepSpeed and Accelerate, which print the same lines or these), SLURM,
Kubernetes.

The torchrun failure table (`ChildFailedError`) is read as a block: one row per entry, with its
time (the launcher's record: local time of the error file or of the launcher, no zone, read as
UTC), host, rank, local rank, exit code or signal, and whether it is the "Root Cause (first
observed failure)". Its `[i]:` is an index, not a rank.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forensics.parsers.lastwords.text import Line, dated_ns

Emit = Callable[[dict[str, Any]], None]
Base = Callable[[Line], dict[str, Any]]

_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def signal_of(code: int | None) -> str | None:
    """torchrun's negative exit codes and the shells' 128+N are signals."""
    if code is None:
        return None
    if code < 0:
        return _SIGNALS.get(-code, f"signal {-code}")
    if 128 < code < 160:
        return _SIGNALS.get(code - 128, f"signal {code - 128}")
    return None


# (event, cls, pattern): named groups pid, local_rank, code, sig, host, tasks, job, when, why, attempts
_SINGLE: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("launcher_failure", "exit", re.compile(
        r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)")),
    ("launcher_failure", "exit", re.compile(r"\[launch\.py:\d+:sigkill_handler\].*?exits with return code = (?P<code>-?\d+)")),
    ("launcher_signal", "sigterm", re.compile(r"Sending process (?P<pid>\d+) closing signal (?P<sig>SIG\w+)")),
    ("launcher_signal", "sigterm", re.compile(r"Killing subprocess (?P<pid>\d+)")),
    ("launcher_stopped", "stopped", re.compile(r"Main process received (?P<sig>SIG\w+), exiting|"
                                               r"Received (?:Signals\.)?(?P<sig2>SIG\w+) death signal, shutting down workers")),
    ("restart", "restart", re.compile(r"Worker group FAILED\. (?P<attempts>\d+)/\d+ attempts left; will restart")),
    ("restart", "membership", re.compile(r"Rendezvous complete for workers\. Result:|Detected \d+ new nodes from group")),
    ("scheduler", "slurm", re.compile(
        r"\*\*\* (?P<job>(?:STEP|JOB) [\w.+]+)(?: ON (?P<host>\S+))? CANCELLED AT (?P<when>\S+)(?: DUE TO (?P<why>[A-Z ]+?))?"
        r"(?:,.*?)? \*\*\*")),
    ("scheduler", "failed", re.compile(r"\*\*\* (?P<job>(?:STEP|JOB) [\w.+]+)(?: ON (?P<host>\S+))? FAILED \(")),
    ("task_exit", "task", re.compile(
        r"srun: error: (?P<host>[\w.-]+): tasks? (?P<tasks>[\d,\-\[\] ]+): (?P<why>Exited with exit code (?P<code>\d+)|"
        r"Terminated|Out Of Memory|Bus error|Killed|Segmentation fault|Aborted)")),
    ("scheduler", "step_oom", re.compile(r"Detected (?P<n>\d+) oom[-_]kill events? in (?:step |StepId=)?(?P<job>[\w.]+)")),
    ("pod", "oom_killed", re.compile(r"\breason: OOMKilled\b|^\S+\s+\d+/\d+\s+OOMKilled\s")),
    ("pod", "evicted", re.compile(r"\breason: Evicted\b|^\S+\s+\d+/\d+\s+Evicted\s|The node was low on resource")),
    ("pod", "preempted", re.compile(r"PreemptionByScheduler|reason: DisruptionTarget")),
    ("pod", "node_oom", re.compile(r"OOMKilling\s+Memory cgroup out of memory: Kill(?:ed)? process (?P<pid>\d+)")),
    ("pod", "error", re.compile(r"\breason: (?:Error|ContainerCannotRun|DeadlineExceeded)\b")),
    ("pod", "gpu_unhealthy", re.compile(r"UnexpectedAdmissionError.*unhealthy devices")),
    ("worker_exited", "defunct", re.compile(r"^\s*(?P<pid>\d+)\s+[ |\\_]*\\_ \S+ <defunct>\s*$")),
)
_SLURM_WHY = {"TIME LIMIT": "time_limit", "PREEMPTION": "preempted", "NODE FAILURE": "node_fail",
              "JOB REQUEUE": "requeue", "TASK FAILURE": "task_failure"}
_POD_EXIT = re.compile(r"^\s*exitCode: (?P<code>\d+)")
_POD_TIME = re.compile(r"^\s*finishedAt: (?P<d>\d{4}-\d{2}-\d{2})T(?P<t>\d{2}:\d{2}:\d{2})")
_SLURM_WHEN = re.compile(r"(?P<d>\d{4}-\d{2}-\d{2})T(?P<t>\d{2}:\d{2}:\d{2})")


def single(line: Line, base: Base) -> dict[str, Any] | None:
    """The row of a one-line launcher / scheduler / pod message, or None."""
    text = line.text
    for event, cls, pattern in _SINGLE:
        m = pattern.search(text)
        if m:
            return _row(line, base, event, cls, {k: v for k, v in m.groupdict().items() if v is not None})
    return None


def _row(line: Line, base: Base, event: str, cls: str, g: dict[str, str]) -> dict[str, Any]:
    row = base(line)
    code = int(g["code"]) if "code" in g else None
    row.update(event=event, cls=cls, message=line.text.strip()[:500], exit_code=code,
               signal=g.get("sig") or g.get("sig2") or signal_of(code), pid=int(g["pid"]) if "pid" in g else row["pid"])
    if "local_rank" in g:
        row["local_rank"] = int(g["local_rank"])
    if "host" in g:
        row["host"] = g["host"]
    if "job" in g:
        row["job"] = g["job"]
    if event == "scheduler" and cls == "slurm":
        row["cls"] = _SLURM_WHY.get((g.get("why") or "").strip(), "cancelled" if not g.get("why") else "cancelled_other")
        when = _SLURM_WHEN.match(g.get("when", ""))
        if when:
            row.update(time_ns=dated_ns(when["d"], when["t"], None), time_from="scheduler")
    if event == "task_exit":
        row["tasks"] = g.get("tasks", "").strip()
        row["cls"] = "task_exit" if code is not None else (g.get("why") or "task").lower().replace(" ", "_")
    if "attempts" in g:
        row["exit_code"] = None
        row["detail"] = f"{g['attempts']} attempt(s) left"
    return row


def pod_field(line: Line, rows: list[dict[str, Any]]) -> bool:
    """`exitCode:` / `finishedAt:` of a pod's terminated state: onto the latest pod row of the file."""
    pods = [r for r in rows[-8:] if r["event"] == "pod"]
    m = _POD_EXIT.match(line.text)
    t = _POD_TIME.match(line.text)
    if not (m or t):
        return False
    if not pods:
        return False
    if m:
        pods[-1]["exit_code"] = int(m["code"])
        pods[-1]["signal"] = signal_of(int(m["code"]))
    if t:
        pods[-1].update(time_ns=dated_ns(t["d"], t["t"], None), time_from="scheduler")
    return True


_TABLE_START = re.compile(r"ChildFailedError:\s*$")
_ENTRY = re.compile(r"^\s*\[(?P<i>\d+)\]:\s*$")
_FIELD = re.compile(r"^\s+(?P<k>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<v>.*?)\s*$")
_RANK_FIELD = re.compile(r"(?P<r>-?\d+)(?: \(local_rank: (?P<l>\d+)\))?")
_CODE_FIELD = re.compile(r"(?P<c>-?\d+)(?: \(pid: (?P<p>\d+)\))?")
_SIG_FIELD = re.compile(r"Signal (?P<n>\d+) \((?P<s>SIG\w+)\)")
_TORCHRUN_TIME = re.compile(r"(?P<d>\d{4}-\d{2}-\d{2})_(?P<t>\d{2}:\d{2}:\d{2})")


@dataclass
class FailureTable:
    """The `ChildFailedError` block: `Failures:` and `Root Cause (first observed failure):` entries."""

    base: Base
    emit: Emit
    active: bool = False
    root: bool = False
    seen_root: bool = False
    entry: dict[str, Any] | None = None
    script: str | None = None
    rules: int = 0
    fields: dict[str, str] = field(default_factory=dict)

    def take(self, line: Line) -> bool:
        text = line.text
        if not self.active:
            if _TABLE_START.search(text):
                self._start()
                return False  # the exception line is the launcher's traceback's too
            field = _FIELD.match(text)
            if not (text.startswith(("Root Cause (first observed failure)", "Failures:")) or
                    (field and field["k"] in ("exitcode", "rank", "host"))):  # an excerpt cut mid-table
                return False
            self._start()
        return self._inside(line)

    def _start(self) -> None:
        self.active, self.root, self.seen_root, self.rules, self.entry = True, False, False, 0, None

    def _inside(self, line: Line) -> bool:
        text = line.text.strip()
        if set(text) <= {"="} and text:
            self.rules += 1
            if self.seen_root or self.rules > 2:
                self._end()
            return True
        if text.endswith(" FAILED") and " " in text:
            self.script = text[: -len(" FAILED")]
            return True
        if text.startswith("Root Cause"):
            self._flush()
            self.root = self.seen_root = True
            return True
        if text.startswith("Failures:") or set(text) <= {"-"} or text == "<NO_OTHER_FAILURES>":
            if text.startswith("Failures:") or set(text) <= {"-"}:
                self._flush()
            return True
        return self._entry_line(line)

    def _entry_line(self, line: Line) -> bool:
        if _ENTRY.match(line.text):
            self._flush()
            self.entry = self.base(line)
            return True
        m = _FIELD.match(line.text)
        if not m:
            self._end()
            return False
        if self.entry is None:
            self.entry = self.base(line)
        self.entry.setdefault("_fields", {})[m["k"]] = m["v"]
        return True

    def _flush(self) -> None:
        if self.entry is None:
            return
        row, f = self.entry, self.entry.pop("_fields", {})
        self.entry = None
        rank = _RANK_FIELD.match(f.get("rank", ""))
        code = _CODE_FIELD.match(f.get("exitcode", ""))
        sig = _SIG_FIELD.search(f.get("traceback", ""))
        when = _TORCHRUN_TIME.search(f.get("time", ""))
        exit_code = int(code["c"]) if code else None
        row.update(event="launcher_failure", cls="exit", first_observed=self.root, host=f.get("host") or row["host"],
                   rank=int(rank["r"]) if rank else row["rank"], local_rank=int(rank["l"]) if rank and rank["l"] else None,
                   exit_code=exit_code, pid=int(code["p"]) if code and code["p"] else None,
                   signal=sig["s"] if sig else signal_of(exit_code), job=self.script,
                   message=" ".join(f"{k}: {v}" for k, v in f.items())[:500], detail=f.get("traceback"))
        if when:
            row.update(time_ns=dated_ns(when["d"], when["t"], None), time_from="launcher", stamp=None)
        self.emit(row)

    def _end(self) -> None:
        self._flush()
        self.active = False

    def finish(self) -> None:
        if self.active:
            self._end()
