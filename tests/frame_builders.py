"""Tiny hand-built jobs as canonical frames, with controllable delays, for detector tests.

This is deliberately a separate, naive event-by-event construction (plain Python lists), so tests do
not compute their expectations with the code under test. Every collective follows NCCL semantics:
each rank's kernel starts when that rank is ready, all end at ``max(ready) + transfer``.

Times are integer ns. Ranks are placed 8 per host (``node0``, ``node1``, ...).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from forensics.base.frames import JobFrames, conform, pg_id
from forensics.facts.context import JobContext
from forensics.pipeline import load

US = 1_000
MS = 1_000_000
SMS = 132


@dataclass
class _Rows:
    kernels: list[dict] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    corr: int = 0

    def kernel(self, rank: int, start: int, end: int, cls: str, *, launch: int | None = None,
               stream: int = 7, grid: int = 264, offset: int = 0, **extra) -> None:
        self.corr += 1
        if "pg_ranks" in extra:  # the frames carry the list's id; process_groups has the list
            extra["pg_id"] = pg_id(extra.pop("pg_ranks"))
        launch = start - 5 * US if launch is None else launch
        host = f"node{rank // 8}"
        self.kernels.append(dict(rank=rank, host=host, source=f"r{rank}.json", device=rank % 8, stream=stream,
                                 name=extra.pop("name", "gemm" if cls == "compute" else "ncclDevKernel_X"),
                                 **{"class": cls}, start_ns=start + offset, end_ns=end + offset,
                                 correlation=self.corr, grid_x=grid, grid_y=1, grid_z=1, **extra))
        self.ops.append(dict(rank=rank, host=host, source=f"r{rank}.json", category="cuda_runtime",
                             name="cudaLaunchKernel", start_ns=launch + offset, end_ns=launch + offset + 3 * US,
                             correlation=self.corr, is_launch=True))

    def frames(self, n_ranks: int, pgs: list[tuple[str, str, list[int]]]) -> JobFrames:
        ranks = pl.DataFrame(dict(rank=list(range(n_ranks)), world_size=[n_ranks] * n_ranks,
                                  host=[f"node{r // 8}" for r in range(n_ranks)], sm_count=[SMS] * n_ranks))
        pg_rows = [dict(rank=r, pg_name=name, pg_desc=desc, pg_size=len(members), pg_ranks=members,
                        pg_id=pg_id(members), declared=True) for name, desc, members in pgs for r in members]
        return JobFrames({
            "kernels": conform("kernels", pl.DataFrame(self.kernels, infer_schema_length=None)),
            "cpu_ops": conform("cpu_ops", pl.DataFrame(self.ops, infer_schema_length=None)),
            "steps": conform("steps", pl.DataFrame(self.steps)),
            "ranks": conform("ranks", ranks),
            "process_groups": conform("process_groups", pl.DataFrame(pg_rows)),
        })


@dataclass
class DPTruth:
    """What the builder put in: per rank and step, the exposed transfer and the wait, in ns."""
    exposed_tx: dict[tuple[int, int], int] = field(default_factory=dict)
    wait: dict[tuple[int, int], int] = field(default_factory=dict)
    step_ns: dict[tuple[int, int], int] = field(default_factory=dict)
    last: list[int] = field(default_factory=list)  # last-arriving rank of each all-reduce, in order


def dp_job(
    n_ranks: int = 8,
    steps: int = 5,
    compute_ns: int = 20 * MS,
    n_kernels: int = 10,
    tx_ns: int = 2 * MS,
    slow: dict[int, float] | None = None,
    host_delay: dict[int, int] | None = None,
    overlap: bool = False,
    noise: float = 0.0,
    clock_offset: dict[int, int] | None = None,
    seq: bool = False,
    pg_desc: str = "DATA_PARALLEL_GROUP",
    seed: int = 0,
) -> tuple[JobFrames, DPTruth]:
    """Data-parallel job: per step, ``n_kernels`` compute kernels then one all-reduce of ``tx_ns``.

    ``slow``: rank -> compute factor; ``host_delay``: rank -> ns the host stalls before launching the
    step's first kernel; ``overlap``: the all-reduce runs on its own stream, issued halfway through the
    compute, so it is hidden when compute outlasts it; ``clock_offset``: host index -> ns added to all
    that host's timestamps.
    """
    rng = random.Random(seed)
    slow, host_delay, clock_offset = slow or {}, host_delay or {}, clock_offset or {}
    rows, truth = _Rows(), DPTruth()
    members = list(range(n_ranks))
    start = {r: 1_000 * MS for r in members}  # each rank's step start; only collectives synchronize ranks
    for s in range(steps):
        ready, comp_end = {}, {}
        for r in members:
            off = clock_offset.get(r // 8, 0)
            t0 = start[r]
            t = t0 + host_delay.get(r, 0)
            per = compute_ns // n_kernels
            for i in range(n_kernels):
                d = int(per * slow.get(r, 1.0) * (1 + noise * rng.gauss(0, 1)))
                # launched inside the step's CPU range (ProfilerStep) and 5 us before it starts when the host is late
                launch = max(t0, t - 5 * US) if i == 0 else t0 + host_delay.get(r, 0) + i * 10 * US
                rows.kernel(r, t, t + d, "compute", launch=launch, offset=off)
                t += d
                if overlap and i == n_kernels // 2 - 1:
                    ready[r] = t
            comp_end[r] = t
            if not overlap:
                ready[r] = t
        last_start = max(ready.values())
        end = last_start + tx_ns
        truth.last.append(min(members, key=lambda r: (-ready[r], r)))
        for r in members:
            off = clock_offset.get(r // 8, 0)
            t0 = start[r]
            rows.kernel(r, ready[r], end, "comm", stream=20 if overlap else 7, grid=16, offset=off,
                        launch=min(ready[r], t0 + host_delay.get(r, 0) + 200 * US) - 5 * US,
                        collective="allreduce", pg_name="1", pg_desc=pg_desc, pg_ranks=members,
                        group_size=n_ranks, bytes=64 << 20, seq=s if seq else None)
            # The optimizer needs the reduced gradients: the next step starts after both.
            step_end = max(comp_end[r], end) + 100 * US
            rows.steps.append(dict(rank=r, host=f"node{r // 8}", source=f"r{r}.json", step=s,
                                   start_ns=t0 + off, end_ns=step_end + off))
            truth.step_ns[(r, s)] = step_end - t0
            truth.wait[(r, s)] = last_start - ready[r]
            hidden = max(0, min(end, comp_end[r]) - last_start) if overlap else 0
            truth.exposed_tx[(r, s)] = tx_ns - hidden
            start[r] = step_end
    return rows.frames(n_ranks, [("1", pg_desc, members)]), truth


@dataclass
class PPTruth:
    bubble: dict[tuple[int, int], int] = field(default_factory=dict)  # (stage, step) -> ns without compute
    step_ns: dict[int, int] = field(default_factory=dict)


def pp_job(p: int = 4, m: int = 8, steps: int = 3, t_f: int = 1 * MS, t_b: int = 2 * MS, tx: int = 20 * US,
           stage_scale: dict[int, float] | None = None) -> tuple[JobFrames, PPTruth]:
    """GPipe schedule on ``p`` stages (one rank each), ``m`` micro-batches: all forwards, then all backwards.

    P2P: a recv kernel on the receiver runs from when it is ready until the data lands; the matching send
    on the sender runs from when the sender is ready until the same instant. Bubble per stage (truth) is
    the step time minus that stage's compute time.
    """
    scale = stage_scale or {}
    rows, truth = _Rows(), PPTruth()
    pg = ("2", "PIPELINE_MODEL_PARALLEL_GROUP", list(range(p)))
    p2p = dict(pg_name="2", pg_desc=pg[1], pg_ranks=pg[2], group_size=p, bytes=1 << 20)
    t0 = 1_000 * MS
    for s in range(steps):
        free = {st: t0 for st in range(p)}
        comp = {st: 0 for st in range(p)}

        def transfer(src: int, dst: int, payload_ready: int, free: dict[int, int] = free, launch: int = t0) -> int:
            start_send, start_recv = payload_ready, free[dst]
            end = max(start_send, start_recv) + tx
            rows.kernel(src, start_send, end, "comm", collective="send", grid=1, launch=launch, **p2p)
            rows.kernel(dst, start_recv, end, "comm", collective="recv", grid=1, launch=launch, **p2p)
            free[src] = end
            free[dst] = end
            return end

        for _phase, order, dur in (("f", range(p), t_f), ("b", range(p - 1, -1, -1), t_b)):
            order = list(order)
            for _mb in range(m):
                for i, st in enumerate(order):
                    d = int(dur * scale.get(st, 1.0))
                    rows.kernel(st, free[st], free[st] + d, "compute", launch=t0)
                    free[st] += d
                    comp[st] += d
                    if i + 1 < len(order):
                        transfer(st, order[i + 1], free[st])
        step_end = max(free.values()) + 50 * US
        for st in range(p):
            rows.steps.append(dict(rank=st, host="node0", source=f"r{st}.json", step=s, start_ns=t0,
                                   end_ns=step_end))
            truth.bubble[(st, s)] = step_end - t0 - comp[st]
        truth.step_ns[s] = step_end - t0
        t0 = step_end
    return rows.frames(p, [pg]), truth


def _link_groups() -> list[tuple[str, str, list[int]]]:
    """The 2-rank DP groups of link_job: per local rank, nodes (0,1)/(2,3) (phase A) and (0,2)/(1,3) (phase B)."""
    groups: list[tuple[str, str, list[int]]] = []
    for lane in range(8):
        for a, b in ((0, 1), (2, 3)):
            groups.append((f"A{a}{b}_{lane}", "DATA_PARALLEL_GROUP", [8 * a + lane, 8 * b + lane]))
        for a, b in ((0, 2), (1, 3)):
            groups.append((f"B{a}{b}_{lane}", "DATA_PARALLEL_GROUP", [8 * a + lane, 8 * b + lane]))
    return groups


def link_job(slow_node: int | None = 2, factor: float = 3.0, steps: int = 3, compute_ns: int = 10 * MS,
             tx_ns: int = 1 * MS) -> JobFrames:
    """4 nodes x 8 ranks; every rank is in two 2-rank DP groups: one pairing nodes (0,1)/(2,3), one pairing
    nodes (0,2)/(1,3). Per step: compute, then an all-reduce in each group. Transfers of every group with a
    rank on ``slow_node`` take ``factor`` times longer (a slow NIC)."""
    rows = _Rows()
    n = 32
    groups = _link_groups()
    t = {r: 1_000 * MS for r in range(n)}
    for s in range(steps):
        start = dict(t)
        for r in range(n):
            rows.kernel(r, t[r], t[r] + compute_ns, "compute", launch=start[r])
            t[r] += compute_ns
        for phase in ("A", "B"):
            done = dict(t)
            for name, desc, members in groups:
                if not name.startswith(phase):
                    continue
                slow = slow_node is not None and any(m // 8 == slow_node for m in members)
                end = max(t[m] for m in members) + int(tx_ns * (factor if slow else 1.0))
                for m in members:
                    rows.kernel(m, t[m], end, "comm", launch=start[m], collective="allreduce", pg_name=name,
                                pg_desc=desc, pg_ranks=members, group_size=2, bytes=8 << 20, grid=8)
                    done[m] = end
            t = done
        for r in range(n):
            end = t[r] + 50 * US
            rows.steps.append(dict(rank=r, host=f"node{r // 8}", source=f"r{r}.json", step=s, start_ns=start[r],
                                   end_ns=end))
            t[r] = end
    return rows.frames(n, groups)


def one_trace_context(run: Path, doc: dict) -> JobContext:
    """The JobContext of a run folder holding one hand-written Kineto trace (``rank0.pt.trace.json``)."""
    (run / "rank0.pt.trace.json").write_text(json.dumps(doc))
    _, frames = load(run, workers=1)
    return JobContext(frames)
