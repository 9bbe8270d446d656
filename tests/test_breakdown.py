"""Per rank/step breakdown against the builders' own bookkeeping."""

from __future__ import annotations

import polars as pl

from forensics.base.frames import JobFrames
from forensics.facts.breakdown import compute_breakdown
from tests.frame_builders import MS, US, dp_job, pp_job

PARTS = ["compute_ns", "comm_exposed_ns", "comm_wait_ns", "other_ns", "idle_ns"]


def test_buckets_partition_the_step_and_match_builder_truth():
    frames, truth = dp_job(n_ranks=8, steps=3, tx_ns=2 * MS, slow={2: 1.1}, host_delay={5: 3 * MS})
    b = compute_breakdown(frames).steps
    assert b.height == 24
    assert b.select((pl.sum_horizontal(PARTS) == pl.col("step_ns")).all()).item()
    got = {(r, s): (w, x, t) for r, s, w, x,
           t in b.select("rank", "step", "comm_wait_ns", "comm_exposed_ns", "step_ns").iter_rows()}
    assert len(truth.wait) == 24
    for key, wait in truth.wait.items():
        assert got[key] == (wait, truth.exposed_tx[key], truth.step_ns[key]), key
    # Rank 5's host stalled 3 ms before launching its first kernel of each step after the first (launched
    # 5 us before it ran; rank 0's first kernel is launched as its step begins).
    hb = dict(b.filter(pl.col("step") == 1).select("rank", "host_bound_ns").iter_rows())
    assert hb[5] - hb[0] == 3 * MS - 5 * US


def test_overlapped_transfer_is_not_exposed():
    frames, truth = dp_job(n_ranks=4, steps=3, tx_ns=2 * MS, overlap=True)
    b = compute_breakdown(frames).steps
    assert b["comm_exposed_ns"].to_list() == [0] * 12
    assert all(v == 0 for v in truth.exposed_tx.values())
    # all of each rank's DP transfer (3 steps x 2 ms) ran under its compute
    per_rank = b.group_by("rank").agg(pl.col("tx_DP_ns").sum(), pl.col("overlap_DP_ns").sum())
    assert per_rank.height == 4 and (per_rank["overlap_DP_ns"] == per_rank["tx_DP_ns"]).all()
    assert per_rank["tx_DP_ns"].to_list() == [3 * 2 * MS] * 4


def test_pipeline_bubble_equals_time_without_compute():
    frames, truth = pp_job(p=4, m=8, steps=2)
    b = compute_breakdown(frames).steps
    got = {(r, s): bw + bi for r, s, bw, bi in b.select("rank", "step", "bubble_wait_ns", "bubble_idle_ns").iter_rows()}
    assert got == truth.bubble


def test_sm_share_sum_does_not_depend_on_the_order_of_the_kernel_rows():
    # Fractional SM shares make the float sum order-sensitive: the breakdown sums each step's terms in one
    # fixed order, so a trace whose events come in another order gives the same bits.
    frames, _ = dp_job(n_ranks=4, steps=3, tx_ns=2 * MS)
    kernels = frames["kernels"].with_columns(
        (pl.int_range(pl.len()).cast(pl.Float64) * 0.137 % 0.9 + 0.01).alias("blocks_per_sm"))
    parts = {name: frames[name] for name in frames.present}
    base = compute_breakdown(JobFrames({**parts, "kernels": kernels}, frames.present)).steps
    shares = base["u_sm_ns"].to_list()
    assert len(set(shares)) > 1 and all(0 < s for s in shares)
    for seed in (1, 2, 3):
        shuffled = kernels.sample(fraction=1.0, shuffle=True, seed=seed)
        got = compute_breakdown(JobFrames({**parts, "kernels": shuffled}, frames.present)).steps
        assert got["u_sm_ns"].to_list() == shares, seed
