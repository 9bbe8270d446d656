"""Small helpers shared by the detectors."""

from __future__ import annotations

import polars as pl

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
