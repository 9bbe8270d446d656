"""CUDA graph replays in Nsight Systems exports (#30 item 1): kernels and memsets that a ``cudaGraphLaunch``
ran are known as such in the kernels frame, with the same columns (graph_replay, graph_id, graph_node_id) and
values as the equivalent Kineto trace gives, and op attribution says they were replayed from a graph.

No public nsys export with graph launches exists in ../shared/sample_data/nsys (every sample's
CUPTI_ACTIVITY_KIND_KERNEL.graphNodeId is NULL), so the exports here are built per the documented schema:
NVIDIA Nsight Systems User Guide, "Exporter" > "SQLite Schema Reference"
(https://docs.nvidia.com/nsight-systems/UserGuide/index.html#exporter-sqlite-schema), whose tables
CUPTI_ACTIVITY_KIND_KERNEL / _MEMSET carry ``graphNodeId`` ("REFERENCES CUDA_GRAPH_EVENTS(graphNodeId)", 0 when
the activity was not launched by a graph, per CUPTI's CUpti_ActivityKernel.graphNodeId) and, from nsys 2026.1
(export schema 3.24), the kernel's ``graphId``; CUPTI_ACTIVITY_KIND_RUNTIME holds the ``cudaGraphLaunch_v10000``
call (``nameId`` into StringIds) whose ``correlationId`` every activity of the replay carries. The exact DDL of
those versions: ../shared/research/nsys_schema_2023.4.4_v3.7.2_full.sql (no graphId) and
../shared/research/nsys_schema_observed_key_tables.sql (2026.2, graphId).
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from nsys_synth import make_export

from forensics.facts.context import JobContext
from forensics.facts.op_categories import GRAPH_REPLAY_OP
from forensics.pipeline import load

PID, TID = 9, 10
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas"
ADD = "triton_poi_fused_add_0"
# (start, end, stream, correlation, name, graph node id, graph id): one eager GEMM launched by cudaLaunchKernel
# (correlation 10), then one replay (correlation 20) of a two-kernel graph
KERNELS = [(300, 600, 7, 10, GEMM, None, None),
           (2_000, 2_100, 7, 20, ADD, 101, 3),
           (2_100, 2_600, 7, 20, GEMM, 102, 3)]
MEMSET = (2_600, 2_650, 7, 20, 4096, 103)  # a memset node of the same graph
RUNTIME = [(120, 140, PID, TID, 10, "cudaLaunchKernel_v7000"), (1_050, 1_100, PID, TID, 20, "cudaGraphLaunch_v10000")]
NVTX = [(0, 10_000, 59, PID, TID, "ProfilerStep#1", 0, None, None),
        (100, 200, 59, PID, TID, "aten::mm, op_id = 5", 0, None, None),
        (1_000, 1_200, 59, PID, TID, "CUDAGraph::replay", 0, None, None)]


def _export(tmp_path, columns: tuple[str, ...]) -> JobContext:
    kernels = [(s, e, 0, st, c, PID, n, 132, node, gid) for s, e, st, c, n, node, gid in KERNELS]
    s, e, st, c, nbytes, node = MEMSET
    make_export(tmp_path / "rank0.sqlite", env={"RANK": "0"}, kernels=kernels, runtime=RUNTIME, nvtx=NVTX,
                graph_columns=columns, memsets=[(s, e, 0, st, c, PID, nbytes, node if columns else None)])
    return JobContext(load(tmp_path, workers=1)[1])


# nsys 2026.1+ (graphNodeId and graphId), 2022.2-2024.5 (graphNodeId only), and an export whose activities carry
# neither (only the launch's correlation id tells)
@pytest.mark.parametrize("columns", [("graphNodeId", "graphId"), ("graphNodeId",), ()])
def test_graph_launched_activities_are_marked_in_the_kernels_frame(tmp_path, columns):
    ctx = _export(tmp_path, columns)
    k = ctx.frames["kernels"].sort("start_ns")
    assert k["graph_replay"].to_list() == [False, True, True, True]
    nodes = [None, 101, 102, 103] if "graphNodeId" in columns else [None] * 4
    assert k["graph_node_id"].to_list() == nodes
    assert k["graph_id"].to_list() == ([None, 3, 3, None] if "graphId" in columns else [None] * 4)
    launch = ctx.frames["cpu_ops"].filter(pl.col("name") == "cudaGraphLaunch")
    assert launch["is_launch"].to_list() == [True]


def test_graph_replayed_kernels_are_attributed_as_replays_under_the_launching_range(tmp_path):
    ctx = _export(tmp_path, ("graphNodeId",))
    att = ctx.op_attribution
    replay = att.filter(pl.col("via") == "graph replay")
    assert replay["kernels"].sum() == 3
    assert replay["time_ns"].sum() == sum(e - s for s, e, *_ in KERNELS[1:]) + (MEMSET[1] - MEMSET[0])
    assert set(replay["op"].to_list()) == {f"{GRAPH_REPLAY_OP} (launched in CUDAGraph::replay)"}
    eager = att.filter(pl.col("via") == "launch")
    assert eager.select("op", "kernels").rows() == [("aten::mm", 1)]
    cov = ctx.coverage
    assert cov["graph_replayed"] == round(650 / 950, 4)
    assert "replayed from CUDA graphs whose capture is not in the trace" in cov["line"]


def _kineto_twin() -> dict:
    """The same activities as a Kineto trace writes them: the replay's kernels carry the launch's correlation id
    and `graph id` / `graph node id` args, the memset its node id."""
    ev: list[dict] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": PID, "tid": TID,
                       "ts": 0.0, "dur": 10.0, "args": {"External id": 1}},
                      {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": TID, "ts": 0.1, "dur": 0.1,
                       "args": {"External id": 5}},
                      {"ph": "X", "cat": "cpu_op", "name": "CUDAGraph::replay", "pid": PID, "tid": TID, "ts": 1.0,
                       "dur": 0.2, "args": {"External id": 6}}]
    for start, end, _pid, _tid, corr, name in RUNTIME:
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": name.split("_v")[0], "pid": PID, "tid": TID,
                   "ts": start / 1e3, "dur": (end - start) / 1e3,
                   "args": {"External id": 5 if corr == 10 else 6, "correlation": corr}})
    for start, end, stream, corr, name, node, gid in KERNELS:
        args: dict = {"device": 0, "stream": stream, "correlation": corr, "External id": 5 if corr == 10 else 6,
                      "grid": [132, 1, 1], "block": [128, 1, 1]}
        if node is not None:
            args.update({"graph id": gid, "graph node id": node})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start / 1e3,
                   "dur": (end - start) / 1e3, "args": args})
    s, e, stream, corr, nbytes, node = MEMSET
    ev.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": stream, "ts": s / 1e3,
               "dur": (e - s) / 1e3, "args": {"device": 0, "stream": stream, "correlation": corr, "bytes": nbytes,
                                              "graph node id": node, "External id": 6}})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ev}


def test_nsys_and_kineto_give_the_same_graph_columns(tmp_path):
    for d in ("nsys", "kineto"):
        (tmp_path / d).mkdir()
    nsys = _export(tmp_path / "nsys", ("graphNodeId", "graphId"))
    (tmp_path / "kineto" / "rank0.pt.trace.json").write_text(json.dumps(_kineto_twin()))
    kineto = JobContext(load(tmp_path / "kineto", workers=1)[1])
    cols = ["correlation", "graph_replay", "graph_id", "graph_node_id"]

    def graph_cols(ctx: JobContext) -> list[tuple]:
        k = ctx.frames["kernels"]
        return k.with_columns(pl.col("start_ns") - pl.col("start_ns").min()).sort("start_ns").select(
            "start_ns", *cols).rows()

    assert graph_cols(nsys) == graph_cols(kineto)


def test_a_profiled_capture_maps_replayed_kernels_to_the_capturing_ranges(tmp_path):
    """The capture in the export: three cudaLaunchKernel calls between cudaStreamBeginCapture and
    cudaStreamEndCapture run nothing (no kernel has their correlation ids); the graph's replay runs three kernels
    whose node ids give the capture order although two of them start out of that order (two streams). Each is
    mapped to the NVTX op range open at the launch that created its node."""
    ops = ("aten::mm", "aten::add", "aten::relu")
    runtime = [(10, 20, PID, TID, 1, "cudaStreamBeginCapture_v10000")]
    runtime += [(110 + 100 * i, 120 + 100 * i, PID, TID, 11 + i, "cudaLaunchKernel_v7000") for i in range(3)]
    runtime += [(400, 410, PID, TID, 2, "cudaStreamEndCapture_v10000"),
                (500, 510, PID, TID, 20, "cudaGraphLaunch_v10000")]
    nvtx = [(0, 10_000, 59, PID, TID, "ProfilerStep#1", 0, None, None)]
    nvtx += [(100 + 100 * i, 150 + 100 * i, 59, PID, TID, f"{op}, op_id = {i + 1}", 0, None, None)
             for i, op in enumerate(ops)]
    # node 201 (gemm) first; node 203 (relu, stream 9) starts before node 202 (add)
    kernels = [(1_000, 1_100, 0, 7, 20, PID, "gemm_kernel", 132, 201),
               (1_200, 1_300, 0, 7, 20, PID, "add_kernel", 132, 202),
               (1_150, 1_250, 0, 9, 20, PID, "relu_kernel", 132, 203)]
    make_export(tmp_path / "rank0.sqlite", env={"RANK": "0"}, kernels=kernels, runtime=runtime, nvtx=nvtx,
                graph_columns=("graphNodeId",))
    ctx = JobContext(load(tmp_path, workers=1)[1])
    att = ctx.op_attribution
    assert set(att["via"].to_list()) == {"graph capture"}
    assert dict(zip(att["kernel_names"].list.first().to_list(), att["op"].to_list())) == {
        "gemm_kernel": "aten::mm", "add_kernel": "aten::add", "relu_kernel": "aten::relu"}
    assert ctx.coverage["graph_mapped_to_ops"] == ctx.coverage["graph_replayed"] == 1.0
