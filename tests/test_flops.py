"""FLOPs from recorded shapes and device peaks: each expectation worked out by hand in the comment."""

from __future__ import annotations

import pytest

from forensics.base.flops import device_key, dtype_key, op_flops, peak_tflops


@pytest.mark.parametrize("name,dims,expected", [
    ("aten::mm", [[4096, 1024], [1024, 512]], 2 * 4096 * 512 * 1024),
    ("aten::addmm", [[512], [4096, 1024], [1024, 512]], 2 * 4096 * 512 * 1024),  # bias first
    ("aten::bmm", [[8, 128, 64], [8, 64, 256]], 2 * 8 * 128 * 256 * 64),
    ("aten::baddbmm", [[8, 128, 256], [8, 128, 64], [8, 64, 256]], 2 * 8 * 128 * 256 * 64),
    ("aten::matmul", [[2, 3, 128, 64], [64, 32]], 2 * 6 * 128 * 32 * 64),
    ("aten::linear", [[8, 4096, 1024], [3072, 1024], [3072]], 2 * 8 * 4096 * 3072 * 1024),
    # q, k, v [B=2, H=16, L=2048, D=128]: Q·Kᵀ and P·V, 2·B·H·L·L·D each
    ("aten::_scaled_dot_product_flash_attention", [[2, 16, 2048, 128]] * 3, 4 * 2 * 16 * 2048 * 2048 * 128),
    # the flash entry point lays them out [B, L, H, D]; cross attention Lq=1024, Lk=4096
    ("aten::_flash_attention_forward", [[2, 1024, 16, 128], [2, 4096, 16, 128], [2, 4096, 16, 128]],
     4 * 2 * 16 * 1024 * 4096 * 128),
    # backward: grad_out first, then q, k, v; 2.5x the forward
    ("aten::_scaled_dot_product_flash_attention_backward", [[2, 16, 2048, 128]] * 4,
     2.5 * 4 * 2 * 16 * 2048 * 2048 * 128),
])
def test_flops_from_shapes(name: str, dims: list[list[int]], expected: float):
    assert op_flops(name, dims) == expected


@pytest.mark.parametrize("name,dims", [
    ("aten::mm", []),  # shapes not recorded
    ("aten::mm", [[4096, 1024]]),
    ("aten::_scaled_dot_product_flash_attention", [[2, 16, 128], [2, 16, 128], [2, 16, 128]]),
    ("aten::add", [[4, 4], [4, 4]]),  # not a GEMM
])
def test_no_guess_without_shapes(name: str, dims: list[list[int]]):
    assert op_flops(name, dims) is None


def test_devices_and_dtypes():
    assert device_key("NVIDIA H100 80GB HBM3") == "H100"
    assert device_key("AMD Instinct MI300X") == "MI300X"
    assert device_key("NVIDIA GeForce RTX 3090") is None
    assert [dtype_key(t) for t in ("c10::BFloat16", "c10::Half", "float", "c10::Float8_e4m3fn", "long int")] \
        == ["bf16", "fp16", "fp32", "fp8", None]
    assert peak_tflops("H100", "bf16") == 989.4
    assert peak_tflops("H100", "fp32") == 494.7  # measured against TF32: the trace cannot tell
    assert peak_tflops("A100", "fp8") is None  # no FP8 on Ampere
    assert peak_tflops(None, "bf16") is None


def _reference(folder, op: str, dims: list[list[int]]) -> tuple[int, int]:
    """Straight from the JSON: calls of ``op`` with ``dims`` over all ranks, and the ns of the kernels whose
    launch began inside such a call and inside no later-starting shaped op of the same thread."""
    import gzip
    import json

    from forensics.base.flops import SHAPED_OPS

    calls, ns = 0, 0
    for path in sorted(folder.glob("*.json.gz")):
        events = json.load(gzip.open(path))["traceEvents"]
        shaped = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("name") in SHAPED_OPS
                         and "Input Dims" in e.get("args", {})), key=lambda e: e["ts"])
        kern = {}
        for e in events:
            if e.get("cat") == "kernel":
                kern[e["args"]["correlation"]] = kern.get(e["args"]["correlation"], 0) + round(e["dur"] * 1000)
        for e in events:
            if e.get("cat") != "cuda_runtime" or e["args"].get("correlation") not in kern:
                continue
            open_ops = [o for o in shaped if o["tid"] == e["tid"] and o["ts"] <= e["ts"]]
            if open_ops and open_ops[-1]["ts"] + open_ops[-1]["dur"] >= e["ts"]:
                o = open_ops[-1]
                if o["name"] == op and o["args"]["Input Dims"] == dims:
                    ns += kern[e["args"]["correlation"]]
        calls += sum(1 for o in shaped if o["name"] == op and o["args"]["Input Dims"] == dims)
    return calls, ns


def test_achieved_tflops_on_the_real_dlrm_traces():
    """param_dlrm_8rank records shapes: the fp32 [16,512] x [512,512] GEMM, checked against the raw JSON."""
    import polars as pl

    from forensics.pipeline import analyze
    from tests.conftest import shared_path

    folder = shared_path("kineto", "param_dlrm_8rank")
    tp = analyze(folder).context.op_throughput
    row = tp.filter((pl.col("op") == "aten::mm") & (pl.col("shapes") == "[[16,512],[512,512]]")).row(0, named=True)
    calls, ns = _reference(folder, "aten::mm", [[16, 512], [512, 512]])
    assert (row["calls"], row["kernel_ns"]) == (calls, ns)
    assert row["dtype"] == "fp32" and row["gflop_per_call"] == 2 * 16 * 512 * 512 / 1e9
    assert row["tflops"] == pytest.approx(calls * 2 * 16 * 512 * 512 / ns / 1e3, rel=1e-12)
    assert tp.filter(pl.col("op") == "aten::linear").height == 0  # its kernels belong to the addmm inside
