"""Tensor-parallel communication outside NCCL (#30): TransformerEngine userbuffers and PyTorch symmetric-memory
(async TP) kernels are communication of the TP group, their overlap with GEMMs is measured, and what runs under a
GEMM is not counted as exposed.

A hand-written one-rank Kineto trace: a GEMM from 0 to 100 µs on stream 7; a userbuffers reduce-scatter from 20 to
80 µs on stream 20 (under the GEMM); a symmetric-memory all-reduce from 110 to 130 µs (alone: exposed).
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from forensics.facts.context import JobContext
from forensics.pipeline import load
from tests.frame_builders import one_trace_context

UB = "userbuffers_fp16_sum_inplace_gpu_rr_rs(void*, int, int, int, int, int, int, void**, int*, int*, int)"
SYMM = "void c10d::symmetric_memory::two_shot_all_reduce_kernel<c10::BFloat16, 8>(c10::BFloat16**, unsigned long)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas"


def _trace() -> dict:
    ev: list[dict] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0,
                       "dur": 200.0, "args": {"External id": 1}}]
    for corr, (name, start, end, stream) in enumerate(((GEMM, 10.0, 110.0, 7), (UB, 30.0, 90.0, 20),
                                                        (SYMM, 120.0, 140.0, 20)), start=100):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm" if name == GEMM else "te::op", "pid": 1, "tid": 1,
                   "ts": corr - 99.0, "dur": 3.0, "args": {"External id": corr}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": corr - 98.0, "dur": 1.0, "args": {"External id": corr, "correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start, "dur": end - start,
                   "args": {"External id": corr, "device": 0, "stream": stream, "correlation": corr,
                            "grid": [132, 1, 1], "block": [128, 1, 1]}})
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}], "traceEvents": ev}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return one_trace_context(tmp_path_factory.mktemp("tp_overlap"), _trace())


def test_userbuffers_and_symmetric_memory_kernels_are_tp_communication(ctx):
    k = ctx.frames["kernels"]
    classes = dict(zip(k["name"].to_list(), k["class"].cast(pl.String).to_list()))
    assert classes == {GEMM: "compute", UB: "comm", SYMM: "comm"}
    colls = dict(zip(k["name"].to_list(), k["collective"].to_list()))
    assert (colls[UB], colls[SYMM]) == ("reduce_scatter", "allreduce")
    cats = dict(zip(ctx.kernel_categories["name"].to_list(), ctx.kernel_categories["category"].to_list()))
    assert (cats[UB], cats[SYMM]) == ("nccl:TP", "nccl:TP")


def test_their_overlap_is_measured_and_only_the_part_outside_gemms_is_exposed(ctx):
    step = ctx.steps.row(0, named=True)
    assert step["tx_TP_ns"] == 80_000  # the whole kernels: no peer instance to split a wait off
    assert step["overlap_TP_ns"] == 60_000
    assert step["exposed_TP_ns"] == 20_000
    assert step["comm_exposed_ns"] == 20_000
    kernels = ctx.match.kernels
    assert set(kernels["transfer_how"].to_list()) == {"unknown"}
    assert kernels["matched"].sum() == 0


def test_fsdp2_collectives_are_dp_communication_with_the_prefetch_overlap_of_fsdp(tmp_path_factory):
    """fsdp2_prefetch is fsdp_clean's engine run written as FSDP2 (all_gather_into_tensor / reduce_scatter_tensor on
    the mesh's own dp_shard group): the same transfer, overlap and exposure, under the DP type instead of default;
    NCCL time outside compute equals the simulator's own per-rank figure."""
    from forensics.simulate import simulate

    out: dict[str, JobContext] = {}
    truth: dict = {}
    for name in ("fsdp_clean", "fsdp2_prefetch"):
        run = tmp_path_factory.mktemp(name)
        truth = simulate(name, run, ranks=4, steps=2, seed=0, params={"layers": "3"})
        out[name] = JobContext(load(run, workers=1)[1])
    f1, f2 = out["fsdp_clean"], out["fsdp2_prefetch"]
    assert set(f2.match.kernels["pg_type"].to_list()) == {"DP"}
    assert set(f2.match.kernels["collective"].to_list()) == {"allgather", "reduce_scatter"}
    assert f2.match.unmatched == {"incomplete_instances": 0, "inconsistent_instances": 0}
    for part in ("tx", "overlap", "exposed"):
        assert f2.steps[f"{part}_DP_ns"].to_list() == f1.steps[f"{part}_default_ns"].to_list()
    # the prefetch hides most of it (the first layer's gather has nothing to hide under)
    assert f2.steps["overlap_DP_ns"].sum() > 3 * f2.steps["exposed_DP_ns"].sum()
    outside = f2.steps.group_by("rank").agg((pl.col("comm_exposed_ns") + pl.col("comm_wait_ns")).mean()).sort("rank")
    assert outside["comm_exposed_ns"].to_list() == pytest.approx(
        [m["exposed_comm_ns_mean"] for m in truth["metrics"]], rel=0.01)


