"""Interval algebra checked on intervals small enough to measure by hand."""

from __future__ import annotations

import random

import polars as pl
import pytest

from forensics.base.intervals import MANY_WINDOWS, clip_to_disjoint_windows, clip_to_windows, mask_lengths, merge


def test_merge_joins_overlapping_and_touching_intervals_per_group():
    df = pl.DataFrame({"g": [1, 1, 1, 1, 2], "start_ns": [0, 5, 10, 30, 0], "end_ns": [6, 10, 12, 40, 3]})
    out = merge(df, ["g"]).collect().sort("g", "start_ns")
    # g=1: [0,6) u [5,10) u [10,12) -> [0,12); [30,40) apart. g=2 untouched.
    assert out.rows() == [(1, 0, 12), (1, 30, 40), (2, 0, 3)]


def test_mask_lengths_measures_set_combinations():
    # A (bit 1) = [0,10) u [20,30); B (bit 2) = [5,25) with a duplicate [6,7) that must not double count.
    df = pl.DataFrame({
        "g": [0] * 4, "bit": [1, 1, 2, 2], "start_ns": [0, 20, 5, 6], "end_ns": [10, 30, 25, 7],
    })
    got = dict(mask_lengths(df, ["g"]).collect().select("mask", "length_ns").iter_rows())
    # only A: [0,5) + [25,30) = 10; A and B: [5,10) + [20,25) = 10; only B: [10,20) = 10
    assert got == {1: 10, 3: 10, 2: 10}


def test_clip_splits_an_interval_across_windows():
    iv = pl.DataFrame({"rank": [0], "start_ns": [5], "end_ns": [25]})
    w = pl.DataFrame({"rank": [0, 0], "step": [1, 2], "w_start": [0, 20], "w_end": [20, 40]})
    out = clip_to_windows(iv, w, on=["rank"]).collect().sort("step").select("step", "start_ns", "end_ns")
    assert out.rows() == [(1, 5, 20), (2, 20, 25)]


def _brute_clip(ivs: list[tuple], wins: list[tuple]) -> list[tuple]:
    """Every (interval, window) pair of one rank that overlap, clipped: Python, pair by pair."""
    out = []
    for rank, s, e, cat in ivs:
        for w_rank, step, ws, we, host in wins:
            if None not in (rank, s, e) and rank == w_rank and s < we and e > ws:
                out.append((rank, max(s, ws), min(e, we), cat, step, ws, we, host))
    return sorted(out, key=repr)


@pytest.mark.parametrize("seed", range(12))
def test_clip_to_disjoint_windows_is_clip_to_windows(seed: int):
    """Many disjoint windows per rank (the as-of path) and few (the join): the pairs a brute force finds."""
    rng = random.Random(seed)
    wins, ivs = [], []
    for rank in range(3):
        t = rng.randint(0, 50)
        for step in range(rng.choice([2, MANY_WINDOWS + 5, 40])):
            t += rng.choice([0, 0, 3])  # touching windows, and gaps
            e = t + rng.randint(1, 20)
            wins.append((rank, step, t, e, f"h{rank}"))
            t = e
    for _ in range(300):
        s = rng.randint(-10, 1000)
        ivs.append((rng.choice([0, 1, 2, 3, None]), s if rng.random() > 0.03 else None,
                    s + rng.choice([0, 1, 5, 30, 200]), rng.choice(["gemm", "nccl"])))
    w = pl.DataFrame(wins, schema={"rank": pl.Int32, "step": pl.Int64, "w_start": pl.Int64, "w_end": pl.Int64,
                                   "host": pl.String}, orient="row")
    i = pl.DataFrame(ivs, schema={"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "category": pl.String},
                     orient="row")
    fast = clip_to_disjoint_windows(i.lazy(), w, on=["rank"]).collect()
    assert fast.columns == clip_to_windows(i.lazy(), w.lazy(), on=["rank"]).collect().columns
    assert sorted(fast.iter_rows(), key=repr) == _brute_clip(ivs, wins)


def test_clip_to_disjoint_windows_with_overlapping_windows_is_the_join():
    """Overlapping windows are not what the as-of path handles: both windows still get the interval."""
    w = pl.DataFrame({"rank": [0] * 40, "step": list(range(40)), "w_start": [10 * k for k in range(40)],
                      "w_end": [10 * k + 15 for k in range(40)]})
    i = pl.DataFrame({"rank": [0], "start_ns": [12], "end_ns": [14]})
    got = clip_to_disjoint_windows(i.lazy(), w, on=["rank"]).collect().sort("step")
    assert got["step"].to_list() == [0, 1] and got["start_ns"].to_list() == [12, 12]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_mask_lengths_per_group_equals_counting_each_nanosecond(seed: int):
    # Several groups (two keys, one of them null in a group), some after one another in time, some
    # overlapping: each group's masks and its extent come from its own intervals only.
    rng = random.Random(seed)
    rows = []
    for (g, h), offset in [((0, 0), 0), ((0, 1), 100), ((1, 0), 50), ((2, None), 200)]:
        for _ in range(rng.randint(1, 12)):
            start = offset + rng.randint(0, 60)
            rows.append({"g": g, "h": h, "bit": rng.choice([1, 2, 4]), "start_ns": start,
                         "end_ns": start + rng.randint(0, 15)})
    df = pl.DataFrame(rows, schema={"g": pl.Int64, "h": pl.Int64, "bit": pl.Int64, "start_ns": pl.Int64,
                                    "end_ns": pl.Int64})
    want: dict[tuple, int] = {}
    for (g, h), part in df.group_by("g", "h"):
        spans = [r for r in part.iter_rows(named=True) if r["end_ns"] > r["start_ns"]]
        if not spans:
            continue
        lo, hi = min(r["start_ns"] for r in spans), max(r["end_ns"] for r in spans)
        for t in range(lo, hi):
            mask = 0
            for r in spans:
                if r["start_ns"] <= t < r["end_ns"]:
                    mask |= r["bit"]
            want[(g, h, mask)] = want.get((g, h, mask), 0) + 1
    got = {(g, h, m): n for g, h, m, n in mask_lengths(df, ["g", "h"]).collect().select(
        "g", "h", "mask", "length_ns").iter_rows()}
    assert got == want
