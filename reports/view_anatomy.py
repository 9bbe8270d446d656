"""Step anatomy: per rank, where the mean step went (compute, overlapped and exposed comm per PG type, idle).

Every bar is the breakdown (``JobContext.steps``) averaged over the rank's steps, split so the segments
add up to the mean step exactly:

* ``compute`` = compute time with no NCCL transfer under it, ``overlapped comm`` = NCCL transfer under
  compute (the two add up to the breakdown's ``compute_ns``);
* ``exposed <PG>`` (NCCL transfer not under compute) and ``wait <PG>`` (NCCL kernels waiting for a peer)
  per process-group type: the breakdown's ``comm_exposed_ns`` / ``comm_wait_ns`` split in proportion to
  the per-type ``exposed_<PG>_ns`` / ``wait_<PG>_ns`` (they overlap only when two types run at once);
* ``other`` (memcpy/memset) and ``idle`` (no kernel).

At more than :data:`MAX_RANK_BARS` ranks the bars are per host (mean over the host's ranks), and the
outlier ranks (culprits of the straggler findings, then the ranks furthest from the median step or
compute) keep bars of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.figures import Figure
from forensics.reports.labels import culprit_ranks, esc, gpu_labels, rank_label
from forensics.reports.view import View, layout

from forensics.facts.collectives import PG_TYPES

if TYPE_CHECKING:
    from forensics.pipeline import Analysis

MAX_RANK_BARS = 64
MAX_OUTLIERS = 16
OUTLIER_Z = 3.5
CAPTION = ("A bar that is taller, or has more compute and less wait than its peers, is the rank the others wait "
           "for; long 'wait' segments on every other bar are the time lost to it.")


def _share(part: str, parts: list[str], total: str) -> pl.Expr:
    """``total`` split in proportion to ``part`` among ``parts`` (0 when they are all 0)."""
    s = pl.sum_horizontal([pl.col(p) for p in parts])
    return pl.when(s > 0).then(pl.col(total) * pl.col(part) / s).otherwise(0.0)


def anatomy_segments(analysis: Analysis) -> tuple[pl.DataFrame, list[str]]:
    """Per rank, mean over its steps, in ms: rank, host, gpu, steps, step_ms and one column per segment
    (the segment names, in stack order, are returned too). Segments add up to ``step_ms``."""
    b = analysis.context.steps
    groups = [g for g in PG_TYPES if f"exposed_{g}_ns" in b.columns
              and (b[f"exposed_{g}_ns"].sum() > 0 or b[f"wait_{g}_ns"].sum() > 0)]
    exp_cols, wait_cols, ovl_cols = ([f"{k}_{g}_ns" for g in groups] for k in ("exposed", "wait", "overlap"))
    per_step = b.with_columns(
        pl.min_horizontal(pl.sum_horizontal([pl.col(c) for c in ovl_cols]) if ovl_cols else pl.lit(0),
                          pl.col("compute_ns")).alias("_ovl"),
        *[_share(f"exposed_{g}_ns", exp_cols, "comm_exposed_ns").alias(f"exposed {g}") for g in groups],
        *[_share(f"wait_{g}_ns", wait_cols, "comm_wait_ns").alias(f"wait {g}") for g in groups],
    ).with_columns((pl.col("compute_ns") - pl.col("_ovl")).alias("compute"), pl.col("_ovl").alias("overlapped comm"),
                   pl.col("other_ns").alias("other"), pl.col("idle_ns").alias("idle"))
    # Without per-type columns (no NCCL kernel typed), exposed and wait still add up.
    if not groups:
        per_step = per_step.with_columns(pl.col("comm_exposed_ns").alias("exposed comm"),
                                         pl.col("comm_wait_ns").alias("comm wait"))
    segs = ["compute", "overlapped comm", *([f"exposed {g}" for g in groups] or ["exposed comm"]),
            *([f"wait {g}" for g in groups] or ["comm wait"]), "other", "idle"]
    table = per_step.group_by("rank").agg(
        pl.len().alias("steps"), (pl.col("step_ns").mean() / 1e6).alias("step_ms"),
        *[(pl.col(s).mean() / 1e6).alias(s) for s in segs],
    ).with_columns(pl.col("rank").cast(pl.Int32))
    table = table.join(gpu_labels(analysis.context), on="rank", how="left")
    return table.select("rank", "host", "gpu", "steps", "step_ms", *segs).sort("rank"), segs


def outlier_ranks(table: pl.DataFrame, culprits: list[int]) -> list[int]:
    """Culprits first, then ranks whose step or compute is at least :data:`OUTLIER_Z` robust z-scores from
    the median (most extreme first), at most :data:`MAX_OUTLIERS` in all; sorted."""
    zs = []
    for col in ("step_ms", "compute"):
        x = pl.col(col)
        # MAD floored at 0.1% of the median: identical peers (MAD 0) still leave a real outlier measurable
        mad = pl.max_horizontal((x - x.median()).abs().median(), 1e-3 * x.median().abs())
        zs.append(pl.when(mad > 0).then(0.6745 * (x - x.median()).abs() / mad).otherwise(0.0))
    z = table.select("rank", pl.max_horizontal(zs).alias("z")).filter(pl.col("z") >= OUTLIER_Z).sort("z",
                                                                                                     descending=True)
    picked = [r for r in culprits if r in set(table["rank"].to_list())]
    picked += [r for r in z["rank"].to_list() if r not in picked]
    return sorted(picked[:MAX_OUTLIERS])


def _bars(table: pl.DataFrame, segs: list[str], culprits: list[int]) -> tuple[pl.DataFrame, str]:
    """The rows to draw, with a ``label``: one per rank, or one per host plus the outlier ranks."""
    if table.height <= MAX_RANK_BARS:
        lab = [("▶ " if r in culprits else "") + rank_label(r, g) for r, g in zip(table["rank"], table["gpu"])]
        return table.with_columns(pl.Series("label", lab, dtype=pl.String)), "rank"
    out = outlier_ranks(table, culprits)
    hosts = table.filter(~pl.col("rank").is_in(out)).group_by("host").agg(
        pl.len().alias("n"), *[pl.col(s).mean() for s in segs]
    ).sort("host").with_columns((pl.col("host").map_elements(esc, return_dtype=pl.String) + " (mean of "
                                 + pl.col("n").cast(pl.String) + " ranks)").alias("label"))
    lone = table.filter(pl.col("rank").is_in(out))
    lab = [("▶ " if r in culprits else "◆ ") + rank_label(r, g) for r, g in zip(lone["rank"], lone["gpu"])]
    rows = pl.concat([lone.with_columns(pl.Series("label", lab, dtype=pl.String)).select("label", *segs),
                      hosts.select("label", *segs)], how="vertical")
    return rows, "host (outlier ranks ◆ and culprits ▶ on their own)"


def step_anatomy_view(analysis: Analysis) -> View:
    view = View("step-anatomy", "Step anatomy: where each rank's step went (mean over steps)", CAPTION)
    if analysis.context.steps.height == 0:
        view.empty_reason = "no GPU kernels with a known rank to measure steps against"
        return view
    table, segs = anatomy_segments(analysis)
    culprits = culprit_ranks(analysis)
    rows, axis = _bars(table, segs, culprits)
    fig = Figure()
    for s in segs:
        if rows[s].sum() > 0:
            fig.add_bar(x=rows["label"].to_list(), y=[round(float(v), 3) for v in rows[s].to_list()], name=s)
    layout(fig, barmode="stack", xaxis_title=axis, yaxis_title="ms per step", height=420)
    fig.update_xaxes(type="category", showticklabels=rows.height <= 96)
    view.figures.append(fig)
    shown = table.with_columns([pl.col(c).round(3) for c in ["step_ms", *segs]])
    view.tables.append(("Per rank, mean over steps (ms); segments add up to step_ms", shown))
    return view
