"""Canonical frames: the one place where every table's columns, dtypes and units are defined.

Parsers produce these frames, detectors consume them; neither touches the other's raw input.
Conventions that hold for every frame:

* all times are integer nanoseconds (``*_ns``, Int64). Trace times are Unix-epoch ns when the
  source gives an absolute clock (Kineto ``baseTimeNanoseconds`` or epoch-µs ``ts``), else they are
  in the source's own clock domain, named by the ``clock`` column where a frame has one;
* ``rank`` is the global rank (Int32) and is null when the source does not say it: never 0 by default;
* ``source`` is the path of the file the row came from, relative to RUN_DIR.

``docs/frames.md`` is generated from this module (``python -m forensics.base.frames``) and a test checks
that it is current.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

KERNEL_CLASSES = ["compute", "comm", "memcpy", "memset", "sync"]
SOURCE_KINDS = ["kineto", "nsys", "nccl_log", "dmesg", "nvidia_smi", "flight_recorder", "job_log", "framework_log",
                "unknown"]
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
class Dtype:
    """A Polars dtype named without importing Polars: ``dt.List(dt.Int64())`` stands for ``pl.List(pl.Int64())``.
    The schemas below are declared this way so that importing this module runs no Polars code (``forensics rules``
    imports the detectors, hence this module, and has no use for Polars); :meth:`build` makes the dtype."""

    name: str
    args: tuple[Any, ...] = ()

    def build(self) -> pl.DataType:
        dtype: pl.DataType = getattr(pl, self.name)(*(a.build() if isinstance(a, Dtype) else a for a in self.args))
        return dtype


class _Dtypes:
    """``dt.Int64()`` -> ``Dtype("Int64")``: the spelling of Polars' dtypes, kept for the declarations."""

    def __getattr__(self, name: str) -> Callable[..., Dtype]:
        return lambda *args: Dtype(name, args)


dt = _Dtypes()


@dataclass(frozen=True)
class Column:
    name: str
    declared: Dtype
    doc: str

    @functools.cached_property
    def dtype(self) -> pl.DataType:
        return self.declared.build()


@dataclass(frozen=True)
class FrameSpec:
    name: str
    doc: str
    columns: tuple[Column, ...]
    # columns that identify a row: the parts of several files may repeat a row, kept once when concatenated
    key: tuple[str, ...] = ()

    @property
    def schema(self) -> pl.Schema:
        return pl.Schema({c.name: c.dtype for c in self.columns})


def _c(name: str, dtype: Dtype, doc: str) -> Column:
    return Column(name, dtype, doc)


FRAME_SPECS: dict[str, FrameSpec] = {}


def _register(*specs: FrameSpec) -> None:
    """Each section below registers its own frames, so sections stay self-contained."""
    for spec in specs:
        if spec.name in FRAME_SPECS:
            raise ValueError(f"frame {spec.name!r} defined twice")
        FRAME_SPECS[spec.name] = spec


_RANK = _c("rank", dt.Int32(), "global rank; null when the source does not say")
_HOST = _c("host", dt.String(),
           "short host name (domain dropped, as NCCL logs print it; forensics.base.hosts.short_host); null when "
           "unknown")
_SOURCE = _c("source", dt.String(), "file the row came from, relative to RUN_DIR")
_PG_COLUMNS = (
    _c("pg_name", dt.String(), "process group name (`Process Group Name` / `pg_name`)"),
    _c("pg_desc", dt.String(), "process group description (`default_pg`, Megatron group names)"),
    _c("pg_id", dt.Int64(),
       "the process group's member list, as an id (`process_groups.pg_id`); its ranks are `pg_ranks` of the "
       "`process_groups` rows with this `pg_id` (see there how to join); null when the trace names no members"),
    _c("group_size", dt.Int32(), "process group size"),
)
_MSG_COLUMNS = (
    _c("in_nelems", dt.Int64(), "input elements (`In msg nelems`)"),
    _c("out_nelems", dt.Int64(), "output elements (`Out msg nelems`)"),
    _c("dtype", dt.String(), "element type as the trace names it (`Float`, `BFloat16`)"),
    _c(
        "bytes",
        dt.Int64(),
        "message size in bytes: max(in, out) elements x element size, the nccl-tests `size` convention",
    ),
    _c("seq", dt.Int64(), "per-process-group sequence number (`Seq`), when the trace has it"),
)

# --- trace frames (foundation) ---------------------------------------------------------------

SOURCES = FrameSpec(
    "sources",
    "One row per file found under RUN_DIR, whatever became of it.",
    (
        _c("path", dt.String(), "path relative to RUN_DIR"),
        _c("kind", dt.Enum(SOURCE_KINDS), "what the content is (decided by content, not by name)"),
        _RANK,
        _HOST,
        _c("status", dt.Enum(SOURCE_STATUSES), "ok / partial (salvaged) / failed / ignored"),
        _c("message", dt.String(), "one line: why partial, failed or ignored, or what was read"),
        _c("size_bytes", dt.Int64(), "file size on disk"),
        _c("parse_ns", dt.Int64(), "wall time spent parsing this file, ns"),
    ),
)

KERNELS = FrameSpec(
    "kernels",
    "GPU activity: kernels, memcpy and memset, one row per event.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("device", dt.Int32(), "GPU index on the host (Kineto `device` / GPU pid)"),
        _c("stream", dt.Int64(), "CUDA/HIP stream id"),
        _c("name", dt.Categorical(), "kernel name as recorded (mangled or demangled); Categorical: cast to String "
           "for string functions"),
        _c("class", dt.Enum(KERNEL_CLASSES), "compute / comm (NCCL, RCCL) / memcpy / memset / sync"),
        _c("start_ns", dt.Int64(), "start, ns"),
        _c("end_ns", dt.Int64(), "end, ns"),
        _c("correlation", dt.Int64(), "CUPTI/roctracer correlation id, links to the launch in cpu_ops"),
        _c("external_id", dt.Int64(), "Kineto `External id`: the enclosing CPU op"),
        _c("grid_x", dt.Int32(), "grid dimension x"),
        _c("grid_y", dt.Int32(), "grid dimension y"),
        _c("grid_z", dt.Int32(), "grid dimension z"),
        _c("block_x", dt.Int32(), "block dimension x"),
        _c("block_y", dt.Int32(), "block dimension y"),
        _c("block_z", dt.Int32(), "block dimension z"),
        _c("blocks_per_sm", dt.Float64(), "`blocks per SM` as the profiler reports it"),
        _c("graph_replay", dt.Boolean(),
           "replayed from a CUDA/HIP graph: launched by `cudaGraphLaunch` / `cuGraphLaunch` / `hipGraphLaunch` "
           "(one correlation id for every kernel of the replay) or carrying a graph id or graph node id (nsys "
           "exports before 2026.1 record only the node id); null when the source cannot tell"),
        _c("graph_id", dt.Int64(), "CUPTI graph id of a graph-replayed kernel (Kineto `graph id`, nsys `graphId`)"),
        _c("graph_node_id", dt.Int64(),
           "CUPTI graph node id (Kineto `graph node id`, nsys `graphNodeId` of kernels, copies and memsets): the "
           "node, numbered in capture order"),
        _c(
            "collective",
            dt.String(),
            "normalised collective for comm kernels: allreduce, allgather, reduce_scatter, alltoall, "
            "broadcast, reduce, sendrecv, send, recv, barrier; null when unknown",
        ),
        _c("name_algo", dt.String(), "algorithm named in the kernel name: a hint only, not what ran"),
        _c("name_proto", dt.String(), "protocol named in the kernel name: a hint only, not what ran"),
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
        _c("pid", dt.Int64(), "process id (for gpu_user_annotation: the device)"),
        _c("tid", dt.Int64(), "thread id (for gpu_user_annotation: the stream)"),
        _c("category", dt.Enum(CPU_OP_CATEGORIES), "Kineto category, legacy names normalised"),
        _c("name", dt.Categorical(), "op / annotation / API name; Categorical (see kernels.name)"),
        _c("start_ns", dt.Int64(), "start, ns"),
        _c("end_ns", dt.Int64(), "end, ns"),
        _c("correlation", dt.Int64(), "correlation id (runtime / driver calls)"),
        _c("external_id", dt.Int64(), "Kineto `External id`"),
        _c("is_launch", dt.Boolean(), "a runtime/driver call that launched GPU work"),
    ),
)