def test_symmetric_memory_all_reduces_of_a_real_trace_are_tp_communication(tmp_path):
    """tracelens/eager_trace.json.gz (AMD-AGI/TraceLens tests/traces/b200/eager_trace.json.gz): vLLM with TP=8 on
    B200 runs its all-reduces as PyTorch symmetric memory (``symm_mem::multimem_all_reduce_`` launching
    ``multimem_all_reduce_kernel``), beside one NCCL all-gather. Expectations from the raw JSON."""
    import gzip

    from conftest import shared_path

    src = shared_path("kineto", "tracelens", "eager_trace.json.gz")
    (tmp_path / "trace.json.gz").write_bytes(src.read_bytes())
    raw = json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
    symm = [e for e in raw if e.get("cat") == "kernel" and "multimem_all_reduce_kernel" in e["name"]]
    gpu = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    ctx = JobContext(load(tmp_path, workers=1)[1])
    k = ctx.kernel_categories.filter(pl.col("name").cast(pl.String).str.contains("multimem_all_reduce_kernel"))
    assert k.height == len(symm) > 10
    assert set(k["class"].cast(pl.String).to_list()) == {"comm"}
    assert set(k["collective"].to_list()) == {"allreduce"}
    assert set(k["category"].to_list()) == {"nccl:TP"}
    share = sum(round(e["dur"] * 1000) for e in symm) / sum(round(e["dur"] * 1000) for e in gpu)
    assert ctx.coverage["categories"]["nccl:TP"] == round(share, 4)


def test_a_simulated_symmetric_memory_tp_job_is_measured_as_its_nccl_twin(tmp_path_factory):
    """symm_tp: pp_clean's TP=2 x PP=2 run with its TP all-reduces written as symmetric-memory kernels (no NCCL, no
    group args). They are TP communication, counted whole (the truth's kernel time), exposed where no compute
    runs beside them (they sit on the compute stream), and the findings are those of the NCCL twin."""
    from forensics.detectors import run_detectors
    from forensics.simulate import simulate

    out: dict[str, JobContext] = {}
    truth: dict = {}
    for name in ("pp_clean", "symm_tp"):
        run = tmp_path_factory.mktemp(name)
        truth = simulate(name, run, ranks=4, steps=2, seed=0, params={"tp": "2", "pp": "2", "microbatches": "4"})
        out[name] = JobContext(load(run, workers=1)[1])
    symm, nccl = out["symm_tp"], out["pp_clean"]
    tp = symm.match.kernels.filter(pl.col("pg_type") == "TP")
    assert tp.height == truth["expected"]["symm_tp"]["symm_kernels"]
    assert set(tp["collective"].to_list()) == {"allreduce"}
    assert symm.steps["tx_TP_ns"].sum() == truth["expected"]["symm_tp"]["symm_kernel_ns"]
    assert symm.steps["exposed_TP_ns"].sum() == symm.steps["tx_TP_ns"].sum()
    assert nccl.steps["step_ns"].to_list() == symm.steps["step_ns"].to_list()

    def found(ctx: JobContext) -> list[tuple]:
        return [(f.detector, f.title, tuple(f.ranks)) for f in run_detectors(ctx)[0]]

    assert found(symm) == found(nccl)


def test_a_simulated_comm_gemm_overlap_is_measured_as_overlap_not_exposed(tmp_path_factory):
    """tp_overlap: pp_clean's TP=2 x PP=2 engine with sequence parallelism and TransformerEngine userbuffers: each TP
    all-gather runs on its own stream beside the first half of the GEMM that consumes it, each reduce-scatter
    beside the second half of the GEMM (or the wgrad GEMM) that produced it. The writer's truth is each kernel's
    intersection with the GEMM it ran beside (nothing else computes then: what follows waits for it). The step
    breakdown measures exactly that overlap, exposes only the rest, and no detector reports exposed communication;
    the eager twin (pp_clean, all-reduces on the compute stream) hides none of its TP time."""
    from forensics.detectors import run_detectors
    from forensics.simulate import simulate

    out: dict[str, JobContext] = {}
    truth: dict = {}
    for name in ("pp_clean", "tp_overlap"):
        run = tmp_path_factory.mktemp(name)
        truth = simulate(name, run, ranks=4, steps=2, seed=0, params={"tp": "2", "pp": "2", "microbatches": "4"})
        out[name] = JobContext(load(run, workers=1)[1])
    ub, eager = out["tp_overlap"], out["pp_clean"]
    exp = truth["expected"]["tp_overlap"]
    tp = ub.match.kernels.filter(pl.col("pg_type") == "TP")
    assert tp.height == exp["ub_kernels"]
    assert sorted(set(tp["collective"].to_list())) == ["allgather", "reduce_scatter"]
    ub_k = ub.kernel_categories.filter(pl.col("name").cast(pl.String).str.contains("userbuffers"))
    assert set(ub_k["category"].to_list()) == {
        "nccl:TP"}
    steps = ub.steps
    assert steps["tx_TP_ns"].sum() == exp["ub_kernel_ns"]
    assert steps["overlap_TP_ns"].sum() == exp["ub_overlap_ns"] > 0.7 * exp["ub_kernel_ns"]
    assert steps["exposed_TP_ns"].sum() == exp["ub_exposed_ns"]
    assert eager.steps["overlap_TP_ns"].sum() == 0 < eager.steps["exposed_TP_ns"].sum()
    found = [(f.detector, f.title) for f in run_detectors(ub)[0]]
    assert not [f for f in found if f[0] == "exposed_comm"], found
