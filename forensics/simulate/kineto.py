"""Streams one rank's Kineto trace (`<host>_<pid>.<epoch_ms>.pt.trace.json.gz`), step by step.

Field shapes follow real PyTorch 2.x traces (see ../shared/research/hta.md §2): `cpu_op` ⊃
`record_param_comms` ⊃ `nccl:*` annotation ⊃ launch → NCCL kernel carrying the collective args, `ac2g`
flows keyed by correlation, `ProfilerStep#N` user annotations, float microsecond timestamps with ns
resolution on a relative clock plus `baseTimeNanoseconds`."""

from __future__ import annotations

import gzip
import json
import tempfile
import zlib
from pathlib import Path
from typing import IO, Any

import orjson

from forensics.simulate.engine import (
    ADAM,
    ADD,
    COLL,
    COMPUTE,
    GELU,
    GELU_BWD,
    HOST,
    LAYER_NORM,
    LAYER_NORM_BWD,
    MEMCPY,
    STREAM_COMPUTE,
    STREAM_DP,
    STREAM_RECV,
    STREAM_RS,
    STREAM_SEND,
    STREAM_TP,
    SYNC,
    Op,
    RankState,
)
from forensics.simulate.model import Job, ProcessGroup, start_stride

# All trace clocks start here (1 day of "uptime"); baseTimeNanoseconds maps them to the epoch.
T0_NS = 86_400_000_000_000
EPOCH_NS = 1_773_478_800_000_000_000  # 2026-03-14T09:00:00Z: the simulated job's profiler start

OLD_COLL = {"allreduce": "AllReduce", "allgather": "AllGather", "reduce_scatter": "ReduceScatter",
            "broadcast": "Broadcast"}
TORCH_COLL = {"allreduce": "allreduce", "allgather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base",
              "send": "send", "recv": "recv", "broadcast": "broadcast"}
FSDP2_COLL = {"allgather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}
"""FSDP2's collectives as ``record_param_comms`` and the ``nccl:`` annotation name them."""
ANNOT = {"allreduce": "nccl:all_reduce", "allgather": "nccl:_all_gather_base",
         "reduce_scatter": "nccl:_reduce_scatter_base",
         "send": "nccl:send", "recv": "nccl:recv", "broadcast": "nccl:broadcast"}


TRITON_NAMES = {
    LAYER_NORM: "triton_per_fused_native_layer_norm", LAYER_NORM_BWD: "triton_red_fused_native_layer_norm_backward",
    ADD: "triton_poi_fused_add", GELU: "triton_poi_fused_gelu", GELU_BWD: "triton_poi_fused_gelu_backward",
}
"""Inductor's kernel families for the eager kernels a compiled layer fuses (GEMMs become mm templates)."""


UB_KERNELS = {
    "allgather": "void userbuffers_fp16_sum_inplace_gpu_rr_ag<2>(int, int, int, int, int, int, int, void**, int, "
                 "unsigned long)",
    "reduce_scatter": "void userbuffers_fp16_sum_inplace_gpu_rr_rs<2>(int, int, int, int, int, int, int, void**, int, "
                      "unsigned long)",
}
"""TransformerEngine's userbuffers kernels of a comm-GEMM overlap (transformer_engine/common/comm_gemm_overlap/
userbuffers/userbuffers.cu; the argument lists abbreviated)."""


ASYNC_TP_OPS = {"allgather": "fused_all_gather_matmul", "reduce_scatter": "fused_matmul_reduce_scatter"}
"""PyTorch's async-TP fused ops (torch/distributed/_symmetric_memory/__init__.py): the dispatcher op is
``symm_mem::<name>``, and its CUDA implementation opens ``record_function(<name>)``."""
SYMM_BARRIER = "c10d::symmetric_memory::barrier_kernel(unsigned int**, int, int, int, unsigned long)"
"""``symm_mem.barrier()``'s kernel (torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemory.cu), launched by the
fused ops before their peer copies."""
SYMM_ALL_REDUCE = ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16**, "
                   "unsigned long, c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, "
                   "unsigned long)")