STEPS = FrameSpec(
    "steps",
    "Training steps per rank (`ProfilerStep#N`, or NVTX step ranges).",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("step", dt.Int64(), "step number N"),
        _c("start_ns", dt.Int64(), "start, ns"),
        _c("end_ns", dt.Int64(), "end, ns"),
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
        _c("pid", dt.Int64(), "process id"),
        _c("tid", dt.Int64(), "thread id"),
        _c("name", dt.String(), "op name (`record_param_comms`, `nccl:all_reduce`, `c10d::allreduce_`)"),
        _c("collective", dt.String(), "normalised collective (see kernels.collective)"),
        _c("start_ns", dt.Int64(), "host call start, ns"),
        _c("end_ns", dt.Int64(), "host call end, ns"),
        _c("external_id", dt.Int64(), "Kineto `External id`"),
        _c("kernel_correlation", dt.Int64(), "correlation of the GPU kernel it launched; null if none"),
        *_PG_COLUMNS,
        *_MSG_COLUMNS,
        _c("src_rank", dt.Int32(), "source rank of a point-to-point op"),
        _c("dst_rank", dt.Int32(), "destination rank of a point-to-point op"),
    ),
)

RANKS = FrameSpec(
    "ranks",
    "One row per rank (per trace source): identity and hardware.",
    (
        _RANK,
        _c("world_size", dt.Int32(), "world size; null when unknown"),
        _HOST,
        _c("pid", dt.Int64(), "main process id"),
        _c("device", dt.Int32(), "GPU index used by this rank; null when unknown"),
        _c("gpu_name", dt.String(), "GPU model"),
        _c("sm_count", dt.Int32(), "streaming multiprocessors (CUs on AMD)"),
        _c("nccl_version", dt.String(), "NCCL/RCCL version the trace reports"),
        _c("backend", dt.String(), "`distributedInfo.backend`"),
        _c("pg_count", dt.Int32(), "number of process groups the rank created"),
        _c("versions", dt.List(dt.String()), "software versions the source reports, `key=value` as written "
           "(Kineto: top-level `*_version` keys, e.g. `cuda_runtime_version=12040`; nsys: `NvDriverVersion`, "
           "`CudaDriverVersion`, `OfedDriverVersion`, `SoftwareReleaseVersion` of TARGET_INFO_SYSTEM_ENV)"),
        _SOURCE,
    ),
)

PROCESS_GROUPS = FrameSpec(
    "process_groups",
    "Process groups, one row per (rank, group): those a rank's trace declares (`distributedInfo.pg_config`, "
    "`declared`), and the member lists its collectives name (`Process Group Ranks`) that it does not declare. Each "
    "member list is stored here, not on every kernel and collective call: `kernels.pg_id` and `comms.pg_id` name it. "
    "To get the members on the rows: `kernels.join(process_groups.select(\"pg_id\", \"pg_ranks\").unique(\"pg_id\"), "
    "on=\"pg_id\", how=\"left\")` (Polars; in SQL a left join on `pg_id` with `DISTINCT pg_id, pg_ranks`).",
    (
        _RANK,
        _c("pg_name", dt.String(), "process group name"),
        _c("pg_desc", dt.String(), "description (`default_pg`, `undefined`, Megatron names)"),
        _c("backend_config", dt.String(), "e.g. `cuda:nccl`"),
        _c("pg_size", dt.Int32(), "group size"),
        _c("pg_ranks", dt.List(dt.Int32()), "global ranks of the group"),
        _c("pg_id", dt.Int64(),
           "id of the member list (`forensics.base.frames.pg_id`: the first 8 bytes of a BLAKE2b hash of the ranks "
           "as written, comma separated), the same in every file and job; null when the ranks are unknown"),
        _c("declared", dt.Boolean(),
           "declared by the rank's trace (`pg_config`); false: named only by its collectives"),
        _SOURCE,
    ),
)

OP_SHAPES = FrameSpec(
    "op_shapes",
    "GEMM and attention ops with the input shapes the profiler recorded (`record_shapes=True`); only the ops "
    "whose FLOPs forensics.base.flops can count.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("tid", dt.Int64(), "thread id of the op (its kernel launches are on the same thread)"),
        _c("name", dt.String(), "op name, e.g. `aten::addmm`"),
        _c("start_ns", dt.Int64(), "host op start, ns"),
        _c("end_ns", dt.Int64(), "host op end, ns"),
        _c("external_id", dt.Int64(), "Kineto `External id`"),
        _c("input_dims", dt.String(), "`Input Dims` as JSON, one list per input (`[]` for a scalar or none)"),
        _c("input_types", dt.String(), "`Input type` as JSON, one name per input (`c10::BFloat16`, `float`)"),
    ),
)

_register(SOURCES, KERNELS, CPU_OPS, STEPS, COMMS, RANKS, PROCESS_GROUPS, OP_SHAPES)

# --- NCCL log frames (NCCL issue) ------------------------------------------------------------

_NCCL_PROC = (
    _SOURCE,
    _HOST,
    _c("pid", dt.Int64(), "process id from the NCCL envelope `host:pid:tid`"),
    _c("cuda_dev", dt.Int32(), "CUDA device index in the envelope bracket `[d]`"),
    _RANK,
    _c("line", dt.Int64(), "1-based line number in the source file"),
)

