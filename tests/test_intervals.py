"""Interval algebra checked on intervals small enough to measure by hand."""

from __future__ import annotations

import polars as pl

from forensics.intervals import clip_to_windows, mask_lengths, merge


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
