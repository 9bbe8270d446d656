"""Interval algebra on Polars frames: merge, and measure any Boolean combination of interval sets.

Every function works per group (``keys``), e.g. per (rank, step), with no Python loop over events.
The trick used by :func:`mask_lengths`: give each set one bit, turn intervals into +1 / -1 events of their set,
sort them by time within the group and keep one running count per set: the sets whose count is above zero after
an event are the bitmask of the segment up to the next event. Any quantity such as ``|A \\ (B u C)|`` is then a
sum of segment lengths over the masks that satisfy it.

Sorts on several keys ask for ``maintain_order=True`` where the order of ties does not matter to the result:
Polars 2.1 sorts several columns two to three times faster stably than unstably (82k events by rank, step and
time: 6-9 ms against 16-22 ms; docs/performance.md, tenth pass).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl


def merge(df: pl.LazyFrame | pl.DataFrame, keys: Sequence[str]) -> pl.LazyFrame:
    """Merge overlapping or touching ``[start_ns, end_ns)`` intervals within each ``keys`` group."""
    keys = list(keys)
    # ties (equal starts) fall in one block whatever their order
    lf = df.lazy().filter(pl.col("end_ns") > pl.col("start_ns")).sort([*keys, "start_ns"], maintain_order=True)
    # A new block starts where an interval begins after everything before it (in the group) ended.
    prev_end = pl.col("end_ns").cum_max().shift(1).over(keys)
    # block ids need only be distinct within a group (the group_by below has the keys): one running sum
    block = (prev_end.is_null() | (pl.col("start_ns") > prev_end)).cast(pl.Int64).cum_sum()
    return (
        lf.with_columns(block.alias("_blk"))
        .group_by([*keys, "_blk"])
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .drop("_blk")
    )


def mask_lengths(df: pl.LazyFrame | pl.DataFrame, keys: Sequence[str], bit_col: str = "bit") -> pl.LazyFrame:
    """Length (ns) of time per ``keys`` group and per mask of active sets.

    ``df`` has ``keys``, ``bit_col`` (a power of two naming the set) and ``start_ns``/``end_ns``.
    Returns ``keys, mask, length_ns`` (mask 0 = inside the group's extent with no set active).
    """
    keys = list(keys)
    iv = df.lazy().filter(pl.col("end_ns") > pl.col("start_ns")).select(
        *keys, "start_ns", "end_ns", pl.col(bit_col).cast(pl.Int64).alias("_bit")).collect()
    bits = [int(b) for b in iv["_bit"].unique().drop_nulls().sort()]
    ev = pl.concat([
        iv.lazy().select(*keys, pl.col("start_ns").alias("t"), "_bit", pl.lit(1, pl.Int64).alias("_d")),
        iv.lazy().select(*keys, pl.col("end_ns").alias("t"), "_bit", pl.lit(-1, pl.Int64).alias("_d")),
    ]).sort([*keys, "t"], maintain_order=True)
    # Every group's events of a set sum to zero (each interval opens and closes in its group), so one running count
    # over the sorted frame is each group's own. Events at one instant: only the last of them starts a segment of
    # non-zero length, and by then all of them are counted, in whichever order they came.
    active = [pl.when(pl.col("_bit") == b).then(pl.col("_d")).otherwise(0).cum_sum() > 0 for b in bits]
    zero = pl.lit(0, pl.Int64)
    mask = pl.sum_horizontal([pl.when(a).then(pl.lit(b, pl.Int64)).otherwise(zero) for a, b in zip(active, bits)]) \
        if bits else zero
    # a segment ends at the next event of the same group
    same_group = pl.all_horizontal([pl.col(k).shift(-1).eq_missing(pl.col(k)) for k in keys])
    seg = ev.select(
        *keys, mask.alias("mask"), pl.when(same_group).then(pl.col("t").shift(-1) - pl.col("t")).alias("length_ns"),
    ).filter(pl.col("length_ns").is_not_null() & (pl.col("length_ns") > 0))
    return seg.group_by([*keys, "mask"]).agg(pl.col("length_ns").sum())


def clip_to_windows(
    intervals: pl.LazyFrame | pl.DataFrame,
    windows: pl.LazyFrame | pl.DataFrame,
    on: Sequence[str],
    window_cols: tuple[str, str] = ("w_start", "w_end"),
) -> pl.LazyFrame:
    """Cut intervals to the windows they overlap (joined on ``on``); an interval spanning two windows is split.

    ``windows`` has ``on`` columns, ``w_start``/``w_end`` and any label columns (e.g. ``step``), which
    are carried onto the result.
    """
    ws, we = window_cols
    joined = intervals.lazy().join(windows.lazy(), on=list(on), how="inner")
    return (
        joined.filter((pl.col("start_ns") < pl.col(we)) & (pl.col("end_ns") > pl.col(ws)))
        .with_columns(
            pl.max_horizontal("start_ns", ws).alias("start_ns"),
            pl.min_horizontal("end_ns", we).alias("end_ns"),
        )
    )


MANY_WINDOWS = 16
"""Windows per group above which :func:`clip_to_disjoint_windows` finds each interval's windows by two as-of
joins instead of joining it with every window of its group (a trace of 333 steps: 333 pairs per kernel)."""


def clip_to_disjoint_windows(
    intervals: pl.LazyFrame | pl.DataFrame, windows: pl.DataFrame, on: Sequence[str],
    window_cols: tuple[str, str] = ("w_start", "w_end"),
) -> pl.LazyFrame:
    """:func:`clip_to_windows`, the same rows in another order, in time linear in the intervals when the windows
    of each group are many and disjoint (step windows): each interval meets the windows from the first that ends
    after it starts to the last that starts before it ends, found by two as-of joins. Any other case (few
    windows, overlapping or empty ones, nulls, a column name both sides have) is :func:`clip_to_windows`."""
    keys, (ws, we) = list(on), window_cols
    lf = intervals.lazy()
    names = lf.collect_schema().names()
    extra = [c for c in windows.columns if c not in keys]
    if not _disjoint_and_many(windows, keys, ws, we) or set(extra) & set(names) or "_wi" in names:
        return clip_to_windows(lf, windows, on, window_cols)
    win = windows.sort([*keys, ws]).with_columns(pl.int_range(pl.len()).over(keys).alias("_wi"))
    first = win.select(*keys, pl.col(we).alias("_t"), pl.col("_wi").alias("_i0")).sort("_t").lazy()
    last = win.select(*keys, pl.col(ws).alias("_t"), pl.col("_wi").alias("_i1")).sort("_t").lazy()
    base = lf.filter(pl.all_horizontal(pl.col([*keys, "start_ns", "end_ns"]).is_not_null())).with_row_index("_row")
    i0 = base.select("_row", *keys, pl.col("start_ns").alias("_t")).sort("_t").join_asof(
        first, on="_t", by=keys, strategy="forward", allow_exact_matches=False, check_sortedness=False)
    i1 = base.select("_row", *keys, pl.col("end_ns").alias("_t")).sort("_t").join_asof(
        last, on="_t", by=keys, strategy="backward", allow_exact_matches=False, check_sortedness=False)
    span = i0.select("_row", "_i0").join(i1.select("_row", "_i1"), on="_row").filter(pl.col("_i0") <= pl.col("_i1"))
    pairs = span.select("_row", pl.int_ranges("_i0", pl.col("_i1") + 1).alias("_wi")).explode("_wi")
    out = base.join(pairs, on="_row").join(win.lazy(), on=[*keys, "_wi"])
    return out.select(*names, *extra).with_columns(
        pl.max_horizontal("start_ns", ws).alias("start_ns"), pl.min_horizontal("end_ns", we).alias("end_ns"))


def _disjoint_and_many(windows: pl.DataFrame, keys: list[str], ws: str, we: str) -> bool:
    """Every window has a start before its end, none overlaps another of its group, no value is null, and some
    group has more than :data:`MANY_WINDOWS` windows."""
    if windows.height <= MANY_WINDOWS or windows.select(pl.sum_horizontal(pl.col([*keys, ws, we]).null_count())).item():
        return False
    prev_end = pl.col(we).shift(1).over(keys)
    ok = windows.sort([*keys, ws]).select(
        (pl.col(ws) < pl.col(we)).all() & (prev_end.is_null() | (pl.col(ws) >= prev_end)).all(),
        pl.len().over(keys).max() > MANY_WINDOWS,
    ).row(0)
    return bool(ok[0] and ok[1])