NCCL_FILES = FrameSpec(
    "nccl_files",
    "One row per NCCL log file: version and how every line was classified (nothing is dropped).",
    (
        _SOURCE,
        _c("nccl_version", dt.String(), "NCCL version from the banner, else null"),
        _c("lines", dt.Int64(), "lines in the file"),
        _c("nccl_lines", dt.Int64(), "lines with an NCCL envelope (`host:pid:tid [d] NCCL INFO|WARN`)"),
        _c("nccl_unknown", dt.Int64(), "NCCL-envelope lines whose message the parser does not understand"),
        _c("nccl_tests_lines", dt.Int64(), "nccl-tests header, device, result and footer lines"),
        _c("pytorch_lines", dt.Int64(), "PyTorch ProcessGroupNCCL lines"),
        _c("ras_lines", dt.Int64(), "NCCL RAS client output lines"),
        _c("other_lines", dt.Int64(), "blank lines and non-NCCL text (training output, shell commands)"),
        _c("unknown_sample", dt.String(), "first NCCL-envelope line not understood, for diagnosis"),
        _c(
            "version_range",
            dt.String(),
            "NCCL versions the line formats allow (`2.20-2.22`, `>=2.24`), when there is no banner",
        ),
    ),
)

NCCL_COMMS = FrameSpec(
    "nccl_comms",
    "Communicator membership: one row per `comm ... rank r nranks n ... Init START|COMPLETE` line, "
    "plus nccl-tests `Rank r Pid p on host device d` lines (origin `nccl-tests`).",
    (
        *_NCCL_PROC,
        _c("origin", dt.String(), "`init` (NCCL init line) or `nccl-tests` (device list)"),
        _c("comm", dt.String(), "communicator pointer `0x...` (per process)"),
        _c("comm_id", dt.String(), "commId hash `0x...` (same on every rank of a communicator, 2.16+)"),
        _c("nranks", dt.Int32(), "ranks in the communicator"),
        _c("nnodes", dt.Int32(), "nodes in the communicator (2.20+ `comm ... nNodes` line), else null"),
        _c("local_ranks", dt.Int32(), "ranks of this communicator on this node (2.20+), else null"),
        _c("nvml_dev", dt.Int32(), "NVML device index (2.18.3+)"),
        _c("bus_id", dt.String(), "PCI bus id `0000:3b:00.0`"),
        _c("phase", dt.String(), "Init START / Init COMPLETE / Destroy COMPLETE / Abort COMPLETE / device"),
        _c("func", dt.String(), "init function (`ncclCommInitRank`, `ncclCommSplit`, 2.21+)"),
        _c("gpu_name", dt.String(), "GPU model (nccl-tests device list only)"),
    ),
)

NCCL_NET = FrameSpec(
    "nccl_net",
    "Network selection and GPUDirect RDMA lines: one row per listed device or interface.",
    (
        *_NCCL_PROC,
        _c(
            "kind",
            dt.String(),
            "bootstrap / socket / ib / ib_none / network / gdr_hca / gdr_gpu / plugin / ofi_provider",
        ),
        _c("index", dt.Int32(), "device index `[i]` in the list"),
        _c("name", dt.String(), "interface / HCA / network / plugin name"),
        _c("port", dt.Int32(), "HCA port"),
        _c("link_layer", dt.String(), "IB or RoCE (HCAs)"),
        _c("address", dt.String(), "interface address as printed"),
        _c("state", dt.String(), "Enabled / Disabled for GPU Direct RDMA lines"),
        _c("detail", dt.String(), "the rest of the message"),
    ),
)

NCCL_CHANNELS = FrameSpec(
    "nccl_channels",
    "Transport of every connection NCCL set up: one row per `Channel|Ring cc[/conn] : r[d] -> r[d] "
    "[send|receive] via T` line.",
    (
        *_NCCL_PROC,
        _c("channel", dt.Int32(), "channel number"),
        _c("conn_index", dt.Int32(), "connection index after `/` (1 = p2p/alltoall buffers), null if absent"),
        _c("src_rank", dt.Int32(), "sending rank (communicator rank)"),
        _c("dst_rank", dt.Int32(), "receiving rank"),
        _c("src_bus_id", dt.String(), "sender PCI bus id when the bracket holds a busId (<= 2.18.1)"),
        _c("dst_bus_id", dt.String(), "receiver PCI bus id when the bracket holds a busId"),
        _c("src_dev", dt.Int32(), "sender device index when the bracket holds an index (>= 2.18.3, <= 2.4)"),
        _c("dst_dev", dt.Int32(), "receiver device index"),
        _c("direction", dt.String(), "send / receive (NET), null for P2P and SHM"),
        _c("transport", dt.String(), "P2P / SHM / NET / COLLNET"),
        _c("via", dt.String(), "transport text after `via`"),
        _c("net", dt.String(), "network name for NET (IB, Socket, IBext_v8, AWS Libfabric)"),
        _c("nic", dt.Int32(), "NIC index for NET"),
        _c("proxy_rank", dt.Int32(), "PXN proxy rank `(r)`, null if none"),
        _c("gdr", dt.Boolean(), "NET connection uses GPUDirect RDMA (`/GDRDMA`); null for P2P/SHM"),
        _c("shared", dt.Boolean(), "`/Shared` net buffers"),
        _c("p2p_kind", dt.String(), "IPC / CUMEM / MNNVL / direct pointer / indirect / common device"),
    ),
)

NCCL_CALLS = FrameSpec(
    "nccl_calls",
    "Per-operation lines: `COLL` calls (`AllReduce: opCount ...`) and `TUNING` choices "
    "(`[Func: ]N Bytes -> Algo a proto p [time t | channel{Lo..Hi}]`).",
    (
        *_NCCL_PROC,
        _c("kind", dt.String(), "coll (COLL line) or tuning (algorithm choice line)"),
        _c("op", dt.String(), "AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Send, Recv, ..."),
        _c("comm", dt.String(), "communicator pointer (COLL)"),
        _c("op_count", dt.Int64(), "opCount (printed in hex; per communicator)"),
        _c("count", dt.Int64(), "element count (COLL)"),
        _c("datatype", dt.String(), "int8 ... float32 ... bfloat16, fp8e4m3 (COLL)"),
        _c("redop", dt.String(), "sum / prod / max / min / avg / premulsum (COLL)"),
        _c("root", dt.Int32(), "root, or the peer for Send/Recv (COLL)"),
        _c("nranks", dt.Int32(), "communicator size (COLL)"),
        _c("bytes", dt.Int64(), "bytes: count x type size (COLL), or the size NCCL tuned for (TUNING)"),
        _c("algo", dt.String(), "Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT (TUNING)"),
        _c("proto", dt.String(), "LL, LL128, Simple (TUNING)"),
        _c("predicted_us", dt.Float64(), "NCCL's predicted time in microseconds (2.20-2.23 TUNING lines)"),
        _c("chan_lo", dt.Int32(), "first channel used (2.24+ TUNING lines)"),
        _c("chan_hi", dt.Int32(), "last channel used (2.24+ TUNING lines)"),
    ),
)

