"""DTensor redistributes (#30 item 4): a DTensor ``redistribute`` runs as functional collectives
(``_c10d_functional::all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_to_all_single``, each followed
by ``_c10d_functional::wait_tensor``) on the device mesh's process groups (descriptions ``mesh_tp``,
``mesh_dp_shard``, ``mesh_ep``). Underneath they are c10d collectives like any other (``record_param_comms`` >
``nccl:<name>`` > NCCL kernel carrying the collective args), so they must be matched across ranks, typed by their
mesh dimension, and their overlap with compute measured.

A hand-written 2-rank Kineto trace, times in µs on both ranks (rank 1 reaches the all-gather 30 µs early):

* GEMM 100-300 on stream 7; the TP all-gather (``mesh_tp``) 150-250 on rank 0, 120-250 on rank 1: transfer 100
  (the shortest), all of it under the GEMM; rank 1 waits 30;
* the DP reduce-scatter (``mesh_dp_shard``) 400-500 on both ranks, with no compute: 100 exposed;
* GEMM 550-650; the EP all-to-all (``mesh_ep``) 600-700 on both ranks: 50 overlapped, 50 exposed.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.pipeline import load

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas"
MESH = {"TP": ("1", "mesh_tp"), "DP": ("2", "mesh_dp_shard"), "EP": ("3", "mesh_ep")}
# (mesh dim, funcol op, Collective name as c10d records it, NCCL kernel, start per rank, end)
COLLS = [
    ("TP", "all_gather_into_tensor", "all_gather_into_tensor", "ncclDevKernel_AllGather_RING_LL", (150, 120), 250),
    ("DP", "reduce_scatter_tensor", "reduce_scatter_tensor", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
     (400, 400), 500),
    ("EP", "all_to_all_single", "all_to_all", "ncclDevKernel_SendRecv", (600, 600), 700),
]


def _ev(cat: str, name: str, tid: int, ts: float, dur: float, **args) -> dict:
    pid = 0 if cat == "kernel" else 1
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _rank_trace(rank: int) -> dict:
    ev = [_ev("user_annotation", "ProfilerStep#1", 1, 0.0, 1000.0, **{"External id": 1})]
    for i, (start, end) in enumerate(((100, 300), (550, 650))):
        ext, corr = 10 + i, 110 + i
        ev += [_ev("cpu_op", "aten::mm", 1, 2.0 + 300 * i, 4.0, **{"External id": ext}),
               _ev("cuda_runtime", "cudaLaunchKernel", 1, 3.0 + 300 * i, 2.0, **{"External id": ext,
                                                                                 "correlation": corr}),
               _ev("kernel", GEMM, 7, float(start), float(end - start), device=0, stream=7, correlation=corr,
                   **{"External id": ext})]
    for i, (dim, op, coll, kernel, starts, end) in enumerate(COLLS):
        name, desc = MESH[dim]
        t0, ext, corr = 10.0 + 100 * i, 20 + 10 * i, 200 + 10 * i
        coll_args = {"Collective name": coll, "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "Group size": 2,
                     "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]", "Process Group Name": name,
                     "Process Group Description": desc, "Process Group Ranks": "[0, 1]", "Seq": 1}
        ev += [_ev("user_annotation", "Redistribute", 1, t0, 60.0, **{"External id": ext}),
               _ev("cpu_op", f"_c10d_functional::{op}", 1, t0 + 1, 30.0, **{"External id": ext + 1}),
               _ev("cpu_op", "record_param_comms", 1, t0 + 2, 26.0, **{"External id": ext + 2, "Rank": rank,
                                                                      **coll_args}),
               _ev("user_annotation", f"nccl:{coll}", 1, t0 + 3, 20.0, **{"External id": ext + 3}),
               _ev("cuda_runtime", "cudaLaunchKernel", 1, t0 + 4, 2.0, **{"External id": ext + 2,
                                                                          "correlation": corr}),
               _ev("kernel", kernel + "(ncclDevKernelArgsStorage<4096ul>)", 24 + i, float(starts[rank]),
                   float(end - starts[rank]), device=0, stream=24 + i, correlation=corr,
                   **{"External id": ext + 2, **coll_args}),
               _ev("cpu_op", "_c10d_functional::wait_tensor", 1, t0 + 40, 3.0, **{"External id": ext + 4}),
               _ev("cuda_runtime", "cudaStreamWaitEvent", 1, t0 + 41, 1.0, **{"External id": ext + 4,
                                                                             "correlation": corr + 1})]
    pgs = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [0, 1]}]
    pgs += [{"pg_name": n, "pg_desc": d, "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [0, 1]}
            for n, d in MESH.values()]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2,
                                                    "pg_count": len(pgs), "pg_config": pgs},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}], "traceEvents": ev}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    run = tmp_path_factory.mktemp("dtensor")
    for rank in (0, 1):
        (run / f"rank{rank}.pt.trace.json").write_text(json.dumps(_rank_trace(rank)))
    return JobContext(load(run, workers=1)[1])


def test_redistribute_collectives_are_communication_of_their_mesh_dimension(ctx):
    k = ctx.match.kernels.sort("rank", "start_ns")
    got = k.select("rank", "pg_type", "collective", "matched").rows()
    assert got == [(r, dim, coll, True) for r in (0, 1) for dim, coll in
                   (("TP", "allgather"), ("DP", "reduce_scatter"), ("EP", "alltoall"))]
    cats = ctx.kernel_categories.filter(pl.col("class") == "comm")
    assert sorted(set(cats["category"].to_list())) == ["nccl:DP", "nccl:EP", "nccl:TP"]
    assert ctx.match.unmatched == {"incomplete_instances": 0, "inconsistent_instances": 0}


def test_redistribute_overlap_and_exposure_are_measured(ctx):
    st = ctx.steps.sort("rank")
    cols = ["tx_TP_ns", "overlap_TP_ns", "exposed_TP_ns", "exposed_DP_ns", "overlap_EP_ns", "exposed_EP_ns"]
    assert st.select(cols).rows() == [(100_000, 100_000, 0, 100_000, 50_000, 50_000)] * 2
    assert st["wait_TP_ns"].to_list() == [0, 30_000]
    assert st["comm_exposed_ns"].to_list() == [150_000, 150_000]


def test_only_the_exposed_redistribute_is_reported(ctx):
    """wait_tensor launches no kernel; the TP all-gather hidden under the GEMM is not reported, the DP
    reduce-scatter with nothing to hide under is (100 of the 1,000 µs step)."""
    assert ctx.frames["kernels"].height == 2 * (2 + len(COLLS))
    exposed = [f for f in run_detectors(ctx)[0] if f.detector == "exposed_comm"]
    assert [f.title for f in exposed] == ["DP collectives not overlapped with compute: 10.0% of the step"]
    assert tuple(exposed[0].ranks) == (0, 1)
