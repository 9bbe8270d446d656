"""Small helpers shared by the detectors."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from forensics.base.findings import Finding, When
from forensics.detectors import Skip
from forensics.facts.context import JobContext

EVIDENCE_CAP = 12


def require_steps(ctx: JobContext) -> pl.DataFrame:
    steps = ctx.steps
    if steps.height == 0:
        raise Skip("no GPU kernels with a known rank to measure step time against")
    return steps


def gpu_seconds(ns: float) -> float:
    return round(float(ns) / 1e9, 6)


def ms(ns: float | None) -> float | None:
    return None if ns is None else round(float(ns) / 1e6, 3)


def profiled_window(ctx: JobContext) -> When:
    """The profiled steps' wall-clock span: when what a trace detector measured happened."""
    steps = ctx.frames["steps"] if ctx.frames.has("steps") else None
    if steps is None or steps.height == 0:
        return When.unknown("no profiled step to place it in")
    lo, hi = steps["start_ns"].min(), steps["end_ns"].max()
    if lo is None or hi is None:
        return When.unknown("the profiled steps carry no times")
    return When.span(int(lo), int(hi), "the profiled window (first step start to last step end)")  # type: ignore[arg-type]


def in_profile(ctx: JobContext, findings: list[Finding]) -> list[Finding]:
    """``findings`` placed in the profiled window (trace detectors measure over the whole window)."""
    when = profiled_window(ctx)
    return [replace(f, when=when) for f in findings]
