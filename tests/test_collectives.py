"""Collective matching, transfer/wait split, last arrival and clock offsets on hand-built jobs.

Expectations come from tests/frame_builders.py, which places every event itself (its own truth), not
from the code under test.
"""

from __future__ import annotations

import polars as pl

from forensics.base.frames import JobFrames
from forensics.facts.collectives import match_collectives, pg_type_expr
from tests.frame_builders import MS, dp_job


def _waits(match) -> dict[tuple[int, int], int]:
    k = match.kernels.filter(pl.col("matched"))
    return {(r, s): w for r, s, w in k.select("rank", "step", "wait_ns").iter_rows()}


def test_ordinal_matching_splits_wait_and_transfer_and_names_last_arrival():
    frames, truth = dp_job(n_ranks=8, steps=4, tx_ns=2 * MS, slow={3: 1.2}, host_delay={6: 1 * MS})
    m = match_collectives(frames)
    assert m.instances.height == 4
    assert m.instances["transfer_ns"].to_list() == [2 * MS] * 4
    assert m.instances["last_rank"].to_list() == truth.last
    assert _waits(m) == truth.wait


def test_seq_matching_gives_the_same_instances():
    frames, truth = dp_job(n_ranks=4, steps=3, seq=True, slow={1: 1.5})
    m = match_collectives(frames)
    assert m.instances.height == 3
    assert all(k.count("#s") == 1 for k in m.instances["instance_key"].to_list())
    assert m.instances["last_rank"].to_list() == truth.last
    assert _waits(m) == truth.wait


def test_a_rank_with_a_different_profiling_window_does_not_break_matching():
    frames, truth = dp_job(n_ranks=4, steps=4, slow={2: 1.3})
    # Rank 0 profiled steps 1..3 only (its step 0 is missing from kernels, launches and steps).
    k0 = frames["steps"].filter((pl.col("rank") == 0) & (pl.col("step") == 0)).row(0, named=True)
    keep = ~((pl.col("rank") == 0) & (pl.col("start_ns") < k0["end_ns"]))
    cut = JobFrames({
        "kernels": frames["kernels"].filter(keep),
        "cpu_ops": frames["cpu_ops"].filter(keep),
        "steps": frames["steps"].filter(~((pl.col("rank") == 0) & (pl.col("step") == 0))),
        "ranks": frames["ranks"], "process_groups": frames["process_groups"],
    })
    m = match_collectives(cut)
    assert m.instances["step"].to_list() == [1, 2, 3]
    assert m.unmatched["incomplete_instances"] == 1
    assert m.instances["last_rank"].to_list() == truth.last[1:]
    assert {k: v for k, v in _waits(m).items()} == {k: v for k, v in truth.wait.items() if k[1] >= 1}


def test_clock_offsets_between_hosts_are_recovered_from_collective_ends():
    frames, truth = dp_job(n_ranks=16, steps=3, clock_offset={1: 7 * MS}, slow={12: 1.1})
    m = match_collectives(frames)
    off = dict(m.host_offsets.select("host", "offset_ns").iter_rows())
    assert off["node1"] - off["node0"] == 7 * MS
    # Durations, and so the split, are unaffected by the offset.
    assert _waits(m) == truth.wait
    assert m.instances["last_rank"].to_list() == truth.last


def test_pg_type_from_descriptions():
    descs = ["PIPELINE_MODEL_PARALLEL_GROUP", "TENSOR_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP",
             "EXPERT_MODEL_PARALLEL_GROUP", "CONTEXT_PARALLEL_GROUP", "default_pg", "undefined", "mesh_fsdp", "dp_shard"]
    got = pl.DataFrame({"d": descs}).select(pg_type_expr(pl.col("d")).alias("d"))["d"].to_list()
    assert got == ["PP", "TP", "DP", "EP", "CP", "default", "default", "DP", "DP"]
