"""diff.html: the verdict of `forensics diff`, where the delta comes from, and what changed, on one page.

Laid out by templates/diff.html.j2 with autoescaping on (run, kernel and finding names are text, never
markup); the one figure is written by :func:`forensics.reports.figures.figure_html` (a plain
:class:`~forensics.reports.figures.Figure`: no plotly graph objects, validators or narwhals to import) and
plotly.js is inlined once: the page works offline.
"""

from __future__ import annotations

from forensics.reports.figures import Figure
from forensics.reports.html import ENV, figure_html
from plotly.offline import get_plotlyjs

from forensics import __version__
from forensics.diff import RunDiff


def contributors_figure(d: RunDiff) -> Figure | None:
    """A waterfall from BASE's median step through each part of the median delta (the medians with the rest
    they leave add up to it) to BASE + the median delta."""
    if not d.contributors or d.base_side is None:
        return None
    parts = d.contributors
    # keys in the order of plotly's validated JSON (the template first), so the page's bytes are what the
    # go.Figure it replaces gave
    fig = Figure().update_layout(template="plotly_white").add_trace(
        "waterfall",
        hovertemplate="%{x}: %{y:.3f} ms<extra></extra>",
        measure=["absolute", *["relative"] * len(parts), "total"],
        x=["BASE step", *[p["what"] for p in parts], "BASE + median delta"],
        y=[d.base_side.step_ms, *[p["delta_ms"] for p in parts], 0.0],
    )
    fig.update_layout(margin={"t": 20, "b": 120, "l": 60, "r": 10},
                      yaxis_title="ms per step (median over the aligned steps)", showlegend=False, height=380)
    return fig


def render(d: RunDiff) -> str:
    fig = contributors_figure(d)
    return ENV.get_template("diff.html.j2").render(
        d=d, version=__version__,
        figure=figure_html(fig, "fig-delta") if fig is not None else None,
        plotly_js=get_plotlyjs() if fig is not None else None,
    )
