"""The `op-categories` view: where each rank's step time goes, by op category, and the ops behind it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.figures import Figure
from forensics.reports.view import View

from forensics.facts.op_categories import CATEGORIES

if TYPE_CHECKING:
    from forensics.pipeline import Analysis

MAX_BARS = 64
"""Above this many ranks the bars are per host (mean over its ranks), so the figure stays readable and small."""
TOP_OPS = 30


def per_step_ms(categories: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """Median over steps of each category's time (ms), per rank, or per host when there are many ranks."""
    med = categories.group_by("rank", "host", "category").agg((pl.col("time_ns").median() / 1e6).alias("ms"))
    if med["rank"].n_unique() <= MAX_BARS:
        return med.with_columns(pl.col("rank").cast(pl.String).alias("who")).sort("rank"), "rank"
    by_host = med.group_by("host", "category").agg(pl.col("ms").mean())
    return by_host.with_columns(pl.col("host").fill_null("?").alias("who")).sort("who"), "host"


def top_ops(attribution: pl.DataFrame, n: int = TOP_OPS) -> pl.DataFrame:
    """The ops with the most kernel time over all ranks: category, op, ranks, kernels, total and per-rank ms."""
    return (
        attribution.group_by("category", "op")
        .agg(
            pl.col("rank").n_unique().alias("ranks"),
            pl.col("kernels").sum().alias("kernels"),
            (pl.col("time_ns").sum() / 1e6).round(3).alias("total_ms"),
        )
        .with_columns((pl.col("total_ms") / pl.col("ranks")).round(3).alias("ms_per_rank"))
        .sort(["total_ms", "category", "op"], descending=[True, False, False], nulls_last=True)
        .head(n)
    )


def op_categories_view(analysis: Analysis) -> View:
    ctx = analysis.context
    view = View("op-categories", "Where the step time goes, by op category",
                "Compare each bar's split with its peers'; idle or NCCL growing at the expense of GEMM is the cost.")
    cats = ctx.categories
    if cats.height == 0:
        view.empty_reason = "no GPU kernels inside steps"
        return view
    data, who = per_step_ms(cats)
    fig = Figure()
    present = set(data["category"].to_list())
    for cat in [c for c in CATEGORIES if c in present]:
        part = data.filter(pl.col("category") == cat)
        fig.add_bar(x=part["who"].to_list(), y=part["ms"].round(3).to_list(), name=cat)
    fig.update_layout(barmode="stack", xaxis_title=who, yaxis_title="ms per step (median)",
                      margin=dict(t=30, b=40, l=50, r=10))
    view.figures.append(fig)
    view.tables.append((f"Top {TOP_OPS} ops by GPU kernel time (all ranks)", top_ops(ctx.op_attribution)))
    view.tables.append(throughput_table(ctx.op_throughput))
    return view


def throughput_table(tp: pl.DataFrame) -> tuple[str, pl.DataFrame]:
    """GEMM / attention shapes by kernel time, with achieved TFLOP/s against the device's dense peak."""
    if tp.height == 0:
        return ("Achieved TFLOP/s: the trace recorded no input shapes of GEMM or attention ops "
                "(profile with record_shapes=True); not guessed", pl.DataFrame())
    table = tp.head(TOP_OPS).select(
        "op", "shapes", "dtype", "device", "calls",
        (pl.col("kernel_ns") / 1e6).round(3).alias("kernel_ms"),
        pl.col("tflops").round(2), pl.col("peak_tflops"),
        (pl.col("efficiency") * 100).round(1).alias("pct_of_peak"),
    )
    return (f"Achieved TFLOP/s of the GEMM and attention shapes with the most kernel time (top {TOP_OPS}); "
            "peak = the device's dense tensor-core figure for the dtype", table)
