"""FLOPs of GEMM and attention ops from their recorded input shapes, and the device peaks they are measured against.

Shapes come from the profiler's ``Input Dims`` and ``Input type`` (``record_shapes=True``); an op whose shapes
were not recorded gets no FLOP count, never a guess. A multiply-add counts as 2 FLOPs.

- ``aten::mm`` ([M,K] x [K,N]), ``aten::addmm`` (bias, [M,K], [K,N]): 2·M·N·K
- ``aten::bmm`` ([B,M,K] x [B,K,N]), ``aten::baddbmm`` (input, [B,M,K], [B,K,N]): 2·B·M·N·K
- ``aten::matmul``: the leading dimensions of the first input are the batch: 2·batch·M·N·K
- ``aten::linear`` (input [..., K], weight [N, K]): 2·rows·N·K, rows the product of the input's leading dimensions
- Triton matmul templates of torch.compile (``triton_tem_fused_mm_0``, ``..._addmm_..``, ``..._bmm_..``; shapes
  from the launcher's host op): 2·batch·M·N·K from the first operands A [.., M, K], B [.., K, N] whose output
  [.., M, N] is among the arguments; other templates (flex attention, convolutions) get none
- scaled-dot-product / flash / memory-efficient attention, forward (q, k, v as [B, H, L, D]; the kernels'
  own ``aten::_flash_attention_forward`` / ``aten::_efficient_attention_forward`` as [B, L, H, D]): 4·B·H·Lq·Lk·D (Q·Kᵀ and P·V), the dense count: a causal
  mask halves the work done, which the shapes do not tell; backward: 2.5 times the forward (five matmuls of
  that size instead of two).

Peaks (:data:`PEAK_TFLOPS`) are the vendors' dense (not 2:4 sparse) tensor-core figures per GPU:
NVIDIA A100 SXM4 (A100 datasheet: BF16/FP16 312, TF32 156, FP32 19.5), H100 SXM5 (H100 datasheet: BF16/FP16
989.4, FP8 1978.9, TF32 494.7, FP32 66.9), H200 SXM (H200 datasheet: the H100's compute), HGX B200 (HGX B200
datasheet, per GPU: BF16/FP16 2250, FP8 4500, TF32 1100, FP32 75), AMD MI300X (MI300X datasheet: BF16/FP16
1307.4, FP8 2614.9, TF32 653.7, FP32 163.4). FP32 GEMMs are measured against the TF32 peak when the device has
one: PyTorch may allow TF32 for them, and the trace does not say whether it did.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "tf32": 1100.0, "fp32": 75.0},
    "MI300X": {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7, "fp32": 163.4},
}

_DEVICE = re.compile(r"\b(A100|H100|H200|B200|MI300X)\b", re.IGNORECASE)
_DTYPES = (("float8", "fp8"), ("bfloat16", "bf16"), ("half", "fp16"), ("float16", "fp16"), ("float", "fp32"))

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
ATTENTION_FWD = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                 "aten::_scaled_dot_product_cudnn_attention")
ATTENTION_BWD = tuple(f"{op}_backward" for op in ATTENTION_FWD)
BLHD_FWD = ("aten::_flash_attention_forward", "aten::_efficient_attention_forward")
BLHD_BWD = ("aten::_flash_attention_backward", "aten::_efficient_attention_backward")
"""The kernels' own entry points take q, k, v as [B, L, H, D]; the scaled-dot-product ops as [B, H, L, D]."""
SHAPED_OPS = frozenset(GEMM_OPS + ATTENTION_FWD + ATTENTION_BWD + BLHD_FWD + BLHD_BWD)
"""Ops whose shapes the Kineto parser keeps (only these: shapes of every op would cost memory), with the Triton
templates (:data:`TRITON_TEMPLATE_PREFIX`)."""
TRITON_TEMPLATE_PREFIX = "triton_tem_"
"""torch.compile's template kernels (inductor names them ``triton_tem_fused_<ops>_<n>``); its launcher records a host
op of the kernel's name around the launch, with the kernel's arguments as ``Input Dims`` when shapes are recorded."""


def device_key(gpu_name: str | None) -> str | None:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``; None for a device without a known peak."""
    m = _DEVICE.search(gpu_name or "")
    return m.group(1).upper() if m else None


def dtype_key(type_name: str | None) -> str | None:
    """Kineto's ``Input type`` (``c10::BFloat16``, ``float``, ``c10::Float8_e4m3fn``) -> bf16 / fp16 / fp32 / fp8."""
    low = (type_name or "").lower()
    for needle, key in _DTYPES:
        if needle in low:
            return key
    return None


def peak_tflops(device: str | None, dtype: str | None) -> float | None:
    table = PEAK_TFLOPS.get(device or "")
    if not table or not dtype:
        return None
    if dtype == "fp32":
        return table.get("tf32", table.get("fp32"))
    return table.get(dtype)


def _gemm(name: str, dims: Sequence[Sequence[int]]) -> float | None:
    shapes = [d for d in dims if d]
    if name == "aten::linear" and len(shapes) >= 2 and len(shapes[1]) == 2:
        x, w = shapes[0], shapes[1]
        return 2.0 * math.prod(x[:-1]) * w[0] * w[1]
    ab = shapes[-2:] if name in ("aten::addmm", "aten::baddbmm") else shapes[:2]
    if len(ab) != 2 or len(ab[0]) < 2 or len(ab[1]) < 2:
        return None
    a, b = ab
    batch = math.prod(a[:-2]) if len(a) > 2 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def _attention(dims: Sequence[Sequence[int]], blhd: bool) -> float | None:
    if len(dims) < 3 or any(len(d) != 4 for d in dims[:3]):
        return None
    q, k = dims[0], dims[1]
    if blhd:
        b, lq, h, d = q
        lk = k[1]
    else:
        b, h, lq, d = q
        lk = k[2]
    return 4.0 * b * h * lq * lk * d


def _triton_mm(dims: Sequence[Sequence[int]]) -> float | None:
    """A Triton matmul template's FLOPs from its arguments' shapes: the first two consecutive tensors A [.., M, K]
    and B [.., K, N] whose product's shape [.., M, N] is also among the arguments (the output buffer), so a bias or
    an epilogue input is not taken for an operand. None when no such triple is there."""
    shapes = [list(d) for d in dims if isinstance(d, (list, tuple))]
    for i in range(len(shapes) - 1):
        a, b = shapes[i], shapes[i + 1]
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            continue
        out = a[:-1] + [b[-1]]
        if out in shapes[i + 2:]:
            batch = math.prod(a[:-2]) if len(a) > 2 else 1
            return 2.0 * batch * a[-2] * a[-1] * b[-1]
    return None


def op_flops(name: str, dims: Sequence[Sequence[int]]) -> float | None:
    """FLOPs of one call of ``name`` with input shapes ``dims``; None when unknown (see module doc)."""
    if name.startswith(TRITON_TEMPLATE_PREFIX):
        return _triton_mm(dims) if "mm" in name else None
    if name in GEMM_OPS:
        return _gemm(name, dims)
    if name in ATTENTION_FWD or name in BLHD_FWD:
        return _attention(dims, blhd=name in BLHD_FWD)
    if name in ATTENTION_BWD or name in BLHD_BWD:
        # the backward's inputs start with grad_out (shaped as q), then q, k, v
        fwd = _attention(dims[1:], blhd=name in BLHD_BWD)
        return None if fwd is None else 2.5 * fwd
    return None
