"""Discrete-event core: per-rank programs (host order) resolved into host and GPU times.

Each rank's program is the list of things its host thread does in order: run a CPU op, launch a kernel
on a stream, launch a collective, wait for the GPU. The host never blocks on a launch; a kernel starts
when it has been launched, its stream is free and the events it waits on have fired. A collective's
kernel starts on each rank when that rank's stream reaches it, and every member's kernel ends at the
last arrival plus the transfer time (a tiny per-rank jitter models ring pipelining). Ranks are
advanced round-robin, each as far as its known inputs allow, one training step at a time, so memory
stays bounded by one step whatever the trace size.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from forensics.simulate.model import Job, ProcessGroup, build_groups, choose_algo, fsdp2_groups, group_of, hsdp_groups
from forensics.simulate.scenarios import ScenarioError

# op kinds
COMPUTE, MEMCPY, COLL, HOST, SYNC = range(5)

STREAM_COMPUTE = 7
STREAM_DP = 24          # DDP all-reduce / FSDP all-gather
STREAM_RS = 26          # FSDP reduce-scatter
STREAM_SEND = 28
STREAM_RECV = 32
STREAM_TP = 22          # comm-GEMM overlap (userbuffers): TP all-gathers / reduce-scatters beside the GEMMs
LAUNCH_LATENCY_NS = 3_500
KERNEL_GAP_NS = 1_200   # a kernel starts at least this long after what it waits for (stream order, events)

GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_{t}_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__"
        "5x_cublas")
FLASH_FWD = ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
             "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, "
             "false, false>(Flash_fwd_params)")
FLASH_BWD = ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, "
             "false, false, "
             "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, "
             "false, false, false>(Flash_bwd_params)")
LAYER_NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
              "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)")
LAYER_NORM_BWD = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, "
                  "float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 "
                  "const*, c10::BFloat16*, int)")
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
       "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)")
GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
        "const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, "
        "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() "
        "const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)")
GELU_BWD = ("void at::native::vectorized_elementwise_kernel<4, "
            "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, "
            "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
            "const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3> >(int, "
            "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, "
            "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
            "const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3>)")
CE_FWD = "void cunn_SoftMaxForward<4, float, float, float, Epilogue>(float*, float const*, int)"
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
        "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
        "(at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool, float*, "
        "float*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous "
        "namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, "
        "double, double, double, bool, float*, float*)")

COLL_OPTYPE = {"allreduce": "ALLREDUCE", "allgather": "_ALLGATHER_BASE", "reduce_scatter": "_REDUCE_SCATTER_BASE",
               "send": "SEND", "recv": "RECV", "broadcast": "BROADCAST"}


class Coll:
    """One collective instance across its members."""

    __slots__ = ("key", "op", "pg", "seq", "members", "arrive", "t_tx", "end", "nbytes", "nelems", "algo", "proto",
                 "channels", "timeout", "absent", "step",
                 "last_arrive")

    def __init__(self, key: tuple, op: str, pg: ProcessGroup, seq: int, members: tuple[int, ...], nbytes: int,
                 step: int) -> None:
        self.key, self.op, self.pg, self.seq, self.members = key, op, pg, seq, members
        self.arrive: dict[int, int] = {}
        self.t_tx = 0
        self.end: int | None = None
        self.nbytes = nbytes
        self.nelems = nbytes // 2
        self.algo, self.proto, self.channels = "Ring", "Simple", 8
        self.timeout = False
        self.absent: tuple[int, ...] = ()
        self.step = step
        self.last_arrive: int | None = None  # once every member arrived: the latest arrival (see last_arrival)

    def last_arrival(self) -> int:
        """The latest member's arrival; asked by every member, computed once (thousands of members)."""
        if self.last_arrive is None:
            self.last_arrive = max(self.arrive.values())
        return self.last_arrive


class Op:
    __slots__ = ("kind", "stream", "name", "cpu", "dur", "host_ns", "deps", "coll", "tid", "meta", "jit",
                 "launch", "start", "end", "cpu_start", "cls", "send", "dims", "under")

    def __init__(self, kind: int, stream: int, name: str, cpu: str, dur: int, host_ns: int, tid: int,
                 deps: tuple[Op, ...] = (), coll: Coll | None = None, meta: Any = None, cls: str = "compute") -> None:
        self.kind, self.stream, self.name, self.cpu, self.dur, self.host_ns = kind, stream, name, cpu, dur, host_ns
        self.deps, self.coll, self.tid, self.meta, self.cls = deps, coll, tid, meta, cls
        self.jit = 0
        self.launch = self.start = self.cpu_start = 0
        self.end: int | None = None
        self.send: Coll | None = None  # a batched exchange: the send this (receive) kernel also carries
        self.dims: tuple[int, int, int] | None = None  # a GEMM's (M, K, N): what a compiled trace records as shapes
        self.under: Op | None = None  # an overlapped TP collective: the GEMM (chunk) it runs beside (the truth)


@dataclass
class RankState:
    rank: int
    host: str
    node: int
    local: int
    pid: int
    bwd_tid: int
    rng: random.Random
    host_t: int = 0
    last: dict[int, Op] = field(default_factory=dict)
    seq: dict[str, int] = field(default_factory=dict)
    compute_scale: float = 1.0
    host_scale: float = 1.0
    stall_ns: int = 0
    stopped: bool = False


@dataclass
class _Tp:
    """What a layer's tensor-parallel GEMMs and collectives share: the rank, its program, thread, step, TP group
    (None without TP) and the activation bytes each TP collective moves."""
    st: RankState
    prog: list[Op]
    tid: int
    step: int
    tpg: ProcessGroup | None
    nbytes: int