def nccl_kernel_name(op: str, algo: str, proto: str, new: bool) -> str:
    """Kernel name in the naming era of the NCCL version (a hint of algo/proto only, as in real NCCL)."""
    if op in ("send", "recv"):
        return "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)" if new else \
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
    a, p = algo.upper(), proto.upper()
    if op == "allgather":
        a, p = "RING", "LL"
    if new:
        red = "" if op in ("allgather", "broadcast") else "_Sum_bf16"
        return f"ncclDevKernel_{OLD_COLL[op]}{red}_{a}_{p}(ncclDevKernelArgsStorage<4096ul>)"
    return f"ncclKernel_{OLD_COLL[op]}_{a}_{p}_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _cuda_int(version: str) -> int:
    """CUDA's integer version as CUPTI reports it: "12.4" -> 12040."""
    major, minor = (int(x) for x in (version.split(".") + ["0"])[:2])
    return major * 1000 + minor * 10


def device_properties(job: Job) -> list[dict[str, Any]]:
    g = job.gpu
    return [
        {"id": i, "name": g.name, "totalGlobalMem": g.mem_bytes, "computeMajor": g.compute_major,
         "computeMinor": g.compute_minor,
         "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
         "sharedMemPerBlock": 49152, "numSms": g.num_sms, "regsPerMultiprocessor": 65536,
         "sharedMemPerBlockOptin": 232448,
         "sharedMemPerMultiprocessor": 233472}
        for i in range(job.topo.gpus_per_node)
    ]


def _us(ns: int) -> float:
    return ns / 1000.0


class Spool:
    """Where every rank's trace text waits until the job is simulated: one anonymous temporary file of
    chunks, each deflated at level 1 on its own. The ranks advance together step by step, so writing each
    trace through its own gzip stream would hold one compressor (~260 KB) and one event buffer per rank
    at once, gigabytes at thousands of ranks; :meth:`TraceWriter.close` compresses the traces one at a
    time from here (deflate's output does not depend on how its input is cut, so the bytes are the same)."""

    def __init__(self, directory: Path) -> None:
        self._f: IO[bytes] = tempfile.TemporaryFile(dir=directory, prefix=".spool-")
        self._end = 0

    def put(self, data: bytes) -> tuple[int, int]:
        """Store ``data``; return where it went (offset, length)."""
        packed = zlib.compress(data, 1)
        self._f.seek(self._end)
        self._f.write(packed)
        where = (self._end, len(packed))
        self._end += len(packed)
        return where

    def get(self, where: tuple[int, int]) -> bytes:
        self._f.seek(where[0])
        return zlib.decompress(self._f.read(where[1]))

    def close(self) -> None:
        self._f.close()


