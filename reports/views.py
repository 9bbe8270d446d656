"""The report's views: each one a question about the job, answered from the one JobContext.

A view is data (title, one-line caption of what to look for, plotly figures, small tables); the HTML
template lays them out, so a view never writes markup and every number it shows comes from the
context's cached facts (no second copy of a join, so no two views disagree). One module per view
(``reports/view_*.py``); :data:`VIEWS` lists them in page order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.figures import Figure
from forensics.reports.view import View
from forensics.reports.view_anatomy import step_anatomy_view
from forensics.reports.view_categories import op_categories_view
from forensics.reports.view_collectives import collectives_view
from forensics.reports.view_hang import hang_view
from forensics.reports.view_heatmap import rank_step_heatmap_view
from forensics.reports.view_hwevents import hw_events_view
from forensics.reports.view_ncclconfig import nccl_config_view
from forensics.reports.view_timeline import timeline_view

from forensics.detectors import load_all

if TYPE_CHECKING:
    from forensics.facts.context import JobContext
    from forensics.pipeline import Analysis

__all__ = ["VIEWS", "View", "ViewBuilder", "build_views", "view_for"]

ViewBuilder = Callable[["Analysis"], View]


def kernel_table(ctx: JobContext) -> pl.DataFrame:
    """Per rank and kernel class: count and total busy milliseconds."""
    kernels = ctx.frames["kernels"].select("rank", "class", "start_ns", "end_ns")  # a narrow frame groups 4x faster
    return (
        kernels.group_by("rank", "class")
        .agg(pl.len().alias("count"), ((pl.col("end_ns") - pl.col("start_ns")).sum() / 1e6).alias("total_ms"))
        .sort("rank", "class", nulls_last=True)
    )


def kernel_classes_view(analysis: Analysis) -> View:
    kernels = kernel_table(analysis.context)
    view = View("kernel-classes", "GPU busy time by kernel class",
                "A rank whose bar is taller or differently split than its peers' does different or slower work.")
    if kernels.height == 0:
        view.empty_reason = "no GPU kernels in the inputs"
        return view
    fig = Figure()
    for cls in kernels["class"].unique(maintain_order=True).to_list():
        part = kernels.filter(pl.col("class") == cls)
        fig.add_bar(x=[str(r) for r in part["rank"].to_list()], y=part["total_ms"].to_list(), name=str(cls))
    fig.update_layout(barmode="stack", xaxis_title="rank", yaxis_title="ms", margin=dict(t=30, b=40, l=50, r=10))
    view.figures.append(fig)
    return view


VIEWS: list[ViewBuilder] = [
    step_anatomy_view, op_categories_view, rank_step_heatmap_view, timeline_view, collectives_view, hw_events_view,
    nccl_config_view, kernel_classes_view, hang_view,
]
"""In page order. Each builder returns its view, possibly with ``empty_reason`` set; never raises for a
job that lacks its inputs."""


def build_views(analysis: Analysis) -> list[View]:
    return [build(analysis) for build in VIEWS]


def view_for(detector: str) -> str | None:
    """Anchor of the view that shows ``detector``'s evidence, as the detector declares it; None when no view does."""
    spec = load_all().get(detector)
    return spec.view if spec else None
