"""Who arrived last at each collective on the real 8-rank DLRM set (../shared/sample_data/kineto/param_dlrm_8rank).

How the expectation was obtained, independently of forensics/: a throwaway script loaded each raw
``worker*.pt.trace.json.gz`` with ``json``, kept the ``cat == "kernel"`` events whose name contains
``nccl``, sorted them by ``ts`` per rank (8 per rank: SendRecv x4, AllReduce, SendRecv, AllReduce x2)
and, for each ordinal, took the rank with the smallest ``dur``. The matching was checked by hand: the
8 kernels of each ordinal have the same name on every rank and their ``ts + dur`` ends agree within
7 µs (one host, one clock), e.g. ordinal 0 ends at ...431940 µs ±1 on all ranks while durations run
from 10 µs (rank 7) to 7,635 µs (rank 1). All 64 kernels are launched inside ProfilerStep#10.

Raw durations (µs) per ordinal, rank 0..7 (from the JSON ``dur``):
  0 SendRecv  2146 7635  518 6132 4882 4679  514   10  -> last: 7 (transfer 10)
  1 SendRecv  1032 1025  517 1021 1108 1060  520    8  -> last: 7 (8)
  2 SendRecv   176  169  173  174  170  175  175    7  -> last: 7 (7)
  3 SendRecv   131  132  131  133  132  132  131    7  -> last: 7 (7)
  4 AllReduce  246  307  198  291   95   96  213   86  -> last: 7 (86)
  5 SendRecv   514  545  468  542   61   10  483  357  -> last: 5 (10)
  6 AllReduce  601  601  572  602   70   20  602  468  -> last: 5 (20)
  7 AllReduce  952  922  915  879   69   79  920  803  -> last: 4 (69)
"""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import shared_path

EXPECTED_LAST = [7, 7, 7, 7, 7, 5, 5, 4]
EXPECTED_TRANSFER_US = [10, 8, 7, 7, 86, 10, 20, 69]
EXPECTED_WAIT_RANK1_US = [7635 - 10, 1025 - 8, 169 - 7, 132 - 7, 307 - 86, 545 - 10, 601 - 20, 922 - 69]


@pytest.fixture(scope="module")
def dlrm():
    from forensics.pipeline import load

    run_dir = shared_path("kineto", "param_dlrm_8rank")
    _, frames = load(run_dir, workers=1)
    return frames


def test_last_arrival_per_collective_matches_the_raw_events(dlrm):
    from forensics.facts.collectives import match_collectives

    m = match_collectives(dlrm)
    inst = m.instances.sort("instance")
    assert inst.height == 8
    assert inst["n_ranks"].to_list() == [8] * 8
    assert inst["last_rank"].to_list() == EXPECTED_LAST
    assert inst["transfer_ns"].to_list() == [x * 1000 for x in EXPECTED_TRANSFER_US]
    waits = (
        m.kernels.filter(pl.col("matched") & (pl.col("rank") == 1))
        .join(inst.select("instance", pl.col("transfer_ns").alias("_x")), on="instance")
        .sort("start_ns")["wait_ns"]
        .to_list()
    )
    assert waits == [w * 1000 for w in EXPECTED_WAIT_RANK1_US]


def test_what_the_detectors_say_on_the_real_set(dlrm):
    from forensics.detectors import run_detectors
    from forensics.facts.context import JobContext

    findings, skipped = run_detectors(JobContext(dlrm), only=["straggler", "exposed_comm", "busy_wait", "pipeline_bubble"])
    assert [s.detector for s in skipped] == ["pipeline_bubble"]  # no pipeline group in DLRM
    by = {f.detector: f for f in findings}
    # Ranks 1 and 3 do more compute (310/315 kernels vs ~246) but they are the ones that wait longest:
    # victims, never culprits. Rank 7 arrives last at 5 of 8 collectives, 4 of them by more than 20 us
    # (ordinal 4: 95 - 86 = 9 us); 4 of 8 against chance 1/8 gives binomial p = 0.011 > 1e-3 with one
    # profiled step, so no straggler is claimed.
    assert "straggler" not in by
    assert "exposed_comm" not in by  # transfers (sum of minimum durations, 217 us) are ~1.5% of a 12-20 ms step
    bw = by["busy_wait"]
    # Culprits, not victims: ranks 0-6 waited; from the table above, 78.5% of their wait (d - transfer summed
    # over ordinals 0-4) was for rank 7, 12.1% for rank 5 (5-6) and 9.4% for rank 4 (7): only rank 7 is named.
    assert bw.ranks == (7,)
    assert {e["rank"] for e in bw.evidence if e["role"] == "victim"} == {0, 1, 2, 3, 4, 5, 6}
    assert bw.metrics["waited_for"] == "7"
    assert bw.metrics["culprit_wait_share"] == pytest.approx(35543 / (35543 + 5481 + 4253), abs=2e-3)
    ev = {e["rank"]: e for e in bw.evidence if e["role"] == "victim"}
    # Rank 1 waited for rank 7 at ordinals 0-4 (rank 7 last): sum of (d_1 - min d) from the table above.
    assert ev[1]["waited_for"] == 7
    assert ev[1]["waited_for_ms"] == pytest.approx((7625 + 1017 + 162 + 125 + 221) / 1000, abs=1e-3)
