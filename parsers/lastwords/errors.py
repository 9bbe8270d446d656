"""What an error message says: its class, and the allocator's numbers of a CUDA out-of-memory.

Classes (``last_words.cls``), checked in this order (first match wins):

* ``cuda_oom``: the caching allocator's `CUDA out of memory. Tried to allocate ...` (every era);
* ``cuda_context_oom``: the CUDA runtime's `CUDA error: out of memory` (no allocator numbers: context or
  NCCL buffers on a full or shared GPU);
* ``illegal_address``, ``device_assert``, ``launch_failure``, ``ecc``: CUDA errors of those kinds;
* ``cuda_unknown`` (`unknown error`, 999) and ``cuda_error`` (any other `CUDA error:`);
* ``nccl_remote`` / ``nccl_system`` / ``nccl_internal`` / ``nccl_cuda`` / ``nccl_usage``: NCCL errors
  raised to Python (`NCCL error in: ...`, `DistBackendError`), by ncclGetErrorString's text;
* ``dataloader``: a DataLoader worker killed, exited or timed out, or a bus error in a worker (shm);
* ``nan``: a NaN/Inf guard (`loss is nan`, `non-finite`, `FloatingPointError`, anomaly mode);
* ``fatal_signal``: `Fatal Python error: Segmentation fault` and the like;
* ``dist_error``: `DistBackendError` / `DistNetworkError` / `DistStoreError` without NCCL or CUDA text (a store or
  socket that a dead peer left): a victim, like the NCCL errors;
* ``exception``: anything else.
"""

from __future__ import annotations

import re

from forensics.parsers.lastwords.text import size_bytes

_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuda_oom", re.compile(r"CUDA out of memory|OutOfMemoryError|HIP out of memory")),
    ("cuda_context_oom", re.compile(r"(?:CUDA|HIP) error: out of memory|cudaErrorMemoryAllocation")),
    ("illegal_address", re.compile(r"illegal memory access|cudaErrorIllegalAddress|illegal address")),
    ("device_assert", re.compile(r"device-side assert|cudaErrorAssert|Assertion `.*` failed")),
    ("launch_failure", re.compile(r"unspecified launch failure|cudaErrorLaunchFailure|too many resources requested"
                                  r"|misaligned address|invalid device function|no kernel image is available")),
    ("ecc", re.compile(r"uncorrectable ECC|ECCUncorrectable|uncorrectable NVLink", re.IGNORECASE)),
    ("cuda_unknown", re.compile(r"(?:CUDA|HIP) error: unknown error")),
    ("nccl_remote", re.compile(r"remote process exited or there was a network error|ncclRemoteError")),
    ("nccl_system", re.compile(r"unhandled system error|ncclSystemError")),
    ("nccl_internal", re.compile(r"NCCL error.*internal error|ncclInternalError")),
    ("nccl_cuda", re.compile(r"unhandled cuda error|ncclUnhandledCudaError")),
    ("nccl_usage", re.compile(r"NCCL error.*invalid (?:usage|argument)|ncclInvalid(?:Usage|Argument)")),
    ("cuda_error", re.compile(r"(?:CUDA|HIP) error: |cudaError\w+")),
    ("dataloader", re.compile(r"DataLoader worker \(pids?|DataLoader timed out|bus error encountered in worker")),
    ("nan", re.compile(r"\b(?:loss|grad(?:ient)?s?(?: norm)?)\b[^.\n]{0,40}\b(?:is|became|are)\s+(?:nan|inf)\b|"
                       r"non-finite|FloatingPointError|returned nan values|Detected (?:NaN|nan|inf)|"
                       r"NaN or Inf found|nan detected", re.IGNORECASE)),
    ("fatal_signal", re.compile(r"^Fatal Python error: ")),
)


_DIST = re.compile(r"Dist(?:Backend|Network|Store)Error")


def classify(text: str) -> str:
    for cls, pattern in _CLASSES:
        if pattern.search(text):
            return cls
    # torch.distributed's own errors with no NCCL or CUDA text (a store or socket a dead peer left): victims
    return "dist_error" if _DIST.search(text[:80]) else "exception"


_OOM_FIELDS = (
    ("oom_requested_bytes", re.compile(r"Tried to allocate (\S+ \w+?)[.;( ]")),
    ("oom_total_bytes", re.compile(r"total capac?ity of (\S+ \w+)|; (\S+ \w+) total capacity")),
    ("oom_free_bytes", re.compile(r"of which (\S+ \w+) is free|; (\S+ \w+) free")),
    ("oom_process_bytes",
     re.compile(r"this process has (\S+ \w+) memory in use|Process \d+ has (\S+ \w+) memory in use")),
    ("oom_allocated_bytes", re.compile(r"(\S+ \w+) is allocated by PyTorch|; (\S+ \w+) already allocated")),
    # 1.x's `cached` is the cache less what is allocated
    ("oom_reserved_unallocated_bytes",
     re.compile(r"(\S+ \w+) is reserved by PyTorch but unallocated|; (\S+ \w+) cached\)")),
    ("oom_reserved_bytes", re.compile(r"(\S+ \w+) reserved in total by PyTorch")),
)
_GPU = re.compile(r"\(GPU (\d+);|GPU (\d+) has a total")


def oom_numbers(text: str) -> dict[str, int | None]:
    """The allocator's numbers in bytes (None where this era's message does not print one). The
    reserved-but-unallocated figure is printed since ~2.1; before, it is reserved minus allocated."""
    out: dict[str, int | None] = {}
    for name, pattern in _OOM_FIELDS:
        m = pattern.search(text)
        out[name] = size_bytes(next((g for g in m.groups() if g), None)) if m else None
    reserved = out.pop("oom_reserved_bytes")
    if (out["oom_reserved_unallocated_bytes"] is None and reserved is not None
            and out["oom_allocated_bytes"] is not None):
        out["oom_reserved_unallocated_bytes"] = max(0, reserved - out["oom_allocated_bytes"])
    g = _GPU.search(text)
    out["gpu_index"] = int(next(x for x in g.groups() if x)) if g else None
    return out
