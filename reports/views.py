"""The report's views: each one a question about the job, answered from the one JobContext.

A view is data (title, one-line caption of what to look for, plotly figures, small tables); the HTML
template lays them out, so a view never writes markup and every number it shows comes from the
context's cached facts (no second copy of a join, so no two views disagree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import polars as pl

from forensics.tables import kernel_table

if TYPE_CHECKING:
    from forensics.analyze import Analysis


@dataclass
class View:
    id: str
    """HTML anchor (findings link to it), e.g. ``step-anatomy``."""
    title: str
    caption: str
    """One line: what to look for in it."""
    figures: list[go.Figure] = field(default_factory=list)
    tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)
    """(caption, small aggregate frame) pairs, shown sortable; never raw events."""
    empty_reason: str | None = None
    """Set when the job has nothing to show here (e.g. no kernels): the view says so instead of drawing."""


ViewBuilder = Callable[["Analysis"], View]


def kernel_classes_view(analysis: Analysis) -> View:
    kernels = kernel_table(analysis.context)
    view = View("kernel-classes", "GPU busy time by kernel class",
                "A rank whose bar is taller or differently split than its peers' does different or slower work.")
    if kernels.height == 0:
        view.empty_reason = "no GPU kernels in the inputs"
        return view
    fig = go.Figure()
    for cls in kernels["class"].unique(maintain_order=True).to_list():
        part = kernels.filter(pl.col("class") == cls)
        fig.add_bar(x=[str(r) for r in part["rank"].to_list()], y=part["total_ms"].to_list(), name=str(cls))
    fig.update_layout(barmode="stack", xaxis_title="rank", yaxis_title="ms", margin=dict(t=30, b=40, l=50, r=10))
    view.figures.append(fig)
    return view


VIEWS: list[ViewBuilder] = [kernel_classes_view]
"""In page order. Each builder returns its view, possibly with ``empty_reason`` set; never raises for a
job that lacks its inputs."""


def build_views(analysis: Analysis) -> list[View]:
    return [build(analysis) for build in VIEWS]
