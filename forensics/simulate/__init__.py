"""Labelled job simulator: writes a RUN_DIR as a real distributed training job would leave it
(per-rank Kineto traces, per-rank stdout with NCCL_DEBUG=INFO lines, per-node kernel logs) plus
``truth.json``, the ground truth of what was injected. Deterministic: same arguments, same bytes.

Library code only; ``forensics simulate`` in cli.py is the front end. See docs/simulator.md.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from forensics.simulate import logs
from forensics.simulate.engine import (
    COLL,
    COLL_OPTYPE,
    COMPUTE,
    GEMM,
    KERNEL_GAP_NS,
    LAUNCH_LATENCY_NS,
    MEMCPY,
    Engine,
    Op,
    StepResult,
    iter_steps,
)
from forensics.simulate.incidents_truth import expected_incidents
from forensics.simulate.kineto import EPOCH_NS, T0_NS, Spool, TraceWriter
from forensics.simulate.lastwords import write_last_words
from forensics.simulate.logs import OOM_ANON_RSS_KB, RM_INIT_STATUS, aer_port
from forensics.simulate.model import PCI_BUS_IDS, Job
from forensics.simulate.scenarios import SCENARIOS, Params, Scenario, ScenarioError

TRUTH_SCHEMA = "forensics-sim-truth/1"
MAX_ARRIVAL_ROWS = 20_000  # last-arrival rows kept in truth.json (large --size runs are truncated)
MAX_RANKS = 4096  # traces grow with the square of the ranks (every collective spells its group's ranks)
MAX_STEPS = 100_000
MAX_SIZE_MB = 100_000.0
_GEMM_PREFIX = GEMM.split("{")[0]
_NCCL_VERSION = re.compile(r"\d{1,3}\.\d{1,3}(\.\d{1,3})?")
__all__ = ["SCENARIOS", "simulate", "build_job", "check_run_args"]


def check_run_args(scenario: str, *, ranks: int | None = None, steps: int | None = None, size_mb: float | None = None,
                   params: dict[str, str] | None = None, nccl_version: str | None = None) -> None:
    """Raise ScenarioError (naming the valid range) for any argument the simulator cannot honour."""
    _check_scalars(ranks, steps, size_mb, nccl_version)
    build_job(scenario, ranks, steps, params)


def _check_scalars(ranks: int | None, steps: int | None, size_mb: float | None, nccl_version: str | None) -> None:
    if ranks is not None and not 1 <= ranks <= MAX_RANKS:
        raise ScenarioError(f"ranks={ranks}: outside the valid range 1..{MAX_RANKS}")
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        raise ScenarioError(f"steps={steps}: outside the valid range 1..{MAX_STEPS}")
    if size_mb is not None and not (math.isfinite(size_mb) and 0 < size_mb <= MAX_SIZE_MB):
        raise ScenarioError(f"size={size_mb}: outside the valid range (0, {MAX_SIZE_MB}] MB")
    if nccl_version is not None and not _NCCL_VERSION.fullmatch(nccl_version):
        raise ScenarioError(f"nccl-version {nccl_version!r}: expected MAJOR.MINOR[.PATCH], e.g. 2.18.5")


def build_job(scenario: str, ranks: int | None = None, steps: int | None = None,
              params: dict[str, str] | None = None) -> tuple[Scenario, Job]:
    if scenario not in SCENARIOS:
        raise KeyError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    sc = SCENARIOS[scenario]
    given = Params(params or {})
    job = sc.build(ranks, steps, given)
    unknown = given.unknown()
    if unknown:
        raise ScenarioError(f"--param {', '.join(unknown)}: not a parameter of {scenario}; "
                            f"it reads {', '.join(sorted(given.asked))}")
    return sc, job.with_(label=scenario)


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    iv = sorted(iv)
    out: list[tuple[int, int]] = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _length(iv: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in iv)


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = tot = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            tot += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def _gemm_ns(prog: list[Op]) -> int:
    return sum(op.dur for op in prog if op.kind == COMPUTE and op.name.startswith(_GEMM_PREFIX))


class _RankMetrics:
    __slots__ = ("steps", "step_ns", "compute_ns", "comm_ns", "exposed_ns", "wait_ns", "last_arrivals",
                 "kernel_busy_ns", "dp_comm_ns", "p2p_ns", "idle_by_step", "pp_wait_ns", "pp_wait_by_step",
                 "gemm_ns", "gpu_first", "gpu_last")

    def __init__(self) -> None:
        self.steps = 0
        self.step_ns = self.compute_ns = self.comm_ns = self.exposed_ns = self.wait_ns = 0
        self.last_arrivals = self.kernel_busy_ns = self.dp_comm_ns = self.p2p_ns = 0
        self.idle_by_step: list[float] = []
        self.pp_wait_ns = 0
        self.pp_wait_by_step: list[float] = []
        self.gemm_ns = 0  # GEMM kernel time as the engine drew it (slow_gemm's injected size comes from it)
        self.gpu_first: int | None = None  # the first GPU op's start and the last one's end (the profiled GPU window)
        self.gpu_last = 0

    def add(self, span: tuple[int, int], prog: list[Op]) -> None:
        comp: list[tuple[int, int]] = []
        comm: list[tuple[int, int]] = []
        allk: list[tuple[int, int]] = []
        stream_end: dict[int, int] = {}
        pp_wait = 0
        for op in prog:
            if op.kind == COMPUTE and any(d.kind == COLL and d.name == "recv" for d in op.deps):
                # Pipeline-dependency wait, as the engine resolved it: the kernel could have started once its
                # stream was free, its other inputs were ready and the host had launched it; whatever it
                # started later than that, it waited for the activation/gradient from the neighbour stage.
                ready = max([stream_end.get(op.stream, 0)] + [d.end or 0 for d in op.deps if d.name != "recv"])
                pp_wait += max(0, op.start - max(ready + KERNEL_GAP_NS, op.launch + LAUNCH_LATENCY_NS))
            if op.kind in (COMPUTE, MEMCPY, COLL) and op.end is not None:
                stream_end[op.stream] = op.end
            if op.kind == COMPUTE or op.kind == MEMCPY:
                assert op.end is not None
                comp.append((op.start, op.end))
                allk.append((op.start, op.end))
            elif op.kind == COLL:
                assert op.end is not None
                c = op.coll
                assert c is not None
                comm.append((op.start, op.end))
                allk.append((op.start, op.end))
                if c.timeout:
                    continue
                last = c.last_arrival()
                self.wait_ns += last - op.start
                if last == op.start and len(c.members) > 1:
                    self.last_arrivals += 1
                if c.op in ("send", "recv"):
                    self.p2p_ns += op.end - op.start
                elif c.pg.kind in ("dp", "dp_rep", "world"):
                    self.dp_comm_ns += op.end - op.start
        cu, mu = _merge(comp), _merge(comm)
        self.gemm_ns += _gemm_ns(prog)
        self.steps += 1
        self.step_ns += span[1] - span[0]
        self.compute_ns += _length(cu)
        self.comm_ns += _length(mu)
        self.exposed_ns += _length(mu) - _overlap(cu, mu)
        self.kernel_busy_ns += _length(_merge(allk))
        self._window(allk)
        self.idle_by_step.append(round(1 - _length(cu) / max(span[1] - span[0], 1), 6))
        self.pp_wait_ns += pp_wait
        self.pp_wait_by_step.append(round(pp_wait / max(span[1] - span[0], 1), 6))

    def _window(self, ops: list[tuple[int, int]]) -> None:
        """Widen the profiled GPU window (first GPU op start, last end) to ``ops``."""
        if ops:
            first = min(a for a, _ in ops)
            self.gpu_first = first if self.gpu_first is None else min(self.gpu_first, first)
            self.gpu_last = max(self.gpu_last, max(b for _, b in ops))

    def as_dict(self, rank: int) -> dict[str, Any]:
        n = max(self.steps, 1)
        step = self.step_ns / n
        return {
            "rank": rank,
            "steps": self.steps,
            "step_ns_mean": round(step),
            "compute_ns_mean": round(self.compute_ns / n),
            "gemm_ns_mean": round(self.gemm_ns / n),
            "comm_ns_mean": round(self.comm_ns / n),
            "dp_comm_ns_mean": round(self.dp_comm_ns / n),
            "p2p_ns_mean": round(self.p2p_ns / n),
            "exposed_comm_ns_mean": round(self.exposed_ns / n),
            "exposed_comm_fraction": round(self.exposed_ns / n / step, 6) if step else 0.0,
            "compute_idle_fraction": round(1 - self.compute_ns / n / step, 6) if step else 0.0,
            "compute_idle_fraction_by_step": self.idle_by_step,
            "gpu_idle_fraction": round(1 - self.kernel_busy_ns / n / step, 6) if step else 0.0,
            # over the whole profiled GPU window (first GPU op to last), the unit of a capture without steps
            "gpu_idle_fraction_window": round(1 - self.kernel_busy_ns / (self.gpu_last - self.gpu_first), 6)
            if self.gpu_first is not None and self.gpu_last > self.gpu_first else 0.0,
            "collective_wait_ns_total": self.wait_ns,
            "pipeline_wait_ns_total": self.pp_wait_ns,
            "pipeline_wait_fraction_by_step": self.pp_wait_by_step,
            "step_ns_total": self.step_ns,
            "times_arrived_last": self.last_arrivals,
        }


@dataclass
class _Recorder:
    """What the step loop of :func:`simulate` collects for truth.json and the logs."""

    job: Job
    engine: Engine
    writers: list[TraceWriter]
    first_host: dict[int, int] = field(default_factory=dict)
    metrics: dict[int, _RankMetrics] = field(default_factory=dict)
    step_log: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    timeout_info: dict[str, Any] | None = None
    all_steps: list[int] = field(default_factory=list)
    coll_log: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[list[Any]] = field(default_factory=list)
    arrivals_truncated: bool = False
    xfer_by_pg: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.first_host = {st.rank: st.host_t for st in self.engine.states}
        self.metrics = {st.rank: _RankMetrics() for st in self.engine.states}
        self.step_log = {st.rank: [] for st in self.engine.states}

    def collectives(self, res: StepResult) -> None:
        for c in res.colls:
            if len(self.xfer_by_pg.setdefault(c.pg.name, [])) < 1000:
                self.xfer_by_pg[c.pg.name].append(c.t_tx)
            # Who arrived last (the latest kernel start, engine time, no clock offsets) and by how much.
            if c.op in ("send", "recv") or c.timeout or len(c.arrive) != len(c.members) or len(c.members) < 2:
                continue
            if len(self.arrivals) >= MAX_ARRIVAL_ROWS:
                self.arrivals_truncated = True
                continue
            order = sorted(c.arrive.items(), key=lambda kv: (kv[1], kv[0]))
            self.arrivals.append([c.pg.name, c.seq, res.step, c.op, order[-1][0], order[-1][1] - order[-2][1]])
        self.all_steps.append(res.step)
        if self.job.tuning_lines:
            self.coll_log += [{"rank0": c.pg.ranks[0], "step": res.step, "op": c.op, "nbytes": c.nbytes, "algo": c.algo,
                               "proto": c.proto,
                               "channels": c.channels, "t_us": c.t_tx / 1e3} for c in res.colls if c.op not in ("send",
                                                                                                                "recv")]

    def programs(self, res: StepResult) -> None:
        job = self.job
        for r, prog in res.programs.items():
            w = self.writers[r]
            span = res.step_span[r]
            if r % 2 and res.step < job.first_step + job.window_skew:
                self.first_host[r] = span[1]  # this rank's profiler window opens later: nothing of this step is traced
                continue
            if not self.engine.halted or r in self._hung_hosts():
                # a host that hung in a call raising an error closes its step range and exports the trace on exit
                if job.profiler_steps:
                    w.step(res.step, span[0], span[1])
                self.metrics[r].add(span, prog)
                self.step_log[r].append((res.step, span[0], span[1]))
            w.ops(prog, res.step)
            w.spill()  # one rank's step text at a time in memory, whatever the world size

    def _hung_hosts(self) -> tuple[int, ...]:
        """The culprits whose host blocked in a call on their lost GPU (``host_hang_ms``) when the job halted."""
        spec = self.engine.timeout_spec or {}
        return tuple(spec.get("ranks", ())) if spec.get("host_hang_ms") else ()

    def halt(self, res: StepResult) -> None:
        """The step in which a collective timed out: what the logs and the truth say about it."""
        job = self.job
        c = next(c for c in res.colls if c.timeout)
        launch = {r: op.launch for r, prog in res.programs.items() for op in prog if op.coll is c}
        stop = {r: max((op.end or op.start) for op in prog) if prog else res.step_span[r][0] for r,
                prog in res.programs.items()}
        spec = self.engine.timeout_spec or {}
        info: dict[str, Any] = {"step": res.step, "coll": c, "arrive": dict(c.arrive), "launch": launch, "stop": stop,
                                "timeout_ms": spec.get("timeout_ms", 600000.0), "ends": spec.get("ends", "watchdog")}
        full = c.nbytes // (2 if job.new_kernel_names else 4)
        info["numel_in"] = full // len(c.members) if c.op == "allgather" else full
        info["numel_out"] = full // len(c.members) if c.op == "reduce_scatter" else full
        self.timeout_info = info


def _open_writers(out: Path, job: Job, engine: Engine, offsets: list[int], compresslevel: int,
                  spool: Spool) -> list[TraceWriter]:
    writers: list[TraceWriter] = []
    for st in engine.states:
        start_ms = (EPOCH_NS + offsets[st.node] + st.host_t) // 1_000_000
        name = f"{st.host}_{st.pid}.{start_ms}.pt.trace.json.gz"
        w = TraceWriter(out / "profiler" / name, job, st, engine.groups, offsets[st.node], spool, compresslevel)
        w.metadata(st.host_t)
        w.spill()
        writers.append(w)
    return writers


def _run_steps(rec: _Recorder, size_mb: float | None) -> None:
    steps = iter_steps(rec.engine)
    res = next(steps, None)
    while res is not None:
        rec.collectives(res)
        rec.programs(res)
        if rec.engine.halted:
            rec.halt(res)
            break
        if size_mb and rec.writers[0].bytes_written >= size_mb * 1e6:
            break
        res = None  # let this step's programs go before the next step is built
        res = next(steps, None)
    for st, w in zip(rec.engine.states, rec.writers):
        w.close(rec.first_host[st.rank], st.host_t)


def simulate(scenario: str, out: Path, *, ranks: int | None = None, steps: int | None = None, seed: int = 0,
             size_mb: float | None = None, params: dict[str, str] | None = None, nccl_version: str | None = None,
             compresslevel: int = 6, truth_path: Path | None = None) -> dict[str, Any]:
    """Write the RUN_DIR for ``scenario`` under ``out``; return the truth document, also written to
    ``truth_path`` (default ``out/truth.json``)."""
    _check_scalars(ranks, steps, size_mb, nccl_version)
    sc, job = build_job(scenario, ranks, steps, params)
    if nccl_version:
        job = job.with_(nccl_version=nccl_version)
    if size_mb:
        job = job.with_(steps=10**9)
    rng = random.Random(f"{seed}:job")
    cluster = rng.choice(("gpu-h100", "trn-h100", "hgx"))
    hosts = [f"{cluster}-{rng.randrange(10, 90)}{n:02d}" for n in range(job.topo.nodes)]
    offsets = [int(rng.uniform(-job.clock_offset_us, job.clock_offset_us) * 1e3) for _ in range(job.topo.nodes)]
    engine = Engine(job, seed, hosts)
    out = Path(out)
    (out / "profiler").mkdir(parents=True, exist_ok=True)
    spool = Spool(out / "profiler")
    try:
        rec = _Recorder(job, engine, _open_writers(out, job, engine, offsets, compresslevel, spool))
        _run_steps(rec, size_mb)
    finally:
        spool.close()

    truth = _truth(sc, job, engine, hosts, offsets, rec.writers, rec.metrics, rec.step_log, rec.timeout_info, seed,
                   params or {},
                   rec.all_steps)
    for f in truth["faults"]:
        if f["kind"] == "slow_nic":
            f["expected"].update(_slow_groups(job, engine, f["params"]["nodes"], rec.xfer_by_pg,
                                              f["params"].get("nic")))
    truth["last_arrivals"] = {"columns": ["pg_name", "seq", "step", "op", "last_rank", "margin_ns"],
                              "rows": rec.arrivals,
                              "truncated": rec.arrivals_truncated}
    log_paths = logs.write_stdout_logs(out, job, engine, offsets, seed, rec.timeout_info, rec.step_log, rec.coll_log)
    end_ns = max(st.host_t for st in engine.states)
    klog_paths, injected = logs.write_kernel_logs(out, job, engine, offsets, seed, sc.kernel_log, end_ns,
                                                  rec.timeout_info)
    for row in truth["ranks"]:
        row["log"] = log_paths[row["rank"]]
    for row in truth["hosts"]:
        row["kernel_log"] = klog_paths[row["host"]]
        row["kernel_log_style"] = logs.STYLES[row["node"] % len(logs.STYLES)]
    truth["kernel_log"] = {"scenario": sc.kernel_log, "injected": injected}
    truth["incidents"] = expected_incidents(truth["faults"], sc.kernel_log)
    words = write_last_words(out, job, rec.engine, offsets, rec.timeout_info, rec.step_log, log_paths)
    if words is not None:
        truth["last_words"] = words
    ck = rec.timeout_info or {}
    if "checkpoint_wall_ns" in ck:  # the last save before the fault: a fatal incident's lost work starts here
        truth["checkpoints"] = [{"rank": 0, "log": log_paths[0], "wall_ns": ck["checkpoint_wall_ns"],
                                 "iteration": ck["checkpoint_iteration"]}]
    truth_path = Path(truth_path) if truth_path is not None else out / "truth.json"
    truth_path.parent.mkdir(parents=True, exist_ok=True)
    truth_path.write_bytes(orjson.dumps(truth, option=orjson.OPT_INDENT_2) + b"\n")  # "schema" first: easy to recognise
    return truth


def _truth(sc: Scenario, job: Job, engine: Engine, hosts: list[str], offsets: list[int], writers: list[TraceWriter],
           metrics: dict[int, _RankMetrics], step_log: dict[int, list[tuple[int, int, int]]],
           timeout_info: dict[str, Any] | None,
           seed: int, params: dict[str, str], all_steps: list[int]) -> dict[str, Any]:
    topo = job.topo
    per_rank = [metrics[r].as_dict(r) for r in range(topo.world)]
    ranks = []
    for st, w in zip(engine.states, writers):
        tp_r, dp_r, pp_r = topo.coords(st.rank)
        ranks.append({
            "rank": st.rank, "host": st.host, "node": st.node, "local_rank": st.local, "pid": st.pid,
            "pci_bus_id": PCI_BUS_IDS[st.local % len(PCI_BUS_IDS)], "tp_rank": tp_r, "dp_rank": dp_r, "pp_stage": pp_r,
            "trace": f"profiler/{w.path.name}", "profiled_steps": [s for s, _, _ in step_log[st.rank]],
            "counts": dict(sorted(w.counts.items())),
        })
    steps_ns = sorted(m["step_ns_mean"] for m in per_rank if m["steps"])
    median_step = steps_ns[len(steps_ns) // 2] if steps_ns else 0
    p, m, v = topo.pp, job.work.microbatches, max(1, job.chunks)
    expected: dict[str, Any] = {"step_ns_median": median_step}
    if p > 1:
        expected["bubble_fraction_theory"] = round((p - 1) / (v * m + p - 1), 6)
        stage_idle: dict[int, list[float]] = {}
        for d in per_rank:
            stage_idle.setdefault(topo.coords(d["rank"])[2], []).append(d["compute_idle_fraction"])
        expected["compute_idle_fraction_by_stage"] = {str(s): round(sum(x) / len(x), 6) for s,
                                                      x in sorted(stage_idle.items())}
        # steady state: the first and last profiled steps hold the pipeline's fill and drain across step edges
        steady = [x for d in per_rank for x in d["compute_idle_fraction_by_step"][1:-1]]
        if steady:
            expected["bubble_fraction_simulated"] = round(sum(steady) / len(steady), 6)
        # Ground truth of the pipeline bubble, from the engine: per stage, the time its compute stream sat
        # idle waiting for an activation/gradient from a neighbour stage, over the step time (all profiled steps).
        wait: dict[int, list[int]] = {}
        for d in per_rank:
            acc = wait.setdefault(topo.coords(d["rank"])[2], [0, 0])
            acc[0] += d["pipeline_wait_ns_total"]
            acc[1] += d["step_ns_total"]
        by_stage = {s: w[0] / w[1] for s, w in sorted(wait.items()) if w[1]}
        if by_stage:
            expected["bubble_fraction_measured_by_stage"] = {str(s): round(x, 6) for s, x in by_stage.items()}
            expected["bubble_fraction_measured"] = round(sum(by_stage.values()) / len(by_stage), 6)
        steady_w = [x for d in per_rank for x in d["pipeline_wait_fraction_by_step"][1:-1]]
        if steady_w:
            expected["bubble_fraction_measured_steady"] = round(sum(steady_w) / len(steady_w), 6)
    expected.update(_trace_shape_truth(job, ranks, writers))
    faults = [_fault_truth(f, job, engine, per_rank, timeout_info) for f in job.faults]
    return {
        "schema": TRUTH_SCHEMA,
        "scenario": sc.name,
        "summary": sc.summary,
        "healthy": not job.faults,
        "seed": seed,
        "params": dict(sorted(params.items())),
        "job": {
            "world_size": topo.world, "tp": topo.tp, "pp": topo.pp, "dp": topo.dp, "nodes": topo.nodes,
            "gpus_per_node": topo.gpus_per_node, "schedule": job.schedule if p > 1 else "none", "chunks": v,
            "microbatches": m,
            "layers_per_stage": job.work.layers, "hidden": job.work.hidden, "seq": job.work.seq,
            "micro_batch": job.work.micro_batch,
            "steps": all_steps, "gpu": job.gpu.name, "num_sms": job.gpu.num_sms, "nccl_version": job.nccl_version,
            "cuda_version": job.cuda_version,
            "kernel_naming": "ncclDevKernel" if job.new_kernel_names else "ncclKernel",
            "seq_on_kernels": job.seq_on_kernels, "dp_overlap": job.overlap_dp, "noise_sigma": job.noise,
            "dp_mode": job.dp_mode,
            "window_skew": job.window_skew,
            "p2p": ("coalesced " if job.p2p_coalesced else "") + ("batched" if job.p2p_batched else "single") if p > 1
            else "none",
            "nccl_env": {k: v for k, v in job.env},
            "net": {"intra": job.net.intra, "inter": job.net.inter, "gdr": job.net.gdr},
            "base_time_ns": EPOCH_NS - T0_NS,
        },
        "hosts": [{"host": h, "node": i, "clock_offset_ns": offsets[i],
                   "ranks": [r for r in range(topo.world) if topo.node_of(r) == i]} for i, h in enumerate(hosts)],
        "process_groups": [{"pg_name": g.name, "pg_desc": g.desc, "kind": g.kind,
                            "ranks": list(g.ranks)} for g in engine.groups],
        "ranks": ranks,
        "faults": faults,
        "expected": expected,
        "metrics": per_rank,
    }


def _trace_shape_truth(job: Job, ranks: list[dict[str, Any]], writers: list[TraceWriter]) -> dict[str, Any]:
    """What the writer did differently from an eager trace (CUDA graphs, symmetric memory, torch.compile)."""
    out: dict[str, Any] = {}
    if job.cuda_graphs:
        out["cuda_graphs"] = _graph_truth(job, ranks)
    if job.symm_tp:
        out["symm_tp"] = {k: sum(w.counts.get(k, 0) for w in writers) for k in ("symm_kernels", "symm_kernel_ns")}
    if job.tp_overlap and job.async_tp:
        got = {k: sum(w.counts.get(k, 0) for w in writers) for k in ("async_tp_copies", "async_tp_ns",
                                                                    "async_tp_overlap_ns")}
        out["async_tp"] = {**got, "async_tp_exposed_ns": got["async_tp_ns"] - got["async_tp_overlap_ns"]}
    elif job.tp_overlap:
        got = {k: sum(w.counts.get(k, 0) for w in writers) for k in ("ub_kernels", "ub_kernel_ns", "ub_overlap_ns")}
        out["tp_overlap"] = {**got, "ub_exposed_ns": got["ub_kernel_ns"] - got["ub_overlap_ns"]}
    if job.compiled:
        out["compiled"] = {k: sum(w.counts.get(k, 0) for w in writers) for k in (
            "triton_kernels", "triton_kernel_ns", "triton_template_flops", "triton_template_ns")}
    return out


def _graph_truth(job: Job, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """What the trace writer replayed from CUDA graphs: the share of every rank's kernel time (the compute
    kernels; NCCL and copies stay eager), and which step captured the graph (null: no capture profiled)."""
    graph = sum(r["counts"].get("graph_kernel_ns", 0) for r in ranks)
    total = sum(r["counts"].get("kernel_ns", 0) for r in ranks)
    gpu = total + sum(r["counts"].get("copy_ns", 0) for r in ranks)
    return {"mode": job.cuda_graphs, "capture_step": job.first_step if job.cuda_graphs == "capture" else None,
            "graph_launches": sum(r["counts"].get("graph_launches", 0) for r in ranks),
            "graph_kernels": sum(r["counts"].get("graph_kernels", 0) for r in ranks),
            "graph_kernel_ns": graph, "kernel_ns": total, "graph_share": round(graph / total, 6) if total else 0.0,
            "gpu_time_ns": gpu, "graph_share_of_gpu_time": round(graph / gpu, 6) if gpu else 0.0}


def _slow_groups(job: Job, engine: Engine, nodes: list[int], xfer_by_pg: dict[str, list[int]],
                 nic: int | None = None) -> dict[str, Any]:
    """The process groups whose traffic crosses a slow node's NIC (members on that node, on the NIC's rail
    when only one NIC is slow, and on another node), and per group kind the engine's median transfer time
    of those groups over that of the others."""
    topo = job.topo

    def med(xs: list[float] | list[int]) -> float:
        xs = sorted(xs)
        return float(xs[len(xs) // 2]) if xs else 0.0

    slow, ratio = [], {}
    per_kind: dict[str, tuple[list[float], list[float]]] = {}
    for g in engine.groups:
        if g.name not in xfer_by_pg:
            continue
        gn = {topo.node_of(r) for r in g.ranks}
        on_slow = [r for r in g.ranks if topo.node_of(r) in nodes and (nic is None or topo.local_rank(r) == nic)]
        through = len(gn) > 1 and bool(on_slow)
        if through:
            slow.append(g.name)
        per_kind.setdefault(g.kind, ([], []))[0 if through else 1].append(med(xfer_by_pg[g.name]))
    for kind, (a, b) in sorted(per_kind.items()):
        if a and b:
            ratio[kind] = round(med(a) / med(b), 4)
    return {"slow_groups": sorted(slow, key=int), "transfer_ratio_by_kind": ratio}


def _who(engine: Engine, ranks: tuple[int, ...]) -> dict[str, Any]:
    sts = [engine.states[r] for r in ranks]
    return {"ranks": sorted(ranks), "hosts": sorted({s.host for s in sts}),
            "gpus": sorted({PCI_BUS_IDS[s.local] for s in sts})}


def _upper_median(key: str, rows: list[dict[str, Any]]) -> float:
    xs = sorted(d[key] for d in rows)
    return xs[len(xs) // 2] if xs else 0.0


def _straggler_truth(f: dict[str, Any], per_rank: list[dict[str, Any]], others: list[dict[str, Any]],
                     r: int) -> dict[str, Any]:
    """Expected figures of a compute or host straggler ``r`` against the other ranks."""
    med = _upper_median
    exp: dict[str, Any] = {}
    if f["kind"] == "compute_straggler":
        exp["compute_slowdown"] = f["slowdown"]
        exp["compute_ratio_vs_median"] = round(per_rank[r]["compute_ns_mean"] / max(med("compute_ns_mean", others), 1),
                                               6)
        exp["victims_wait_ns_median"] = med("collective_wait_ns_total", others)
        exp["culprit_wait_ns"] = per_rank[r]["collective_wait_ns_total"]
    else:
        exp["launch_factor"] = f.get("launch_factor", 1.0)
        exp["stall_ms_per_step"] = f.get("stall_ms", 0.0)
        exp["culprit_gpu_idle_fraction"] = per_rank[r]["gpu_idle_fraction"]
        exp["others_gpu_idle_fraction_median"] = med("gpu_idle_fraction", others)
        exp["victims"] = [d["rank"] for d in others]
        exp["victims_wait_ns_median"] = med("collective_wait_ns_total", others)
        exp["culprit_wait_ns"] = per_rank[r]["collective_wait_ns_total"]
    return exp


def _slow_kernel_truth(f: dict[str, Any], per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The GEMM time per rank and step (mean over ranks) and the part of it the slowdown added."""
    gemm_ms = sum(d["gemm_ns_mean"] for d in per_rank) / max(len(per_rank), 1) / 1e6
    return {"slowdown": f["slowdown"], "gemm_ms_per_step": round(gemm_ms, 6),
            "added_ms_per_step": round(gemm_ms * f["slowdown"] / (1.0 + f["slowdown"]), 6)}