@dataclass
class StepResult:
    step: int
    programs: dict[int, list[Op]]
    step_span: dict[int, tuple[int, int]]  # rank -> host start, host end
    colls: list[Coll]


class DeadlockError(RuntimeError):
    pass


def _end_of(op: Op) -> int | None:
    if op.end is not None:
        return op.end
    c = op.coll
    if c is not None and c.end is not None:
        op.end = max(c.end + (0 if op.name == "recv" else op.jit), op.start + 1_000)
        if op.send is not None:  # a batched exchange ends when both of its transfers are done
            op.end = max(op.end, op.start + op.send.t_tx)
        return op.end
    return None


def _ready_time(st: RankState, op: Op) -> int | None:
    """When ``op`` may start on the GPU: after its stream's previous op and its dependencies (None: not
    known yet, something it waits for has not been placed)."""
    ready = 0
    prev = st.last.get(op.stream)
    if prev is not None:
        e = _end_of(prev)
        if e is None:
            return None
        ready = e
    for d in op.deps:
        e = _end_of(d)
        if e is None:
            return None
        ready = max(ready, e)
    return ready


class Engine:
    """Builds each rank's per-step program and resolves it. ``fault`` hooks live in the builder."""

    def __init__(self, job: Job, seed: int, hosts: list[str]) -> None:
        self.job = job
        self.seed = seed
        self.topo = job.topo
        self.groups = (hsdp_groups(job.topo, job.shard) or (fsdp2_groups(job.topo) if job.fsdp2 else [])
                       or build_groups(job.topo))
        self.hosts = hosts
        self.colls: dict[tuple, Coll] = {}
        self.states: list[RankState] = []
        for r in range(self.topo.world):
            rng = random.Random(f"{seed}:rank:{r}")
            pid = 1000 + rng.randrange(1000, 900000)
            node = self.topo.node_of(r)
            st = RankState(r, hosts[node], node, self.topo.local_rank(r), pid, pid + 173 + rng.randrange(0, 60), rng)
            st.host_t = 40_000 + rng.randrange(0, 300_000)  # profiler windows open at slightly different times
            self.states.append(st)
        self.timeout_spec: dict[str, Any] | None = None
        self.gemm_scale = 1.0  # a slower kernel class on every rank (slow_gemm)
        for f in job.faults:
            st_ranks = f.get("ranks", ())
            if f["kind"] == "compute_straggler":
                for r in st_ranks:
                    self.states[r].compute_scale = 1.0 + f["slowdown"]
            elif f["kind"] in ("host_straggler", "input_bound"):
                for r in st_ranks:
                    self.states[r].host_scale = f.get("launch_factor", 1.0)
                    self.states[r].stall_ns = int(f.get("stall_ms", 0.0) * 1e6)
            elif f["kind"] == "slow_kernel_class":
                self.gemm_scale = 1.0 + f["slowdown"]
            elif f["kind"] == "collective_timeout":
                self.timeout_spec = dict(f)  # resolved (seq, group) here; the job's fault stays as given
        self.stage_scale = job.stage_scale or (1.0,) * self.topo.pp
        self.halted = False

    # ---------------------------------------------------------------- durations
    def _noise(self, st: RankState) -> float:
        return st.rng.lognormvariate(0.0, self.job.noise) if self.job.noise > 0 else 1.0

    def _gemm_ns(self, flops: float, st: RankState, scale: float) -> int:
        g = self.job.gpu
        return int((flops / (g.peak_tflops * 1e12 * self.job.work.gemm_eff) * 1e9 + 3_000) * scale * self.gemm_scale
                   * self._noise(st))

    def _attn_ns(self, flops: float, st: RankState, scale: float) -> int:
        g = self.job.gpu
        return int((flops / (g.peak_tflops * 1e12 * self.job.work.attn_eff) * 1e9 + 4_000) * scale * self._noise(st))

    def _mem_ns(self, nbytes: float, st: RankState, scale: float) -> int:
        return int((nbytes / (self.job.gpu.hbm_gbs * 1e9 * 0.8) * 1e9 + 2_000) * scale * self._noise(st))

    def _host_ns(self, st: RankState, base_us: float) -> int:
        return int(base_us * 1e3 * st.host_scale * (0.85 + 0.3 * st.rng.random()))

    # ---------------------------------------------------------------- program building
    def _kernel(self, st: RankState, prog: list[Op], name: str, cpu: str, dur: int, tid: int, grid: int, block: int,
                deps: tuple[Op, ...] = (), stream: int = STREAM_COMPUTE,
                dims: tuple[int, int, int] | None = None) -> Op:
        host = self._host_ns(st, self.job.host_op_us)
        op = Op(COMPUTE, stream, name, cpu, dur, host, tid, deps, meta=(grid, block))
        op.dims = dims
        prog.append(op)
        return op

    def _coll(self, st: RankState, prog: list[Op], op_name: str, pg: ProcessGroup, nbytes: int, stream: int, tid: int,
              step: int, deps: tuple[Op, ...] = (), peer: int | None = None, p2p_index: int = 0) -> Op:
        j = self.job
        if op_name in ("send", "recv"):
            src, dst = (st.rank, peer) if op_name == "send" else (peer, st.rank)
            assert src is not None and dst is not None
            key: tuple = ("p2p", src, dst, p2p_index)
            members: tuple[int, ...] = (src, dst)
            seq = 0
        else:
            seq = st.seq.get(pg.name, 0) + 1
            st.seq[pg.name] = seq
            key = (pg.name, seq)
            members = pg.ranks
        c = self.colls.get(key)
        if c is None:
            c = Coll(key, op_name, pg, seq, members, nbytes, step)
            nodes = {self.topo.node_of(r) for r in members}
            rails = frozenset((self.topo.node_of(r), self.topo.local_rank(r)) for r in members)
            c.algo, c.proto, c.t_tx = choose_algo(op_name, nbytes, len(members), nodes, j.net, j.algos, j.protos, rails)
            c.channels = 2 if op_name in ("send", "recv") else (16 if len(nodes) == 1 else 8)
            if op_name == "allreduce" and c.algo == "Tree":
                c.channels = min(c.channels, 8)
            self.colls[key] = c
        cpu = {"allreduce": "c10d::allreduce_", "allgather": "c10d::_allgather_base_",
               "reduce_scatter": "c10d::_reduce_scatter_base_",
               "send": "c10d::send", "recv": "c10d::recv_", "broadcast": "c10d::broadcast_"}[op_name]
        op = Op(COLL, stream, op_name, cpu, 0, self._host_ns(st, 55.0), tid, deps, coll=c, meta=peer, cls="comm")
        op.jit = st.rng.randrange(0, 900)
        prog.append(op)
        return op

    def _layer_fwd(self, st: RankState, prog: list[Op], scale: float, tid: int, step: int) -> None:
        w, tp = self.job.work, self.topo.tp
        b, s, h = w.micro_batch, w.seq, w.hidden
        ff = w.ffn_mult * h
        act = b * s * h * 2
        tpg = group_of(self.groups, st.rank, "tp")
        tpc = _Tp(st, prog, tid, step, tpg, act)
        self._kernel(st, prog, LAYER_NORM, "aten::native_layer_norm", self._mem_ns(3 * act, st, scale), tid, b * s // 4,
                     256)
        self._col_gemm(tpc, "tn", "aten::mm", self._gemm_ns(2 * b * s * h * 3 * h / tp, st, scale),
                       (b * s, h, 3 * h // tp))
        self._kernel(st, prog, FLASH_FWD, "FlashAttnFunc", self._attn_ns(2 * b * s * s * h / tp, st, scale), tid,
                     b * (s // 128) * max(1, 16 // tp), 128)
        wait = self._row_gemm(tpc, "tn", "aten::mm", self._gemm_ns(2 * b * s * h * h / tp, st, scale),
                              (b * s, h // tp, h))
        self._kernel(st, prog, ADD, "aten::add", self._mem_ns(3 * act, st, scale), tid, b * s * h // 2048, 128,
                     deps=wait)
        self._kernel(st, prog, LAYER_NORM, "aten::native_layer_norm", self._mem_ns(3 * act, st, scale), tid, b * s // 4,
                     256)
        self._col_gemm(tpc, "tn", "aten::mm", self._gemm_ns(2 * b * s * h * ff / tp, st, scale), (b * s, h, ff // tp))
        self._kernel(st, prog, GELU, "aten::gelu", self._mem_ns(2 * act * w.ffn_mult / tp, st, scale), tid,
                     b * s * ff // 2048 // tp, 128)
        wait = self._row_gemm(tpc, "tn", "aten::mm", self._gemm_ns(2 * b * s * h * ff / tp, st, scale),
                              (b * s, ff // tp, h))
        self._kernel(st, prog, ADD, "aten::add", self._mem_ns(3 * act, st, scale), tid, b * s * h // 2048, 128,
                     deps=wait)

    def _layer_bwd(self, st: RankState, prog: list[Op], scale: float, tid: int, step: int) -> Op:
        w, tp = self.job.work, self.topo.tp
        b, s, h = w.micro_batch, w.seq, w.hidden
        ff = w.ffn_mult * h
        act = b * s * h * 2
        sms = self.job.gpu.num_sms
        tpg = group_of(self.groups, st.rank, "tp")
        tpc = _Tp(st, prog, tid, step, tpg, act)
        bw = "autograd::engine::evaluate_function: MmBackward0"
        # a row-parallel layer's backward gathers its sequence-sharded output gradient (under its dgrad GEMM)
        self._col_gemm(tpc, "nn", bw, self._gemm_ns(2 * b * s * h * ff / tp, st, scale), (b * s, h, ff // tp))
        self._kernel(st, prog, GEMM.format(t="nt"), bw, self._gemm_ns(2 * b * s * h * ff / tp, st, scale), tid, sms,
                     384, dims=(h, b * s, ff // tp))
        self._kernel(st, prog, GELU_BWD, "autograd::engine::evaluate_function: GeluBackward0",
                     self._mem_ns(3 * act * w.ffn_mult / tp, st, scale), tid, b * s * ff // 2048 // tp, 128)
        self._kernel(st, prog, GEMM.format(t="nn"), bw, self._gemm_ns(2 * b * s * h * ff / tp, st, scale), tid, sms,
                     384, dims=(b * s, h, ff // tp))
        # a column-parallel layer's input gradient is reduced: eager after its wgrad GEMM, overlapped beside it
        wait = self._reduced_wgrad(tpc, bw, self._gemm_ns(2 * b * s * h * ff / tp, st, scale), (h, b * s, ff // tp))[1]
        self._kernel(st, prog, LAYER_NORM_BWD, "autograd::engine::evaluate_function: NativeLayerNormBackward0",
                     self._mem_ns(4 * act, st, scale), tid, b * s // 4, 256, deps=wait)
        self._col_gemm(tpc, "nn", bw, self._gemm_ns(2 * b * s * h * h / tp, st, scale), (b * s, h // tp, h))
        self._kernel(st, prog, GEMM.format(t="nt"), bw, self._gemm_ns(2 * b * s * h * h / tp, st, scale), tid, sms, 384,
                     dims=(h // tp, b * s, h))
        self._kernel(st, prog, FLASH_BWD, "FlashAttnFuncBackward", self._attn_ns(5 * b * s * s * h / tp, st, scale),
                     tid, b * (s // 128) * max(1, 16 // tp), 256)
        self._kernel(st, prog, GEMM.format(t="nn"), bw, self._gemm_ns(2 * b * s * h * 3 * h / tp, st, scale), tid, sms,
                     384, dims=(b * s, h, 3 * h // tp))
        if tpg is not None and not self.job.tp_overlap:
            self._coll(st, prog, "allreduce", tpg, act, STREAM_COMPUTE, tid, step)
        last, wait = self._reduced_wgrad(tpc, bw, self._gemm_ns(2 * b * s * h * 3 * h / tp, st, scale),
                                         (h, b * s, 3 * h // tp), eager_reduce=False)
        self._kernel(st, prog, LAYER_NORM_BWD, "autograd::engine::evaluate_function: NativeLayerNormBackward0",
                     self._mem_ns(4 * act, st, scale), tid, b * s // 4, 256, deps=wait)
        return last

    # ---------------------------------------------------------------- tensor parallelism
    def _gemm(self, c: _Tp, t: str, cpu: str, dur: int, dims: tuple[int, int, int], deps: tuple[Op, ...] = ()) -> Op:
        return self._kernel(c.st, c.prog, GEMM.format(t=t), cpu, dur, c.tid, self.job.gpu.num_sms, 384, deps=deps,
                            dims=dims)

    def _overlapped(self, c: _Tp, op_name: str, under: Callable[[], Op]) -> Op:
        """A TP collective on its own stream, started when the compute before it is done, beside the GEMM (chunk)
        ``under`` builds (comm-GEMM overlap: TransformerEngine userbuffers, async TP)."""
        assert c.tpg is not None
        if self.job.async_tp == "serialized":  # the copy waits for the GEMM chunk instead of running beside it
            gemm = under()
            comm = self._coll(c.st, c.prog, op_name, c.tpg, c.nbytes, STREAM_TP, c.tid, c.step, deps=(gemm,))
            comm.under = gemm
            return comm
        before = next((o for o in reversed(c.prog) if o.stream == STREAM_COMPUTE), None)
        comm = self._coll(c.st, c.prog, op_name, c.tpg, c.nbytes, STREAM_TP, c.tid, c.step,
                          deps=(before,) if before is not None else ())
        comm.under = under()
        return comm

    def _col_gemm(self, c: _Tp, t: str, cpu: str, dur: int, dims: tuple[int, int, int]) -> None:
        """A column-parallel GEMM; with ``tp_overlap``, the all-gather of its sequence-sharded input runs beside its
        first half (the local shard) and the second half waits for it."""
        if not (self.job.tp_overlap and c.tpg is not None):
            self._gemm(c, t, cpu, dur, dims)
            return
        half = (dims[0] // 2, dims[1], dims[2])
        ag = self._overlapped(c, "allgather", lambda: self._gemm(c, t, cpu, dur // 2, half))
        self._gemm(c, t, cpu, dur - dur // 2, half, deps=(ag,))

    def _row_gemm(self, c: _Tp, t: str, cpu: str, dur: int, dims: tuple[int, int, int]) -> tuple[Op, ...]:
        """A row-parallel GEMM and its TP reduction: eager, an all-reduce after it on the compute stream; with
        ``tp_overlap``, a reduce-scatter of its first half beside its second half. Returns what the next op
        waits for."""
        if not (self.job.tp_overlap and c.tpg is not None):
            self._gemm(c, t, cpu, dur, dims)
            if c.tpg is not None:
                self._coll(c.st, c.prog, "allreduce", c.tpg, c.nbytes, STREAM_COMPUTE, c.tid, c.step)
            return ()
        half = (dims[0] // 2, dims[1], dims[2])
        self._gemm(c, t, cpu, dur // 2, half)
        return (self._overlapped(c, "reduce_scatter", lambda: self._gemm(c, t, cpu, dur - dur // 2, half)),)

    def _reduced_wgrad(self, c: _Tp, cpu: str, dur: int, dims: tuple[int, int, int],
                       eager_reduce: bool = True) -> tuple[Op, tuple[Op, ...]]:
        """A wgrad GEMM and the reduction of the input gradient computed before it: eager (``eager_reduce``), an
        all-reduce after it; with ``tp_overlap``, a reduce-scatter beside it. Returns the GEMM and what the next
        op waits for."""
        if not (self.job.tp_overlap and c.tpg is not None):
            g = self._gemm(c, "nt", cpu, dur, dims)
            if c.tpg is not None and eager_reduce:
                self._coll(c.st, c.prog, "allreduce", c.tpg, c.nbytes, STREAM_COMPUTE, c.tid, c.step)
            return g, ()
        rs = self._overlapped(c, "reduce_scatter", lambda: self._gemm(c, "nt", cpu, dur, dims))
        assert rs.under is not None
        return rs.under, (rs,)

    def _dp_buckets(self, st: RankState, prog: list[Op], grads_ready: list[Op], step: int, tid: int) -> list[Op]:
        """DDP reducer: a bucket is all-reduced as soon as its last gradient is ready (or all at the end)."""
        dpg = group_of(self.groups, st.rank, "dp")
        if dpg is None:
            return []
        w = self.job.work
        per_layer = w.layer_params(self.topo.tp) * w.grad_bytes
        cap = int(w.bucket_mb * 1024 * 1024)
        out: list[Op] = []
        acc = 0
        layers = len(grads_ready)
        for i, ready in enumerate(grads_ready):
            acc += per_layer
            if acc >= cap or i == layers - 1:
                dep = ready if self.job.overlap_dp else grads_ready[-1]
                out.append(self._coll(st, prog, "allreduce", dpg, acc, STREAM_DP, tid, step, deps=(dep,)))
                acc = 0
        return out

    def _optimizer(self, st: RankState, prog: list[Op], waits: list[Op], tid: int) -> None:
        w = self.job.work
        if not w.optimizer:
            return
        params = w.layer_params(self.topo.tp) * w.layers * max(1, self.job.chunks)
        dur = self._mem_ns(params * 16, st, st.compute_scale)
        deps = tuple(waits)
        chunks = 4
        for i in range(chunks):
            self._kernel(st, prog, ADAM, "Optimizer.step#FusedAdam.step" if i == 0 else "aten::_fused_adam_",
                         dur // chunks, tid, 320, 512, deps=deps if i == 0 else ())

    def _step_head(self, st: RankState, prog: list[Op], tid: int) -> None:
        host = int(180_000 * (0.8 + 0.4 * st.rng.random())) + st.stall_ns
        prog.append(Op(HOST, 0, "", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, host, tid,
                       meta=st.stall_ns))
        w = self.job.work
        nbytes = w.micro_batch * w.seq * 8 * max(1, w.microbatches)
        op = Op(MEMCPY, STREAM_COMPUTE, "Memcpy HtoD (Pinned -> Device)", "aten::to", int(nbytes / 25e9 * 1e9) + 2_000,
                self._host_ns(st, 30.0), tid, meta=nbytes, cls="memcpy")
        prog.append(op)

    def _step_tail(self, st: RankState, prog: list[Op], tid: int) -> None:
        prog.append(Op(SYNC, 0, "cudaDeviceSynchronize", "aten::item", 0, self._host_ns(st, 20.0), tid))

    def build_step(self, st: RankState, step: int) -> list[Op]:
        prog: list[Op] = []
        tid = st.pid
        if self.job.item_syncs:
            self._sync_loop_step(st, prog, step)
            return prog
        self._step_head(st, prog, tid)
        if self.topo.pp == 1 and self.job.dp_mode == "fsdp":
            self._fsdp_step(st, prog, step)
        elif self.topo.pp == 1:
            self._ddp_step(st, prog, step)
        elif self.job.p2p_batched:
            self._pipeline_step_batched(st, prog, step)
        else:
            self._pipeline_step(st, prog, step)
        self._step_tail(st, prog, tid)
        return prog

    def _sync_loop_step(self, st: RankState, prog: list[Op], step: int) -> None:
        """``item_syncs`` rounds of: the forward layers, ``.item()`` on its result (a 4-byte device-to-host copy
        and a stream synchronize: the host waits until the GPU has drained), then host work of
        ``host_after_sync_us`` with nothing queued on the GPU (e.g. a Python decode loop reading each token)."""
        for _ in range(self.job.item_syncs):
            for _ in range(self.job.work.layers):
                self._layer_fwd(st, prog, st.compute_scale, st.pid, step)
            prog.append(Op(MEMCPY, STREAM_COMPUTE, "Memcpy DtoH (Device -> Pageable)", "aten::_local_scalar_dense",
                           2_500,
                           self._host_ns(st, 12.0), st.pid, meta=4, cls="memcpy"))
            prog.append(Op(SYNC, 0, "cudaStreamSynchronize", "aten::item", 0, self._host_ns(st, 8.0), st.pid))
            host = int(self.job.host_after_sync_us * 1e3 * (0.9 + 0.2 * st.rng.random()))
            prog.append(Op(HOST, 0, "", "postprocess", 0, host, st.pid))

    def _ddp_step(self, st: RankState, prog: list[Op], step: int) -> None:
        w = self.job.work
        scale = st.compute_scale
        for _ in range(w.layers):
            self._layer_fwd(st, prog, scale, st.pid, step)
        self._kernel(st, prog, CE_FWD, "aten::_log_softmax", self._mem_ns(w.micro_batch * w.seq * 32000 * 4, st, scale),
                     st.pid, w.micro_batch * w.seq // 4, 128)
        ready = [self._layer_bwd(st, prog, scale, st.bwd_tid, step) for _ in range(w.layers)]
        buckets = self._dp_buckets(st, prog, ready, step, st.bwd_tid)
        self._optimizer(st, prog, buckets, st.pid)

    def _fsdp_step(self, st: RankState, prog: list[Op], step: int) -> None:
        """FSDP (FULL_SHARD): each layer's parameters are all-gathered before use (prefetched one layer
        ahead on their own stream) in forward and again in backward; gradients are reduce-scattered
        on another stream right after each layer's backward (HSDP: within the shard group, then the
        shard is all-reduced across the replicate group)."""
        w = self.job.work
        scale = st.compute_scale
        dpg = group_of(self.groups, st.rank, "dp")
        rep = group_of(self.groups, st.rank, "dp_rep")
        full = w.layer_params(self.topo.tp) * w.grad_bytes
        n = w.layers

        def gather(tid: int) -> Op | None:
            return self._coll(st, prog, "allgather", dpg, full, STREAM_DP, tid, step) if dpg is not None else None

        ag = gather(st.pid)
        for i in range(n):
            nxt = gather(st.pid) if i + 1 < n else None  # prefetch the next layer while this one computes
            start = len(prog)
            self._layer_fwd(st, prog, scale, st.pid, step)
            if ag is not None:
                prog[start].deps = (ag,)
            ag = nxt
        self._kernel(st, prog, CE_FWD, "aten::_log_softmax", self._mem_ns(w.micro_batch * w.seq * 32000 * 4, st, scale),
                     st.pid, w.micro_batch * w.seq // 4, 128)
        rs: list[Op] = []
        ag = gather(st.bwd_tid)
        for i in range(n):
            nxt = gather(st.bwd_tid) if i + 1 < n else None
            start = len(prog)
            last = self._layer_bwd(st, prog, scale, st.bwd_tid, step)
            if ag is not None:
                prog[start].deps = (ag,)
            if dpg is not None:
                rs.append(self._coll(st, prog, "reduce_scatter", dpg, full, STREAM_RS, st.bwd_tid, step, deps=(last,)))
            if rep is not None:  # HSDP: the gradient shard is all-reduced across the replicas
                rs.append(self._coll(st, prog, "allreduce", rep, full // self.job.shard, STREAM_RS, st.bwd_tid, step,
                                     deps=(rs[-1],)))
            ag = nxt
        self._optimizer(st, prog, rs, st.pid)

    # ---------------------------------------------------------------- pipeline
    def pipeline_order(self, stage: int) -> list[tuple[str, int, int]]:
        """Megatron's 1F1B (v=1) or interleaved (v>1) order of (F|B, micro-batch, chunk) on one stage."""
        p, m, v = self.topo.pp, self.job.work.microbatches, max(1, self.job.chunks)
        if v == 1:
            warm = min(p - stage - 1, m)
            order: list[tuple[str, int, int]] = [("F", i, 0) for i in range(warm)]
            f, b = warm, 0
            while f < m:
                order.append(("F", f, 0))
                f += 1
                order.append(("B", b, 0))
                b += 1
            order += [("B", i, 0) for i in range(b, m)]
            return order
        total = m * v

        def fwd_id(k: int) -> tuple[int, int]:
            chunk = (k // p) % v
            mb = (k // (p * v)) * p + k % p
            return mb, chunk

        def bwd_id(k: int) -> tuple[int, int]:
            mb, chunk = fwd_id(k)
            return mb, v - 1 - chunk

        warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
        order = [("F", *fwd_id(k)) for k in range(warm)]
        f, b = warm, 0
        while f < total:
            order.append(("F", *fwd_id(f)))
            f += 1
            order.append(("B", *bwd_id(b)))
            b += 1
        order += [("B", *bwd_id(k)) for k in range(b, total)]
        return order

    def _pipeline_step(self, st: RankState, prog: list[Op], step: int) -> None:
        w = self.job.work
        tp_r, dp_r, stage = self.topo.coords(st.rank)
        p, v = self.topo.pp, max(1, self.job.chunks)
        ppg = group_of(self.groups, st.rank, "pp")
        assert ppg is not None
        prev_rank = self.topo.rank_of(tp_r, dp_r, (stage - 1) % p)
        next_rank = self.topo.rank_of(tp_r, dp_r, (stage + 1) % p)
        scale = st.compute_scale * self.stage_scale[stage]
        act = w.micro_batch * w.seq * w.hidden * 2 // self.topo.tp
        last_bwd: list[Op] = []
        for kind, mb, chunk in self.pipeline_order(stage):
            # the virtual stage: chunk c on stage s is model stage c*p + s
            vstage = chunk * p + stage
            first, last = vstage == 0, vstage == p * v - 1
            if kind == "F":
                recv_from = None if first else prev_rank
                self._pp_forward(st, prog, step, ppg, act, scale, (mb, vstage, last), recv_from, next_rank)
            else:
                recv_from = None if last else next_rank
                last_bwd.append(self._pp_backward(st, prog, step, ppg, act, scale, (mb, vstage, first), recv_from,
                                                  prev_rank))
        # gradients are reduced after the flush (Megatron without overlap_grad_reduce)
        buckets = self._dp_buckets(st, prog, [last_bwd[-1]] * (w.layers * v), step, st.pid)
        self._optimizer(st, prog, buckets, st.pid)

    def _pipeline_step_batched(self, st: RankState, prog: list[Op], step: int) -> None:
        """Megatron 1F1B (v=1) with batched P2P: in the steady state ``send_forward_recv_backward`` and
        ``send_backward_recv_forward`` are one batch_isend_irecv each, i.e. one SendRecv kernel per exchange
        (the kernel carries the receive's metadata, the send rides along); warm-up and cool-down transfers
        are single kernels."""
        b = _Batched(self, st, prog, step)
        p, m, s = self.topo.pp, self.job.work.microbatches, b.s
        first, last = s == 0, s == p - 1
        warm = min(p - s - 1, m)
        for i in range(warm):
            b.compute("F", None if first else b.p2p("recv", "F", i))
            if not last:
                b.p2p("send", "F", i)
        pending = b.p2p("recv", "F", warm) if m > warm and not first else None
        for i in range(m - warm):
            b.compute("F", pending)
            b.compute("B", None if last else b.batched("F", warm + i, "B", i))
            pending = None
            if not first and i == m - warm - 1:
                b.p2p("send", "B", i)
            elif not first:
                pending = b.batched("B", i, "F", warm + i + 1)
        for i in range(m - warm, m):
            b.compute("B", None if last else b.p2p("recv", "B", i))
            if not first:
                b.p2p("send", "B", i)
        buckets = self._dp_buckets(st, prog, [b.last_bwd[-1]] * self.job.work.layers, step, st.pid)
        self._optimizer(st, prog, buckets, st.pid)

    def _pp_forward(self, st: RankState, prog: list[Op], step: int, ppg: ProcessGroup, act: int, scale: float,
                    where: tuple[int, int, bool], recv_from: int | None, send_to: int) -> None:
        """One micro-batch forward of one virtual stage: receive activations (unless first), the layers,
        the loss on the last stage, send activations on (unless last). ``where``: (micro-batch, vstage, last)."""
        w = self.job.work
        mb, vstage, last = where
        deps: tuple[Op, ...] = ()
        if recv_from is not None:
            deps = (self._coll(st, prog, "recv", ppg, act, STREAM_RECV, st.pid, step, peer=recv_from,
                               p2p_index=hash_idx("F", step, mb, vstage - 1)),)
        start_len = len(prog)
        for _ in range(w.layers):
            self._layer_fwd(st, prog, scale, st.pid, step)
        if deps:
            prog[start_len].deps = deps
        if last and w.loss_kernel:
            self._kernel(st, prog, CE_FWD, "aten::_log_softmax",
                         self._mem_ns(w.micro_batch * w.seq * 32000 * 4 / self.topo.tp, st, scale), st.pid,
                         w.micro_batch * w.seq // 4, 128)
        if not last:
            self._coll(st, prog, "send", ppg, act, STREAM_SEND, st.pid, step, deps=(prog[-1],), peer=send_to,
                       p2p_index=hash_idx("F", step, mb, vstage))

    def _pp_backward(self, st: RankState, prog: list[Op], step: int, ppg: ProcessGroup, act: int, scale: float,
                     where: tuple[int, int, bool], recv_from: int | None, send_to: int) -> Op:
        """One micro-batch backward of one virtual stage; returns its last layer's backward kernel.
        ``where``: (micro-batch, vstage, first)."""
        w = self.job.work
        mb, vstage, first = where
        deps: tuple[Op, ...] = ()
        if recv_from is not None:
            deps = (self._coll(st, prog, "recv", ppg, act, STREAM_RECV, st.pid, step, peer=recv_from,
                               p2p_index=hash_idx("B", step, mb, vstage + 1)),)
        start_len = len(prog)
        for _ in range(w.layers):
            lb = self._layer_bwd(st, prog, scale, st.pid, step)
        if deps:
            prog[start_len].deps = deps
        if not first:
            self._coll(st, prog, "send", ppg, act, STREAM_SEND, st.pid, step, deps=(prog[-1],), peer=send_to,
                       p2p_index=hash_idx("B", step, mb, vstage))
        return lb

    # ---------------------------------------------------------------- resolution
    def _try(self, st: RankState, op: Op) -> bool:
        """Place ``op`` in time if everything it waits for has ended; False when it must wait."""
        if op.kind == HOST:
            op.cpu_start = st.host_t
            st.host_t += op.host_ns
            return True
        if op.kind == SYNC:
            return self._try_sync(st, op)
        ready = _ready_time(st, op)
        if ready is None:
            return False
        op.cpu_start = st.host_t
        op.launch = st.host_t + op.host_ns // 3
        op.start = max(op.launch + LAUNCH_LATENCY_NS, ready + KERNEL_GAP_NS)
        st.host_t += op.host_ns
        st.last[op.stream] = op
        c = op.coll
        if c is None:
            op.end = op.start + op.dur
            return True
        c.arrive[st.rank] = op.start
        _arrive_send(op, st.rank)
        if op.name == "send":
            # a send does not wait for the receiver's stream (NCCL buffers it); the receive ends at
            # max(send start, receive start) + transfer. Blocking sends on one stream would deadlock
            # the interleaved schedule, which Megatron avoids with batched isend/irecv.
            op.end = op.start + c.t_tx
        if c.timeout:
            op.end = op.launch + int(self.timeout_spec["timeout_ms"] * 1e6) if self.timeout_spec else op.start
        elif len(c.arrive) == len(c.members):
            c.end = max(c.arrive.values()) + c.t_tx
        return True

    @staticmethod
    def _try_sync(st: RankState, op: Op) -> bool:
        """A device synchronize: ends after every stream's last op."""
        ends = []
        for o in st.last.values():
            e = _end_of(o)
            if e is None:
                return False
            ends.append(e)
        op.cpu_start = st.host_t
        op.launch = st.host_t + op.host_ns // 3
        op.start = op.launch
        hang = op.meta if isinstance(op.meta, int) else 0  # a device that never answers (lost GPU)
        op.end = max([op.launch + 2_000, *[e + 1_500 for e in ends]]) + hang
        st.host_t = op.end + op.host_ns // 2
        return True

    def run_step(self, step: int) -> StepResult:
        programs: dict[int, list[Op]] = {}
        spans: dict[int, tuple[int, int]] = {}
        active = [st for st in self.states if not st.stopped]
        for st in active:
            programs[st.rank] = self.build_step(st, step)
            spans[st.rank] = (st.host_t, 0)
        new_colls = [c for c in self.colls.values() if c.step == step]
        self._apply_timeout(step, programs, new_colls)
        ptr = {st.rank: 0 for st in active}
        pending = list(active)
        while pending:
            progressed = False
            still = []
            for st in pending:
                prog = programs[st.rank]
                i = ptr[st.rank]
                while i < len(prog) and self._try(st, prog[i]):
                    i += 1
                    progressed = True
                ptr[st.rank] = i
                if i < len(prog):
                    still.append(st)
            pending = still
            if pending and not progressed:
                stuck = ", ".join(f"rank {st.rank} at op {ptr[st.rank]}" for st in pending[:4])
                raise DeadlockError(f"simulation deadlock in step {step}: {stuck}")
        for st in active:
            prog = programs[st.rank]
            for op in prog:
                _end_of(op)
            spans[st.rank] = (spans[st.rank][0], st.host_t)
        for c in new_colls:
            self.colls.pop(c.key, None)
        return StepResult(step, programs, spans, new_colls)

    def _apply_timeout(self, step: int, programs: dict[int, list[Op]], colls: list[Coll]) -> None:
        spec = self.timeout_spec
        if spec is None or spec.get("step") != step:
            return
        # the data-parallel collectives of that step (all-reduce for DDP, all-gather / reduce-scatter for FSDP)
        cands = [c for c in colls if c.op not in ("send", "recv") and c.pg.kind in ("dp", "dp_rep", "world")]
        if not cands:
            raise ScenarioError(f"no data-parallel collective in step {step} to time out")
        target = next((c for c in cands if c.seq == spec["seq"]), cands[0])
        spec["seq"] = target.seq
        target.timeout = True
        target.absent = tuple(spec["ranks"])
        spec["pg_name"], spec["pg_desc"], spec["nelems"] = target.pg.name, target.pg.desc, target.nelems
        for r, prog in programs.items():
            idx = next(i for i, op in enumerate(prog) if op.coll is target)
            if r in target.absent:
                # the late rank is stuck on the host before it ever launches the collective
                cut = idx
                while cut > 0 and prog[cut - 1].kind != COMPUTE:
                    cut -= 1
                del prog[cut:]
                hang = spec.get("host_hang_ms", 0.0)
                if hang:
                    # its host reads a scalar from the lost GPU (.item()) and blocks until the driver gives up
                    prog.append(Op(SYNC, 0, "cudaStreamSynchronize", "aten::item", 0, 20_000, self.states[r].pid,
                                   meta=int(hang * 1e6)))
            else:
                # the process aborts after the watchdog fires; nothing after the collective runs
                del prog[idx + 1:]
            self.states[r].stopped = True
        self.halted = True


def _arrive_send(op: Op, rank: int) -> None:
    """The send half of a batched exchange arrives with its kernel."""
    c = op.send
    if c is None:
        return
    c.arrive[rank] = op.start
    if len(c.arrive) == len(c.members):
        c.end = max(c.arrive.values()) + c.t_tx


class _Batched:
    """One rank's step program under :meth:`Engine._pipeline_step_batched`: its transfers and compute."""

    def __init__(self, eng: Engine, st: RankState, prog: list[Op], step: int) -> None:
        self.eng, self.st, self.prog, self.step = eng, st, prog, step
        topo, w = eng.topo, eng.job.work
        tp_r, dp_r, self.s = topo.coords(st.rank)
        self.prev = topo.rank_of(tp_r, dp_r, (self.s - 1) % topo.pp)
        self.next = topo.rank_of(tp_r, dp_r, (self.s + 1) % topo.pp)
        ppg = group_of(eng.groups, st.rank, "pp")
        assert ppg is not None
        self.ppg = ppg
        self.scale = st.compute_scale * eng.stage_scale[self.s]
        self.act = w.micro_batch * w.seq * w.hidden * 2 // topo.tp
        self.last_bwd: list[Op] = []

    def p2p(self, name: str, kind: str, mb: int) -> Op:
        """A single send (of this stage's output, after the last kernel) or receive (from the neighbour)."""
        peer = self.next if (name == "send") == (kind == "F") else self.prev
        src = self.s if name == "send" else self.s + (1 if kind == "B" else -1)
        deps = (self.prog[-1],) if name == "send" else ()
        return self.eng._coll(self.st, self.prog, name, self.ppg, self.act,
                              STREAM_SEND if name == "send" else STREAM_RECV,
                              self.st.pid, self.step, deps=deps, peer=peer,
                              p2p_index=hash_idx(kind, self.step, mb, src))

    def batched(self, send_kind: str, send_mb: int, recv_kind: str, recv_mb: int) -> Op:
        """One kernel for a send and a receive (batch_isend_irecv); labelled as the receive."""
        snd = self.p2p("send", send_kind, send_mb)
        self.prog.pop()
        rcv = self.p2p("recv", recv_kind, recv_mb)
        rcv.deps, rcv.send = snd.deps, snd.coll
        return rcv

    def compute(self, kind: str, dep: Op | None) -> None:
        eng, st, prog, w = self.eng, self.st, self.prog, self.eng.job.work
        start = len(prog)
        for _ in range(w.layers):
            if kind == "F":
                eng._layer_fwd(st, prog, self.scale, st.pid, self.step)
            else:
                self.last_bwd.append(eng._layer_bwd(st, prog, self.scale, st.pid, self.step))
        if dep is not None:
            prog[start].deps = (dep,)
        if kind == "F" and self.s == eng.topo.pp - 1 and w.loss_kernel:
            eng._kernel(st, prog, CE_FWD, "aten::_log_softmax",
                        eng._mem_ns(w.micro_batch * w.seq * 32000 * 4 / eng.topo.tp, st, self.scale),
                        st.pid, w.micro_batch * w.seq // 4, 128)


def hash_idx(kind: str, step: int, mb: int, src_vstage: int) -> int:
    """Identity of one activation/gradient transfer: direction, step, micro-batch, sending virtual stage."""
    return ((step * 4096 + mb) * 1024 + src_vstage) * 2 + (kind == "B")


def iter_steps(engine: Engine) -> Iterator[StepResult]:
    for k in range(engine.job.steps):
        if engine.halted:
            return
        yield engine.run_step(engine.job.first_step + k)