NCCL_TUNING = FrameSpec(
    "nccl_tuning",
    "NCCL's TUNING table printed at init (rank 0, `NCCL_DEBUG_SUBSYS=TUNING`): one row per "
    "(table, collective, algorithm, protocol).",
    (
        *_NCCL_PROC,
        _c("table", dt.Int32(), "0-based index of the table within the file"),
        _c("collective", dt.String(), "Broadcast, Reduce, AllGather, ReduceScatter, AllReduce"),
        _c("algo", dt.String(), "algorithm column"),
        _c("proto", dt.String(), "protocol column"),
        _c("latency_us", dt.Float64(), "base latency NCCL uses, microseconds"),
        _c("bw_gbps", dt.Float64(), "algorithm bandwidth NCCL uses, GB/s (0 = disabled / not applicable)"),
        _c("max_nthreads", dt.Int32(), "`Max NThreads` row value for this column"),
    ),
)

NCCL_ENV = FrameSpec(
    "nccl_env",
    "NCCL environment settings: ENV echo lines (`NCCL_X set by environment to v`) and NCCL_* "
    "assignments on shell command lines found in the log.",
    (
        *_NCCL_PROC,
        _c("var", dt.String(), "variable name, e.g. NCCL_ALGO"),
        _c("value", dt.String(), "value as printed (trailing period removed)"),
        _c(
            "origin",
            dt.String(),
            "`nccl` (echoed by NCCL), `command` (a command line in the log) or `plugin` (set by the net "
            "plugin, e.g. aws-ofi-nccl's `Adding NCCL_PROTO=simple to environment`)",
        ),
    ),
)

NCCL_EVENTS = FrameSpec(
    "nccl_events",
    "NCCL warnings and errors, plus init facts detectors need (topology, NVLS, P2P support, "
    "channel counts, GDR summary, RAS status, nccl-tests validation).",
    (
        *_NCCL_PROC,
        _c("level", dt.String(), "WARN / ERROR / INFO"),
        _c(
            "kind",
            dt.String(),
            "ib_async, ib_completion, socket_closed, net_recv_failed (a socket recv/send to a peer failed), "
            "connect_failed (a connect to a peer failed), proxy_error, cuda_failure, call_failed, no_libibverbs, "
            "no_algo, error_trace, nccl_error, init_timings, channels, "
            "nvls_support, p2p_check, connected, topo_system, topo_link, graph_pattern, thread_thresholds "
            "(value = nranks), ring_order (a ring per channel), trees, ring_graph, ras_group, ras_missing, "
            "ras_dead, ras_outlier, nccl_tests_check, nccl_tests_avg, flight_recorder_disabled, "
            "flight_recorder (dump triggered; code = the rank it came from), ofi_error (AWS OFI / EFA "
            "provider error; code = RC), remote_error (a WARN saying the remote process exited or the network "
            "failed), nccl_tests_failure (nccl-tests stopped on an NCCL error), warn_other",
        ),
        _c("code", dt.Int64(), "numeric code: IB completion status, ncclResult_t, CUDA error, count"),
        _c("value", dt.Float64(), "numeric value (seconds, channel count, bandwidth) where the kind has one"),
        _c("peer", dt.String(), "remote peer address, node or process the line names"),
        _c("file_line", dt.String(), "NCCL source `file:line` of a WARN"),
        _c("message", dt.String(), "message text"),
        _c("time_ns", dt.Int64(), "epoch ns of the line's own dated stamp (2.26+ WARN `[date time]` prefix, "
           "NCCL_DEBUG_TIMESTAMP_FORMAT's `[date time]` or a launcher's ISO prefix; a time without a zone is read as "
           "UTC), else null; a year-less glog stamp (`stamp`) is placed with the job's year by "
           "forensics.facts.job_year.placed"),
        _c("stamp", dt.String(), "the line's year-less glog stamp `MMDD HH:MM:SS[.frac]` (PyTorch's `[E0314 ...`) "
           "when it has no dated one, else null"),
    ),
)

COLLECTIVE_TIMEOUTS = FrameSpec(
    "collective_timeouts",
    "PyTorch ProcessGroupNCCL watchdog / blocking-wait timeouts, PG status lines and desync reports.",
    (
        _SOURCE,
        _HOST,
        _RANK,
        _c("line", dt.Int64(), "1-based line number"),
        _c("kind", dt.String(), "watchdog_timeout / blocking_wait / pg_status / desync / nccl_error"),
        _c("pg", dt.Int32(), "process group id `[PG n]`, null in old formats"),
        _c("seq", dt.Int64(), "SeqNum of the collective (work sequence id)"),
        _c("op_type", dt.String(), "OpType (ALLREDUCE, BROADCAST, ...)"),
        _c("numel_in", dt.Int64(), "NumelIn"),
        _c("numel_out", dt.Int64(), "NumelOut"),
        _c("timeout_ns", dt.Int64(), "Timeout(ms) in ns"),
        _c("ran_ns", dt.Int64(), "how long it ran before timing out, ns"),
        _c("last_enqueued", dt.Int64(), "last enqueued work sequence number"),
        _c("last_completed", dt.Int64(), "last completed work sequence number"),
        _c("lagging_rank", dt.Int32(), "desync report: the rank that did not join"),
        _c("message", dt.String(), "the line, launcher prefix removed"),
    ),
)

CHECKPOINTS = FrameSpec(
    "checkpoints",
    "Checkpoint-save lines in the ranks' output (Megatron-LM, DeepSpeed, PyTorch Lightning, "
    "torch.distributed.checkpoint / generic `checkpoint saved`), read from NCCL logs, job logs and text that holds "
    "nothing else (`framework_log`): when the job last saved its state.",
    (
        _SOURCE,
        _HOST,
        _c("rank", dt.Int32(),
           "global rank: `[Rank n]`/`[rankN]:` on the line, else the rank of the file (when its own parser "
           "found one); null when unknown"),
        _c("line", dt.Int64(), "1-based line number"),
        _c("time_ns", dt.Int64(),
           "Unix ns (read as UTC) from a dated stamp on the line (`YYYY-MM-DD HH:MM:SS[.,frac]`); "
           "null when the line carries none or only a year-less glog stamp (see `stamp`)"),
        _c("stamp", dt.String(), "year-less glog stamp `MMDD HH:MM:SS[.frac]` of a `[I0314 09:10:00.2 ...]` line; "
           "placed in time with the job's year, as the watchdog lines are"),
        _c("iteration", dt.Int64(), "training iteration saved (Megatron-LM), null when not printed"),
        _c("step", dt.Int64(),
           "global step saved (DeepSpeed `global_stepN`, Lightning `global step N`, generic `step N`)"),
        _c("epoch", dt.Int64(), "epoch (Lightning), null otherwise"),
        _c("path", dt.String(), "checkpoint path as printed, null when not printed"),
        _c("framework", dt.String(), "megatron / deepspeed / lightning / generic: which line format matched"),
    ),
)

