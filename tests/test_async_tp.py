"""Async TP's copy-engine path (#30 item 4): the peer copies of PyTorch's fused ops are TP communication.

``symm_mem::fused_all_gather_matmul`` / ``symm_mem::fused_matmul_reduce_scatter`` (torch/distributed/
_symmetric_memory/__init__.py) open a ``record_function`` range of the bare op name and move their data with
``aten::copy_`` (``cudaMemcpyAsync``: ``Memcpy DtoD`` on the GPU) between symmetric-memory ``barrier_kernel``
launches, on the current stream and a backend stream, while the chunk GEMMs run.

A hand-written one-rank trace: a fused all-gather-matmul whose GEMM runs from 10 to 110 µs on stream 7 while a
barrier (26-28 µs) and a peer copy (30-80 µs) run on backend stream 30 (all hidden); a fused matmul-reduce-scatter
whose copy runs alone from 120 to 140 µs (exposed); an eager device-to-device copy outside any fused op (150-160 µs),
which stays a copy.
"""

from __future__ import annotations

import polars as pl
import pytest

from forensics.facts.context import JobContext
from forensics.pipeline import load
from tests.frame_builders import one_trace_context

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas"
BARRIER = "c10d::symmetric_memory::barrier_kernel(unsigned int**, int, int, int, unsigned long)"
DTOD = "Memcpy DtoD (Device -> Device)"


class _Trace:
    def __init__(self) -> None:
        self.ev: list[dict] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                                "ts": 0.0, "dur": 200.0, "args": {"External id": 1}}]
        self.corr = 100

    def cpu(self, cat: str, name: str, ts: float, dur: float) -> None:
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                        "args": {"External id": self.corr}})

    def gpu(self, op: str, name: str, host: float, start: float, end: float, stream: int) -> None:
        """``op`` at ``host`` launching ``name`` (a kernel, or a copy when the name says Memcpy)."""
        self.corr += 1
        copy = name.startswith("Memcpy")
        self.cpu("cpu_op", op, host, 2.0)
        self.ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync" if copy else "cudaLaunchKernel",
                        "pid": 1, "tid": 1, "ts": host + 0.5, "dur": 1.0,
                        "args": {"External id": self.corr, "correlation": self.corr}})
        args: dict = {"External id": self.corr, "device": 0, "stream": stream, "correlation": self.corr}
        if copy:
            args.update({"context": 1, "bytes": 8388608, "memory bandwidth (GB/s)": 167.8})
        else:
            args.update({"grid": [132, 1, 1], "block": [128, 1, 1]})
        self.ev.append({"ph": "X", "cat": "gpu_memcpy" if copy else "kernel", "name": name, "pid": 0, "tid": stream,
                        "ts": start, "dur": end - start, "args": args})


def _trace() -> dict:
    t = _Trace()
    t.cpu("cpu_op", "symm_mem::fused_all_gather_matmul", 1.0, 12.0)
    t.cpu("user_annotation", "fused_all_gather_matmul", 1.5, 11.0)
    t.gpu("symm_mem::barrier", BARRIER, 2.0, 26.0, 28.0, 30)
    t.gpu("aten::mm", GEMM, 5.0, 10.0, 110.0, 7)
    t.gpu("aten::copy_", DTOD, 8.0, 30.0, 80.0, 30)
    t.cpu("cpu_op", "symm_mem::fused_matmul_reduce_scatter", 14.0, 6.0)
    t.gpu("aten::copy_", DTOD, 15.0, 120.0, 140.0, 30)
    t.gpu("aten::copy_", DTOD, 22.0, 150.0, 160.0, 7)
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}], "traceEvents": t.ev}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return one_trace_context(tmp_path_factory.mktemp("async_tp"), _trace())


def test_copies_inside_fused_ops_are_tp_communication_of_the_ops_collective(ctx):
    k = ctx.frames["kernels"].sort("start_ns")
    rows = list(zip(k["name"].to_list(), k["class"].cast(pl.String).to_list(), k["collective"].to_list()))
    assert rows == [(GEMM, "compute", None), (BARRIER, "comm", "allgather"), (DTOD, "comm", "allgather"),
                    (DTOD, "comm", "reduce_scatter"), (DTOD, "memcpy", None)]
    cats = ctx.kernel_categories.sort("start_ns")["category"].to_list()
    assert cats == ["gemm", "nccl:TP", "nccl:TP", "nccl:TP", "memcpy"]


