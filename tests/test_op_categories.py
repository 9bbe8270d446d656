"""Op categories: kernel names from real traces, and per-step category times on a hand-built job."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from forensics.facts.context import JobContext
from forensics.facts.op_categories import category_expr
from tests.frame_builders import MS, US, _Rows

# Kernel names copied from the traces in ../shared/sample_data/kineto, labelled by hand.
NAMES = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", "gemm"),
    ("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1", "gemm"),
    ("volta_scudnn_128x64_stridedB_interior_nn_v1", "gemm"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int)", "gemm"),
    ("Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1", "gemm"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::half_t>>", "attention"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "attention"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float)", "normalization"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>", "normalization"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>", "elementwise"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float const*)", "elementwise"),
    ("void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>", "embedding"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>",
     "embedding"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>", "optimizer"),
    # `lambda` in a template argument is not the LAMB optimizer
    ("void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast<at::native::"
     "BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float>>>"
     "(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)", "elementwise"),
    ("void fast_hadamard_transform_kernel<Kernel_traits<128>>", "other"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedSgdMathFunctor<float, 2>>", "optimizer"),
    ("void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t>>",
     "other"),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800>", "other"),
]


@pytest.mark.parametrize("name,expected", NAMES)
def test_kernel_names_from_real_traces(name: str, expected: str):
    got = pl.DataFrame({"name": [name]}).select(category_expr(pl.col("name")).alias("c"))["c"][0]
    assert got == expected


def _job() -> JobContext:
    """Two ranks, two steps of 30 ms. Per step (t0 = step start): GEMM t0+1..t0+11 ms, elementwise
    t0+11..t0+13, layer norm on a second stream t0+5..t0+8 (concurrent with the GEMM), an all-reduce
    t0+14..t0+20 on the DATA_PARALLEL group, a memcpy t0+21..t0+22, nothing else."""
    rows = _Rows()
    for rank in (0, 1):
        for step in (0, 1):
            t0 = step * 30 * MS
            rows.steps.append(dict(rank=rank, host="node0", source=f"r{rank}.json", step=step,
                                   start_ns=t0, end_ns=t0 + 30 * MS))
            rows.kernel(rank, t0 + 1 * MS, t0 + 11 * MS, "compute", name="ampere_sgemm_128x64_nn", external_id=1)
            rows.kernel(rank, t0 + 11 * MS, t0 + 13 * MS, "compute",
                        name="at::native::vectorized_elementwise_kernel", external_id=2)
            rows.kernel(rank, t0 + 5 * MS, t0 + 8 * MS, "compute", name="layer_norm_fwd", stream=9, external_id=3)
            rows.kernel(rank, t0 + 14 * MS, t0 + 20 * MS, "comm", name="ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                        collective="allreduce", pg_name="0", pg_desc="DATA_PARALLEL", pg_ranks=[0, 1], group_size=2,
                        in_nelems=1 << 20, out_nelems=1 << 20, dtype="Float", external_id=4)
            rows.kernel(rank, t0 + 21 * MS, t0 + 22 * MS, "memcpy", name="Memcpy HtoD (Pageable -> Device)")
    for rank in (0, 1):
        for ext, op in ((1, "aten::mm"), (2, "aten::add"), (3, "aten::layer_norm"), (4, "nccl:all_reduce")):
            rows.ops.append(dict(rank=rank, host="node0", source=f"r{rank}.json", category="cpu_op", name=op,
                                 start_ns=0, end_ns=US, external_id=ext, is_launch=False))
    return JobContext(rows.frames(2, [("0", "DATA_PARALLEL", [0, 1])]))


def test_category_times_per_rank_and_step():
    ctx = _job()
    got = {(r["rank"], r["step"], r["category"]): (r["kernels"], r["time_ns"]) for r in ctx.categories.to_dicts()}
    for rank in (0, 1):
        for step in (0, 1):
            assert got[(rank, step, "gemm")] == (1, 10 * MS)
            assert got[(rank, step, "elementwise")] == (1, 2 * MS)
            assert got[(rank, step, "normalization")] == (1, 3 * MS)
            assert got[(rank, step, "nccl:DP")] == (1, 6 * MS)
            assert got[(rank, step, "memcpy")] == (1, 1 * MS)
    # idle is the breakdown's no-kernel time: step 0 runs to the next step's start (30 ms), kernels cover
    # 1..13, 14..20, 21..22 ms -> idle 1 + 1 + 1 + 8 = 11 ms; the last step ends at its last kernel (22 ms)
    # or its own end (30 ms), whichever the breakdown uses: read it from the breakdown frame itself
    idle = {(r["rank"], r["step"]): r["idle_ns"] for r in ctx.steps.to_dicts()}
    assert len(idle) == ctx.steps.height > 0
    for (rank, step), ns in idle.items():
        assert got[(rank, step, "idle")] == (0, ns)
    assert idle[(0, 0)] == 11 * MS


def test_kernels_are_attributed_to_their_launching_op():
    att = _job().op_attribution
    row = att.filter((pl.col("rank") == 0) & (pl.col("category") == "gemm")).to_dicts()
    assert row == [{"rank": 0, "category": "gemm", "op": "aten::mm", "kernels": 2, "time_ns": 20 * MS,
                    "kernel_names": ["ampere_sgemm_128x64_nn"], "via": "launch", "region": None}]
    memcpy = att.filter((pl.col("rank") == 0) & (pl.col("category") == "memcpy"))
    assert memcpy["op"].to_list() == [None]  # no External id: no op, said as null
    assert att["time_ns"].to_list() == sorted(att["time_ns"].to_list(), reverse=True)


def test_the_view_shows_the_median_step_split_and_the_top_ops():
    from forensics.reports.view_categories import per_step_ms, top_ops

    ctx = _job()
    data, who = per_step_ms(ctx.categories)
    assert who == "rank"
    gemm = data.filter(pl.col("category") == "gemm").sort("who")
    assert gemm["who"].to_list() == ["0", "1"] and gemm["ms"].to_list() == [10.0, 10.0]
    ops = top_ops(ctx.op_attribution)
    first = ops.row(0, named=True)
    # 2 ranks x 2 steps x 10 ms of GEMM under aten::mm
    assert (first["category"], first["op"], first["ranks"], first["kernels"], first["total_ms"], first["ms_per_rank"]) \
        == ("gemm", "aten::mm", 2, 4, 40.0, 20.0)


def _sql_gemm_ops(db: Path) -> dict[str, int]:
    """Straight from the export: for each nvjet (cuBLAS GEMM) kernel, the innermost NVTX range open on the
    launching thread when its launch call began, op id dropped; counted per op over both processes."""
    import re
    import sqlite3

    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT r.globalTid, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND r.globalTid / 16777216 = "
        "k.globalPid / 16777216 WHERE s.value LIKE 'nvjet%'").fetchall()
    counts: dict[str, int] = {}
    for tid, t in rows:
        hit = con.execute(
            "SELECT COALESCE(n.text, s.value), n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
            "WHERE n.globalTid = ? AND n.start <= ? AND n.eventType = 59 ORDER BY n.start DESC LIMIT 1",
            (tid, t)).fetchone()
        if hit and hit[1] is not None and hit[1] >= t:
            op = re.sub(r",\s*(op_id|seq|sizes|stream)\s*=.*$", "", hit[0])
            counts[op] = counts.get(op, 0) + 1
    con.close()
    return counts


def test_nsys_kernels_are_attributed_through_the_launching_thread(tmp_path: Path):
    """nsys-ai mfu_2gpu_before: no External ids; GEMMs attributed to the aten op NVTX range around the launch."""
    import shutil

    from forensics.pipeline import analyze
    from tests.conftest import shared_path

    db = shared_path("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")
    shutil.copy(db, tmp_path / db.name)
    att = analyze(tmp_path).context.op_attribution.filter(pl.col("category") == "gemm")
    got = dict(att.group_by("op").agg(pl.col("kernels").sum()).iter_rows())
    expected = _sql_gemm_ops(db)
    assert expected and sum(expected.values()) >= 100
    assert {op: got.get(op) for op in expected} == expected
