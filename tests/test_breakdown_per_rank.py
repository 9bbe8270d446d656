"""The step breakdown (JobContext.steps) per rank, as medians over its steps: checked against the frame builder."""

from __future__ import annotations

import polars as pl
import pytest

from forensics.base.frames import JobFrames
from forensics.facts.context import JobContext
from tests.frame_builders import MS, dp_job


def step_breakdown_table(ctx: JobContext) -> pl.DataFrame:
    """Per rank, median over its steps: where the step time went (ms), and the utilization it implies.

    ``compute + exposed_comm + comm_wait + other + idle = step`` per step (see forensics.facts.breakdown);
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


def test_per_rank_medians_match_the_builder():
    # 20 ms compute, 2 ms all-reduce; rank 3's host stalls 10 ms each step: the others wait 10 ms for it.
    frames, truth = dp_job(n_ranks=4, steps=3, compute_ns=20 * MS, tx_ns=2 * MS, host_delay={3: 10 * MS})
    t = step_breakdown_table(JobContext(frames))
    assert t["rank"].to_list() == [0, 1, 2, 3]
    row = {r["rank"]: r for r in t.iter_rows(named=True)}
    assert row[0]["step_ms"] == pytest.approx(truth.step_ns[(0, 1)] / 1e6, abs=1e-3)
    assert row[0]["compute_ms"] == 20.0 and row[0]["exposed_comm_ms"] == 2.0 and row[0]["comm_wait_ms"] == 10.0
    # Host-bound in its window: from the step start to the late launch call, 10 ms - 5 us launch latency.
    assert row[3]["comm_wait_ms"] == 0.0 and row[3]["host_bound_ms"] == pytest.approx(9.995, abs=1e-6)
    assert row[0]["wait"] == pytest.approx(10 / 32.1, abs=1e-3)


def test_whole_trace_without_steps_and_empty_without_kernels():
    frames, _ = dp_job(n_ranks=2, steps=2, compute_ns=20 * MS, tx_ns=2 * MS)
    t = step_breakdown_table(JobContext(JobFrames({"kernels": frames["kernels"], "cpu_ops": frames["cpu_ops"]})))
    # One window per rank from its first kernel start to its last kernel end: 2 x (20 ms + 2 ms) + 0.1 ms gap.
    assert t["steps"].to_list() == [1, 1] and t["step_ms"].to_list() == [44.1, 44.1]
    assert t["compute_ms"].to_list() == [40.0, 40.0]
    assert step_breakdown_table(JobContext(JobFrames({}))).height == 0