NCCL_TESTS = FrameSpec(
    "nccl_tests",
    "nccl-tests result rows, one per (size, placement); rows split by interleaved output are "
    "recovered when their size can be inferred (algbw x time).",
    (
        _SOURCE,
        _HOST,
        _c("line", dt.Int64(), "1-based line number"),
        _c("collective", dt.String(), "AllReduce, AllGather, ... from the `*_perf` command, else null"),
        _c("size_bytes", dt.Int64(), "message size `size` (B)"),
        _c("count", dt.Int64(), "elements"),
        _c("type", dt.String(), "data type"),
        _c("redop", dt.String(), "reduction op or null"),
        _c("root", dt.Int32(), "root (-1 = none)"),
        _c("placement", dt.String(), "out-of-place / in-place"),
        _c("time_us", dt.Float64(), "time per op, microseconds"),
        _c("algbw_gbps", dt.Float64(), "algorithm bandwidth GB/s"),
        _c("busbw_gbps", dt.Float64(), "bus bandwidth GB/s"),
        _c("wrong", dt.Float64(), "#wrong (or max error in old builds); null for N/A"),
        _c("size_inferred", dt.Boolean(), "size recovered from a row fragment (algbw x time)"),
    ),
)

_register(
    NCCL_FILES,
    NCCL_COMMS,
    NCCL_NET,
    NCCL_CHANNELS,
    NCCL_CALLS,
    NCCL_TUNING,
    NCCL_ENV,
    NCCL_EVENTS,
    COLLECTIVE_TIMEOUTS,
    NCCL_TESTS,
    CHECKPOINTS,
)


# --- kernel log / GPU health frames (kernel-log issue) ---------------------------------------

KERNEL_EVENT_KINDS = [
    "xid", "sxid", "fabric_manager", "gsp", "fallen_off_bus", "gpu_init_failed", "ecc", "nvlink", "gpu_identity",
    "driver_load", "nvrm_other", "aer", "ghes", "pcie_link", "device_other", "ib_port", "mlx5",
    "netdev_carrier", "cpu_thermal", "edac", "mce", "oom", "hung_task", "soft_lockup", "hard_lockup",
    "segfault", "boot", "benign", "context", "unknown",
    # host-side kinds read by node_health only
    "fs_error", "storage_client", "netdev_link", "rcu_stall", "shutdown",
]

KERNEL_EVENTS = FrameSpec(
    "kernel_events",
    "One row per kernel-log record (dmesg, journalctl, syslog, /dev/kmsg, fabric-manager log); "
    "multi-line continuations are folded into their record. Lines no pattern knows are kept as "
    "kind `unknown` (counted, never dropped).",
    (
        _HOST,
        _SOURCE,
        _c("line", dt.Int64(), "1-based line number of the record's first line in the source"),
        _c("boot", dt.Int32(), "boot number within (source, host): a new boot starts at `Linux version` "
           "or when the monotonic clock jumps back by more than 10 s"),
        _c("time_text", dt.String(), "the timestamp as printed (null when the line has none)"),
        _c("time_format", dt.String(), "monotonic, ctime (dmesg -T), human (dmesg -H), iso, syslog, kmsg, "
           "fabricmanager, talos, none"),
        _c("mono_ns", dt.Int64(), "seconds-since-boot stamp, ns; null when the line has none"),
        _c("wall_ns", dt.Int64(), "Unix-epoch ns (UTC; zone-less stamps read as UTC); null when the log does "
           "not let us place the record (monotonic stamp and no derivable boot time)"),
        _c("wall_source", dt.String(), "how wall_ns was obtained: `stamp` (absolute stamp with a year), "
           "`stamp_year_from_file` (syslog/-H stamp without a year: year from the file's own absolute "
           "stamps, else its mtime), `boot_time` (monotonic + boot time derived from lines carrying both)"),
        _c("facility", dt.String(), "who wrote it: `kernel`, the syslog ident (`systemd[1]`), `fabricmanager`"),
        _c("level", dt.String(), "log level when the format carries one (kmsg, dmesg -x, fabric manager)"),
        _c("kind", dt.Enum(KERNEL_EVENT_KINDS), "message kind (see docs/gpu_health.md)"),
        _c("pci_bus_id", dt.String(), "PCI address named by the line, normalised to `dddd:bb:dd.f` lower-case"),
        _c("xid", dt.Int32(), "NVIDIA Xid or NVSwitch SXid number"),
        _c("pid", dt.Int64(), "process id the line names (Xid pid=, OOM victim, segfault, hung task)"),
        _c("process", dt.String(), "process name the line names"),
        _c("message", dt.String(), "the message with every prefix stripped, continuations joined"),
        _c("fields", dt.String(), "JSON object of the parsed fields (Xid text, caused-by-previous-Xid, "
           "NVLink registers, AER severity/type/bit, ...)"),
    ),
)

GPU_HEALTH = FrameSpec(
    "gpu_health",
    "One row per GPU in an `nvidia-smi -q` snapshot: ECC counters, retired pages, remapped rows, "
    "reset status and active clock event (throttle) reasons.",
    (
        _HOST,
        _SOURCE,
        _c("snapshot_ns", dt.Int64(), "the snapshot's `Timestamp` as Unix-epoch ns (read as UTC); null if absent"),
        _c("driver_version", dt.String(), "driver version"),
        _c("gpu_index", dt.Int32(), "position of the GPU in the output (nvidia-smi index order); null if the "
           "excerpt has no GPU header"),
        _c("pci_bus_id", dt.String(), "`dddd:bb:dd.f`; null when the excerpt does not say"),
        _c("uuid", dt.String(), "GPU UUID"),
        _c("serial", dt.String(), "board serial"),
        _c("product", dt.String(), "product name"),
        _c("ecc_volatile_sram_ce", dt.Int64(), "volatile SRAM correctable"),
        _c("ecc_volatile_sram_ue", dt.Int64(), "volatile SRAM uncorrectable (R550+: parity + SEC-DED)"),
        _c("ecc_volatile_dram_ce", dt.Int64(), "volatile DRAM correctable"),
        _c("ecc_volatile_dram_ue", dt.Int64(), "volatile DRAM uncorrectable"),
        _c("ecc_aggregate_sram_ce", dt.Int64(), "aggregate (lifetime) SRAM correctable"),
        _c("ecc_aggregate_sram_ue", dt.Int64(), "aggregate SRAM uncorrectable (R550+: parity + SEC-DED)"),
        _c("ecc_aggregate_dram_ce", dt.Int64(), "aggregate DRAM correctable"),
        _c("ecc_aggregate_dram_ue", dt.Int64(), "aggregate DRAM uncorrectable"),
        _c("sram_threshold_exceeded", dt.Boolean(), "R550+ `SRAM Threshold Exceeded`"),
        _c("retired_pages_sbe", dt.Int64(), "pages retired for single-bit errors (pre-Ampere)"),
        _c("retired_pages_dbe", dt.Int64(), "pages retired for double-bit errors (pre-Ampere)"),
        _c("retired_pages_pending", dt.Boolean(), "`Pending Page Blacklist`"),
        _c("remapped_rows_ce", dt.Int64(), "rows remapped for correctable errors"),
        _c("remapped_rows_ue", dt.Int64(), "rows remapped for uncorrectable errors"),
        _c("remap_pending", dt.Boolean(), "a remap waits for a GPU reset"),
        _c("remap_failure", dt.Boolean(), "`Remapping Failure Occurred`"),
        _c("remap_banks_none", dt.Int64(), "banks with no spare rows left (histogram `None`)"),
        _c("reset_required", dt.Boolean(), "`GPU Reset Status / Reset Required`"),
        _c("drain_and_reset", dt.Boolean(), "`Drain and Reset Recommended`"),
        _c("clock_reasons_active", dt.List(dt.String()), "Clocks Event/Throttle Reasons that read `Active`"),
        _c("sm_clock_mhz", dt.Int64(), "current SM clock, MHz"),
        _c("temperature_c", dt.Int64(), "current GPU temperature, C"),
    ),
)

