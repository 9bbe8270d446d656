"""The cost model against the predictions a real NCCL 2.22.3 job printed (NVIDIA/nccl#1453)."""

from __future__ import annotations

import math

import pytest
from forensics.parsers.nccl_log import parse
from forensics.parsers.result import ParseContext

from forensics.facts import nccl_cost as nc
from tests.conftest import shared_path

LOG = "11_v2.22.3_h100_3node_24rank_tuning_lines_busbw_collapse_above_32MB.log"

# Printed by rank 0 (`<bytes> Bytes -> Algo a proto p time t`), read off the log by hand.
PRINTED = [
    (256, "Tree", "LL", 25.229528),
    (512, "Tree", "LL", 25.259054),
    (65536, "Tree", "LL", 37.798233),
    (131072, "Tree", "LL128", 51.603912),
    (8589934592, "Ring", "Simple", 86069.968750),
]
# 3 nodes x 8 H100, Intel hosts, 16 channels of 24 GB/s intra / 12 GB/s inter per channel (nccl.md §B.6)
COMM = nc.Comm(nranks=24, nnodes=3, arch="hopper", cpu_vendor="intel", ring=nc.Graph(16, 24.0, 12.0), era="2.22")


@pytest.mark.parametrize(("nbytes", "algo", "proto", "printed"), PRINTED)
def test_model_reproduces_printed_choice_and_time_within_1_percent(nbytes, algo, proto, printed):
    a, p, t, _ = nc.choose(COMM, "AllReduce", nbytes)
    assert (a, p) == (algo, proto)
    assert abs(t - printed) / printed < 0.01


def test_every_tuning_line_in_the_log_is_reproduced():
    path = shared_path("nccl_logs", LOG)
    calls = parse(path, ParseContext(path.parent, LOG)).frames["nccl_calls"]
    tuning = calls.filter(calls["kind"] == "tuning")
    assert tuning.height == 30  # grep -c 'Bytes -> Algo' = 30
    for row in tuning.iter_rows(named=True):
        a, p, t, _ = nc.choose(COMM, "AllReduce", row["bytes"])
        assert (a, p) == (row["algo"], row["proto"])
        assert abs(t - row["predicted_us"]) / row["predicted_us"] < 0.01


def test_forcing_an_algorithm_removes_the_others():
    forced = nc.Comm(nranks=24, nnodes=3, ring=nc.Graph(16, 24.0, 12.0), era="2.22", algos=frozenset({"Ring"}))
    a, _, t_forced, cands = nc.choose(forced, "AllReduce", 65536)
    assert a == "Ring" and all(k[0] == "Ring" for k in cands)
    assert t_forced > 37.798233  # the default (Tree/LL) is faster at 64 KiB


def test_choose_from_table_replays_printed_numbers():
    # Broadcast row of a 2.8.3 TUNING table (30_): only Ring/Simple 18.0 us / 9.0 GB/s is enabled
    table = {("Ring", "LL"): (6.3, 0.0), ("Ring", "LL128"): (14.0, 0.0), ("Ring", "Simple"): (18.0, 9.0)}
    a, p, t, cands = nc.choose_from_table(table, "Broadcast", 9_000_000)
    assert (a, p) == ("Ring", "Simple") and list(cands) == [("Ring", "Simple")]
    assert math.isclose(t, 18.0 + 9_000_000 / 9000.0)


def test_single_node_hopper_with_nvls_prefers_nvls_for_large_allreduce():
    c = nc.Comm(nranks=8, nnodes=1, ring=nc.Graph(16, 40.0, 40.0), nvls=nc.Graph(16, 40.0, 40.0))
    a, p, _, _ = nc.choose(c, "AllReduce", 1 << 30)
    assert (a, p) == ("NVLS", "Simple")
