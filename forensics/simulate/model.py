"""Job description: topology, process groups, the FLOP model of a transformer layer and the NCCL cost model.

Pure data and arithmetic; no randomness here (noise is drawn in ``engine``)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

GPUS_PER_NODE = 8
# DGX/HGX H100 PCI bus ids of the eight GPUs (domain:bus:device.function).
PCI_BUS_IDS = (
    "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
    "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0",
)


@dataclass(frozen=True)
class GPU:
    name: str = "NVIDIA H100 80GB HBM3"
    num_sms: int = 132
    peak_tflops: float = 989.0  # dense bf16
    hbm_gbs: float = 3350.0
    mem_bytes: int = 85520809984
    compute_major: int = 9
    compute_minor: int = 0


@dataclass(frozen=True)
class Net:
    """Link model. Bandwidths in GB/s per GPU; latencies in microseconds."""

    intra: str = "P2P"          # P2P (NVLink) or SHM (P2P disabled)
    inter: str = "IB"           # IB or Socket
    gdr: bool = True
    nvlink_gbs: float = 370.0
    shm_gbs: float = 22.0
    ib_gbs: float = 45.0        # one 400 Gb/s NIC per GPU, achievable
    socket_gbs: float = 2.8
    nogdr_factor: float = 0.55  # staging through host memory
    slow_nodes: tuple[tuple[int, float], ...] = ()  # (node, bandwidth factor): every NIC of the node degraded
    slow_nics: tuple[tuple[int, int, float], ...] = ()  # (node, NIC = local GPU index, bandwidth factor): one rail

    def bandwidth(self, nodes: set[int], rails: frozenset[tuple[int, int]] = frozenset()) -> float:
        """Per-GPU bandwidth of a transfer among ``nodes``; ``rails``: the (node, local GPU) of its members,
        whose NICs carry it (one NIC per GPU)."""
        if len(nodes) <= 1:
            return self.nvlink_gbs if self.intra == "P2P" else self.shm_gbs
        bw = self.ib_gbs if self.inter == "IB" else self.socket_gbs
        if self.inter == "IB" and not self.gdr:
            bw *= self.nogdr_factor
        slow = [f for n, f in self.slow_nodes if n in nodes] + [f for n, k, f in self.slow_nics if (n, k) in rails]
        if slow:
            bw *= min(slow)
        intra = self.nvlink_gbs if self.intra == "P2P" else self.shm_gbs
        return min(bw, intra)

    def hop_latency_us(self, nodes: set[int]) -> float:
        if len(nodes) <= 1:
            return 0.6 if self.intra == "P2P" else 1.8
        base = 2.5 if self.inter == "IB" else 18.0
        return base if self.gdr or self.inter != "IB" else base + 1.5


ALGOS = ("Tree", "Ring")
PROTOS = ("LL", "LL128", "Simple")
# Fraction of link bandwidth each protocol delivers, and its per-hop latency (us).
PROTO_BW = {"LL": 0.45, "LL128": 0.9, "Simple": 1.0}
PROTO_LAT = {"LL": 1.0, "LL128": 1.6, "Simple": 4.0}
ALGO_BASE_LAT = {"Tree": 8.0, "Ring": 7.0}


def collective_time_ns(coll: str, nbytes: int, n: int, nodes: set[int], net: Net, algo: str, proto: str,
                       rails: frozenset[tuple[int, int]] = frozenset()) -> int:
    """Transfer time of one collective once every rank has arrived: latency term + bandwidth term."""
    if n <= 1:
        return 2_000
    bw = net.bandwidth(nodes, rails) * PROTO_BW[proto] * 1e3  # bytes per us
    hop = net.hop_latency_us(nodes) + PROTO_LAT[proto]
    if coll in ("send", "recv"):
        return int((ALGO_BASE_LAT["Ring"] + hop + nbytes / bw) * 1e3)
    if coll == "allreduce":
        if algo == "Ring":
            steps, factor = 2 * (n - 1), 2 * (n - 1) / n
        else:  # double binary tree: log depth, but only half the ring's bandwidth on big messages
            steps, factor = 2 * max(1, math.ceil(math.log2(n))), 2.0 * (1.0 + 0.25 * (len(nodes) > 1))
    else:  # allgather / reduce_scatter / broadcast: ring only
        steps, factor = n - 1, (n - 1) / n
    return int((ALGO_BASE_LAT[algo] + steps * hop + nbytes * factor / bw) * 1e3)


def choose_algo(coll: str, nbytes: int, n: int, nodes: set[int], net: Net, algos: tuple[str, ...],
                protos: tuple[str, ...],
                rails: frozenset[tuple[int, int]] = frozenset()) -> tuple[str, str, int]:
    """NCCL picks the (algorithm, protocol) with the least predicted time among those allowed."""
    if coll not in ("allreduce",):
        algos = ("Ring",)
    best: tuple[int, str, str] | None = None
    for a in algos:
        for p in protos:
            t = collective_time_ns(coll, nbytes, n, nodes, net, a, p, rails)
            if best is None or t < best[0]:
                best = (t, a, p)
    assert best is not None
    return best[1], best[2], best[0]


@dataclass(frozen=True)
class Workload:
    """A GPT-like transformer. One "step" is one optimizer step over ``microbatches`` micro-batches."""

    layers: int = 12             # layers per pipeline stage (per model chunk when interleaved)
    hidden: int = 1024
    seq: int = 4096
    micro_batch: int = 8
    microbatches: int = 1        # m
    ffn_mult: int = 4
    gemm_eff: float = 0.62
    attn_eff: float = 0.45
    bucket_mb: float = 25.0      # DDP bucket cap
    grad_bytes: int = 2          # bf16 grads
    loss_kernel: bool = True     # the last pipeline stage computes the loss (makes it slightly longer)
    optimizer: bool = True       # run the optimizer step (fused Adam) at the end of each step

    def layer_params(self, tp: int) -> int:
        h = self.hidden
        return (4 * h * h + 2 * self.ffn_mult * h * h) // tp + 4 * h


@dataclass(frozen=True)
class Topology:
    tp: int = 1
    pp: int = 1
    dp: int = 8
    gpus_per_node: int = GPUS_PER_NODE

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.world / self.gpus_per_node))

    # Megatron order tp-dp-pp: tp fastest.
    def coords(self, rank: int) -> tuple[int, int, int]:
        tp_rank = rank % self.tp
        dp_rank = (rank // self.tp) % self.dp
        pp_rank = rank // (self.tp * self.dp)
        return tp_rank, dp_rank, pp_rank

    def rank_of(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.gpus_per_node


@dataclass(frozen=True)
class ProcessGroup:
    name: str          # "0", "1", ... (torch assigns them in creation order, same on every rank)
    desc: str          # default_pg, TENSOR_MODEL_PARALLEL_GROUP, ...
    ranks: tuple[int, ...]
    kind: str          # world / tp / dp / pp

    @functools.cached_property
    def ranks_text(self) -> str:
        """The ranks as a trace's "Process Group Ranks" spells them; cached, as every collective of every
        member writes it and thousands of ranks are long to spell."""
        return "[" + ", ".join(str(r) for r in self.ranks) + "]"

    @functools.cached_property
    def start_stride(self) -> tuple[int, int]:
        """The group's first rank and the stride between its ranks (-1: not evenly spaced), as the trace's
        ``record_param_comms`` says; cached for the same reason as :attr:`ranks_text`."""
        return start_stride(self.ranks)

    def pg_config(self) -> dict[str, Any]:
        return {"pg_name": self.name, "pg_desc": self.desc, "backend_config": "cuda:nccl", "pg_size": len(self.ranks),
                "ranks": list(self.ranks)}


def start_stride(ranks: tuple[int, ...]) -> tuple[int, int]:
    """First rank and the stride between consecutive ranks (-1 when they are not evenly spaced)."""
    stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    if any(b - a != stride for a, b in zip(ranks, ranks[1:])):
        stride = -1
    return ranks[0], stride


def build_groups(topo: Topology) -> list[ProcessGroup]:
    """Megatron-Core creates its groups in this order: data-parallel, tensor, pipeline."""
    groups = [ProcessGroup("0", "default_pg", tuple(range(topo.world)), "world")]
    idx = 1
    if topo.dp > 1 and topo.world > topo.dp:
        for pp_r in range(topo.pp):
            for tp_r in range(topo.tp):
                ranks = tuple(topo.rank_of(tp_r, d, pp_r) for d in range(topo.dp))
                groups.append(ProcessGroup(str(idx), "DATA_PARALLEL_GROUP", ranks, "dp"))
                idx += 1
    if topo.tp > 1:
        for pp_r in range(topo.pp):
            for d in range(topo.dp):
                ranks = tuple(topo.rank_of(t, d, pp_r) for t in range(topo.tp))
                groups.append(ProcessGroup(str(idx), "TENSOR_MODEL_PARALLEL_GROUP", ranks, "tp"))
                idx += 1
    if topo.pp > 1:
        for d in range(topo.dp):
            for t in range(topo.tp):
                ranks = tuple(topo.rank_of(t, d, p) for p in range(topo.pp))
                groups.append(ProcessGroup(str(idx), "PIPELINE_MODEL_PARALLEL_GROUP", ranks, "pp"))
                idx += 1
    return groups


def hsdp_groups(topo: Topology, shard: int) -> list[ProcessGroup]:
    """HSDP (pure data parallel, torch's 2-D device mesh): the world, shard groups of ``shard`` consecutive
    ranks, then replicate groups of the ranks with the same index in each shard group; [] unless there
    are several shard groups."""
    n = topo.dp
    if not shard or topo.tp != 1 or topo.pp != 1 or n <= shard:
        return []
    groups = [ProcessGroup("0", "default_pg", tuple(range(topo.world)), "world")]
    groups += [ProcessGroup(str(1 + s), "dp_shard", tuple(range(s * shard, (s + 1) * shard)),
                            "dp") for s in range(n // shard)]
    return groups + [ProcessGroup(str(1 + n // shard + i), "dp_replicate", tuple(range(i, n, shard)), "dp_rep")
                     for i in range(shard)]


def fsdp2_groups(topo: Topology) -> list[ProcessGroup]:
    """FSDP2 over a 1-D device mesh: the world, then the mesh's shard group (all ranks, its own communicator)."""
    if topo.tp != 1 or topo.pp != 1 or topo.dp < 2:
        return []
    return [ProcessGroup("0", "default_pg", tuple(range(topo.world)), "world"),
            ProcessGroup("1", "mesh_dp_shard", tuple(range(topo.world)), "dp")]


def group_of(groups: list[ProcessGroup], rank: int, kind: str) -> ProcessGroup | None:
    """The rank's group of that kind; the DP group is the world group for pure data parallelism."""
    for g in groups:
        if g.kind == kind and rank in g.ranks:
            return g
    if kind == "dp":
        world = groups[0]
        if len(world.ranks) > 1 and not any(g.kind in ("tp", "pp") for g in groups):
            return world
    return None


@dataclass(frozen=True)
class Job:
    """Everything the engine needs to know about the job, faults included."""

    topo: Topology = Topology()
    work: Workload = Workload()
    gpu: GPU = GPU()
    net: Net = Net()
    schedule: str = "1f1b"          # 1f1b or interleaved (pipeline only)
    chunks: int = 1                 # v, model chunks per stage (interleaved)
    p2p_batched: bool = False       # Megatron batch_isend_irecv: one SendRecv kernel per send+recv exchange (1F1B, v=1)
    p2p_coalesced: bool = False     # every PP transfer kernel labelled as PyTorch's coalescing manager does
                                    # (`nccl:coalesced`, Collective name "coalesced", no Src/Dst Rank)
    steps: int = 4
    first_step: int = 100           # ProfilerStep# of the first profiled step
    noise: float = 0.02             # lognormal sigma of compute kernel durations
    nccl_version: str = "2.21.5"
    cuda_version: str = "12.4"
    algos: tuple[str, ...] = ALGOS
    protos: tuple[str, ...] = PROTOS
    env: tuple[tuple[str, str], ...] = ()   # NCCL env overrides echoed in the logs
    overlap_dp: bool = True
    window_skew: int = 0             # odd ranks open their profiler window this many steps late
    dp_mode: str = "ddp"             # ddp (bucketed all-reduce) or fsdp (all-gather + reduce-scatter per layer)
    shard: int = 0                   # fsdp only: HSDP shard group size (0: shard over every DP rank)
    seq_on_kernels: bool = True
    clock_offset_us: float = 1500.0  # per-node clock offsets drawn within +- this
    host_op_us: float = 14.0         # host cost of one aten op with its kernel launch
    tuning_lines: bool = False
    faults: tuple[dict[str, Any], ...] = ()
    stage_scale: tuple[float, ...] = ()  # per pipeline stage compute multiplier (stage imbalance)
    profiler_steps: bool = True      # False: the traces hold no ProfilerStep# ranges (a bare profiler capture)
    # > 0: each step is this many (forward, .item(), host work) rounds instead of training
    item_syncs: int = 0
    host_after_sync_us: float = 0.0  # ... and the host's work after each .item(), while nothing is queued on the GPU
    cuda_graphs: str = ""            # "" eager; "replay": each step's compute kernels replay from one CUDA graph
                                     # (one cudaGraphLaunch under CUDAGraph::replay); "capture": the same, and the
                                     # first profiled step also captures the graph (its launches run nothing)
    fsdp2: bool = False              # dp_mode=fsdp written as FSDP2 over a device mesh: all_gather_into_tensor /
                                     # reduce_scatter_tensor on its own "mesh_dp_shard" group
    symm_tp: bool = False            # TP all-reduces through PyTorch symmetric memory (symm_mem::two_shot_all_reduce_,
                                     # no NCCL), as vLLM and async-TP jobs run them
    tp_overlap: bool = False         # sequence-parallel TP with comm-GEMM overlap (TransformerEngine userbuffers, the
                                     # shape of async TP): each TP all-reduce becomes an all-gather before a column-
                                     # parallel GEMM and a reduce-scatter after a row-parallel one, each on a side
                                     # stream under a GEMM (chunk)
    async_tp: str = ""               # with tp_overlap, written as PyTorch's async TP instead of userbuffers:
                                     # "overlap": symm_mem::fused_* ops whose peer copies (Memcpy DtoD) run on the
                                     # backend stream beside the GEMM chunk; "serialized": each copy starts only
                                     # after that GEMM chunk (nothing hides it)
    compiled: bool = False           # torch.compile: Triton kernels (GEMMs as mm templates with their shapes) launched
                                     # inside CompiledFunction / CompiledFunctionBackward regions
    label: str = ""

    def with_(self, **kw: Any) -> Job:
        return replace(self, **kw)

    @property
    def new_kernel_names(self) -> bool:
        major, minor = (int(x) for x in self.nccl_version.split(".")[:2])
        return (major, minor) >= (2, 19)