GPU_DIAG = FrameSpec(
    "gpu_diag",
    "`dcgmi diag` / `dcgmi health` results: one row per (test, GPU or message).",
    (
        _HOST,
        _SOURCE,
        _c("line", dt.Int64(), "1-based line of the row in the source"),
        _c("tool", dt.String(), "`dcgmi_diag` or `dcgmi_health`"),
        _c("section", dt.String(), "table section (Deployment, Hardware, ...)"),
        _c("test", dt.String(), "test or check name (left column)"),
        _c("result", dt.String(), "pass / fail / warning / skip / error / info"),
        _c("gpu_index", dt.Int32(), "DCGM GPU index the row is about; null when it names none"),
        _c("message", dt.String(), "the right-hand cell, wrapped lines joined"),
    ),
)

_register(KERNEL_EVENTS, GPU_HEALTH, GPU_DIAG)



# --- Nsight Systems-only frames (nsys issue) --------------------------------------------------

GPU_METRICS = FrameSpec(
    "gpu_metrics",
    "Sampled GPU hardware counters (`nsys profile --gpu-metrics-device`), one row per (GPU, sample). "
    "Each value is the percentage over the interval from this sample to the next one of the same GPU; "
    "see forensics/facts/gpu_metrics.py for windowed averages.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("device", dt.Int32(), "GPU index on the host (`GPU_METRICS.typeId & 0xFF`)"),
        _c("timestamp_ns", dt.Int64(), "sample time (start of the interval it describes), ns"),
        _c("gr_active", dt.Float64(), "`GR Active`: % of time the graphics/compute engine was busy"),
        _c("sm_active", dt.Float64(), "`SM Active`: % of SM cycles with at least one warp in flight (avg over SMs)"),
        _c("sm_issue", dt.Float64(), "`SM Issue`: % of SM cycles issuing an instruction"),
        _c("tensor_active", dt.Float64(), "`Tensor Active`: % of cycles the tensor pipes were busy"),
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
        _c("pid", dt.Int64(), "process id"),
        _c("device", dt.Int32(), "GPU index the overhead is projected onto"),
        _c("name", dt.String(), "overhead kind, e.g. `CUDA profiling data flush overhead`"),
        _c("start_ns", dt.Int64(), "start, ns"),
        _c("end_ns", dt.Int64(), "end, ns"),
    ),
)

_register(GPU_METRICS, PROFILER_OVERHEAD)


# --- the job's own last words (forensics.parsers.lastwords) ---------------------------------------

LAST_WORDS = FrameSpec(
    "last_words",
    "What the job itself said as it died: Python tracebacks, CUDA / NCCL errors raised to Python, C++ "
    "`terminate called` / `what():`, device-side assertions, data-loader deaths, the launcher's failure table "
    "and signals (torchrun / torch.distributed.elastic, torch.distributed.launch, DeepSpeed), SLURM and "
    "Kubernetes messages. One row per event; read from rank stdout/stderr, launcher and scheduler output "
    "wherever they sit (a rank's stdout that is also an NCCL log is read for both).",
    (
        _SOURCE,
        _HOST,
        _c("rank", dt.Int32(),
           "global rank: `[rankN]:` prefix, the failure table's `rank`, `rank<N>` in the file name; "
           "null when unknown"),
        _c("local_rank", dt.Int32(), "local rank: torchrun's `[default3]:` prefix, the failure table, `local_rank: N`"),
        _c("pid", dt.Int64(), "process id where printed (failure table, launcher lines, data-loader worker)"),
        _c("line", dt.Int64(), "1-based line number where the event starts (a traceback: its exception line)"),
        _c("pg", dt.String(), "the process group the event's line names (PyTorch's `[PG ID n ...]` / `[PG n]` prefix: "
           "the PG ID, as the watchdog lines name it), else null"),
        _c("time_ns", dt.Int64(), "Unix ns, read as UTC, when known (see `time_from`)"),
        _c("stamp", dt.String(), "year-less glog stamp `MMDD HH:MM:SS[.frac]` when that is the only time (placed "
           "with the job's year by the detector)"),
        _c("time_from", dt.String(), "line (a stamp on the event's own line) / before (the nearest timestamped line "
           "before it in the file) / launcher (torchrun's failure record: its local time, no zone) / scheduler "
           "(SLURM's CANCELLED AT, a pod's finishedAt) / null"),
        _c("event", dt.String(), "exception (a Python traceback's last line, or such a line alone) / error_line "
           "(CUDA error, C++ what(), assertion, data-loader or fatal line) / launcher_failure / launcher_signal "
           "(the launcher terminating a worker) / launcher_stopped / restart / scheduler / task_exit (srun) / pod / "
           "worker_exited (a `<defunct>` worker in a process listing)"),
        _c("cls", dt.String(),
           "class: cuda_oom, cuda_context_oom, illegal_address, device_assert, launch_failure, ecc, "
           "cuda_unknown, cuda_error, nccl_remote/system/internal/cuda/usage (NCCL errors raised to Python), "
           "dataloader, nan, fatal_signal, exception, truncated (a traceback cut off), launcher; launcher: exit, "
           "sigterm, stopped, restart, membership; SLURM: time_limit, preempted, node_fail, requeue, task_failure, "
           "cancelled (no reason: scancel), failed, step_oom, task_exit; pods: oom_killed, evicted, preempted, "
           "node_oom, error, gpu_unhealthy; defunct"),
        _c("exc_type", dt.String(), "exception type as printed (`torch.OutOfMemoryError`, `c10::CUDAError`)"),
        _c("message", dt.String(), "first line of the message (500 characters at most), or the line itself"),
        _c("detail", dt.String(), "the message's continuation lines (NCCL `Last error:` ...), C++ `raised from`"),
        _c("user_frame", dt.String(),
           "innermost frame outside libraries (`file:line in func`); a device assertion's kernel"),
        _c("innermost", dt.String(), "innermost frame of the traceback (`file:line in func`)"),
        _c("frames", dt.Int32(), "frames in the traceback (all of them, also those not kept)"),
        _c("traceback", dt.String(), "the traceback as text: first 8 and last 40 frames with their code lines"),
        _c("exit_code", dt.Int32(), "exit code (negative: killed by that signal, torchrun's convention)"),
        _c("signal", dt.String(), "signal name (SIGKILL, SIGTERM, SIGABRT ...) from the exit code or the text"),
        _c("first_observed", dt.Boolean(), "torchrun's `Root Cause (first observed failure)` entry"),
        _c("role", dt.String(), "rank (the rank's own failure) / chained (raised while handling an earlier one) / "
           "launcher (the launcher's own traceback)"),
        _c("job", dt.String(), "SLURM `STEP id` / `JOB id`, the failure table's script"),
        _c("tasks", dt.String(), "srun task list (`0-3`)"),
        _c("repeats", dt.Int32(), "identical consecutive error lines folded into this row (null: 1)"),
        _c("oom_requested_bytes", dt.Int64(), "CUDA OOM: `Tried to allocate`, bytes"),
        _c("oom_total_bytes", dt.Int64(), "CUDA OOM: GPU total capacity, bytes"),
        _c("oom_free_bytes", dt.Int64(), "CUDA OOM: free on the GPU, bytes"),
        _c("oom_process_bytes", dt.Int64(),
           "CUDA OOM: memory in use by this process (or the one process listed), bytes"),
        _c("oom_allocated_bytes", dt.Int64(), "CUDA OOM: allocated by PyTorch, bytes"),
        _c("oom_reserved_unallocated_bytes", dt.Int64(), "CUDA OOM: reserved by PyTorch but unallocated, bytes "
           "(1.4-2.0: reserved minus allocated)"),
        _c("gpu_index", dt.Int32(), "CUDA OOM: `GPU n` of the message (the process's device index)"),
    ),
)

