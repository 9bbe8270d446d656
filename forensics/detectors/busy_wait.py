"""Busy-wait "utilization": GPUs that look busy because NCCL kernels spin waiting for a peer.

What it detects:
    Ranks whose GPU is almost always running some kernel (what nvidia-smi / DCGM GPU_UTIL report) while
    a large share of that time is NCCL kernels spinning until another rank arrives, not computing.

Why it matters:
    "99% GPU utilization" is then a wrong reassurance: the GPU is waiting, and the time is lost to
    whoever it waits for. A spinning NCCL kernel occupies only a few SMs (one block per channel), so
    SM-level activity and power stay low while utilization reads full.

How it measures:
    Per rank and step (interval algebra, :mod:`forensics.breakdown`): ``U_any`` = time any kernel runs /
    step (the nvidia-smi quantity), ``U_compute`` = time compute kernels run / step, ``U_SM`` = kernel
    time weighted by ``min(1, blocks / SMs)`` / step, and the wait fraction ``W`` = time when only
    non-pipeline NCCL kernels run and they are in their waiting part (duration minus the collective's
    transfer time, :mod:`forensics.collectives`) / step. When the job was profiled with GPU metrics
    (Nsight Systems ``--gpu-metrics-device``), ``U_SM`` is instead the measured SM Active over each
    step (:mod:`forensics.gpu_metrics`), and the finding says which one it used (``U_SM_source``:
    ``sm_active`` or ``blocks_estimate``). Pipeline (PP) waiting is the bubble and is left
    to the pipeline_bubble detector. A rank is flagged when, over its steps' medians, ``U_any >=
    min_util_any`` and ``W >= min_wait``, or ``U_any - U_compute >= min_gap`` with ``W`` at least
    ``min_wait_share_of_gap`` of that gap (and ``W >= min_wait_floor``). Who they waited for: each
    wait is charged to the instance's last-arriving rank.
    Impact: this is a symptom; the lost GPU time is counted once, by the straggler finding for the
    waited-for rank (or the bubble finding), so ``gpu_seconds_lost`` is left empty here and the wait is
    in the metrics.

What to do:
    Do not read GPU utilization as efficiency. Fix the rank that is waited for (see the straggler
    finding naming it); for a hang-like 100% at idle power, look for the rank that never joined.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from forensics.collectives import CollectiveMatch
from forensics.context import JobContext
from forensics.detectors import Skip, detector
from forensics.detectors._common import EVIDENCE_CAP, gpu_seconds, ms, require_steps
from forensics.findings import Finding, Severity
from forensics.gpu_metrics import has_metric, sm_active_in_windows
from forensics.settings import setting


@dataclass(frozen=True)
class BusyWaitConfig:
    """Thresholds of the busy-wait check (shares of the step time)."""

    min_util_any: float = setting(0.8, unit="fraction of step", low=0.0, high=1.0,
                                  doc="any-kernel active share (nvidia-smi utilization) from which a rank can be flagged")
    min_wait: float = setting(0.15, unit="fraction of step", low=0.0, high=1.0,
                              doc="wait fraction W that flags a rank with U_any at or above min_util_any")
    min_gap: float = setting(0.2, unit="fraction of step", low=0.0, high=1.0,
                             doc="second rule: U_any - U_compute at or above this ...")
    min_wait_share_of_gap: float = setting(0.5, unit="fraction of gap", low=0.0, high=1.0,
                                           doc="... with W at least this share of that gap ...")
    min_wait_floor: float = setting(0.05, unit="fraction of step", low=0.0, high=1.0,
                                    doc="... and W at least this share of the step")
    critical_wait: float = setting(0.4, unit="fraction of step", low=0.0, high=1.0,
                                   doc="wait fraction W above which the finding is critical")


def waits_by_culprit(match: CollectiveMatch) -> pl.DataFrame:
    """(rank, last_rank, wait_ns): whom each rank's NCCL wait was for.

    A matched collective's wait is for its last arrival. In an instance some members never joined (a
    hung or dead rank), the whole wait is for the missing members, shared equally among them.
    """
    matched = match.kernels.filter(pl.col("matched") & (pl.col("rank") != pl.col("last_rank"))).select(
        "rank", pl.col("last_rank").cast(pl.Int32), pl.col("wait_ns").cast(pl.Float64)
    )
    if match.incomplete.height == 0:
        return matched
    missing = match.incomplete.filter(pl.col("missing_ranks").list.len() > 0).select(
        "instance_key", "missing_ranks"
    )
    never_arrived = (
        match.kernels.filter(~pl.col("matched") & pl.col("instance_key").is_not_null())
        .join(missing, on="instance_key", how="inner")
        .with_columns((pl.col("wait_ns") / pl.col("missing_ranks").list.len()).alias("wait_ns"))
        .explode("missing_ranks")
        .select("rank", pl.col("missing_ranks").cast(pl.Int32).alias("last_rank"), pl.col("wait_ns").cast(pl.Float64))
    )
    return pl.concat([matched, never_arrived], how="vertical")


def utilization_table(steps: pl.DataFrame) -> pl.DataFrame:
    """Per rank: median over steps of U_any, U_compute, U_SM and W, and total wait (ns)."""
    T = pl.col("step_ns").cast(pl.Float64)
    return (
        steps.with_columns(
            ((pl.col("step_ns") - pl.col("idle_ns")) / T).alias("u_any"),
            (pl.col("compute_ns") / T).alias("u_compute"),
            (pl.col("u_sm_ns") / T).alias("u_sm"),
            (pl.col("busy_wait_ns") / T).alias("w"),
        )
        .group_by("rank", "host")
        .agg(
            pl.col("u_any").median(), pl.col("u_compute").median(), pl.col("u_sm").median(), pl.col("w").median(),
            pl.col("busy_wait_ns").sum().alias("wait_ns"), pl.col("step").n_unique().alias("steps"),
        )
        .sort("rank")
    )


def measured_u_sm(frames, min_coverage: float = 0.9) -> pl.DataFrame:
    """Per rank: median over its steps of measured SM Active (fraction), from the ``gpu_metrics`` frame,
    using only steps the samples cover for at least ``min_coverage`` of their length. Empty when the
    job has no SM Active counter."""
    schema = {"rank": pl.Int32(), "u_sm_measured": pl.Float64()}
    if not has_metric(frames, "sm_active"):
        return pl.DataFrame(schema=schema)
    gpus = (
        frames["gpu_metrics"].filter(pl.col("rank").is_not_null() & pl.col("sm_active").is_not_null())
        .select("rank", "source", "device").unique().sort("source", "device").unique("rank", keep="first")
    )
    windows = frames["steps"].select("rank", "step", "start_ns", "end_ns").join(gpus, on="rank", how="inner")
    measured = sm_active_in_windows(frames, windows, "sm_active").filter(
        pl.col("sm_active_covered_ns") >= min_coverage * (pl.col("end_ns") - pl.col("start_ns"))
    )
    return measured.group_by("rank").agg(pl.col("sm_active").median().alias("u_sm_measured")).select(
        pl.col("rank").cast(pl.Int32), "u_sm_measured")


@detector("busy_wait", settings=BusyWaitConfig, requires=("kernels",))
def detect(ctx: JobContext, cfg: BusyWaitConfig) -> list[Finding]:
    frames = ctx.frames
    ta = ctx
    steps = require_steps(ta)
    if ta.match.kernels.height == 0:
        raise Skip("no NCCL/RCCL kernels in the traces: no waiting to measure")
    u = utilization_table(steps)
    # Measured SM Active replaces the blocks-per-SM estimate of U_SM where the job has it.
    u = u.join(measured_u_sm(frames), on="rank", how="left").with_columns(
        pl.when(pl.col("u_sm_measured").is_not_null()).then(pl.lit("sm_active")).otherwise(pl.lit("blocks_estimate"))
        .alias("u_sm_source"),
        pl.coalesce("u_sm_measured", "u_sm").alias("u_sm"),
    )
    rule1 = (pl.col("u_any") >= cfg.min_util_any) & (pl.col("w") >= cfg.min_wait)
    gap = pl.col("u_any") - pl.col("u_compute")
    rule2 = (gap >= cfg.min_gap) & (pl.col("w") >= cfg.min_wait_share_of_gap * gap) & (pl.col("w") >= cfg.min_wait_floor)
    flagged = u.filter(rule1 | rule2)
    if flagged.height == 0:
        return []
    ranks = [int(r) for r in flagged["rank"].to_list()]
    mk = waits_by_culprit(ta.match).filter(pl.col("rank").is_in(ranks))
    waited_for = mk.group_by("last_rank").agg(pl.col("wait_ns").sum()).sort(["wait_ns", "last_rank"], descending=[True, False])
    top_for = [int(r) for r in waited_for["last_rank"].head(5).to_list()]
    per_pair = (
        mk.group_by("rank", "last_rank").agg(pl.col("wait_ns").sum()).sort(["wait_ns", "last_rank"], descending=[True, False])
        .unique("rank", keep="first").sort("rank")
    )
    pair_d = {int(r): (int(q), w) for r, q, w in per_pair.iter_rows()}
    med = flagged.select(pl.col("u_any", "u_compute", "u_sm", "w").median()).row(0, named=True)
    sources = set(flagged["u_sm_source"].to_list())
    sm_source = sources.pop() if len(sources) == 1 else "mixed"
    sm_text = {"sm_active": "measured SM Active", "blocks_estimate": "SM-weighted estimate"}.get(sm_source, "SM Active or estimate")
    evidence = tuple(
        {"rank": int(r), "host": h, "U_any": round(a, 4), "U_compute": round(c, 4), "U_SM": round(sm, 4),
         "W": round(w, 4), "U_SM_source": src, "waited_for": pair_d.get(int(r), (None, 0))[0],
         "waited_for_ms": ms(pair_d.get(int(r), (None, 0))[1])}
        for r, h, a, c, sm, w, src in flagged.sort("w", descending=True)
        .select("rank", "host", "u_any", "u_compute", "u_sm", "w", "u_sm_source").head(EVIDENCE_CAP).iter_rows()
    )
    total_wait = float(flagged["wait_ns"].sum())
    hosts = tuple(sorted({h for h in flagged["host"].to_list() if h}))
    return [Finding(
        detector="busy_wait",
        severity=Severity.CRITICAL if med["w"] >= cfg.critical_wait else Severity.WARNING,
        title=f"GPU utilization inflated by NCCL busy-waiting on {len(ranks)} rank(s)",
        summary=(
            f"{len(ranks)} rank(s) look {med['u_any']:.0%} busy (what nvidia-smi shows), but compute runs only "
            f"{med['u_compute']:.0%} of the step ({sm_text} {med['u_sm']:.0%}); {med['w']:.0%} of the step is NCCL "
            f"kernels spinning while waiting, mostly for rank(s) {', '.join(map(str, top_for)) or 'unknown'}. "
            "The lost time is counted in the straggler/bubble finding for the waited-for rank."
        ),
        remediation=(
            "Treat GPU utilization as 'some kernel was running', not as work done. Fix the rank(s) waited for "
            f"({', '.join(map(str, top_for)) or 'see straggler findings'}); see the straggler finding for its cause."
        ),
        ranks=tuple(ranks),
        hosts=hosts,
        metrics={
            "U_any": round(med["u_any"], 4), "U_compute": round(med["u_compute"], 4), "U_SM": round(med["u_sm"], 4),
            "U_SM_source": sm_source,
            "wait_fraction": round(med["w"], 4), "wait_gpu_seconds": gpu_seconds(total_wait),
            "waited_for": ",".join(map(str, top_for)), "ranks_affected": len(ranks),
        },
        evidence=evidence,
        gpu_seconds_lost=None,
        fraction_of_step=round(med["w"], 4),
        key="busy_wait",
        confidence="high",
    )]
