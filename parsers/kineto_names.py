"""Names in Kineto traces: collectives, NCCL/RCCL kernel names, dtypes, rank and host from file names."""

from __future__ import annotations

import re
from functools import lru_cache

# Element sizes of c10 ScalarType names as Kineto writes them in `dtype` / `Input type`.
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4, "complexhalf": 4,
    "bfloat16": 2, "half": 2, "float16": 2, "short": 2, "int16": 2, "uint16": 2,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "uint64": 8, "complexfloat": 8,
    "complexdouble": 16,
    "byte": 1, "char": 1, "bool": 1, "int8": 1, "uint8": 1, "qint8": 1, "quint8": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}

_COLLECTIVE_ALIASES = {
    "allreduce": "allreduce",
    "allgather": "allgather",
    "reducescatter": "reduce_scatter",
    "alltoall": "alltoall",
    "alltoallv": "alltoall",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "sendrecv",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "barrier": "barrier",
    "monitoredbarrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}
_STRIP_PARTS = re.compile(r"_?(?:into_tensor|tensor|base|coalesced|_*$)")


@lru_cache(maxsize=4096)
def normalise_collective(raw: str | None) -> str | None:
    """`_allgather_base`, `all_gather_into_tensor`, `nccl:all_reduce`, `c10d::allreduce_`,
    `ReduceScatter` ... -> allgather, allreduce, reduce_scatter. Unknown names come back
    lower-cased (so nothing is lost), empty ones as None."""
    if not raw:
        return None
    text = raw.strip()
    for prefix in ("c10d::", "nccl:", "gloo:", "rccl:"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = text.lower().strip("_")
    key = _STRIP_PARTS.sub("", text).replace("_", "")
    return _COLLECTIVE_ALIASES.get(key, text or None)


# ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_RING_LL,
# ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclSymDevKernel_..., ncclSymkDevKernel_...,
# ncclDevKernel_Generic, rcclGenericKernel<...>, optionally preceded by `void `.
# Communication kernels: NCCL/RCCL in every naming era, plus DeepEP's expert-parallel kernels.
TP_OVERLAP_KERNEL = (r"(?i)userbuffers|symm_mem|symmetric_memory|multimem_(all_reduce|all_gather|one_shot|two_shot)|"
                     r"(one|two)_shot_all_reduce")
"""Tensor-parallel communication overlapped with GEMMs outside NCCL: TransformerEngine's userbuffers kernels
(``userbuffers_fp16_sum_inplace_gpu_rr_rs``, ``kuserbuffers_pullsend``), PyTorch symmetric memory (async TP's
``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, ``multimem_all_reduce``, ``two_shot_all_reduce``)."""
COMM_KERNEL_PATTERN = r"(?i)nccl|rccl|dpsk::ep::|deep_ep::|" + TP_OVERLAP_KERNEL.removeprefix("(?i)")

_FUSED_TP = {"fused_all_gather_matmul": "allgather", "fused_all_gather_scaled_matmul": "allgather",
             "fused_all_gather_block_scaled_matmul": "allgather", "fused_matmul_reduce_scatter": "reduce_scatter",
             "fused_scaled_matmul_reduce_scatter": "reduce_scatter"}
FUSED_TP_OPS: dict[str, str] = {f"{ns}{name}": coll for ns in ("symm_mem::", "cuda_p2p::", "")
                                for name, coll in _FUSED_TP.items()}
"""Async TP's fused ops and the collective each one runs: the dispatcher ops ``symm_mem::fused_all_gather_matmul``,
``symm_mem::fused_matmul_reduce_scatter`` and their scaled variants (``cuda_p2p::`` in PyTorch 2.4), and the
``record_function`` ranges of the same bare names their CUDA implementations open
(torch/distributed/_symmetric_memory/__init__.py). Inside them the data moves as ``aten::copy_`` peer copies
(``cudaMemcpyAsync``: ``Memcpy DtoD`` / ``Memcpy PtoP`` on the GPU) between ``barrier_kernel`` launches, on the
current stream and a backend stream, while the chunk GEMMs run: the copies are the op's communication."""
TP_OVERLAP_COMM = TP_OVERLAP_KERNEL + r"|^Memcpy "
"""Comm-class rows of TP communication fused with GEMMs: the kernels of :data:`TP_OVERLAP_KERNEL`, and the copies an
async-TP fused op moves its data with (the parser makes only those copies comm-class)."""
_KERNEL_COLL = re.compile(
    r"(?:nccl|rccl)\w*?Kernel_(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll|AlltoAll)"
    r"(?=_|\(|<|$)",
    re.IGNORECASE,
)
_ALGO = re.compile(r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)(?=_|\(|<|$)")
_PROTO = re.compile(r"_(LL128|LL|SIMPLE)(?=_|\(|<|$)")


_TP_OVERLAP = re.compile(TP_OVERLAP_KERNEL)
_TP_COLL = ((re.compile(r"(?i)reduce_scatter|_rs\b|_rs_|rr_rs|matmul_reduce_scatter"), "reduce_scatter"),
            (re.compile(r"(?i)all_gather|_ag\b|_ag_|pullsend|pushrecv"), "allgather"),
            (re.compile(r"(?i)all_reduce|sum_inplace"), "allreduce"))


def kernel_name_hints(name: str) -> tuple[str | None, str | None, str | None]:
    """(collective, algorithm, protocol) as the NCCL kernel name states them: hints only."""
    if _TP_OVERLAP.search(name) and not re.search(r"(?i)nccl|rccl", name):
        return next((coll for pattern, coll in _TP_COLL if pattern.search(name)), None), None, None
    base = name.split("(", 1)[0]
    m = _KERNEL_COLL.search(base)
    coll = normalise_collective(m.group(1)) if m else None
    algo = _ALGO.search(base)
    proto = _PROTO.search(base)
    return coll, (algo.group(1) if algo else None), (proto.group(1) if proto else None)


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)
# tensorboard_trace_handler's default: <hostname>_<pid>.<ms timestamp>.pt.trace.json
_HOST_PID_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$")


def rank_from_filename(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def host_from_filename(name: str, trace_pids: set[int]) -> str | None:
    """Host from `<host>_<pid>.<ts>.pt.trace.json`, trusted only when the pid in the name is a pid
    of the trace (custom worker names like `worker0_step_12.<ts>.pt.trace.json` are not hosts)."""
    m = _HOST_PID_NAME.match(name)
    if not m:
        return None
    if trace_pids and int(m.group("pid")) not in trace_pids:
        return None
    host = m.group("host")
    if not trace_pids and _RANK_IN_NAME.fullmatch("_" + host):
        return None
    return host


@lru_cache(maxsize=1024)
def parse_rank_list(text: str | None) -> tuple[int, ...] | None:
    """`"[0, 1, 2]"` -> (0, 1, 2); None for anything else."""
    if text is None:
        return None
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    body = body[1:-1].strip()
    if not body:
        return ()
    try:
        return tuple(int(x) for x in body.split(","))
    except ValueError:
        return None