def test_the_copies_overlap_is_measured_and_only_the_unhidden_copy_is_exposed(ctx):
    step = ctx.steps.row(0, named=True)
    assert step["tx_TP_ns"] == 72_000  # barrier 2 µs + copies 50 and 20 µs: whole, no peer instance to split by
    assert step["overlap_TP_ns"] == 52_000
    assert step["exposed_TP_ns"] == 20_000
    assert step["comm_exposed_ns"] == 20_000
    assert step["other_ns"] == 10_000  # the eager copy stays a copy
    assert set(ctx.match.kernels["transfer_how"].to_list()) == {"unknown"}


def _simulated(tmp_path_factory, name: str, **kw) -> tuple[dict, JobContext]:
    from forensics.simulate import simulate

    run = tmp_path_factory.mktemp(name)
    truth = simulate(name, run, seed=0, **kw)
    return truth, JobContext(load(run, workers=1)[1])


def test_simulated_async_tp_is_measured_as_overlap_and_equals_its_userbuffers_twin(tmp_path_factory):
    """async_tp: tp_overlap's engine run written with PyTorch's names (symm_mem::fused_all_gather_matmul /
    fused_matmul_reduce_scatter, a barrier kernel and a Memcpy DtoD on the backend stream per transfer). The
    writer's truth is each transfer's intersection with the GEMM chunk it ran beside; the step breakdown measures
    exactly that, and the same figures as the userbuffers twin; no exposed-communication finding."""
    from forensics.detectors import run_detectors

    kw = {"ranks": 4, "steps": 2, "params": {"tp": "2", "pp": "2", "microbatches": "4"}}
    truth, ctx = _simulated(tmp_path_factory, "async_tp", **kw)
    _, twin = _simulated(tmp_path_factory, "tp_overlap", **kw)
    exp = truth["expected"]["async_tp"]
    copies = ctx.kernel_categories.filter(pl.col("name").cast(pl.String).str.starts_with("Memcpy DtoD"))
    assert copies.height == exp["async_tp_copies"]
    assert set(copies["category"].to_list()) == {"nccl:TP"}
    tp = ctx.match.kernels.filter(pl.col("pg_type") == "TP")
    assert tp.height == 2 * exp["async_tp_copies"]  # a barrier kernel and a copy each
    assert sorted(set(tp["collective"].to_list())) == ["allgather", "reduce_scatter"]
    steps = ctx.steps
    assert steps["tx_TP_ns"].sum() == exp["async_tp_ns"]
    assert steps["overlap_TP_ns"].sum() == exp["async_tp_overlap_ns"] > 0.7 * exp["async_tp_ns"]
    assert steps["exposed_TP_ns"].sum() == exp["async_tp_exposed_ns"]
    for col in ("step_ns", "tx_TP_ns", "overlap_TP_ns", "exposed_TP_ns", "compute_ns"):
        assert steps[col].to_list() == twin.steps[col].to_list(), col
    assert not [f for f in run_detectors(ctx)[0] if f.detector == "exposed_comm"]


def test_simulated_async_tp_whose_copies_wait_for_the_gemm_is_exposed_and_found(tmp_path_factory):
    """async_tp_serialized: each copy starts after the GEMM chunk it should hide under. The truth overlap is
    nothing; the breakdown exposes every copy and barrier, and exposed_comm warns of fused TP communication not
    hidden, with the median rank's exposed share of the step."""
    from forensics.detectors import run_detectors

    truth, ctx = _simulated(tmp_path_factory, "async_tp_serialized", steps=2)
    exp = truth["expected"]["async_tp"]
    steps = ctx.steps
    assert exp["async_tp_overlap_ns"] == 0
    assert steps["tx_TP_ns"].sum() == steps["exposed_TP_ns"].sum() == exp["async_tp_ns"]
    found = [f for f in run_detectors(ctx)[0] if f.detector == "exposed_comm"]
    assert [(f.severity.value, f.key, f.title.split(":")[0]) for f in found] == [
        ("warning", "TP/EP/CP", "TP communication fused with GEMMs not hidden by them")]
    share = (steps["exposed_TP_ns"] / steps["step_ns"]).to_list()
    per_rank = steps.with_columns(pl.Series("x", share)).group_by("rank").agg(pl.col("x").median())["x"]
    assert found[0].fraction_of_step == pytest.approx(float(per_rank.median()), abs=1e-4)
    assert list(found[0].ranks) == list(range(truth["job"]["world_size"]))