def _input_bound_truth(f: dict[str, Any], per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    return {"stall_ms_per_step": f["stall_ms"],
            "gpu_idle_fraction_median": _upper_median("gpu_idle_fraction", per_rank)}


def _item_sync_truth(f: dict[str, Any], per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    return {"d2h_syncs_per_rank": f["syncs"], "host_after_sync_us": f["host_us"],
            "gpu_idle_fraction_window_median": _upper_median("gpu_idle_fraction_window", per_rank)}


_JOB_WIDE_TRUTH = {"input_bound": _input_bound_truth, "slow_kernel_class": _slow_kernel_truth,
                   "host_sync_idle": _item_sync_truth}
"""Faults on every rank alike: their expected figures from the per-rank metrics."""


def _device_truth(f: dict[str, Any], engine: Engine) -> dict[str, Any]:
    """What the kernel log says about a device fault: the Xid, the fatal AER's port and errant function (the
    GPU's audio function, while the GPU is at .0), the failed GPU init's status and device minor, or the
    OOM victim's pid and size."""
    if f["kind"] == "xid":
        return {"xid": f["code"]}
    if f["kind"] == "gpu_init_failed":
        return {"device_minor": f["gpu"], "init_status": RM_INIT_STATUS, "severity": "critical"}
    if f["kind"] == "aer_fatal":
        bus = PCI_BUS_IDS[engine.states[f["ranks"][0]].local]
        return {"aer_port": aer_port(bus), "aer_device": f"{bus[:-1]}{f['function']}", "severity": "critical"}
    return {"victim_pid": engine.states[f["ranks"][0]].pid, "anon_rss_kb": OOM_ANON_RSS_KB}


def _slow_nic_who(f: dict[str, Any], topo: Any, engine: Engine) -> dict[str, Any]:
    """The slow node's host and its ranks (only the slow NIC's rail when one NIC is slow)."""
    nodes, nic = f["nodes"], f.get("nic")
    ranks = [r for r in range(topo.world) if topo.node_of(r) in nodes and nic in (None, topo.local_rank(r))]
    return {"hosts": [engine.hosts[n] for n in nodes], "ranks": ranks, "gpus": []}


def _gpu_init_who(f: dict[str, Any], engine: Engine) -> dict[str, Any]:
    """A fault without culprit ranks: the GPU that failed to initialize and its node (no rank runs on it),
    else nobody."""
    if f["kind"] != "gpu_init_failed":
        return {"ranks": [], "hosts": [], "gpus": []}
    return {"ranks": [], "hosts": [engine.hosts[f["node"]]], "gpus": [PCI_BUS_IDS[f["gpu"]]]}


def _fault_truth(f: dict[str, Any], job: Job, engine: Engine, per_rank: list[dict[str, Any]],
                 timeout_info: dict[str, Any] | None) -> dict[str, Any]:
    kind = f["kind"]
    out: dict[str, Any] = {"kind": kind, "params": {k: (list(v) if isinstance(v, tuple) else v) for k,
                                                    v in sorted(f.items()) if k != "kind"}}
    topo = job.topo
    culprits = tuple(f.get("ranks", ()))
    out.update(_who(engine, culprits) if culprits else _gpu_init_who(f, engine))
    exp: dict[str, Any] = {}
    others = [d for d in per_rank if d["rank"] not in culprits and d["steps"]]
    med = _upper_median
    if kind in ("compute_straggler", "host_straggler"):
        exp.update(_straggler_truth(f, per_rank, others, culprits[0]))
    elif kind in _JOB_WIDE_TRUTH:
        exp.update(_JOB_WIDE_TRUTH[kind](f, per_rank))
    elif kind == "dp_not_overlapped":
        exp["exposed_comm_fraction_median"] = med("exposed_comm_fraction", per_rank)
    elif kind == "slow_nic":
        out.update(_slow_nic_who(f, topo, engine))
        exp.update({"nic": f"mlx5_{f['nic']}:1"} if "nic" in f else {})
        exp["bandwidth_factor"] = f["bandwidth_factor"]
        exp["exposed_comm_fraction_median"] = med("exposed_comm_fraction", per_rank)
    elif kind in ("net_socket", "gdr_off", "p2p_disabled", "nccl_algo_forced", "nccl_proto_forced"):
        exp["exposed_comm_fraction_median"] = med("exposed_comm_fraction", per_rank)
        exp["dp_comm_ns_mean_median"] = med("dp_comm_ns_mean", per_rank)
        exp["nccl_env"] = {k: v for k, v in job.env}
    elif kind in ("pipeline_bubbles_small_m", "pipeline_stage_imbalance"):
        p, m, v = topo.pp, job.work.microbatches, max(1, job.chunks)
        exp["bubble_fraction_theory"] = round((p - 1) / (v * m + p - 1), 6)
        exp["compute_idle_fraction_median"] = med("compute_idle_fraction", per_rank)
        if kind == "pipeline_stage_imbalance":
            stage = f["stage"]
            out.update(_who(engine, tuple(r for r in range(topo.world) if topo.coords(r)[2] == stage)))
            exp["stage"] = stage
            exp["factor"] = f["factor"]
    elif kind == "collective_timeout" and timeout_info is not None:
        c = timeout_info["coll"]
        exp.update({
            "step": timeout_info["step"], "pg_name": c.pg.name, "pg_desc": c.pg.desc, "seq": c.seq,
            "op_type": COLL_OPTYPE[c.op],
            "collective": c.op, "numel": timeout_info["numel_in"], "numel_out": timeout_info["numel_out"],
            "timeout_ms": f["timeout_ms"],
            "missing_ranks": sorted(c.absent), "waiting_ranks": sorted(timeout_info["arrive"]),
        })
    elif kind in ("xid", "aer_fatal", "oom_kill", "gpu_init_failed"):
        exp.update(_device_truth(f, engine))
    out["expected"] = exp
    return out