STACKS = FrameSpec(
    "stacks",
    "Stack dumps of a hung job (py-spy dump, faulthandler, torch.distributed debug-server `stacks_*.txt`, gdb): "
    "one row per thread.",
    (
        _SOURCE,
        _HOST,
        _c("rank", dt.Int32(),
           "global rank (`=== Rank N ===`, `[rankN]:`, `rank<N>` in the file name); null when unknown"),
        _c("process", dt.String(), "process id (py-spy `Process N:`), else the thread id"),
        _c("tid", dt.String(), "thread id as printed (OS tid, hex id, gdb LWP)"),
        _c("thread", dt.String(), "thread name (`MainThread`), null when not printed"),
        _c("status", dt.String(), "py-spy status: idle / active / active+gil"),
        _c("main", dt.Boolean(), "the process's main thread (named MainThread, or its stack reaches `<module>`)"),
        _c("line", dt.Int64(), "1-based line of the thread's header"),
        _c("dump", dt.String(), "py-spy / faulthandler / gdb"),
        _c("frames", dt.List(dt.String()), "frames innermost first, `func (file:line)` (256 at most)"),
        _c("depth", dt.Int32(), "frames in the dump (also those not kept)"),
        _c("innermost", dt.String(), "innermost frame"),
        _c("where", dt.String(), "collective / data_loader / checkpoint_io / lock / compute (forensics.parsers."
           "lastwords.stacks.where)"),
    ),
)

_register(LAST_WORDS, STACKS)
# --- PyTorch Flight Recorder dumps (parsers/flight_recorder.py) ------------------------------

FR_STATES = ["scheduled", "started", "completed"]
_FR_PG = (
    _c("pg_id", dt.Int32(), "ProcessGroupNCCL uid of the group on this rank (`pg_id`; keys `pg_status`; the watchdog's "
       "`[PG ID n]`)"),
    _c("pg_name", dt.String(),
       "process group name (`process_group[0]`, the `pg_config` key; the same on every member)"),
    _c("pg_desc", dt.String(),
       "process group description (`default_pg`, Megatron group names); joins NCCL logs and traces"),
)

FR_DUMPS = FrameSpec(
    "fr_dumps",
    "One row per Flight Recorder dump (a rank's dump, pickle or JSON): what it holds. A dump with no entries is "
    "evidence too: every collective that rank issued had completed (or was dropped by `onlyActive`).",
    (
        _RANK,
        _HOST,
        _SOURCE,
        _c("format", dt.String(),
           "`pickle` (torch C++ pickler, protocol 2; nvidia-resiliency-ext's `_dump_N`) or `json`"),
        _c("version", dt.String(), "dump format version (`version`: 1.0 ... 2.10)"),
        _c("comm_lib_version", dt.String(), "NCCL version (`nccl_version`, `comm_lib_version` from 2.10)"),
        _c("entries", dt.Int64(), "entries in the dump (0: all work completed, or none recorded)"),
        _c("pg_count", dt.Int32(), "process groups in `pg_config` (null when the dump has none)"),
        _c("has_status", dt.Boolean(), "the dump has `pg_status` (per-group last enqueued / started / completed)"),
        _c("has_stacks", dt.Boolean(), "entries carry stack `frames`"),
        _c("latest_ns", dt.Int64(), "latest time the dump records (created / started / completed), epoch ns: the dump "
           "was written after it"),
    ),
)

_FR_TEXT = "(Categorical: each distinct text stored once)"
FR_ENTRIES = FrameSpec(
    "fr_entries",
    "One row per Flight Recorder entry: a collective or point-to-point op a rank enqueued, with its state. The "
    "tensor shapes, dtypes and stack, the same on every rank of a collective, are stored once per distinct value in "
    "`fr_signatures`: join on `sig`. Text columns are Categorical (8 M entries of 4,096 ranks fit in ~1 GB); cast "
    "to String to join with String columns of other frames.",
    (
        _RANK,
        _c("host", dt.Categorical(), f"hostname, when the file name carries one {_FR_TEXT}"),
        _c("source", dt.Categorical(), f"file the row came from, relative to RUN_DIR {_FR_TEXT}"),
        _FR_PG[0],
        _c("pg_name", dt.Categorical(),
           f"process group name (`process_group[0]`, the `pg_config` key; the same on every member) {_FR_TEXT}"),
        _c("pg_desc", dt.Categorical(),
           f"process group description (`default_pg`, Megatron group names); joins NCCL logs and traces {_FR_TEXT}"),
        _c("record_id", dt.Int64(), "position in the rank's ring buffer (monotonic; gaps when `onlyActive` dropped "
           "completed entries)"),
        _c("collective_seq", dt.Int64(), "per-group collective sequence number (`collective_seq_id`, `seq_id` before "
           "2.0): the same on every member for the same collective; the watchdog's work sequence id"),
        _c("p2p_seq", dt.Int64(), "per-group point-to-point sequence number (`p2p_seq_id`)"),
        _c("op_id", dt.Int64(), "logical op number (`op_id`)"),
        _c("op", dt.Categorical(), "operation, backend prefix dropped (`all_reduce`, `_all_gather_base`, `send 3->0` "
           f"with group-local peers, `coalesced`) {_FR_TEXT}"),
        _c("is_p2p", dt.Boolean(), "point-to-point op"),
        _c("sig", dt.UInt64(), "the entry's tensor shapes, dtypes and stack: a row of `fr_signatures` (a content hash, "
           "the same for equal values in every file)"),
        _c("state", dt.Enum(FR_STATES), "scheduled (enqueued, not started) / started / completed"),
        _c("created_ns", dt.Int64(), "when the op was enqueued (`time_created_ns`), epoch ns"),
        _c("started_ns", dt.Int64(), "when the watchdog saw it start (`time_discovered_started_ns`), epoch ns; null "
           "when not seen (JSON writes 0)"),
        _c("completed_ns", dt.Int64(), "when the watchdog saw it complete, epoch ns; null when not seen"),
        _c("duration_ns", dt.Int64(), "GPU duration (`duration_ms`, with TORCH_NCCL_ENABLE_TIMING), ns"),
        _c("timeout_ns", dt.Int64(), "the op's watchdog timeout (`timeout_ms`), ns"),
        _c("retired", dt.Boolean(), "the watchdog retired the work"),
        _c("thread_name", dt.Categorical(), f"thread that enqueued it (`thread_name`, 2.9+) {_FR_TEXT}"),
        _c("thread_id", dt.Categorical(), f"that thread's id {_FR_TEXT}"),
    ),
)

