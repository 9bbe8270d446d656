"""Canonical frames: the one place where every table's columns, dtypes and units are defined.

Parsers produce these frames, detectors consume them; neither touches the other's raw input.
Conventions that hold for every frame:

* all times are integer nanoseconds (``*_ns``, Int64). Trace times are Unix-epoch ns when the
  source gives an absolute clock (Kineto ``baseTimeNanoseconds`` or epoch-µs ``ts``), else they are
  in the source's own clock domain, named by the ``clock`` column where a frame has one;
* ``rank`` is the global rank (Int32) and is null when the source does not say it: never 0 by default;
* ``source`` is the path of the file the row came from, relative to RUN_DIR.

``docs/frames.md`` is generated from this module (``python -m forensics.frames``) and a test checks
that it is current.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import polars as pl

KERNEL_CLASSES = ["compute", "comm", "memcpy", "memset", "sync"]
SOURCE_KINDS = ["kineto", "nsys", "nccl_log", "dmesg", "nvidia_smi", "unknown"]
SOURCE_STATUSES = ["ok", "partial", "failed", "ignored"]
CPU_OP_CATEGORIES = [
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "cuda_runtime",
    "cuda_driver",
    "python_function",
]


@dataclass(frozen=True)
class Column:
    name: str
    dtype: pl.DataType
    doc: str


@dataclass(frozen=True)
class FrameSpec:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def schema(self) -> pl.Schema:
        return pl.Schema({c.name: c.dtype for c in self.columns})


def _c(name: str, dtype: pl.DataType, doc: str) -> Column:
    return Column(name, dtype, doc)


FRAME_SPECS: dict[str, FrameSpec] = {}


def _register(*specs: FrameSpec) -> None:
    """Each section below registers its own frames, so sections stay self-contained."""
    for spec in specs:
        if spec.name in FRAME_SPECS:
            raise ValueError(f"frame {spec.name!r} defined twice")
        FRAME_SPECS[spec.name] = spec


_RANK = _c("rank", pl.Int32(), "global rank; null when the source does not say")
_HOST = _c("host", pl.String(), "host name; null when unknown")
_SOURCE = _c("source", pl.String(), "file the row came from, relative to RUN_DIR")
_PG_COLUMNS = (
    _c("pg_name", pl.String(), "process group name (`Process Group Name` / `pg_name`)"),
    _c("pg_desc", pl.String(), "process group description (`default_pg`, Megatron group names)"),
    _c("pg_ranks", pl.List(pl.Int32()), "global ranks of the process group"),
    _c("group_size", pl.Int32(), "process group size"),
)
_MSG_COLUMNS = (
    _c("in_nelems", pl.Int64(), "input elements (`In msg nelems`)"),
    _c("out_nelems", pl.Int64(), "output elements (`Out msg nelems`)"),
    _c("dtype", pl.String(), "element type as the trace names it (`Float`, `BFloat16`)"),
    _c(
        "bytes",
        pl.Int64(),
        "message size in bytes: max(in, out) elements x element size, the nccl-tests `size` convention",
    ),
    _c("seq", pl.Int64(), "per-process-group sequence number (`Seq`), when the trace has it"),
)

# --- trace frames (foundation) ---------------------------------------------------------------

SOURCES = FrameSpec(
    "sources",
    "One row per file found under RUN_DIR, whatever became of it.",
    (
        _c("path", pl.String(), "path relative to RUN_DIR"),
        _c("kind", pl.Enum(SOURCE_KINDS), "what the content is (decided by content, not by name)"),
        _RANK,
        _HOST,
        _c("status", pl.Enum(SOURCE_STATUSES), "ok / partial (salvaged) / failed / ignored"),
        _c("message", pl.String(), "one line: why partial, failed or ignored, or what was read"),
        _c("size_bytes", pl.Int64(), "file size on disk"),
        _c("parse_ns", pl.Int64(), "wall time spent parsing this file, ns"),
    ),
)

KERNELS = FrameSpec(
    "kernels",
    "GPU activity: kernels, memcpy and memset, one row per event.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("device", pl.Int32(), "GPU index on the host (Kineto `device` / GPU pid)"),
        _c("stream", pl.Int64(), "CUDA/HIP stream id"),
        _c("name", pl.String(), "kernel name as recorded (mangled or demangled)"),
        _c("class", pl.Enum(KERNEL_CLASSES), "compute / comm (NCCL, RCCL) / memcpy / memset / sync"),
        _c("start_ns", pl.Int64(), "start, ns"),
        _c("end_ns", pl.Int64(), "end, ns"),
        _c("correlation", pl.Int64(), "CUPTI/roctracer correlation id, links to the launch in cpu_ops"),
        _c("external_id", pl.Int64(), "Kineto `External id`: the enclosing CPU op"),
        _c("grid_x", pl.Int32(), "grid dimension x"),
        _c("grid_y", pl.Int32(), "grid dimension y"),
        _c("grid_z", pl.Int32(), "grid dimension z"),
        _c("block_x", pl.Int32(), "block dimension x"),
        _c("block_y", pl.Int32(), "block dimension y"),
        _c("block_z", pl.Int32(), "block dimension z"),
        _c("blocks_per_sm", pl.Float64(), "`blocks per SM` as the profiler reports it"),
        _c(
            "collective",
            pl.String(),
            "normalised collective for comm kernels: allreduce, allgather, reduce_scatter, alltoall, "
            "broadcast, reduce, sendrecv, send, recv, barrier; null when unknown",
        ),
        _c("name_algo", pl.String(), "algorithm named in the kernel name: a hint only, not what ran"),
        _c("name_proto", pl.String(), "protocol named in the kernel name: a hint only, not what ran"),
        *_PG_COLUMNS,
        *_MSG_COLUMNS,
    ),
)

CPU_OPS = FrameSpec(
    "cpu_ops",
    "Host-side ranges: operators, annotations, runtime and driver calls, Python functions.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("pid", pl.Int64(), "process id (for gpu_user_annotation: the device)"),
        _c("tid", pl.Int64(), "thread id (for gpu_user_annotation: the stream)"),
        _c("category", pl.Enum(CPU_OP_CATEGORIES), "Kineto category, legacy names normalised"),
        _c("name", pl.String(), "op / annotation / API name"),
        _c("start_ns", pl.Int64(), "start, ns"),
        _c("end_ns", pl.Int64(), "end, ns"),
        _c("correlation", pl.Int64(), "correlation id (runtime / driver calls)"),
        _c("external_id", pl.Int64(), "Kineto `External id`"),
        _c("is_launch", pl.Boolean(), "a runtime/driver call that launched GPU work"),
    ),
)

STEPS = FrameSpec(
    "steps",
    "Training steps per rank (`ProfilerStep#N`, or NVTX step ranges).",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("step", pl.Int64(), "step number N"),
        _c("start_ns", pl.Int64(), "start, ns"),
        _c("end_ns", pl.Int64(), "end, ns"),
    ),
)

COMMS = FrameSpec(
    "comms",
    "One row per host-side collective call (`record_param_comms`, else `nccl:*` / `c10d::*`), "
    "linked to its GPU kernel.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("pid", pl.Int64(), "process id"),
        _c("tid", pl.Int64(), "thread id"),
        _c("name", pl.String(), "op name (`record_param_comms`, `nccl:all_reduce`, `c10d::allreduce_`)"),
        _c("collective", pl.String(), "normalised collective (see kernels.collective)"),
        _c("start_ns", pl.Int64(), "host call start, ns"),
        _c("end_ns", pl.Int64(), "host call end, ns"),
        _c("external_id", pl.Int64(), "Kineto `External id`"),
        _c("kernel_correlation", pl.Int64(), "correlation of the GPU kernel it launched; null if none"),
        *_PG_COLUMNS,
        *_MSG_COLUMNS,
        _c("src_rank", pl.Int32(), "source rank of a point-to-point op"),
        _c("dst_rank", pl.Int32(), "destination rank of a point-to-point op"),
    ),
)

RANKS = FrameSpec(
    "ranks",
    "One row per rank (per trace source): identity and hardware.",
    (
        _RANK,
        _c("world_size", pl.Int32(), "world size; null when unknown"),
        _HOST,
        _c("pid", pl.Int64(), "main process id"),
        _c("device", pl.Int32(), "GPU index used by this rank; null when unknown"),
        _c("gpu_name", pl.String(), "GPU model"),
        _c("sm_count", pl.Int32(), "streaming multiprocessors (CUs on AMD)"),
        _c("nccl_version", pl.String(), "NCCL/RCCL version the trace reports"),
        _c("backend", pl.String(), "`distributedInfo.backend`"),
        _c("pg_count", pl.Int32(), "number of process groups the rank created"),
        _SOURCE,
    ),
)

PROCESS_GROUPS = FrameSpec(
    "process_groups",
    "Process groups from `distributedInfo.pg_config`, one row per (rank, group).",
    (
        _RANK,
        _c("pg_name", pl.String(), "process group name"),
        _c("pg_desc", pl.String(), "description (`default_pg`, `undefined`, Megatron names)"),
        _c("backend_config", pl.String(), "e.g. `cuda:nccl`"),
        _c("pg_size", pl.Int32(), "group size"),
        _c("pg_ranks", pl.List(pl.Int32()), "global ranks of the group"),
        _SOURCE,
    ),
)

_register(SOURCES, KERNELS, CPU_OPS, STEPS, COMMS, RANKS, PROCESS_GROUPS)

# --- NCCL log frames (NCCL issue) ------------------------------------------------------------



# --- kernel log / GPU health frames (kernel-log issue) ---------------------------------------



# --- Nsight Systems-only frames (nsys issue) --------------------------------------------------

GPU_METRICS = FrameSpec(
    "gpu_metrics",
    "Sampled GPU hardware counters (`nsys profile --gpu-metrics-device`), one row per (GPU, sample). "
    "Each value is the percentage over the interval from this sample to the next one of the same GPU; "
    "see forensics/gpu_metrics.py for windowed averages.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("device", pl.Int32(), "GPU index on the host (`GPU_METRICS.typeId & 0xFF`)"),
        _c("timestamp_ns", pl.Int64(), "sample time (start of the interval it describes), ns"),
        _c("gr_active", pl.Float64(), "`GR Active`: % of time the graphics/compute engine was busy"),
        _c("sm_active", pl.Float64(), "`SM Active`: % of SM cycles with at least one warp in flight (avg over SMs)"),
        _c("sm_issue", pl.Float64(), "`SM Issue`: % of SM cycles issuing an instruction"),
        _c("tensor_active", pl.Float64(), "`Tensor Active`: % of cycles the tensor pipes were busy"),
    ),
)

PROFILER_OVERHEAD = FrameSpec(
    "profiler_overhead",
    "Nsight Systems' CUDA profiling overhead ranges (data flush / stop), projected onto every GPU the "
    "process used. nsys' own gap and utilization analyses count these as busy, so do we.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("pid", pl.Int64(), "process id"),
        _c("device", pl.Int32(), "GPU index the overhead is projected onto"),
        _c("name", pl.String(), "overhead kind, e.g. `CUDA profiling data flush overhead`"),
        _c("start_ns", pl.Int64(), "start, ns"),
        _c("end_ns", pl.Int64(), "end, ns"),
    ),
)

_register(GPU_METRICS, PROFILER_OVERHEAD)


# --------------------------------------------------------------------------------------------


def schema(name: str) -> pl.Schema:
    return FRAME_SPECS[name].schema


def empty(name: str) -> pl.DataFrame:
    """An empty frame with the canonical schema of ``name``."""
    return pl.DataFrame(schema=schema(name))


def conform(name: str, df: pl.DataFrame) -> pl.DataFrame:
    """Return ``df`` with exactly the canonical columns of ``name``, in order, cast to their dtypes.

    Missing columns are added as nulls; extra columns are an error (a parser bug, not bad input).
    """
    target = schema(name)
    extra = [c for c in df.columns if c not in target]
    if extra:
        raise ValueError(f"frame {name!r}: columns not in the canonical schema: {extra}")
    exprs = [
        (pl.col(col).cast(dtype, strict=True) if col in df.columns else pl.lit(None, dtype=dtype)).alias(col)
        for col, dtype in target.items()
    ]
    return df.select(exprs)


def concat(name: str, parts: Iterable[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate conformed parts of one frame; an empty frame when there are none."""
    frames = [p for p in parts if p.height]
    if not frames:
        return empty(name)
    return pl.concat([conform(name, p) for p in frames], how="vertical")


