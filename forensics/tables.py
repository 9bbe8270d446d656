"""Small per-rank tables for reports (aggregates, never raw events), read from the job's one JobContext.

Every table takes the analysis's :class:`~forensics.context.JobContext`, never frames: the numbers it
shows are the same cached facts the detectors used.
"""

from __future__ import annotations

import polars as pl

from forensics.context import JobContext


def step_table(ctx: JobContext) -> pl.DataFrame:
    """Per rank: profiler steps seen, and step time mean / median / max in milliseconds."""
    steps = ctx.frames["steps"]
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


def kernel_table(ctx: JobContext) -> pl.DataFrame:
    """Per rank and kernel class: count and total busy milliseconds."""
    kernels = ctx.frames["kernels"].select("rank", "class", "start_ns", "end_ns")  # a narrow frame groups 4x faster
    return (
        kernels.group_by("rank", "class")
        .agg(pl.len().alias("count"), ((pl.col("end_ns") - pl.col("start_ns")).sum() / 1e6).alias("total_ms"))
        .sort("rank", "class", nulls_last=True)
    )


def step_breakdown_table(ctx: JobContext) -> pl.DataFrame:
    """Per rank, median over its steps: where the step time went (ms), and the utilization it implies.

    ``compute + exposed_comm + comm_wait + other + idle = step`` per step (see forensics.breakdown);
    ``host_bound`` is the part of idle spent waiting for the host to launch work; ``U_any`` is what
    nvidia-smi would call utilization, ``wait`` the share of the step NCCL kernels only spin.
    Without profiler steps, one row per rank over the whole trace (step -1). Empty without kernels.
    """
    cols = {"rank": pl.Int32, "host": pl.String, "steps": pl.UInt32, "step_ms": pl.Float64, "compute_ms": pl.Float64,
            "exposed_comm_ms": pl.Float64, "comm_wait_ms": pl.Float64, "other_ms": pl.Float64, "idle_ms": pl.Float64,
            "host_bound_ms": pl.Float64, "U_any": pl.Float64, "wait": pl.Float64}
    if not ctx.frames.has("kernels"):
        return pl.DataFrame(schema=cols)
    b = ctx.steps
    if b.height == 0:
        return pl.DataFrame(schema=cols)

    def med_ms(c: str) -> pl.Expr:
        return (pl.col(c).median() / 1e6).round(3)

    return (
        b.group_by("rank", "host")
        .agg(
            pl.col("step").n_unique().alias("steps"),
            med_ms("step_ns").alias("step_ms"),
            med_ms("compute_ns").alias("compute_ms"),
            med_ms("comm_exposed_ns").alias("exposed_comm_ms"),
            med_ms("comm_wait_ns").alias("comm_wait_ms"),
            med_ms("other_ns").alias("other_ms"),
            med_ms("idle_ns").alias("idle_ms"),
            med_ms("host_bound_ns").alias("host_bound_ms"),
            (1 - pl.col("idle_ns") / pl.col("step_ns")).median().round(3).alias("U_any"),
            (pl.col("busy_wait_ns") / pl.col("step_ns")).median().round(3).alias("wait"),
        )
        .sort("rank")
        .cast(cols)  # type: ignore[arg-type]
    )
