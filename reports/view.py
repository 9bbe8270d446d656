"""One view of the report (a section of report.html: figures and small tables over one side of the job), and
the figure layout the views share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl
from forensics.reports.figures import Figure


@dataclass
class View:
    """One view of the report (re-exported by :mod:`forensics.reports.views`)."""

    id: str
    """HTML anchor (findings link to it), e.g. ``step-anatomy``."""
    title: str
    caption: str
    """One line: what to look for in it."""
    figures: list[Figure] = field(default_factory=list)
    tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)
    """(caption, small aggregate frame) pairs, shown sortable; never raw events."""
    empty_reason: str | None = None
    """Set when the job has nothing to show here (e.g. no kernels): the view says so instead of drawing."""


MARGIN = dict(t=30, b=40, l=60, r=10)


def layout(fig: Figure, **kw: Any) -> Figure:
    fig.update_layout(margin=MARGIN, legend=dict(orientation="h", y=-0.2), **kw)
    return fig
