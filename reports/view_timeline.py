"""Timeline of one step across ranks on one clock: compute, NCCL per communicator, idle.

The slowest step (largest median step time over ranks) and a median one, for the culprit ranks of the
straggler findings, the median rank and the fastest rank (least compute in that step). Times are put on
the job's common clock by subtracting each rank's offset (``JobContext.clock_offsets``, estimated from
how matched collectives end together; 0 where unknown) and drawn in ms from the earliest shown step start.

Bars are bounded: kernels are merged into contiguous busy intervals per lane (compute; NCCL transfer and
wait per communicator; memcpy/memset), bridging gaps shorter than 1/:data:`RESOLUTION` of the window,
so a lane has at most about :data:`RESOLUTION` bars whatever the number of kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.figures import Figure
from forensics.reports.labels import culprit_ranks, esc, gpu_labels, rank_label
from forensics.reports.view import View, layout

from forensics.base.intervals import merge

if TYPE_CHECKING:
    from forensics.facts.context import JobContext
    from forensics.pipeline import Analysis

RESOLUTION = 400
TABLE_PARTS = ("step", "compute", "comm_wait", "idle")
MAX_CULPRITS = 3
CAPTION = ("Read across: the rank whose compute ends last is the one the others' NCCL 'wait' bars are waiting "
           "for; idle gaps before a rank's kernels point at its host.")
COLORS = {"compute": "#1f77b4", "NCCL transfer": "#2ca02c", "NCCL wait": "#d62728", "memcpy/memset": "#9467bd",
          "idle": "#c7c7c7"}


def pick_steps(ctx: JobContext) -> list[tuple[int, str]]:
    """(step, why): the slowest step by median step time over ranks, then the median step (when different)."""
    med = ctx.steps.group_by("step").agg(pl.col("step_ns").median().alias("m")).sort("m", "step")
    if med.height == 0:
        return []
    slow = int(med["step"][-1])
    mid = int(med["step"][(med.height - 1) // 2])
    return [(slow, "slowest")] + ([(mid, "median")] if mid != slow else [])


def pick_ranks(ctx: JobContext, step: int, culprits: list[int]) -> list[tuple[int, str]]:
    """(rank, role) in display order: culprits, then the median and fastest ranks by compute in ``step``."""
    s = ctx.steps.filter(pl.col("step") == step).sort("compute_ns", "rank")
    if s.height == 0:
        return []
    present = set(s["rank"].to_list())
    out = [(r, "culprit") for r in culprits if r in present][:MAX_CULPRITS]
    ranks = s["rank"].to_list()
    if not out:
        out.append((int(ranks[-1]), "most compute"))
    for r, role in ((ranks[(len(ranks) - 1) // 2], "median"), (ranks[0], "fastest")):
        if int(r) not in {x for x, _ in out}:
            out.append((int(r), role))
    return out


def _offsets(ctx: JobContext, ranks: list[int]) -> pl.DataFrame:
    off = ctx.clock_offsets.by_rank.select(pl.col("rank").cast(pl.Int32), "offset_ns")
    return pl.DataFrame({"rank": ranks}, schema={"rank": pl.Int32}).join(off, on="rank", how="left").with_columns(
        pl.col("offset_ns").fill_null(0))


def _raw_intervals(ctx: JobContext, ranks: list[int]) -> pl.LazyFrame:
    """rank, lane, kind, start_ns, end_ns of the ranks' kernels (rank's own clock): NCCL split in wait/transfer."""
    k = ctx.frames["kernels"].lazy().filter(pl.col("rank").is_in(ranks) & (pl.col("class") != "comm"))
    other = pl.when(pl.col("class") == "compute").then(pl.lit("compute")).otherwise(pl.lit("memcpy/memset"))
    plain = k.select(pl.col("rank").cast(pl.Int32), other.alias("lane"), other.alias("kind"), "start_ns", "end_ns")
    c = ctx.match.kernels.lazy().filter(pl.col("rank").is_in(ranks))
    lane = pl.lit("NCCL ") + pl.col("pg_type") + pl.lit(" pg ") + pl.col("pg_name").fill_null("?")
    split = pl.col("start_ns") + pl.col("wait_ns")
    wait = c.select(pl.col("rank").cast(pl.Int32), lane.alias("lane"), pl.lit("NCCL wait").alias("kind"),
                    "start_ns", split.alias("end_ns"))
    tx = c.select(pl.col("rank").cast(pl.Int32), lane.alias("lane"), pl.lit("NCCL transfer").alias("kind"),
                  split.alias("start_ns"), "end_ns")
    return pl.concat([plain, wait, tx], how="vertical").filter(pl.col("end_ns") > pl.col("start_ns"))


def step_intervals(ctx: JobContext, step: int, ranks: list[int]) -> pl.DataFrame:
    """rank, lane, kind, start_ns, end_ns on the common clock, clipped to each rank's window of ``step``, merged
    per (rank, lane, kind) with gaps under 1/RESOLUTION of the longest window bridged; ``idle`` lanes are the
    window's gaps of the union of all kernels (at least that long)."""
    win = ctx.step_windows.filter((pl.col("step") == step) & pl.col("rank").is_in(ranks)).select(
        pl.col("rank").cast(pl.Int32), "w_start", "w_end")
    if win.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "lane": pl.String, "kind": pl.String,
                                    "start_ns": pl.Int64, "end_ns": pl.Int64})
    tol = max(1, int((win["w_end"] - win["w_start"]).max() or 0) // RESOLUTION)
    # One lazy query, collected once: the frames are small, each eager step would cost more than its work.
    wl = win.lazy()
    raw = _raw_intervals(ctx, ranks).join(wl, on="rank").filter(
        (pl.col("start_ns") < pl.col("w_end")) & (pl.col("end_ns") > pl.col("w_start"))
    ).with_columns(pl.max_horizontal("start_ns", "w_start").alias("start_ns"),
                   pl.min_horizontal("end_ns", "w_end").alias("end_ns"))
    busy = merge(raw.with_columns(pl.col("end_ns") + tol), ["rank", "lane", "kind"]).with_columns(
        pl.col("end_ns") - tol)
    union = merge(raw, ["rank"])
    # ties are equal rows (rank, start, end): their order changes nothing
    edges = pl.concat([union, wl.select("rank", pl.col("w_start").alias("start_ns"), pl.col("w_start").alias("end_ns")),
                       wl.select("rank", pl.col("w_end").alias("start_ns"), pl.col("w_end").alias("end_ns"))],
                      how="vertical").sort("rank", "start_ns", "end_ns", maintain_order=True)
    idle = edges.select("rank", pl.col("end_ns").cum_max().over("rank").alias("start_ns"),
                        pl.col("start_ns").shift(-1).over("rank").alias("end_ns")).filter(
        pl.col("end_ns") - pl.col("start_ns") >= tol).with_columns(pl.lit("idle").alias("lane"),
                                                                   pl.lit("idle").alias("kind"))
    out = pl.concat([busy.select("rank", "lane", "kind", "start_ns", "end_ns"),
                     idle.select("rank", "lane", "kind", "start_ns", "end_ns")], how="vertical")
    off = _offsets(ctx, ranks).lazy()
    return out.join(off, on="rank").select("rank", "lane", "kind", pl.col("start_ns") - pl.col("offset_ns"),
                                           pl.col("end_ns") - pl.col("offset_ns")).sort("rank", "lane",
                                                                                        "start_ns").collect()


def _figure(iv: pl.DataFrame, ranks: list[tuple[int, str]], labels: dict[int, str], title: str) -> Figure:
    t0 = int(iv["start_ns"].min() or 0)  # type: ignore[arg-type]
    order = {r: i for i, (r, _) in enumerate(ranks)}
    role = dict(ranks)
    iv = iv.with_columns(
        pl.col("rank").replace_strict(order, return_dtype=pl.Int64).alias("_o"),
        ((pl.col("start_ns") - t0) / 1e6).alias("s_ms"), ((pl.col("end_ns") - pl.col("start_ns")) / 1e6).alias("d_ms"),
    )
    lanes = iv.select("rank", "lane", "_o").unique().sort("_o", "lane")
    name = {(r, ln): f"{role[r]} {rank_label(r, labels.get(r))} · {esc(ln)}" for r, ln, _ in lanes.iter_rows()}
    fig = Figure()
    for kind, color in COLORS.items():
        part = iv.filter(pl.col("kind") == kind)
        if part.height == 0:
            continue
        fig.add_bar(y=[name[(r, ln)] for r, ln in zip(part["rank"], part["lane"])], x=part["d_ms"].round(4).to_list(),
                    base=part["s_ms"].round(4).to_list(), orientation="h", name=kind, marker_color=color,
                    hovertemplate="%{y}<br>%{base:.3f} ms + %{x:.3f} ms<extra>" + kind + "</extra>")
    layout(fig, title=title, barmode="overlay", xaxis_title="ms from the earliest step start (common clock)",
           height=max(240, 22 * len(name) + 110))
    fig.update_yaxes(categoryorder="array", categoryarray=list(name.values())[::-1])
    return fig


def _step_sums(ctx: JobContext, step: int, ranks: list[int]) -> dict[int, dict[str, int]]:
    """rank -> {part: ns} of ``step`` (the breakdown's step, compute, comm_wait and idle time), one query."""
    b = ctx.steps.filter((pl.col("step") == step) & pl.col("rank").is_in(ranks))
    sums = b.group_by("rank").agg([pl.col(f"{c}_ns").sum().alias(c) for c in TABLE_PARTS])
    return {int(row.pop("rank")): row for row in sums.iter_rows(named=True)}


def timeline_view(analysis: Analysis) -> View:
    view = View("timeline", "Timeline of the slowest and a median step, on one clock", CAPTION)
    ctx = analysis.context
    steps = pick_steps(ctx)
    if not steps:
        view.empty_reason = "no GPU kernels with a known rank to draw a step from"
        return view
    labels = dict(gpu_labels(ctx).select("rank", "gpu").iter_rows())
    culprits = culprit_ranks(analysis)
    rows: list[dict[str, object]] = []
    shown: set[int] = set()
    for step, why in steps:
        ranks = pick_ranks(ctx, step, culprits)
        iv = step_intervals(ctx, step, [r for r, _ in ranks])
        if iv.height:
            view.figures.append(_figure(iv, ranks, labels, f"{why} step {step}" if step >= 0 else "whole trace"))
        sums = _step_sums(ctx, step, [r for r, _ in ranks])
        for r, role in ranks:
            shown.add(r)
            rows.append({"step": step, "which": why, "rank": r, "role": role, "gpu": labels.get(r)} | {
                f"{c}_ms": round(float(sums.get(r, {}).get(c, 0)) / 1e6, 3) for c in TABLE_PARTS})
    off = _offsets(ctx, sorted(shown))
    table = pl.DataFrame(rows).with_columns(pl.col("rank").cast(pl.Int32)).join(off, on="rank", how="left")
    view.tables.append(("Ranks shown (ms in that step; clock offset subtracted, ms)", table.with_columns(
        (pl.col("offset_ns") / 1e6).round(3).alias("clock_offset_ms")).drop("offset_ns")))
    return view
