"""Small per-rank tables derived from frames for reports (aggregates, never raw events)."""

from __future__ import annotations

import polars as pl

from forensics.frames import JobFrames


def step_table(frames: JobFrames) -> pl.DataFrame:
    """Per rank: steps seen, and step time mean / median / max in milliseconds."""
    steps = frames["steps"]
    if steps.height == 0:
        return pl.DataFrame(
            schema={"rank": pl.Int32, "host": pl.String, "steps": pl.UInt32, "mean_ms": pl.Float64,
                    "median_ms": pl.Float64, "max_ms": pl.Float64}
        )
    dur_ms = (pl.col("end_ns") - pl.col("start_ns")) / 1e6
    return (
        steps.group_by("rank", "host")
        .agg(
            pl.len().alias("steps"),
            dur_ms.mean().alias("mean_ms"),
            dur_ms.median().alias("median_ms"),
            dur_ms.max().alias("max_ms"),
        )
        .sort("rank", nulls_last=True)
    )


def kernel_table(frames: JobFrames) -> pl.DataFrame:
    """Per rank and kernel class: count and total busy milliseconds."""
    kernels = frames["kernels"]
    return (
        kernels.group_by("rank", "class")
        .agg(pl.len().alias("count"), ((pl.col("end_ns") - pl.col("start_ns")).sum() / 1e6).alias("total_ms"))
        .sort("rank", "class", nulls_last=True)
    )
