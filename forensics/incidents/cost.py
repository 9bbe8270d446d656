"""What an incident cost, and how that was computed (in words, for the summary).

Fatal (a member's cost basis is fatal: a timeout killed the job): GPUs x (the watchdog's kill - the fault), or
the hung collective's run time when the fault is not placed in time, plus the work since the last checkpoint.
Slowdown: the root's (or the largest measured consequence's) excess time x steps x GPUs. The figures come from
the findings' typed cost basis and time, never from their metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from forensics.base.findings import Finding, Role
from forensics.detectors import kind_of as declared_kind
from forensics.incidents.model import JobFacts, fmt_time


@dataclass(frozen=True)
class Cost:
    gpu_seconds: float | None
    method: str
    fatal: bool = False
    died_at_ns: int | None = None
    hang_s: float | None = None


def timeout_of(members: list[Finding]) -> Finding | None:
    """The member that killed the job (its cost basis is fatal), if any."""
    return next((f for f in members if f.cost.fatal), None)


def incident_cost(members: list[Finding], facts: JobFacts) -> Cost:
    """Fatal: GPUs x (end of job - fault); slowdown: the detectors' excess time x steps x GPUs."""
    to = timeout_of(members)
    if to is not None:
        return _fatal_cost(members[0], to, facts)
    root = members[0]
    if root.gpu_seconds_lost is not None:
        return Cost(root.gpu_seconds_lost, f"slowdown: the {root.detector} finding's excess time x steps x GPUs "
                    f"over the profiled steps = {root.gpu_seconds_lost:.3f} GPU-s")
    measured = [f for f in members if f.gpu_seconds_lost is not None]
    if measured:
        worst = max(measured, key=lambda f: (f.gpu_seconds_lost or 0.0, f.id))
        return Cost(worst.gpu_seconds_lost, f"slowdown: the largest measured consequence ({worst.detector}: excess "
                    f"time x steps x GPUs) = {worst.gpu_seconds_lost:.3f} GPU-s; the root cause itself is not timed")
    return Cost(None, "not computed: no finding of this incident measures lost time")


def _struck(root: Finding) -> int | None:
    """When a root fault struck: the start of its time, for a finding whose declared role is a fault."""
    kind = declared_kind(root)
    return root.when.start_ns if kind is not None and kind.role is Role.FAULT else None


def _fatal_cost(root: Finding, to: Finding, facts: JobFacts) -> Cost:
    died, ran_s = to.cost.died_ns, to.cost.hung_s
    fault = _struck(root) if root is not to else None
    how = ""
    hang_s: float | None = None
    if isinstance(fault, int) and isinstance(died, int) and fault <= died:
        hang_s, how = (died - fault) / 1e9, "from the fault to the watchdog kill"
    elif ran_s is not None:
        hang_s, how = ran_s, "the hung collective's run time until the watchdog killed the job ('ran for'; a lower bound)"
    if hang_s == 0.0 and root is to:  # stopped from outside (a scheduler): no hang, only the work since the checkpoint
        return _stopped_cost(died, facts)
    if hang_s is None or not facts.gpus:
        missing = "the GPU count" if hang_s is not None else "the hang's duration"
        return Cost(None, f"fatal; not computed: the inputs lack {missing}", True, died)
    start = fault if isinstance(fault, int) else (died - int(ran_s * 1e9) if died is not None and ran_s is not None else None)
    lost_s, lost_how = work_lost(start, facts, "the fault" if isinstance(fault, int) else "the hang's start")
    total = facts.gpus * (hang_s + lost_s)
    method = f"fatal: {facts.gpus} GPU(s) x {hang_s:.1f} s {how} = {facts.gpus * hang_s:.1f} GPU-s; {lost_how}"
    if lost_s:
        method += f"; total {total:.1f} GPU-s"
    return Cost(total, method, True, died, hang_s)


def _stopped_cost(died: int | None, facts: JobFacts) -> Cost:
    lost_s, how = work_lost(died, facts, "the stop")
    if not lost_s:
        return Cost(None, f"not computed: stopped from outside, not a fault; {how}", True, died, 0.0)
    if not facts.gpus:
        return Cost(None, f"not computed: the inputs lack the GPU count ({lost_s:.1f} s of work since the last "
                    "checkpoint lost)", True, died, 0.0)
    return Cost(facts.gpus * lost_s, f"stopped from outside (not a fault): {how}", True, died, 0.0)


def work_lost(fault_ns: int | None, facts: JobFacts, what: str) -> tuple[float, str]:
    """Seconds of work lost since the latest timed checkpoint save before the fault, and how it was found."""
    if not facts.checkpoint_lines:
        return 0.0, "work since the last checkpoint not counted (no checkpoint line read)"
    if not facts.checkpoints_ns:
        return 0.0, (f"work since the last checkpoint not counted ({facts.checkpoint_lines} checkpoint line(s) read, "
                     "none with a wall-clock time)")
    if fault_ns is None:
        return 0.0, "work since the last checkpoint not counted (the fault's wall-clock time is unknown)"
    before = [t for t in facts.checkpoints_ns if t <= fault_ns]
    if not before:
        return 0.0, f"work since the last checkpoint not counted (no timed checkpoint save before {what})"
    gap_s = (fault_ns - before[-1]) / 1e9
    gpus = facts.gpus or 0
    return gap_s, (f"plus work since the last checkpoint: {gpus} GPU(s) x {gap_s:.1f} s from the checkpoint save at "
                   f"{fmt_time(before[-1])} to {what} = {gpus * gap_s:.1f} GPU-s")