FR_SIGNATURES = FrameSpec(
    "fr_signatures",
    "The distinct tensor shapes, dtypes and stacks of Flight Recorder entries, one row each: `fr_entries.sig` joins "
    "here (`entries.join(signatures, on=\"sig\")`). Every rank of a collective shares one row, so 8 M entries "
    "need a few hundred rows.",
    (
        _c("sig", dt.UInt64(), "the signature's id: a hash of the columns below (identical values, identical id)"),
        _c("in_sizes", dt.List(dt.List(dt.Int64())), "input tensor shapes"),
        _c("out_sizes", dt.List(dt.List(dt.Int64())), "output tensor shapes"),
        _c("in_dtypes", dt.List(dt.String()), "input dtypes (`BFloat16`, `Float`)"),
        _c("out_dtypes", dt.List(dt.String()), "output dtypes"),
        _c("in_numel", dt.Int64(), "input elements, all tensors"),
        _c("out_numel", dt.Int64(), "output elements, all tensors"),
        _c("stack", dt.List(dt.String()), "stack frames when dumped with stacks (`frames`), innermost first, "
           "`name (file:line)`"),
    ),
    key=("sig",),
)

FR_PG_STATUS = FrameSpec(
    "fr_pg_status",
    "Per rank and process group: the last collective enqueued, started and completed (`pg_status`; from the entries "
    "when a dump predates it). The watchdog's `last enqueued / last completed work` counters.",
    (
        _RANK,
        _HOST,
        _SOURCE,
        *_FR_PG,
        _c("pg_ranks", dt.List(dt.Int32()), "global ranks of the group (`pg_config`); null when the dump has none"),
        _c("last_enqueued", dt.Int64(), "last enqueued collective sequence number"),
        _c("last_started", dt.Int64(), "last started (-1: never, or timing off)"),
        _c("last_completed", dt.Int64(), "last completed"),
        _c("origin", dt.String(), "`pg_status`, or `entries` (derived from the entries: no `pg_status` in the dump)"),
    ),
)

_register(FR_DUMPS, FR_ENTRIES, FR_SIGNATURES, FR_PG_STATUS)


# --------------------------------------------------------------------------------------------


SCHEMA_VERSION = 4
"""Version of the frames' schema, written into every Parquet file of `forensics frames` (``PARQUET_VERSION_KEY``).
2: the rank lists of kernels and comms moved to ``process_groups`` (``pg_id``).
3: the Flight Recorder entries' shapes, dtypes and stacks moved to ``fr_signatures`` (``sig``); their text
columns are Categorical. 4: kernel and host-op names (``kernels.name``, ``cpu_ops.name``) are Categorical."""
PARQUET_VERSION_KEY = "forensics.frames.schema_version"


def pg_id(ranks: Iterable[int] | None) -> int | None:
    """The id of a process group's member list: stable across files, processes and runs (not Python's ``hash``)."""
    if ranks is None:
        return None
    digest = hashlib.blake2b(",".join(map(str, ranks)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def text_contains(col: str, pattern: str) -> pl.Expr:
    """``col``'s rows whose text matches the regex ``pattern`` (null stays null), for a Categorical column (names):
    the pattern runs once per distinct value, not once per row (``.str`` functions refuse a Categorical, and a
    cast to String would build every row's text)."""
    values = pl.col(col).unique()
    return pl.col(col).is_in(values.filter(values.cast(pl.String).str.contains(pattern)).implode())


def pg_members(process_groups: pl.DataFrame) -> pl.DataFrame:
    """``pg_id`` -> ``pg_ranks``, one row per member list, to join to kernels or comms on ``pg_id``."""
    return process_groups.select("pg_id", "pg_ranks").drop_nulls("pg_id").unique("pg_id", keep="first")


@functools.cache
def schema(name: str) -> pl.Schema:
    """The canonical schema of ``name``, built once (validating every dtype costs ~0.1 ms): shared, do
    not modify it."""
    return FRAME_SPECS[name].schema


@functools.cache
def _empty_template(name: str) -> pl.DataFrame:
    return pl.DataFrame(schema=schema(name))


def empty(name: str) -> pl.DataFrame:
    """A new empty frame with the canonical schema of ``name`` (clearing a template: ~5 us, against ~1 ms
    to build a frame from a schema)."""
    return _empty_template(name).clear()


def conform(name: str, df: pl.DataFrame) -> pl.DataFrame:
    """Return ``df`` with exactly the canonical columns of ``name``, in order, cast to their dtypes.

    Missing columns are added as nulls; extra columns are an error (a parser bug, not bad input).
    """
    target = schema(name)
    columns = df.columns
    extra = [c for c in columns if c not in target]
    if extra:
        raise ValueError(f"frame {name!r}: columns not in the canonical schema: {extra}")
    if df.height == 0:  # nothing to cast: the canonical empty frame
        return empty(name)
    if columns == target.names() and df.dtypes == target.dtypes():  # already canonical: no query
        return df
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
    target = schema(name)
    # parts parsers conformed already are taken as they are (many small files: one pass less each)
    out = pl.concat([p if p.schema == target else conform(name, p) for p in frames], how="vertical")
    key = FRAME_SPECS[name].key
    return out.unique(list(key), keep="first", maintain_order=True) if key and len(frames) > 1 else out


class JobFrames(Mapping[str, "pl.DataFrame"]):  # a string: no Polars code at import (see Dtype)
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
            # kept: an empty frame costs milliseconds to build and detectors ask for absent ones often
            df = self._frames[name] = empty(name)
            return df
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
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
        "Generated by `python -m forensics.base.frames > docs/frames.md` from `forensics/base/frames.py`;",
        "do not edit by hand. All times are integer nanoseconds (Int64). `rank` is null when unknown.",
        "`forensics frames RUN_DIR --out DIR` writes each frame as `DIR/<name>.parquet`, with the schema's version",
        f"in the file's key-value metadata (`{PARQUET_VERSION_KEY}` = `{SCHEMA_VERSION}`). Process-group member",
        "lists are stored once, in `process_groups`: kernels and comms carry a `pg_id` to join them by (see there).",
        "Kernel and host-op names (`kernels.name`, `cpu_ops.name`) are Categorical (each distinct name stored once,",
        "4 bytes a row): string functions need a cast first (`pl.col(\"name\").cast(pl.String).str.contains(...)`),",
        "and a join on `name` with a String column needs the same cast on one side (DuckDB reads them as VARCHAR).",
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