class JobFrames(Mapping[str, pl.DataFrame]):
    """All canonical frames of one job. Absent frames read as empty frames of the right schema.

    ``present`` says which frames some source actually produced, so a detector can tell
    "no NCCL kernels in the traces" from "no traces at all".
    """

    def __init__(self, frames: Mapping[str, pl.DataFrame], present: Iterable[str] | None = None) -> None:
        self._frames = {name: conform(name, df) for name, df in frames.items()}
        self.present: frozenset[str] = frozenset(present if present is not None else frames.keys())

    def __getitem__(self, name: str) -> pl.DataFrame:
        if name in self._frames:
            return self._frames[name]
        if name in FRAME_SPECS:
            return empty(name)
        raise KeyError(name)

    def __iter__(self):  # type: ignore[override]
        return iter(FRAME_SPECS)

    def __len__(self) -> int:
        return len(FRAME_SPECS)

    def has(self, name: str) -> bool:
        """True when a source produced this frame and it has at least one row."""
        return name in self.present and self[name].height > 0


def render_markdown() -> str:
    """The text of docs/frames.md."""
    lines = [
        "# Canonical frames",
        "",
        "Generated by `python -m forensics.frames > docs/frames.md` from `forensics/frames.py`;",
        "do not edit by hand. All times are integer nanoseconds (Int64). `rank` is null when unknown.",
        "`forensics frames RUN_DIR --out DIR` writes each frame as `DIR/<name>.parquet`.",
        "",
    ]
    for spec in FRAME_SPECS.values():
        lines += [f"## `{spec.name}`", "", spec.doc, "", "| column | dtype | meaning |", "|---|---|---|"]
        for col in spec.columns:
            lines.append(f"| `{col.name}` | {_dtype_text(col.dtype)} | {col.doc} |")
        lines.append("")
    return "\n".join(lines)


def _dtype_text(dtype: pl.DataType) -> str:
    if isinstance(dtype, pl.Enum):
        return "Enum(" + ", ".join(dtype.categories.to_list()) + ")"
    return str(dtype)


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_markdown())
