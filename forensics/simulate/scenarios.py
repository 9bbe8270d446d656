"""Named scenarios: a clean job, or one with exactly one injected fault, and what the truth should say."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from forensics.simulate.model import ALGOS, GPUS_PER_NODE, PROTOS, Job, Net, Topology, Workload


class ScenarioError(ValueError):
    """A scenario parameter that cannot work (the CLI reports it as a usage error)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    build: Callable[[int | None, int | None, Params], Job]
    # benign / nic_replug / xid79 / xid48 / xid94 / xid149 / xid63 / aer_audio / rm_init / throttle / link_flap / oom
    kernel_log: str = "benign"


class Params:
    """The ``--param KEY=VALUE`` strings of one run, read through typed, range-checked accessors.

    It remembers every key a scenario asked for, so a key that the scenario never reads is reported
    as unknown (with the keys it does read) instead of being silently ignored.
    """

    def __init__(self, raw: Mapping[str, str], asked: set[str] | None = None) -> None:
        self.raw = dict(raw)
        self.asked: set[str] = set() if asked is None else asked

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        self.asked.add(key)
        value = self.raw.get(key, default)
        if value not in choices:
            raise ScenarioError(f"--param {key}={value!r}: expected one of {', '.join(choices)}")
        return value

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        self.asked.add(key)
        if key not in self.raw:
            return default
        try:
            value = int(self.raw[key])
        except ValueError:
            raise ScenarioError(f"--param {key}={self.raw[key]!r}: expected an integer in {low}..{high}") from None
        if not low <= value <= high:
            raise ScenarioError(f"--param {key}={value}: outside the valid range {low}..{high}")
        return value

    def number(self, key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
        self.asked.add(key)
        if key not in self.raw:
            return default
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        try:
            value = float(self.raw[key])
        except ValueError:
            raise ScenarioError(f"--param {key}={self.raw[key]!r}: expected a number in {bounds}") from None
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
            raise ScenarioError(f"--param {key}={self.raw[key]}: outside the valid range {bounds}")
        return value

    def flag(self, key: str, default: int) -> bool:
        return bool(self.integer(key, default, 0, 1))

    def with_defaults(self, **defaults: str) -> Params:
        """The same parameters with ``defaults`` for keys not given (keys asked stay shared)."""
        return Params({**defaults, **self.raw}, self.asked)

    def without(self, key: str) -> Params:
        """The same parameters less ``key`` (which the caller reads with its own meaning)."""
        return Params({k: v for k, v in self.raw.items() if k != key}, self.asked)

    def unknown(self) -> list[str]:
        return sorted(set(self.raw) - self.asked)


def _ddp(ranks: int | None, steps: int | None, params: Params, default: int = 8, **job: Any) -> Job:
    n = ranks or default
    mode = params.choice("dp_mode", job.pop("dp_mode", "ddp"), ("ddp", "fsdp"))
    job["dp_mode"] = mode
    graphs = params.choice("cuda_graphs", job.pop("cuda_graphs", "off"), ("off", "replay", "capture"))
    job["cuda_graphs"] = "" if graphs == "off" else graphs
    job["compiled"] = params.flag("compiled", int(job.pop("compiled", False)))
    job["fsdp2"] = params.flag("fsdp2", int(job.pop("fsdp2", False)))
    if job["fsdp2"] and mode != "fsdp":
        raise ScenarioError("--param fsdp2=1 needs dp_mode=fsdp")
    if job["compiled"] and job["cuda_graphs"]:
        raise ScenarioError("--param compiled=1 with cuda_graphs: not simulated together (pick one)")
    layers = params.integer("layers", 12 if n <= 16 else 6, 1, 256)
    work = Workload(layers=layers, hidden=params.integer("hidden", 1024, 8, 65536),
                    seq=params.integer("seq", 4096, 1, 1 << 20),
                    micro_batch=params.integer("micro_batch", 8, 1, 4096))
    return Job(topo=Topology(tp=1, pp=1, dp=n), work=work, steps=steps or 4,
               noise=params.number("noise", 0.02, 0.0, 1.0),
               seq_on_kernels=params.flag("seq_args", 1), window_skew=params.integer("window_skew", 0, 0, 1000), **job)


def _pp(ranks: int | None, steps: int | None, params: Params, m: int = 8, v: int = 1, **job: Any) -> Job:
    n = ranks or 8
    pp = params.integer("pp", 4, 1, n)
    tp = params.integer("tp", 1, 1, n)
    if n % (pp * tp):
        raise ScenarioError(f"--ranks {n} is not a multiple of pp*tp = {pp * tp}")
    m = params.integer("microbatches", m, 1, 1024)
    v = params.integer("chunks", v, 1, 16)
    if v > 1 and m % pp:
        raise ScenarioError(f"interleaved schedule needs microbatches ({m}) divisible by pp ({pp})")
    work = Workload(layers=params.integer("layers", 2 if v == 1 else 1, 1, 256),
                    hidden=params.integer("hidden", 2048, 8, 65536),
                    seq=params.integer("seq", 2048, 1, 1 << 20), micro_batch=params.integer("micro_batch", 2, 1, 4096),
                    microbatches=m,
                    loss_kernel=params.flag("loss_kernel", 1), optimizer=params.flag("optimizer", 1))
    return Job(topo=Topology(tp=tp, pp=pp, dp=n // (pp * tp)), work=work, steps=steps or 3, chunks=v,
               noise=params.number("noise", 0.02, 0.0, 1.0), seq_on_kernels=params.flag("seq_args", 1),
               window_skew=params.integer("window_skew", 0, 0, 1000), schedule="interleaved" if v > 1 else "1f1b",
               **job)


def _multinode(ranks: int | None, default: int, what: str) -> None:
    n = ranks or default
    if n <= 8:
        raise ScenarioError(f"{what} needs traffic between nodes: use --ranks > 8 (8 GPUs per node)")


def _culprit(params: Params, n: int, default: int) -> int:
    return params.integer("rank", default, 0, n - 1)


def ddp_clean(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _ddp(ranks, steps, params, label="clean")


def fsdp_clean(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _ddp(ranks, steps, params, dp_mode="fsdp", label="clean")


def ddp_straggler(ranks: int | None, steps: int | None, params: Params) -> Job:
    n = ranks or 8
    r = _culprit(params, n, 5 if n > 5 else n - 1)
    return _ddp(ranks, steps, params, faults=({"kind": "compute_straggler", "ranks": (r,),
                                               "slowdown": params.number("slowdown", 0.15, 0.0, 10.0)},))


def graph_straggler(ranks: int | None, steps: int | None, params: Params) -> Job:
    n = ranks or 16
    r = _culprit(params, n, 5 if n > 5 else n - 1)
    return _ddp(ranks, steps, params, default=16, cuda_graphs="replay",
                faults=({"kind": "compute_straggler", "ranks": (r,),
                         "slowdown": params.number("slowdown", 0.15, 0.0, 10.0)},))


def graph_capture(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _ddp(ranks, steps, params, cuda_graphs="capture", label="clean")


def fsdp2_prefetch(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _ddp(ranks, steps, params, dp_mode="fsdp", fsdp2=True, label="clean")


def compiled(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _ddp(ranks, steps, params, compiled=True, label="clean")


def host_straggler(ranks: int | None, steps: int | None, params: Params) -> Job:
    n = ranks or 8
    r = _culprit(params, n, 2 if n > 2 else 0)
    return _ddp(ranks, steps, params,
                faults=({"kind": "host_straggler", "ranks": (r,),
                         "launch_factor": params.number("launch_factor", 20.0, 0.0, 1000.0, low_open=True),
                                               "stall_ms": params.number("stall_ms", 0.0, 0.0, 60000.0)},))


def late_rank(ranks: int | None, steps: int | None, params: Params) -> Job:
    n = ranks or 8
    r = _culprit(params, n, 6 if n > 6 else n - 1)
    return _ddp(ranks, steps, params, faults=({"kind": "host_straggler", "ranks": (r,), "launch_factor": 1.0,
                                               "stall_ms": params.number("stall_ms", 40.0, 0.0, 60000.0),
                                               "busy_wait": True},))


def input_bound(ranks: int | None, steps: int | None, params: Params) -> Job:
    """Every rank's data loader stalls at each step start (``stall_ms``, default 60 ms: the GPU idles
    about 40% of each ~90 ms default DDP step)."""
    n = ranks or 8
    stall = params.number("stall_ms", 60.0, 0.0, 1e6)
    return _ddp(ranks, steps, params, faults=({"kind": "input_bound", "ranks": tuple(range(n)), "stall_ms": stall},))


def item_sync(ranks: int | None, steps: int | None, params: Params) -> Job:
    """A single process traced without ProfilerStep ranges (a bare ``torch.profiler`` capture): each round runs
    ``layers`` forward layers (1), reads a scalar with ``.item()`` (device-to-host copy + stream synchronize) and then
    spends ``host_us`` (default 400 us) on the host with nothing queued, ``syncs`` rounds in all (default
    4,097): the GPU idles most of the capture, and the cause is the host's synchronizations."""
    n = ranks or 1
    syncs = params.integer("syncs", 4097, 1, 1 << 20)
    host_us = params.number("host_us", 400.0, 0.0, 1e7)
    work = Workload(layers=params.integer("layers", 1, 1, 256), hidden=params.integer("hidden", 1024, 8, 65536),
                    seq=params.integer("seq", 128, 1, 1 << 20), micro_batch=params.integer("micro_batch", 1, 1, 4096))
    return Job(topo=Topology(tp=1, pp=1, dp=n), work=work, steps=1, noise=params.number("noise", 0.02, 0.0, 1.0),
               profiler_steps=False, item_syncs=syncs, host_after_sync_us=host_us,
               faults=({"kind": "host_sync_idle", "ranks": tuple(range(n)), "syncs": syncs, "host_us": host_us},))


def slow_gemm(ranks: int | None, steps: int | None, params: Params) -> Job:
    """Every rank's GEMM kernels run ``slowdown`` longer (default 0.3 = +30%), as after a library upgrade
    that picks slower GEMM kernels: a slower kernel class on the whole job, not a straggler."""
    slowdown = params.number("slowdown", 0.3, 0.0, 10.0)
    return _ddp(ranks, steps, params,
                faults=({"kind": "slow_kernel_class", "kernel_class": "gemm", "slowdown": slowdown},))


def ddp_no_overlap(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _ddp(ranks, steps, params, default=16, overlap_dp=False, faults=({"kind": "dp_not_overlapped"},))


def slow_nic(ranks: int | None, steps: int | None, params: Params) -> Job:
    """Megatron layout TP=8 (one node) x PP=2 x DP=n/16: each pipeline stage spans n/16 nodes, so the DP
    groups of one stage cross the slow node's NIC and those of the other stage do not, and each PP group
    pairs node k of stage 0 with node k of stage 1. Only the slow node is in every slow group: the
    fault can be localized from the trace, as in a real job (with one flat DP group it cannot).
    ``nic=K`` slows only the node's K-th NIC (the rail of its local GPU K) instead of all of them."""
    n = ranks or 32
    if n < 32 or n % 16:
        raise ScenarioError(f"slow_nic needs --ranks a multiple of 16, at least 32 (TP=8 x PP=2 x DP>=2 over nodes of "
                            f"8 GPUs); got {n}")
    net, fault = _slow_nic_fault(params, n)
    params = params.with_defaults(pp="2", tp="8")
    if (params.raw["pp"], params.raw["tp"]) != ("2", "8"):
        raise ScenarioError("slow_nic fixes its layout: tp=8, pp=2")
    return _pp(n, steps, params, net=net, faults=(fault,))


def _slow_nic_fault(params: Params, n: int) -> tuple[Net, dict[str, Any]]:
    """The network with node ``node``'s NICs (or only its NIC ``nic``) at ``bandwidth_factor``, and the fault."""
    node = params.integer("node", 1, 0, n // 8 - 1)
    factor = params.number("bandwidth_factor", 0.25, 0.0, 1.0, low_open=True)
    nic = params.integer("nic", -1, -1, 7)
    net = Net(slow_nodes=((node, factor),)) if nic < 0 else Net(slow_nics=((node, nic, factor),))
    fault: dict[str, Any] = {"kind": "slow_nic", "nodes": (node,), "bandwidth_factor": factor}
    if nic >= 0:
        fault["nic"] = nic
    return net, fault


def _hsdp(ranks: int | None, steps: int | None, params: Params, **job: Any) -> Job:
    """Hybrid-sharded data parallel (FSDP HYBRID_SHARD): shard groups of ``shard`` ranks, replicated."""
    n = ranks or 32
    shard = params.integer("shard", 16, 2, 4096)
    if n % shard or shard >= n:
        raise ScenarioError(f"HSDP needs --ranks ({n}) a multiple of shard ({shard}) and more than one replica")
    out = _ddp(n, steps, params, dp_mode="fsdp", shard=shard, **job)
    if out.dp_mode != "fsdp":
        raise ScenarioError("HSDP shards parameters: dp_mode must be fsdp")
    return out


def hsdp_clean(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _hsdp(ranks, steps, params, label="clean")


def hsdp_slow_nic(ranks: int | None, steps: int | None, params: Params) -> Job:
    """4 nodes, HSDP with shard groups of 16 ranks (nodes 0+1, 2+3) and 2-rank replicate groups (node k with
    node k+2): every communicator through the slow node is slow, and only that node is in all of them."""
    n = ranks or 32
    if n < 32 or n % 8:
        raise ScenarioError(f"hsdp_slow_nic needs --ranks a multiple of 8, at least 32 (several nodes per shard "
                            f"group); got {n}")
    net, fault = _slow_nic_fault(params, n)
    return _hsdp(n, steps, params, net=net, faults=(fault,))


def net_socket(ranks: int | None, steps: int | None, params: Params) -> Job:
    _multinode(ranks, 16, "net_socket")
    return _ddp(ranks, steps, params, default=16, net=Net(inter="Socket"), env=(("NCCL_IB_DISABLE", "1"),),
                faults=({"kind": "net_socket"},))


def gdr_off(ranks: int | None, steps: int | None, params: Params) -> Job:
    _multinode(ranks, 16, "gdr_off")
    return _ddp(ranks, steps, params, default=16, net=Net(gdr=False), faults=({"kind": "gdr_off"},))


def p2p_disabled(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _ddp(ranks, steps, params, net=Net(intra="SHM"), env=(("NCCL_P2P_DISABLE", "1"),),
                faults=({"kind": "p2p_disabled"},))


def algo_forced(ranks: int | None, steps: int | None, params: Params) -> Job:
    algo = params.choice("algo", "Tree", ALGOS)
    return _ddp(ranks, steps, params, default=16, algos=(algo,), env=(("NCCL_ALGO", algo),), tuning_lines=True,
                faults=({"kind": "nccl_algo_forced", "algo": algo},))


def proto_forced(ranks: int | None, steps: int | None, params: Params) -> Job:
    proto = params.choice("proto", "LL", PROTOS)
    return _ddp(ranks, steps, params, default=16, protos=(proto,), env=(("NCCL_PROTO", proto),), tuning_lines=True,
                faults=({"kind": "nccl_proto_forced", "proto": proto},))


def collective_timeout(ranks: int | None, steps: int | None, params: Params) -> Job:
    n = ranks or 8
    if n < 2:
        raise ScenarioError("a collective timeout needs at least 2 ranks")
    r = _culprit(params, n, 3 if n > 3 else n - 1)
    steps = steps or 3
    # here `seq` names the all-reduce that hangs, not the sequence length of the model
    fault = {"kind": "collective_timeout", "ranks": (r,),
             "step": 100 + params.integer("step_index", steps - 1, 0, steps - 1),
             "seq": params.integer("seq", 0, 0, 1 << 20),
             "timeout_ms": params.number("timeout_ms", 600000.0, 0.0, 1e9, low_open=True)}
    job = _ddp(ranks, steps, params.without("seq"), faults=(fault,))
    return job


def symm_tp(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _pp(ranks, steps, params.with_defaults(tp="2", pp="2"), symm_tp=True, label="clean")


def tp_overlap(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _pp(ranks, steps, params.with_defaults(tp="2", pp="2"), tp_overlap=True, label="clean")


def async_tp(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _pp(ranks, steps, params.with_defaults(tp="2", pp="2"), tp_overlap=True, async_tp="overlap", label="clean")


def async_tp_serialized(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _pp(ranks, steps, params.with_defaults(tp="4", pp="2"), tp_overlap=True, async_tp="serialized",
               faults=({"kind": "async_tp_serialized"},))


def pp_clean(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _pp(ranks, steps, params, label="clean")


def pp_small_m(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _pp(ranks, steps, params, m=params.integer("microbatches", 2, 1, 1024),
               faults=({"kind": "pipeline_bubbles_small_m"},))


def pp_imbalance(ranks: int | None, steps: int | None, params: Params) -> Job:
    pp = params.integer("pp", 4, 1, ranks or 8)
    stage = params.integer("stage", pp - 1, 0, pp - 1)
    factor = params.number("factor", 1.5, 0.0, 100.0, low_open=True)
    scale = tuple(factor if s == stage else 1.0 for s in range(pp))
    return _pp(ranks, steps, params, stage_scale=scale,
               faults=({"kind": "pipeline_stage_imbalance", "stage": stage, "factor": factor},))


def pp_interleaved(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _pp(ranks, steps, params, v=params.integer("chunks", 2, 1, 16), label="clean")


def pp_megatron(ranks: int | None, steps: int | None, params: Params) -> Job:
    """Megatron-style 1F1B, p=4, m=32, with batched send/recv (one SendRecv kernel per exchange)."""
    job = _pp(ranks, steps, params, m=32, p2p_batched=True, label="clean")
    if job.chunks != 1:
        raise ScenarioError("pp_megatron models the non-interleaved 1F1B schedule: chunks must be 1")
    return job


def pp_megatron_imbalance(ranks: int | None, steps: int | None, params: Params) -> Job:
    """Megatron-style 1F1B (p=4, m=32, DP=2) with batch_isend_irecv under PyTorch's coalescing manager (every
    PP kernel is an `nccl:coalesced` SendRecv; steady-state kernels carry a send and a receive) and one slow
    stage: ``stage`` (default 1) computes ``factor`` (default 1.35) times longer."""
    pp = params.integer("pp", 4, 1, ranks or 8)
    stage = params.integer("stage", 1, 0, pp - 1)
    factor = params.number("factor", 1.35, 0.0, 100.0, low_open=True)
    scale = tuple(factor if s == stage else 1.0 for s in range(pp))
    job = _pp(ranks, steps, params, m=32, p2p_batched=True, p2p_coalesced=True, stage_scale=scale,
              faults=({"kind": "pipeline_stage_imbalance", "stage": stage, "factor": factor},))
    if job.chunks != 1:
        raise ScenarioError("pp_megatron_imbalance models the non-interleaved 1F1B schedule: chunks must be 1")
    return job


def pp_interleaved_coalesced(ranks: int | None, steps: int | None, params: Params) -> Job:
    """Interleaved 1F1B (p=4, v=2, m=8, DP=2) whose PP transfers run under PyTorch's coalescing manager:
    every PP kernel an `nccl:coalesced` SendRecv without Src/Dst Rank (one transfer per kernel)."""
    return _pp(ranks, steps, params, v=params.integer("chunks", 2, 1, 16), p2p_coalesced=True, label="clean")


def pp_imbalance_stage2(ranks: int | None, steps: int | None, params: Params) -> Job:
    return pp_imbalance(ranks, steps, params.with_defaults(stage="2", factor="1.25"))


def old_nccl(ranks: int | None, steps: int | None, params: Params) -> Job:
    return _ddp(ranks, steps, params, nccl_version="2.18.5", cuda_version="12.2", label="clean")


def xid(code: int) -> Callable[[int | None, int | None, Params], Job]:
    def build(ranks: int | None, steps: int | None, params: Params) -> Job:
        n = ranks or 8
        r = _culprit(params, n, 4 if n > 4 else 0)
        if code == 79:
            if n < 2:
                raise ScenarioError("xid79 hangs a collective: it needs at least 2 ranks")
            # the GPU falls off the bus: its rank never reaches the next gradient all-reduce; its host blocks in
            # .item() on the lost GPU for ``hang_ms`` until the driver reports the error, and its profiler exports
            # the failing step as the exception unwinds
            steps = steps or 3
            hang = params.number("hang_ms", 30000.0, 0.0, 1e9)
            return _ddp(ranks, steps, params, faults=(
                {"kind": "collective_timeout", "ranks": (r,), "step": 100 + steps - 1, "seq": 0, "timeout_ms": 600000.0,
                 "host_hang_ms": hang},
                {"kind": "xid", "code": 79, "ranks": (r,)}))
        return _ddp(ranks, steps, params, faults=({"kind": "xid", "code": code, "ranks": (r,)},))
    return build


def _hang_after(ranks: int | None, steps: int | None, params: Params, name: str, default_rank: int,
                fault: dict[str, object]) -> Job:
    """A DDP job whose culprit rank meets ``fault`` and never reaches the last step's first all-reduce:
    the others time out in the watchdog."""
    n = ranks or 8
    if n < 2:
        raise ScenarioError(f"{name} hangs a collective: it needs at least 2 ranks")
    r = _culprit(params, n, default_rank if n > default_rank else n - 1)
    steps = steps or 3
    return _ddp(ranks, steps, params, faults=(
        {"kind": "collective_timeout", "ranks": (r,), "step": 100 + steps - 1, "seq": 0, "timeout_ms": 600000.0},
        {**fault, "ranks": (r,)}))


def peer_exit(ranks: int | None, steps: int | None, params: Params) -> Job:
    """The OOM killer kills one rank's process; its peers' NCCL reports at once that the remote peer closed the
    connection (ncclRemoteError), before any watchdog timeout (#28: a communication failure, not a timeout)."""
    job = _hang_after(ranks, steps, params, "peer_exit", 5, {"kind": "oom_kill"})
    faults = tuple({**f, "ends": "comm_error"} if f["kind"] == "collective_timeout" else f for f in job.faults)
    return dataclasses.replace(job, faults=faults)


def node_reboot(ranks: int | None, steps: int | None, params: Params) -> Job:
    """One rank's node shuts down for a reboot mid-step (systemd-shutdown's last words, then the kernel's `reboot:
    Restarting system`); its peers' NCCL reports the closed connection at once (#28 item 2: a node shutdown before a
    communication failure is its root)."""
    n = ranks or 16
    if n <= GPUS_PER_NODE:
        raise ScenarioError(f"node_reboot needs peers on another node: more than {GPUS_PER_NODE} ranks")
    job = _hang_after(n, steps, params, "node_reboot", 5, {"kind": "node_shutdown"})
    r = next(iter(job.faults[0]["ranks"]))
    node = tuple(q for q in range(n) if q // GPUS_PER_NODE == r // GPUS_PER_NODE)  # every rank of the node stops
    faults = tuple({**f, "ranks": node, **({"ends": "comm_error"} if f["kind"] == "collective_timeout" else {})}
                   for f in job.faults)
    return dataclasses.replace(job, faults=faults)


def oom_kill(ranks: int | None, steps: int | None, params: Params) -> Job:
    """The host's OOM killer kills one rank's training process: it never reaches the next gradient
    all-reduce and the others time out in the watchdog (a host fault, not the GPU's)."""
    return _hang_after(ranks, steps, params, "oom_kill", 5, {"kind": "oom_kill"})


def aer_fatal_audio(ranks: int | None, steps: int | None, params: Params) -> Job:
    """A fatal PCIe AER (completion timeout) that the GPU's HDMI audio function (.1) reports: the port's
    link is lost with the GPU at .0 behind it, whose rank never reaches the next gradient all-reduce."""
    return _hang_after(ranks, steps, params, "aer_fatal_audio", 2, {"kind": "aer_fatal", "function": 1})


def rm_init_failed(ranks: int | None, steps: int | None, params: Params) -> Job:
    """The last node's GPU ``gpu`` (default: the first one the job leaves free, the node's second GPU with
    the default 9 ranks) fails to initialize (RmInitAdapter failed) each time the device is opened: at boot
    and when the job starts. The job runs on the node's other GPUs; no rank uses the broken one."""
    n = ranks or 9
    used = n % GPUS_PER_NODE
    if used == 0:
        raise ScenarioError(f"rm_init_failed needs a GPU the job leaves free on its last node: --ranks not a multiple "
                            f"of "
                            f"{GPUS_PER_NODE}; got {n}")
    gpu = params.integer("gpu", used, used, GPUS_PER_NODE - 1)
    return _ddp(n, steps, params, faults=({"kind": "gpu_init_failed", "node": (n - 1) // GPUS_PER_NODE, "gpu": gpu},))


def _death(death: str, default_rank: int) -> Callable[[int | None, int | None, Params], Job]:
    """One rank dies of its own error (``death``) and never reaches the last step's all-reduce: the others time
    out in the watchdog; 16 ranks on 2 nodes by default, so the timeouts cross nodes."""
    def build(ranks: int | None, steps: int | None, params: Params) -> Job:
        return _hang_after(ranks or 16, steps, params, death, default_rank, {"kind": "app_death", "death": death})
    return build


def pp_exception(ranks: int | None, steps: int | None, params: Params) -> Job:
    """One rank of the last pipeline stage raises a Python exception in its loss after the last step."""
    job = _pp(ranks, steps, params, label="clean")
    r = _culprit(params, job.topo.world, job.topo.world - 1)
    return job.with_(faults=({"kind": "app_death", "death": "exception", "ranks": (r,)},))


def _scheduler(why: str) -> Callable[[int | None, int | None, Params], Job]:
    def build(ranks: int | None, steps: int | None, params: Params) -> Job:
        job = _ddp(ranks, steps, params, label="clean")
        return job.with_(faults=({"kind": "scheduler_stop", "why": why, "ranks": ()},))
    return build


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("ddp_clean", "healthy data-parallel job (DDP, overlapped bucketed all-reduce)", ddp_clean),
    Scenario("fsdp_clean", "healthy FSDP job (per-layer all-gather prefetch, reduce-scatter of gradients)", fsdp_clean),
    Scenario("pp_clean", "healthy pipeline + data parallel job (PP=4, 1F1B, m=8)", pp_clean),
    Scenario("pp_interleaved", "healthy interleaved pipeline (PP=4, v=2 chunks, m=8)", pp_interleaved),
    Scenario("pp_megatron", "healthy Megatron-style 1F1B pipeline (PP=4, m=32) with batched send/recv", pp_megatron),
    Scenario("pp_megatron_imbalance", "Megatron-style 1F1B (PP=4, m=32, DP=2), coalesced batch_isend_irecv, stage 1 "
             "computes 35% longer", pp_megatron_imbalance),
    Scenario("pp_interleaved_coalesced", "healthy interleaved pipeline (PP=4, v=2, m=8, DP=2) with every PP transfer "
             "under nccl:coalesced", pp_interleaved_coalesced),
    Scenario("pp_imbalance_stage2", "pipeline stage imbalance: stage 2 computes 25% longer", pp_imbalance_stage2),
    Scenario("old_nccl", "healthy DDP job on NCCL 2.18 (old ncclKernel_* names, fp32 grads)", old_nccl),
    Scenario("ddp_straggler", "one rank's GPU compute is slower (compute straggler)", ddp_straggler),
    Scenario("graph_straggler",
             "16-rank DDP job whose compute kernels replay from CUDA graphs (one cudaGraphLaunch per step, "
             "capture not profiled); one rank's GPU compute is slower", graph_straggler),
    Scenario("graph_capture", "healthy DDP job replaying its compute from CUDA graphs; the first profiled step also "
             "captures the graph", graph_capture),
    Scenario("fsdp2_prefetch", "healthy FSDP2 job on a device mesh: all_gather_into_tensor prefetched a layer ahead, "
             "reduce_scatter_tensor of gradients, both on the mesh's dp_shard group", fsdp2_prefetch),
    Scenario("symm_tp", "healthy TP=2 x PP=2 job whose TP all-reduces run through PyTorch symmetric memory "
             "(two_shot_all_reduce kernels, no NCCL)", symm_tp),
    Scenario("tp_overlap", "healthy TP=2 x PP=2 job with sequence parallelism and comm-GEMM overlap (TransformerEngine "
             "userbuffers, the shape of async TP): TP all-gathers and reduce-scatters beside the GEMMs", tp_overlap),
    Scenario("async_tp", "healthy TP=2 x PP=2 job with PyTorch async TP: symm_mem::fused_all_gather_matmul and "
             "fused_matmul_reduce_scatter, whose peer copies run on a backend stream beside the chunk GEMMs",
             async_tp),
    Scenario("async_tp_serialized", "TP=4 x PP=2 async TP job whose peer copies start only after the GEMM chunk they "
             "should hide under (the suboptimal schedule of PyTorch's _pipelined_all_gather_and_consume): TP "
             "communication exposed", async_tp_serialized),
    Scenario("compiled", "healthy DDP job compiled with torch.compile: Triton kernels (GEMMs as mm templates with "
             "recorded shapes) inside CompiledFunction / CompiledFunctionBackward regions", compiled),
    Scenario("host_straggler",
             "one rank's host launches kernels slowly (launch-bound straggler; its node logs CPU thermal throttling)",
             host_straggler, kernel_log="throttle"),
    Scenario("late_rank", "one rank's data loader stalls every step; the others busy-wait in NCCL", late_rank),
    Scenario("input_bound", "input-bound job: every rank's data loader stalls each step, the GPU idles ~40% of it",
             input_bound),
    Scenario("item_sync", "one process, no profiler steps: 4,097 .item() reads (device-to-host copy + stream sync), "
             "the GPU idle most of the capture while the host works after each", item_sync),
    Scenario("slow_gemm",
             "every rank's GEMM kernels run 30% longer (a slower kernel class, e.g. after a library upgrade)",
             slow_gemm),
    Scenario("ddp_no_overlap", "DDP all-reduce runs after backward instead of overlapping it", ddp_no_overlap),
    Scenario("slow_nic", "one node's NIC runs at a fraction of its bandwidth (TP=8 x PP=2 x DP; 32 ranks)", slow_nic,
             kernel_log="link_flap"),
    Scenario("hsdp_clean",
             "healthy hybrid-sharded data parallel job (HSDP: shard groups of 16 ranks over 2 nodes, replicated)",
             hsdp_clean),
    Scenario("hsdp_slow_nic", "one node's NIC slow in a 4-node HSDP job (shard 16 = 2 nodes, 2 replicas; 32 ranks)",
             hsdp_slow_nic,
             kernel_log="link_flap"),
    Scenario("net_socket", "inter-node traffic over NET/Socket (TCP) instead of InfiniBand", net_socket),
    Scenario("gdr_off", "GPUDirect RDMA unavailable: inter-node traffic staged through host memory", gdr_off),
    Scenario("p2p_disabled", "NCCL_P2P_DISABLE=1: intra-node traffic through shared memory, not NVLink", p2p_disabled),
    Scenario("algo_forced", "NCCL_ALGO forced to Tree for large multi-node all-reduces", algo_forced),
    Scenario("proto_forced", "NCCL_PROTO forced to LL for large all-reduces", proto_forced),
    Scenario("pp_small_m", "pipeline bubbles from too few micro-batches (m=2, p=4)", pp_small_m),
    Scenario("pp_imbalance", "pipeline stage imbalance: the last stage is 1.5x slower", pp_imbalance),
    Scenario("collective_timeout", "one rank never arrives at an all-reduce; the others time out in the watchdog",
             collective_timeout),
    Scenario("xid79", "GPU falls off the bus (Xid 79); its rank never arrives; watchdog timeout", xid(79),
             kernel_log="xid79"),
    Scenario("xid48", "double-bit ECC error (Xid 48) on one GPU", xid(48), kernel_log="xid48"),
    Scenario("xid94", "contained ECC error (Xid 94) on one GPU", xid(94), kernel_log="xid94"),
    Scenario("xid63", "row-remapping event (Xid 63) on one GPU", xid(63), kernel_log="xid63"),
    Scenario("xid149", "NVLink5 link fault (Xid 149) on one GPU; the driver tears down its channels "
             "(Xid 45 caused by previous Xid 149)", xid(149), kernel_log="xid149"),
    Scenario("aer_fatal_audio",
             "fatal PCIe AER reported by a GPU's audio function (.1): the GPU at .0 is lost; its rank "
             "never arrives; watchdog timeout", aer_fatal_audio, kernel_log="aer_audio"),
    Scenario("rm_init_failed", "a GPU the job leaves free on its last node fails to initialize (RmInitAdapter failed; "
             "9 ranks: the node's second GPU)", rm_init_failed, kernel_log="rm_init"),
    Scenario("node_reboot", "one rank's node shuts down for a reboot mid-step; its peers' NCCL reports the closed "
             "connection at once (a communication failure rooted at the node's shutdown)", node_reboot,
             kernel_log="shutdown"),
    Scenario("oom_kill", "the OOM killer kills one rank's process (host memory); its peers time out in the watchdog",
             oom_kill, kernel_log="oom"),
    Scenario("peer_exit", "the OOM killer kills one rank's process; its peers' NCCL reports the closed connection "
             "at once (a communication failure, not a watchdog timeout)", peer_exit, kernel_log="oom"),
    Scenario("benign_kernel_log", "healthy job whose kernel logs hold only benign noise", ddp_clean),
    Scenario("nic_replug", "healthy job whose NIC ports were re-plugged an hour before (module plugged, slot power "
             "sufficient, link up again): no finding", ddp_clean, kernel_log="nic_replug"),
    Scenario("cuda_oom", "CUDA out of memory on one rank (traceback, torchrun's failure table); the others, across "
             "nodes, time out in the watchdog", _death("cuda_oom", 11)),
    Scenario("illegal_address",
             "illegal memory access in a custom kernel on one rank, with the driver's Xid 31 on its GPU; "
             "the others time out", _death("illegal_address", 11), kernel_log="xid31"),
    Scenario("time_limit", "SLURM cancels the job at its time limit after a checkpoint save", _scheduler("TIME LIMIT")),
    Scenario("preempted", "SLURM preempts the job after a checkpoint save", _scheduler("PREEMPTION")),
    Scenario("dataloader_hang", "a hang: one rank sits in its data loader (stack dumps of every rank), the others in "
             "the all-reduce until the watchdog", _death("dataloader_hang", 6)),
    Scenario("pp_exception", "a Python exception on one rank of the last pipeline stage", pp_exception),
)}