class TraceWriter:
    """Writes one rank's trace incrementally; counts what it wrote (the truth for parser tests)."""

    def __init__(self, path: Path, job: Job, st: RankState, groups: list[ProcessGroup], offset_ns: int, spool: Spool,
                 compresslevel: int = 6) -> None:
        self.path = path
        self.job = job
        self.st = st
        self.offset = T0_NS + offset_ns
        self.dev = st.local
        self._spool = spool
        self._compresslevel = compresslevel
        self._pending: list[bytes] = []  # text not yet in the spool
        self._chunks: list[tuple[int, int]] = []  # this trace's text in the spool, in order
        self._buf: list[bytes] = []
        self._first = True
        self.bytes_written = 0
        # CUPTI correlation ids count every runtime call since the process started, so a profiled window
        # starts far from 0 (HTA also downcasts small id columns to int8 and then fails to index them)
        self.ext = 1000 + st.pid % 9000
        self.corr = 20000 + (st.pid * 7) % 60000
        self.ev_idx = 0
        self.counts: dict[str, int] = {}
        self.my_groups = [g for g in groups if st.rank in g.ranks]
        dist = {
            "backend": "nccl", "rank": st.rank, "world_size": job.topo.world, "pg_count": len(self.my_groups),
            "pg_config": [g.pg_config() for g in self.my_groups], "nccl_version": job.nccl_version,
        }
        # Header keys as Kineto writes them (`"key": value`): HTA finds the rank with r'"rank":\s+(\d+)'.
        props = ",\n".join("    " + json.dumps(p) for p in device_properties(job))
        head = (b'{\n  "schemaVersion": 1,\n  "deviceProperties": [\n' + props.encode() + b'\n  ]'
                + b',\n  "distributedInfo": ' + json.dumps(dist).encode()
                + b',\n  "record_shapes": 0,\n  "with_stack": 0,\n  "profile_memory": 0,\n  "cupti_version": 24,\n'
                + b'  "cuda_runtime_version": ' + str(_cuda_int(job.cuda_version)).encode()
                + b',\n  "cuda_driver_version": 12040,\n  "traceEvents": [\n')
        self._write(head)

    # ------------------------------------------------------------------ low level
    def _write(self, data: bytes) -> None:
        self._pending.append(data)
        self.bytes_written += len(data)

    def spill(self) -> None:
        """Move what this rank has written so far into the spool (at the end of each of its steps)."""
        self.flush()
        if self._pending:
            self._chunks.append(self._spool.put(b"".join(self._pending)))
            self._pending.clear()

    def _ev(self, ev: dict[str, Any], kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self._buf.append(orjson.dumps(ev))
        if len(self._buf) >= 512:
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        data = b",\n  ".join(self._buf)
        self._write((b"  " if self._first else b",\n  ") + data)
        self._first = False
        self._buf.clear()

    def ts(self, ns: int) -> float:
        return _us(ns + self.offset)

    def _next_ext(self) -> int:
        self.ext += 1
        return self.ext

    def _next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def _idx(self) -> int:
        self.ev_idx += 1
        return self.ev_idx - 1

    def _x(self, cat: str, name: str, pid: int, tid: int, start: int, end: int, args: dict[str, Any]) -> None:
        self._ev({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self.ts(start),
                  "dur": _us(max(end - start, 0)), "args": args}, cat)

    # ------------------------------------------------------------------ structure
    def metadata(self, start_ns: int) -> None:
        st, ts = self.st, self.ts(start_ns)
        self._ev({"name": "process_name", "ph": "M", "ts": ts, "pid": st.pid, "tid": 0, "args": {"name": "python3.11"}},
                 "metadata")
        self._ev({"name": "process_labels", "ph": "M", "ts": ts, "pid": st.pid, "tid": 0, "args": {"labels": "CPU"}},
                 "metadata")
        for tid, name in ((st.pid, "python3.11"), (st.bwd_tid, "pt_autograd_0")):
            self._ev({"name": "thread_name", "ph": "M", "ts": ts, "pid": st.pid, "tid": tid,
                      "args": {"name": f"thread {tid} ({name})"}}, "metadata")
        self._ev({"name": "process_name", "ph": "M", "ts": ts, "pid": self.dev, "tid": 0,
                  "args": {"name": f"GPU {self.dev}"}}, "metadata")
        self._ev({"name": "process_labels", "ph": "M", "ts": ts, "pid": self.dev, "tid": 0,
                  "args": {"labels": f"GPU {self.dev}"}}, "metadata")
        streams = (STREAM_COMPUTE, STREAM_DP, STREAM_RS, STREAM_SEND, STREAM_RECV)
        for s in streams + ((STREAM_TP,) if self.job.tp_overlap else ()):
            self._ev({"name": "thread_name", "ph": "M", "ts": ts, "pid": self.dev, "tid": s,
                      "args": {"name": f"stream {s} "}}, "metadata")

    def step(self, number: int, start: int, end: int) -> None:
        st = self.st
        self._x("user_annotation", f"ProfilerStep#{number}", st.pid, st.pid, start, end,
                {"External id": self._next_ext(), "Record function id": 0, "Ev Idx": self._idx()})
        self.counts["steps"] = self.counts.get("steps", 0) + 1

    def op(self, op: Op) -> None:
        st = self.st
        k = op.kind
        if k == HOST:
            self._x("user_annotation", op.cpu, st.pid, op.tid, op.cpu_start, op.cpu_start + op.host_ns - 800,
                    {"External id": self._next_ext(), "Record function id": 0, "Ev Idx": self._idx()})
            return
        if k == SYNC:
            assert op.end is not None
            ext = self._next_ext()
            self._x("cpu_op", op.cpu, st.pid, op.tid, op.cpu_start, op.end + op.host_ns // 3,
                    {"External id": ext, "Record function id": 0, "Ev Idx": self._idx()})
            self._x("cuda_runtime", op.name, st.pid, op.tid, op.launch, op.end,
                    {"External id": ext, "cbid": 165, "correlation": self._next_corr()})
            return
        assert op.end is not None
        if k == COMPUTE:
            self._launch(op, op.cpu, "cudaLaunchKernel", "cuda_runtime", 211)
        elif k == MEMCPY:
            ext = self._next_ext()
            corr = self._next_corr()
            self._x("cpu_op", op.cpu, st.pid, op.tid, op.cpu_start, op.cpu_start + op.host_ns - 500,
                    {"External id": ext, "Record function id": 0, "Ev Idx": self._idx()})
            self._x("cuda_runtime", "cudaMemcpyAsync", st.pid, op.tid, op.launch, op.launch + op.host_ns // 3,
                    {"External id": ext, "cbid": 41, "correlation": corr})
            nbytes = int(op.meta)
            self._x("gpu_memcpy", op.name, self.dev, op.stream, op.start, op.end,
                    {"External id": ext, "device": self.dev, "context": 1, "stream": op.stream, "correlation": corr,
                     "bytes": nbytes,
                     "memory bandwidth (GB/s)": round(nbytes / max(op.end - op.start, 1), 3)})
            self._flows(corr, op)
            if self.job.cuda_graphs:  # with kernel_ns, every rank's GPU time: the denominator of the graph share
                self.counts["copy_ns"] = self.counts.get("copy_ns", 0) + op.end - op.start
        elif k == COLL:
            self._collective(op)

    def ops(self, prog: list[Op], step: int) -> None:
        """One step's ops: eager, compiled (``job.compiled``), or (``job.cuda_graphs``) with its compute kernels
        replayed from a CUDA graph."""
        if self.job.compiled:
            self._compiled(prog)
            return
        if not self.job.cuda_graphs:
            for op in prog:
                self.op(op)
            return
        graphed = [op for op in prog if op.kind == COMPUTE and op.end is not None]
        for op in prog:
            if not (op.kind == COMPUTE and op.end is not None):
                self.op(op)
        if graphed:
            capture = self.job.cuda_graphs == "capture" and step == self.job.first_step
            self._graph(graphed, capture)

    def _compiled(self, prog: list[Op]) -> None:
        """torch.compile: each run of compute ops on a thread (up to its next other op) is one compiled region,
        ``CompiledFunction`` on the main thread, ``CompiledFunctionBackward`` on the autograd thread; inside it
        the kernels are Triton kernels launched by ``cuLaunchKernel`` under a host op of their own name (as
        inductor's launcher records them), GEMMs as ``triton_tem_fused_mm_N`` with their input shapes. Flash
        attention stays an aten kernel, the fused optimizer stays outside the regions."""
        runs: dict[int, list[Op]] = {}
        for op in prog:
            compiled = op.kind == COMPUTE and op.end is not None and op.name != ADAM
            if not compiled:
                self._region(runs.pop(op.tid, []))
                self.op(op)
                continue
            runs.setdefault(op.tid, []).append(op)
        for run in runs.values():
            self._region(run)

    def _region(self, ops: list[Op]) -> None:
        if not ops:
            return
        st = self.st
        name = "CompiledFunction" if ops[0].tid == st.pid else "CompiledFunctionBackward"
        end = max(max(op.cpu_start + op.host_ns - 500, op.launch + op.host_ns // 3) for op in ops)
        self._x("cpu_op", name, st.pid, ops[0].tid, ops[0].cpu_start - 200, end + 200,
                {"External id": self._next_ext(), "Record function id": 0, "Ev Idx": self._idx()})
        for i, op in enumerate(ops):
            triton = "triton_tem_fused_mm" if op.dims is not None else TRITON_NAMES.get(op.name)
            if triton is None:
                self._launch(op, op.cpu, "cudaLaunchKernel", "cuda_runtime", 211)
                continue
            kname = f"{triton}_{i}"
            cpu_args: dict[str, Any] = {"kernel_backend": "triton", "kernel_name": kname}
            if op.dims is not None:
                m, k, n = op.dims
                cpu_args.update({"Input Dims": [[m, k], [k, n], [m, n]], "Input type": ["c10::BFloat16"] * 3})
                self.counts["triton_template_flops"] = self.counts.get("triton_template_flops", 0) + 2 * m * k * n
                self.counts["triton_template_ns"] = self.counts.get("triton_template_ns",
                                                                    0) + (op.end or op.start) - op.start
            self._launch(op, kname, "cuLaunchKernel", "cuda_driver", 307, kernel_name=kname, cpu_args=cpu_args)
            self.counts["triton_kernels"] = self.counts.get("triton_kernels", 0) + 1
            self.counts["triton_kernel_ns"] = self.counts.get("triton_kernel_ns", 0) + (op.end or op.start) - op.start

    def _graph(self, ops: list[Op], capture: bool) -> None:
        """The compute kernels of one step as one graph replay: ``CUDAGraph::replay`` > ``cudaGraphLaunch``, every
        kernel carrying its correlation id. With ``capture``, first the capture on the main thread: each op and
        its launch call between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture``, no kernel run by them."""
        st, tid = self.st, self.st.pid
        t_launch = ops[0].launch
        if capture:
            ext = self._next_ext()
            t0 = ops[0].cpu_start - 2_000
            self._x("cuda_runtime", "cudaStreamBeginCapture", st.pid, tid, t0, t0 + 1_000,
                    {"External id": ext, "cbid": 317, "correlation": self._next_corr()})
            for op in ops:
                e = self._next_ext()
                self._x("cpu_op", op.cpu, st.pid, tid, op.cpu_start, op.cpu_start + op.host_ns - 500,
                        {"External id": e, "Record function id": 0, "Ev Idx": self._idx()})
                self._x("cuda_runtime", "cudaLaunchKernel", st.pid, tid, op.launch, op.launch + op.host_ns // 3,
                        {"External id": e, "cbid": 211, "correlation": self._next_corr()})
                self.counts["captured_launches"] = self.counts.get("captured_launches", 0) + 1
            t_end = max(op.launch + op.host_ns // 3 for op in ops) + 1_000
            self._x("cuda_runtime", "cudaStreamEndCapture", st.pid, tid, t_end, t_end + 2_000,
                    {"External id": ext, "cbid": 318, "correlation": self._next_corr()})
            self._x("cuda_runtime", "cudaGraphInstantiate", st.pid, tid, t_end + 3_000, t_end + 40_000,
                    {"External id": ext, "cbid": 393, "correlation": self._next_corr()})
            t_launch = t_end + 41_000
        ext, corr = self._next_ext(), self._next_corr()
        self._x("cpu_op", "CUDAGraph::replay", st.pid, tid, t_launch - 2_000, t_launch + 9_000,
                {"External id": ext, "Record function id": 0, "Ev Idx": self._idx()})
        self._x("cuda_runtime", "cudaGraphLaunch", st.pid, tid, t_launch, t_launch + 6_000,
                {"External id": ext, "cbid": 311, "correlation": corr})
        self.counts["graph_launches"] = self.counts.get("graph_launches", 0) + 1
        self._ev({"ph": "s", "id": corr, "pid": st.pid, "tid": tid, "ts": self.ts(t_launch), "cat": "ac2g",
                  "name": "ac2g"}, "ac2g")
        for op in ops:
            self._kernel_event(op, op.name, ext, corr)
            self._ev({"ph": "f", "id": corr, "pid": self.dev, "tid": op.stream, "ts": self.ts(op.start), "cat": "ac2g",
                      "name": "ac2g", "bp": "e"}, "ac2g")
            self.counts["graph_kernels"] = self.counts.get("graph_kernels", 0) + 1
            self.counts["graph_kernel_ns"] = self.counts.get("graph_kernel_ns", 0) + (op.end or op.start) - op.start

    def _flows(self, corr: int, op: Op) -> None:
        st = self.st
        self._ev({"ph": "s", "id": corr, "pid": st.pid, "tid": op.tid, "ts": self.ts(op.launch), "cat": "ac2g",
                  "name": "ac2g"}, "ac2g")
        self._ev({"ph": "f", "id": corr, "pid": self.dev, "tid": op.stream, "ts": self.ts(op.start), "cat": "ac2g",
                  "name": "ac2g", "bp": "e"}, "ac2g")

    def _launch(self, op: Op, cpu_name: str, api: str, api_cat: str, cbid: int, ext: int | None = None,
                extra_args: dict[str, Any] | None = None, kernel_name: str | None = None,
                cpu_args: dict[str, Any] | None = None) -> None:
        st = self.st
        if ext is None:
            ext = self._next_ext()
            self._x("cpu_op", cpu_name, st.pid, op.tid, op.cpu_start, op.cpu_start + op.host_ns - 500,
                    {"External id": ext, "Record function id": 0, "Ev Idx": self._idx(), **(cpu_args or {})})
        corr = self._next_corr()
        self._x(api_cat, api, st.pid, op.tid, op.launch, op.launch + op.host_ns // 3,
                {"External id": ext, "cbid": cbid, "correlation": corr})
        self._kernel_event(op, kernel_name or op.name, ext, corr, extra_args)
        self._flows(corr, op)

    def _kernel_event(self, op: Op, name: str, ext: int, corr: int, extra_args: dict[str, Any] | None = None) -> None:
        grid, block = op.meta if isinstance(op.meta, tuple) else (8, 640)
        sms = self.job.gpu.num_sms
        args: dict[str, Any] = {
            "External id": ext, "queued": 0, "device": self.dev, "context": 1, "stream": op.stream, "correlation": corr,
            "registers per thread": 96 if op.coll is not None else 168,
            "shared memory": 87568 if op.coll is not None else 197632,
            "blocks per SM": round(grid / sms, 6), "warps per SM": round(grid * block / 32 / sms, 6),
            "grid": [grid, 1, 1], "block": [block, 1, 1],
            "est. achieved occupancy %": 0 if op.coll is not None else min(100, int(grid / sms * 100 // 8)),
        }
        if extra_args:
            args.update(extra_args)
        assert op.end is not None
        self._x("kernel", name, self.dev, op.stream, op.start, op.end, args)
        if self.job.cuda_graphs:  # the truth of the graph scenarios: every kernel's time, to share the graphs' out
            self.counts["kernel_ns"] = self.counts.get("kernel_ns", 0) + op.end - op.start

    def _collective(self, op: Op) -> None:
        st, job = self.st, self.job
        c = op.coll
        assert c is not None
        if job.symm_tp and c.pg.kind == "tp" and op.name == "allreduce":
            self._symm_all_reduce(op)
            return
        if job.tp_overlap and c.pg.kind == "tp":
            self._async_tp(op) if job.async_tp else self._userbuffers(op)
            return
        new = job.new_kernel_names
        dtype = "BFloat16" if new else "Float"
        kind = op.name  # send and recv share one Coll; the op says which side this is
        nelems = c.nbytes // (2 if new else 4)
        in_n = out_n = nelems
        if kind == "allgather":  # nbytes is the gathered (full) buffer
            in_n = nelems // len(c.members)
        elif kind == "reduce_scatter":
            out_n = nelems // len(c.members)
        pg = c.pg
        first, stride = start_stride(c.members) if kind in ("send", "recv") else pg.start_stride
        coalesced = job.p2p_coalesced and kind in ("send", "recv")
        torch_name = FSDP2_COLL.get(kind, TORCH_COLL[kind]) if job.fsdp2 else TORCH_COLL[kind]
        coll_args: dict[str, Any] = {
            "Collective name": "coalesced" if coalesced else torch_name, "In msg nelems": in_n, "Out msg nelems": out_n,
            "Group size": len(pg.ranks), "dtype": dtype, "In split size": "[]", "Out split size": "[]",
            "Process Group Name": pg.name, "Process Group Description": pg.desc,
            "Process Group Ranks": pg.ranks_text,
        }
        if job.seq_on_kernels and kind not in ("send", "recv"):
            coll_args["Seq"] = c.seq
        e1, e2, e3 = self._next_ext(), self._next_ext(), self._next_ext()
        t0 = op.cpu_start
        t1 = t0 + op.host_ns - 400
        self._x("cpu_op", op.cpu, st.pid, op.tid, t0, t1,
                {"External id": e1, "Record function id": 0, "Ev Idx": self._idx()})
        rpc: dict[str, Any] = {"External id": e2, "Record function id": 0, "Ev Idx": self._idx(), "Rank": st.rank,
                               "Global rank start": first, "Global rank stride": stride, **coll_args}
        if kind == "send" and not coalesced:
            rpc["Dst Rank"] = c.members[1]
        elif kind == "recv" and not coalesced:
            rpc["Src Rank"] = c.members[0]
        self._x("cpu_op", "record_param_comms", st.pid, op.tid, t0 + 1_500, t1 - 1_000, rpc)
        annot = f"nccl:{torch_name}" if job.fsdp2 and kind in FSDP2_COLL else ANNOT[kind]
        self._x("user_annotation", "nccl:coalesced" if coalesced else annot, st.pid, op.tid, t0 + 3_000, t1 - 2_000,
                {"External id": e3, "Record function id": 0, "Ev Idx": self._idx()})
        self.counts["comms"] = self.counts.get("comms", 0) + 1
        api, api_cat, cbid = ("cuLaunchKernelEx", "cuda_driver", 652) if new else ("cudaLaunchKernel", "cuda_runtime",
                                                                                   211)
        op.meta = (c.channels, 512 if new else 640)
        self._launch(op, "", api, api_cat, cbid, ext=e2, extra_args=coll_args,
                     kernel_name=nccl_kernel_name(kind, c.algo, c.proto, new))
        self.counts["nccl_kernels"] = self.counts.get("nccl_kernels", 0) + 1

    def _symm_all_reduce(self, op: Op) -> None:
        """A TP all-reduce through symmetric memory: ``symm_mem::two_shot_all_reduce_`` launching PyTorch's own
        kernel, with no ``record_param_comms`` and no process-group args on the kernel."""
        assert op.end is not None
        op.meta = (op.coll.channels if op.coll is not None else 16, 512)
        self._launch(op, "symm_mem::two_shot_all_reduce_", "cudaLaunchKernel", "cuda_runtime", 211,
                     kernel_name=SYMM_ALL_REDUCE)
        self.counts["symm_kernels"] = self.counts.get("symm_kernels", 0) + 1
        self.counts["symm_kernel_ns"] = self.counts.get("symm_kernel_ns", 0) + op.end - op.start

    def _userbuffers(self, op: Op) -> None:
        """A TP all-gather / reduce-scatter of a comm-GEMM overlap: TransformerEngine's userbuffers kernel on its own
        stream beside a GEMM, launched from TE's extension (no ``record_param_comms``, no group args; the CPU op
        name is this writer's label). The truth: its time, and how much of it ran beside the GEMM it overlaps."""
        assert op.end is not None and op.coll is not None
        op.meta = (op.coll.channels, 1024)
        self._launch(op, f"te::userbuffers_{op.name}", "cudaLaunchKernelExC", "cuda_runtime", 430,
                     kernel_name=UB_KERNELS[op.name])
        under = op.under
        overlap = 0 if under is None or under.end is None else max(0, min(op.end, under.end) - max(op.start,
                                                                                                   under.start))
        for key, value in (("ub_kernels", 1), ("ub_kernel_ns", op.end - op.start), ("ub_overlap_ns", overlap)):
            self.counts[key] = self.counts.get(key, 0) + value

    def _async_tp(self, op: Op) -> None:
        """A TP all-gather / reduce-scatter of PyTorch's async TP: ``symm_mem::fused_all_gather_matmul`` (or
        ``fused_matmul_reduce_scatter``) and its ``record_function`` range around the transfer and the GEMM chunk
        it overlaps; inside, a symmetric-memory barrier kernel, then ``aten::copy_`` of the peer's shard
        (``cudaMemcpyAsync``, ``Memcpy DtoD`` on the backend stream). The truth: their time, and how much of it ran
        beside the GEMM chunk."""
        assert op.end is not None and op.coll is not None
        under = op.under
        ext = self._fused_range(op, ASYNC_TP_OPS[op.name])
        self._barrier_and_copy(op, ext, op.coll.nbytes // len(op.coll.members))
        overlap = 0 if under is None or under.end is None else max(0, min(op.end, under.end) - max(op.start,
                                                                                                   under.start))
        for key, value in (("async_tp_copies", 1), ("async_tp_ns", op.end - op.start),
                           ("async_tp_overlap_ns", overlap)):
            self.counts[key] = self.counts.get(key, 0) + value

    def _fused_range(self, op: Op, name: str) -> int:
        """The fused op's dispatcher range and its ``record_function`` range, around the host time of the transfer
        and of the GEMM chunk it overlaps (the ops next to it in the program); returns the op's External id."""
        st = self.st
        host = [(o.cpu_start, o.cpu_start + o.host_ns) for o in (op, op.under) if o is not None]
        t0, t1 = min(a for a, _ in host) - 300, max(b for _, b in host) - 200
        ext = self._next_ext()
        self._x("cpu_op", f"symm_mem::{name}", st.pid, op.tid, t0, t1,
                {"External id": ext, "Record function id": 0, "Ev Idx": self._idx()})
        self._x("user_annotation", name, st.pid, op.tid, t0 + 100, t1 - 100,
                {"External id": self._next_ext(), "Record function id": 0, "Ev Idx": self._idx()})
        return ext

    def _barrier_and_copy(self, op: Op, ext: int, nbytes: int) -> None:
        """The engine's transfer interval split between the barrier kernel (its first 2 µs at most) and the
        copy, both launched from the transfer's host time."""
        assert op.end is not None
        split = op.start + min(2_000, (op.end - op.start) // 4)
        barrier = Op(op.kind, op.stream, SYMM_BARRIER, "", 0, op.host_ns // 4, op.tid, meta=(1, 32))
        barrier.launch, barrier.start, barrier.end = op.cpu_start + 100, op.start, split
        corr = self._next_corr()
        self._x("cuda_runtime", "cudaLaunchKernel", self.st.pid, op.tid, barrier.launch,
                barrier.launch + op.host_ns // 12, {"External id": ext, "cbid": 211, "correlation": corr})
        self._kernel_event(barrier, SYMM_BARRIER, ext, corr)
        self._flows(corr, barrier)
        copy = Op(MEMCPY, op.stream, "Memcpy DtoD (Device -> Device)", "aten::copy_", 0, op.host_ns - op.host_ns // 4,
                  op.tid, meta=nbytes, cls="memcpy")
        copy.cpu_start, copy.launch, copy.start, copy.end = op.cpu_start + op.host_ns // 4, op.launch, split, op.end
        self.op(copy)

    def close(self, start_ns: int, end_ns: int) -> None:
        """End the trace and write the file, compressed from the spool."""
        self._ev({"ph": "X", "cat": "Trace", "ts": self.ts(start_ns), "dur": _us(end_ns - start_ns), "pid": "Spans",
                  "tid": "PyTorch Profiler",
                  "name": "PyTorch Profiler (0)", "args": {"Op count": 0}}, "Trace")
        self._ev({"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
                  "tid": "Trace PyTorch Profiler", "ts": self.ts(start_ns)}, "instant")
        self._ev({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                  "ts": self.ts(end_ns + 1_000)}, "instant")
        self.flush()
        tail = (b'\n  ],\n  "traceName": "' + str(self.path.name).encode() + b'",\n  "displayTimeUnit": "ms",\n'
                + b'  "baseTimeNanoseconds": ' + str(EPOCH_NS - T0_NS).encode() + b"\n}\n")
        self._write(tail)
        self.spill()
        with open(self.path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                         compresslevel=self._compresslevel) as gz:
            for where in self._chunks:
                gz.write(self._spool.get(where))
        self._chunks.clear()
