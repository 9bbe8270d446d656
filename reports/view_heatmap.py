"""The rank x step heatmap: step time and exposed communication per rank and step, culprits marked.

Cells are the breakdown's numbers (``JobContext.steps``): ``step_ns`` is the step window
(``JobContext.step_windows``: from the step's start to the next step's start) and exposed
communication is ``comm_exposed_ns + comm_wait_ns`` (NCCL time not hidden under compute: transfer
plus waiting for peers), so the heatmap, the step anatomy and the detectors show one number per cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.figures import Figure, colorscale
from forensics.reports.labels import culprit_ranks, gpu_labels, rank_label
from forensics.reports.view import View, layout

if TYPE_CHECKING:
    from forensics.pipeline import Analysis

CAPTION = ("A row that is hot in step time is a slow rank; a row that is cold in exposed communication while "
           "the others are hot is the rank they wait for (culprits are marked ▶).")


def heatmap_cells(analysis: Analysis) -> pl.DataFrame:
    """rank, gpu, step, step_ms, exposed_comm_ms: one row per (rank, step), sorted by rank then step."""
    steps = analysis.context.steps
    labels = gpu_labels(analysis.context).select("rank", "gpu")
    return steps.select(
        pl.col("rank").cast(pl.Int32), "step",
        (pl.col("step_ns") / 1e6).alias("step_ms"),
        ((pl.col("comm_exposed_ns") + pl.col("comm_wait_ns")) / 1e6).alias("exposed_comm_ms"),
    ).join(labels, on="rank", how="left").select("rank", "gpu", "step", "step_ms", "exposed_comm_ms").sort("rank",
                                                                                                           "step")


def _figure(cells: pl.DataFrame, value: str, title: str, culprits: set[int]) -> Figure:
    wide = cells.pivot(on="step", index=["rank", "gpu"], values=value, sort_columns=True).sort("rank")
    step_cols = [c for c in wide.columns if c not in ("rank", "gpu")]
    y = [("▶ " if r in culprits else "") + rank_label(r, g) for r, g in zip(wide["rank"], wide["gpu"])]
    z = [[None if v is None else round(float(v), 3) for v in row] for row in wide.select(step_cols).iter_rows()]
    vals = cells[value].drop_nulls()
    med = float(vals.median() or 0.0)  # type: ignore[arg-type]
    # colours span at least +-5% of the median: noise of a few tenths of a percent must not look like a signal
    lo, hi = min(float(vals.min()), 0.95 * med), max(float(vals.max()), 1.05 * med)  # type: ignore[arg-type]
    fig = Figure().add_heatmap(
        z=z, x=[f"step {c}" for c in step_cols], y=y, colorscale=colorscale("Viridis"), colorbar=dict(title="ms"),
        zmin=max(0.0, lo), zmax=hi,
        hovertemplate="%{y}<br>%{x}<br>%{z:.3f} ms<extra></extra>",
    )
    height = min(900, max(260, 14 * len(y) + 80))
    layout(fig, title=title, height=height)
    fig.update_yaxes(autorange="reversed", showticklabels=len(y) <= 64)
    return fig


def rank_step_heatmap_view(analysis: Analysis) -> View:
    view = View("rank-step-heatmap", "Step time per rank and step", CAPTION)
    cells = heatmap_cells(analysis)
    if cells.height == 0:
        view.empty_reason = "no GPU kernels with a known rank to measure steps against"
        return view
    culprits = set(culprit_ranks(analysis))
    view.figures.append(_figure(cells, "step_ms", "step time (ms)", culprits))
    view.figures.append(_figure(cells, "exposed_comm_ms", "exposed communication: NCCL transfer + wait (ms)", culprits))
    if culprits:
        marked = cells.filter(pl.col("rank").is_in(sorted(culprits)))
        view.tables.append(("Culprit ranks (straggler findings), per step", marked.with_columns(
            pl.col("step_ms").round(3), pl.col("exposed_comm_ms").round(3))))
    return view
