"""diff.html: the verdict of `forensics diff`, where the delta comes from, and what changed, on one page.

Laid out by templates/diff.html.j2 with autoescaping on (run, kernel and finding names are text, never
markup); the one figure goes through plotly.io and plotly.js is inlined once: the page works offline.
"""

from __future__ import annotations

import plotly.graph_objects as go
from forensics.reports.html import ENV, figure_html
from plotly.offline import get_plotlyjs

from forensics import __version__
from forensics.diff import RunDiff


def contributors_figure(d: RunDiff) -> go.Figure | None:
    """A waterfall from BASE's mean step to NEW's: one bar per part of the delta (they add up)."""
    if not d.contributors:
        return None
    parts = d.contributors
    fig = go.Figure(go.Waterfall(
        x=["BASE step", *[p["what"] for p in parts], "NEW step"],
        y=[round(d.base.step_ms, 3), *[p["delta_ms"] for p in parts], round(d.new.step_ms, 3)],
        measure=["absolute", *["relative"] * len(parts), "total"],
        hovertemplate="%{x}: %{y:.3f} ms<extra></extra>",
    ))
    fig.update_layout(yaxis_title="ms per step (mean over ranks and steps)", showlegend=False, height=380,
                      margin={"t": 20, "b": 120, "l": 60, "r": 10})
    return fig


def render(d: RunDiff) -> str:
    fig = contributors_figure(d)
    return ENV.get_template("diff.html.j2").render(
        d=d, version=__version__,
        figure=figure_html(fig, "fig-delta") if fig is not None else None,
        plotly_js=get_plotlyjs() if fig is not None else None,
    )
