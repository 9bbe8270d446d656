"""Per rank and step: where the step time went, by interval algebra on the GPU timeline.

Step windows, on the GPU execution timeline (without profiler steps, one window per rank over all its
GPU activity, step -1): a kernel belongs to the step whose ``ProfilerStep#N`` CPU range launched it
(launch -> kernel correlation), and is placed by its own GPU time. Per rank, step N's window starts at
the later of its CPU start and the end of the GPU work of the steps before it (a GPU running behind the
CPU is still busy with them), never after its own first kernel, and runs to the next step's window; the
last step ends at the later of its last kernel and its CPU end (GPU work launched after it belongs to no
step). So the idle time before a step's first kernel (data loading) stays in that step, and a GPU that
lags the CPU by tens of ms is measured on its own time. Kernels are cut to the windows. Within a window
every instant is put in exactly one bucket, by priority:

``compute`` (any compute kernel) > ``comm_exposed`` (NCCL transfer, not hidden by compute) >
``comm_wait`` (NCCL kernel waiting for a peer, see :mod:`forensics.facts.collectives`) > ``other``
(memcpy/memset only) > ``idle`` (no kernel), so the five add up to ``step_ns``. ``host_bound_ns`` is
the part of ``idle`` before a kernel whose launch call began only after the GPU had gone idle (the
GPU was starved by the host: HTA's host-wait rule, measured from the launch time).

Per PG type ``g`` (DP, TP, PP, EP, CP, default): ``tx_g`` (transfer union), ``wait_g``,
``exposed_g`` (transfer not under compute), ``overlap_g`` (transfer under compute).
Pipeline view: ``bubble_wait_ns`` (only PP kernels, waiting or moving) and ``bubble_idle_ns``
(nothing running; this includes host-bound idle, because a host blocked in a pipeline flush or sync
launches late for reasons the GPU timeline cannot tell from a slow host); both leave out gaps between
compute kernels shorter than :data:`LAUNCH_GAP_NS` (launch overhead: a recv spinning on another stream
across them does not make them pipeline waits); ``busy_wait_ns`` (only non-PP NCCL kernels waiting: the GPU
looks busy but does nothing). ``u_sm_ns``: kernel time weighted by the share of SMs the kernel's
blocks can occupy (``min(1, blocks / SMs)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from forensics.base.frames import JobFrames
from forensics.base.intervals import clip_to_disjoint_windows, mask_lengths, merge
from forensics.facts.collectives import (
    PG_TYPES,
    CollectiveMatch,
    attach_steps,
    effective_steps,
    launch_times,
    match_collectives,
)

COMPUTE = 1
OTHER = 2
HOST = 1 << 16
WINDOW = 1 << 17
SHORT_GAP = 1 << 18
LAUNCH_GAP_NS = 10_000
"""A gap between two compute kernels shorter than this is launch overhead (the next kernel was queued and
started as soon as the GPU could take it), not a pipeline bubble: no P2P wait is that short."""
TX = {g: 4 << (2 * i) for i, g in enumerate(PG_TYPES)}
WAIT = {g: 8 << (2 * i) for i, g in enumerate(PG_TYPES)}
ALL_TX = sum(TX.values())
ALL_WAIT = sum(WAIT.values())
KERNEL_BITS = COMPUTE | OTHER | ALL_TX | ALL_WAIT
NON_PP_COMM = (ALL_TX | ALL_WAIT) & ~(TX["PP"] | WAIT["PP"])


@dataclass(frozen=True)
class Breakdown:
    steps: pl.DataFrame  # one row per (rank, step)
    collectives: CollectiveMatch
    windows: pl.DataFrame  # rank, host, step, w_start, w_end: the measured step windows (ns)


def _has(bits: int) -> pl.Expr:
    return (pl.col("mask") & bits) != 0


def _none(bits: int) -> pl.Expr:
    return (pl.col("mask") & bits) == 0


# a function, not a constant: importing this module runs no Polars code (`forensics rules`, frames.Dtype)
def window_schema() -> dict[str, type[pl.DataType]]:
    return {"rank": pl.Int32, "host": pl.String, "step": pl.Int64, "w_start": pl.Int64, "w_end": pl.Int64}


def step_windows(frames: JobFrames, kernels: pl.DataFrame) -> pl.DataFrame:
    """Per rank and step: ``w_start``, ``w_end`` on the GPU timeline (see module doc).

    ``kernels`` carry ``step`` (the step that launched them, :func:`forensics.facts.collectives.attach_steps`).
    A step starts when its ProfilerStep began on the CPU, or later if the GPU was still running earlier
    work then, and never after its own first kernel; it ends where the next one starts, the last one at
    the later of its last kernel and its CPU end.
    """
    steps = effective_steps(frames).sort("rank", "start_ns")
    if steps.height == 0:
        return pl.DataFrame(schema=window_schema())
    own = kernels.filter(pl.col("step").is_not_null())
    per_step = own.group_by("rank", "step").agg(
        pl.col("start_ns").min().alias("_kfirst"), pl.col("end_ns").max().alias("_klast"))
    # GPU work launched before the first profiled step (no launch in the trace) still delays it.
    first_own = own.group_by("rank").agg(pl.col("start_ns").min().alias("_first_own"))
    before = (
        kernels.filter(pl.col("step").is_null()).join(first_own, on="rank", how="inner")
        .filter(pl.col("start_ns") < pl.col("_first_own"))
        .group_by("rank").agg(pl.col("end_ns").max().alias("_pre_end"))
    )
    prev_end = pl.max_horizontal(pl.col("_klast").cum_max().forward_fill().shift(1), pl.col("_pre_end")).over(
        "rank", order_by="start_ns")
    w = (
        steps.group_by("rank", "step")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.col("host").first())
        .join(per_step, on=["rank", "step"], how="left")
        .join(before, on="rank", how="left")
        .sort("rank", "start_ns")
        .with_columns(prev_end.alias("_prev_end"))
        .with_columns(
            pl.min_horizontal("_kfirst", pl.max_horizontal("start_ns", "_prev_end")).cum_max().over(
                "rank", order_by="start_ns").alias("w_start")
        )
    )
    return w.select(
        "rank",
        "host",
        "step",
        "w_start",
        pl.coalesce(pl.col("w_start").shift(-1).over("rank", order_by="start_ns"),
                    pl.max_horizontal("_klast", "end_ns")).alias("w_end"),
    ).filter(pl.col("w_end") > pl.col("w_start")).cast(window_schema())  # type: ignore[arg-type]


def compute_breakdown(frames: JobFrames, match: CollectiveMatch | None = None,
                      launches: pl.DataFrame | None = None) -> Breakdown:
    """The per (rank, step) breakdown frame; ``match`` and ``launches`` (:func:`launch_times`) are reused when
    the caller already has them."""
    launches = launch_times(frames) if launches is None else launches
    match = match if match is not None else match_collectives(frames, launches)
    kern = _kernels_with_launch_and_sm_share(frames, launches)
    windows = step_windows(frames, kern)
    intervals = _labelled_intervals(kern, match, windows)
    wcols = windows.select("rank", "step", "w_start", "w_end")
    # linear in the intervals however many steps (windows are disjoint); only integer sums follow, so the row
    # order it gives changes nothing
    clipped = clip_to_disjoint_windows(intervals.lazy(), wcols, on=["rank"])
    masks = mask_lengths(clipped.select("rank", "step", "start_ns", "end_ns", "bit"), ["rank", "step"]).filter(
        _has(WINDOW)
    )
    table = masks.group_by("rank", "step").agg(_bucket_aggs()).collect()

    # a float sum: its terms are summed in one fixed order (time within each step), whichever order the clip gives
    usm = (
        clip_to_disjoint_windows(kern.select("rank", "start_ns", "end_ns", "_sm_share").lazy(), wcols, on=["rank"])
        .sort("rank", "step", "start_ns", "end_ns", "_sm_share", maintain_order=True)  # ties: equal terms
        .group_by("rank", "step", maintain_order=True)
        .agg(((pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64) * pl.col("_sm_share")).sum().alias("u_sm_ns"))
        .collect()
    )
    table = (
        windows.select("rank", "host", "step")
        .join(table, on=["rank", "step"], how="inner")
        .join(usm, on=["rank", "step"], how="left")
        .with_columns(
            pl.min_horizontal(
                pl.col("u_sm_ns").fill_null(0.0), (pl.col("step_ns") - pl.col("idle_ns")).cast(pl.Float64)
            ).alias("u_sm_ns")
        )
        .sort("rank", "step")
    )
    return Breakdown(table, match, windows)


def _kernels_with_launch_and_sm_share(frames: JobFrames, launches: pl.DataFrame) -> pl.DataFrame:
    """Ranked kernels with their launch time (``launch_ns``), step (by launch time) and SM share."""
    # only the columns the breakdown reads: the rank lists and strings of the rest cost memory at every
    # join and sort (measured: 0.6 GB for the 722k kernels of a 1,024-rank job)
    cols = ["rank", "correlation", "start_ns", "end_ns", "class", "blocks_per_sm", "grid_x", "grid_y", "grid_z"]
    kern = attach_steps(frames, frames["kernels"].select(cols).filter(pl.col("rank").is_not_null()), launches)
    sm = frames["ranks"].group_by("rank").agg(pl.col("sm_count").max())
    return kern.join(sm, on="rank", how="left").with_columns(
        pl.coalesce(
            pl.col("blocks_per_sm"),
            (pl.col("grid_x") * pl.col("grid_y").fill_null(1) * pl.col("grid_z").fill_null(1)).cast(pl.Float64)
            / pl.col("sm_count").cast(pl.Float64),
        )
        .clip(upper_bound=1.0)
        .fill_null(1.0)
        .alias("_sm_share")
    )


def _labelled_intervals(kern: pl.DataFrame, match: CollectiveMatch, windows: pl.DataFrame) -> pl.DataFrame:
    """Every interval with its bit: kernels, NCCL transfer and wait parts, host-bound gaps, step windows and
    short launch gaps (rank, start_ns, end_ns, bit)."""
    base = ["rank", "start_ns", "end_ns", "bit"]
    non_comm = kern.filter(pl.col("class") != "comm").select(
        "rank", "start_ns", "end_ns",
        pl.when(pl.col("class") == "compute").then(pl.lit(COMPUTE)).otherwise(pl.lit(OTHER))
        .cast(pl.Int64).alias("bit"),
    )
    ck = match.kernels
    tx_bit = pl.col("pg_type").replace_strict(TX, return_dtype=pl.Int64)
    wait_bit = pl.col("pg_type").replace_strict(WAIT, return_dtype=pl.Int64)
    split = pl.col("end_ns") - pl.col("transfer_ns")
    comm_tx = ck.select("rank", split.alias("start_ns"), "end_ns", tx_bit.alias("bit"))
    comm_wait = ck.select("rank", "start_ns", split.alias("end_ns"), wait_bit.alias("bit"))
    # Host-bound gaps: from the moment the GPU went idle to the launch of the next kernel.
    prev_end = pl.col("end_ns").cum_max().shift(1).over("rank", order_by="start_ns")
    host = (
        kern.select("rank", "start_ns", "end_ns", "launch_ns")
        .with_columns(prev_end.alias("_idle_from"))
        .select(
            "rank",
            pl.col("_idle_from").alias("start_ns"),
            pl.min_horizontal("launch_ns", "start_ns").alias("end_ns"),
            pl.lit(HOST, dtype=pl.Int64).alias("bit"),
        )
        .drop_nulls()
    )
    win = windows.select("rank", pl.col("w_start").alias("start_ns"), pl.col("w_end").alias("end_ns"),
                         pl.lit(WINDOW, dtype=pl.Int64).alias("bit"))
    # Short gaps between consecutive (merged) compute intervals: launch overhead, never counted as bubble.
    cm = merge(non_comm.filter(pl.col("bit") == COMPUTE).select("rank", "start_ns", "end_ns"),
               ["rank"]).sort("rank", "start_ns", maintain_order=True)  # disjoint blocks: no ties
    short = (
        cm.select("rank", pl.col("end_ns").shift(1).over("rank").alias("_gs"), pl.col("start_ns").alias("_ge"))
        .filter((pl.col("_ge") - pl.col("_gs")) < LAUNCH_GAP_NS)
        .select("rank", pl.col("_gs").alias("start_ns"), pl.col("_ge").alias("end_ns"),
                pl.lit(SHORT_GAP, dtype=pl.Int64).alias("bit"))
        .collect()
    )
    return pl.concat([x.select(base) for x in (non_comm, comm_tx, comm_wait, host, win, short)], how="vertical")


def _bucket_aggs() -> list[pl.Expr]:
    """The step buckets and per-PG-type sums over the mask lengths (see module doc for the priorities)."""
    L = pl.col("length_ns")
    no_kernel = _none(KERNEL_BITS)
    aggs = [
        L.sum().alias("step_ns"),
        L.filter(_has(COMPUTE)).sum().alias("compute_ns"),
        L.filter(_none(COMPUTE) & _has(ALL_TX)).sum().alias("comm_exposed_ns"),
        L.filter(_none(COMPUTE | ALL_TX) & _has(ALL_WAIT)).sum().alias("comm_wait_ns"),
        L.filter(_none(COMPUTE | ALL_TX | ALL_WAIT) & _has(OTHER)).sum().alias("other_ns"),
        L.filter(no_kernel).sum().alias("idle_ns"),
        L.filter(no_kernel & _has(HOST)).sum().alias("host_bound_ns"),
        L.filter(_none(COMPUTE | OTHER | NON_PP_COMM | SHORT_GAP)
                 & _has(TX["PP"] | WAIT["PP"])).sum().alias("bubble_wait_ns"),
        L.filter(no_kernel & _none(SHORT_GAP)).sum().alias("bubble_idle_ns"),
        L.filter(_none(COMPUTE | OTHER | ALL_TX) & _has(NON_PP_COMM & ALL_WAIT)).sum().alias("busy_wait_ns"),
    ]
    for g in PG_TYPES:
        aggs += [
            L.filter(_has(TX[g])).sum().alias(f"tx_{g}_ns"),
            L.filter(_has(WAIT[g])).sum().alias(f"wait_{g}_ns"),
            L.filter(_has(TX[g]) & _none(COMPUTE)).sum().alias(f"exposed_{g}_ns"),
            L.filter(_has(TX[g]) & _has(COMPUTE)).sum().alias(f"overlap_{g}_ns"),
        ]
    return aggs


def kernel_exposure(frames: JobFrames, match: CollectiveMatch) -> pl.DataFrame:
    """Per NCCL kernel: ``exposed_ns`` (its transfer part not under the rank's compute) and
    ``structural_exposed_ns``: the same, capped by the exposure of that collective on its last-arriving
    rank. The last arriver waited for nobody, so what is exposed there is exposed by the schedule; what
    a victim shows beyond it was caused by waiting for someone (a straggler), not by missing overlap.
    """
    comp = frames["kernels"].select("rank", "class", "start_ns", "end_ns").filter(
        (pl.col("class") == "compute") & pl.col("rank").is_not_null())
    merged = merge(comp.select("rank", "start_ns", "end_ns"), ["rank"]).collect().sort("rank", "start_ns")
    merged = merged.with_columns(
        ((pl.col("end_ns") - pl.col("start_ns")).cum_sum().over("rank") - (pl.col("end_ns") - pl.col("start_ns")))
        .alias("_cum_before")
    )

    def busy_before(col: str) -> pl.Expr:
        # Compute time on this rank before instant `col` (joined interval: the last one starting <= col).
        return pl.col("_cum_before").fill_null(0) + (
            pl.min_horizontal(pl.col(col), pl.col("_c_end")) - pl.col("_c_start")
        ).clip(lower_bound=0).fill_null(0)

    k = match.kernels.with_row_index("_kid").with_columns((pl.col("end_ns") - pl.col("transfer_ns")).alias("_tx_start"))
    right = merged.select("rank", pl.col("start_ns").alias("_c_start"), pl.col("end_ns").alias("_c_end"), "_cum_before")

    def at(col: str, name: str) -> pl.DataFrame:
        j = k.select("_kid", "rank", col).sort(col).join_asof(
            right.sort("_c_start"), left_on=col, right_on="_c_start", by="rank", strategy="backward",
            check_sortedness=False,
        )
        return j.select("_kid", busy_before(col).alias(name))

    k = k.join(at("end_ns", "_F_end"), on="_kid").join(at("_tx_start", "_F_tx"), on="_kid")
    k = k.with_columns((pl.col("transfer_ns") - (pl.col("_F_end") - pl.col("_F_tx"))).alias("exposed_ns"))
    on_last = k.filter(pl.col("is_last")).select("instance", pl.col("exposed_ns").alias("_last_exposed"))
    k = k.join(on_last, on="instance", how="left", nulls_equal=False).with_columns(
        pl.min_horizontal("exposed_ns", pl.coalesce("_last_exposed", "exposed_ns")).alias("structural_exposed_ns")
    )
    return k.sort("_kid").drop("_kid", "_tx_start", "_F_end", "_F_tx", "_last_exposed")
