"""The JobContext: one object per analysis that holds the frames and every fact derived from them.

The pipeline (:func:`forensics.pipeline.analyze`) builds exactly one context per job; every detector,
table and report reads it, so two views can never disagree about a number. Derived facts are
``cached_property`` attributes of the context itself: computed on first use, at most once, and never
stashed anywhere else (not in the frames, not in module globals).

Units: every time is integer nanoseconds (``*_ns``); on a rank's own GPU timeline for trace facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import polars as pl

from forensics.base.frames import JobFrames, pg_members
from forensics.facts.breakdown import Breakdown, compute_breakdown, kernel_exposure
from forensics.facts.collectives import CollectiveMatch, launch_times, match_collectives, pg_type_expr
from forensics.facts.identity import identities, job_identities
from forensics.facts.kernel_events import normalize_events
from forensics.facts.nccl_setup import JobNccl, job_nccl
from forensics.facts.op_categories import categorized_kernels, category_breakdown, gpu_time_coverage, op_attribution
from forensics.facts.op_throughput import op_throughput
from forensics.facts.placement import Placement
from forensics.facts.run_header import run_facts


# a function, not a constant: importing this module runs no Polars code (`forensics rules`, frames.Dtype)
def stages_schema() -> dict[str, type[pl.DataType]]:
    return {"rank": pl.Int32, "pp_stage": pl.Int64, "pp_size": pl.Int64, "pp_key": pl.String}


@dataclass(frozen=True)
class ClockOffsets:
    """Clock offsets between ranks and hosts, from how matched collectives end together.

    Every member of a synchronizing collective finishes within microseconds of the others, so a rank
    whose end times sit consistently after the instance's median end runs a clock that far ahead:
    ``offset_ns = median over instances of (end_ns - median end_ns of the instance)``
    (:mod:`forensics.facts.collectives`). Subtract it from a rank's (host's) times to put them on the job's
    common clock. Empty without matched synchronizing collectives.

    ``by_rank``: rank (Int32), host (String), offset_ns (Int64, ns).
    ``by_host``: host (String), offset_ns (Int64, ns; relative to the median host), n_ranks (UInt32).
    """

    by_rank: pl.DataFrame
    by_host: pl.DataFrame


@dataclass
class JobContext:
    """Facts about one job shared by every detector and view, each computed once on first use.

    ``frames`` are the parsed, canonical frames (:mod:`forensics.base.frames`); every other attribute is
    derived from them. Build one per analysis (the pipeline does) and pass it around; never build a
    second one for the same frames, or its facts are computed twice.
    """

    frames: JobFrames
    """The canonical frames of the job (one Polars frame per name; see docs/frames.md)."""

    # --- who is who --------------------------------------------------------------------------------

    @cached_property
    def sources(self) -> pl.DataFrame:
        """One row per file found in the run folder: path, kind, rank, host, status, message, parse_ns."""
        return self.frames["sources"]

    @cached_property
    def ranks(self) -> list[int]:
        """Global ranks named by any trace or source, ascending."""
        found: set[int] = set()
        for name in ("ranks", "sources"):
            found.update(int(r) for r in self.frames[name]["rank"].drop_nulls().to_list())
        return sorted(found)

    @cached_property
    def hosts(self) -> list[str]:
        """Host names (short form, as the frames carry them) named by any trace or source, sorted."""
        found: set[str] = set()
        for name in ("ranks", "sources"):
            found.update(str(h) for h in self.frames[name]["host"].drop_nulls().to_list())
        return sorted(found)

    @cached_property
    def world(self) -> tuple[int | None, str | None]:
        """(world size, where it came from): the largest of the traces' metadata and the NCCL init lines'
        ``nranks``; (None, None) when neither says."""
        found: list[tuple[int, str]] = []
        sizes = self.frames["ranks"]["world_size"].drop_nulls()
        if sizes.len():
            found.append((int(sizes.max()), "trace metadata"))  # type: ignore[arg-type]
        if self.frames.has("nccl_comms"):
            n = self.frames["nccl_comms"].filter(pl.col("origin") == "init")["nranks"].drop_nulls()
            if n.len():
                found.append((int(n.max()), "NCCL init lines"))  # type: ignore[arg-type]
        # the larger wins; on a tie the first (trace metadata) is named
        return max(found, key=lambda x: x[0], default=(None, None))

    @property
    def world_size(self) -> int | None:
        """The job's world size (see :attr:`world`); None when unknown."""
        return self.world[0]

    @cached_property
    def identity(self) -> pl.DataFrame:
        """Ranks <-> hosts <-> GPUs as one frame.

        One row per (host, pid, cuda_dev) process: those the NCCL logs mention
        (:func:`forensics.facts.identity.identities`), then traced processes no log names (``how`` = "trace").
        Columns: host, pid, cuda_dev (CUDA device index), rank (global rank), bus_id (normalised PCI
        bus id, null when no log gave it), how (which evidence gave the rank), trace_rank (the trace
        ``ranks`` frame's rank for that process; null without traces).
        """
        return job_identities(self.frames, self.log_identity)

    @cached_property
    def log_identity(self) -> pl.DataFrame:
        """The processes the NCCL logs mention, joined to trace ranks (:func:`forensics.facts.identity.identities`):
        :attr:`identity` less the traced processes no log names."""
        return identities(self.frames)

    @cached_property
    def run(self) -> dict[str, Any]:
        """The run header: ranks, hosts and GPUs seen and expected, sources used and ignored
        (:func:`forensics.facts.run_header.run_facts`; schema: ``run``). Read it, never change it."""
        return run_facts(self.frames, self.identity, self.ranks, self.hosts, self.world)

    @cached_property
    def nccl(self) -> JobNccl:
        """The job's NCCL setup the nccl_* detectors share: log identities, hosts, node and rank counts,
        GPU generations, the NCCL_* settings (:class:`forensics.facts.nccl_setup.JobNccl`). Read, never change."""
        return job_nccl(self.frames, self.log_identity, self.world_size)

    @cached_property
    def placement(self) -> Placement:
        """Where a host- or GPU-side event happened (:class:`forensics.facts.placement.Placement`): the
        job's hosts (those the kernel logs name included), GPU -> rank maps from :attr:`identity` and
        nvidia-smi, the profiled window per host. Shared by gpu_hw_error and node_health: read, never change."""
        place = Placement(self.frames, self.identity)
        if self.frames.has("kernel_events"):
            place.learn_hosts(self.frames["kernel_events"]["host"].drop_nulls().unique().to_list())
        return place

    @cached_property
    def kernel_events(self) -> pl.DataFrame:
        """The kernel_events frame with one host per line (:attr:`placement`'s names), ``clock`` and ``t``,
        lines collected twice dropped (:func:`forensics.facts.kernel_events.normalize_events`)."""
        return normalize_events(self.frames["kernel_events"], self.placement)

    # --- trace facts (GPU timeline, ns) ------------------------------------------------------------

    @cached_property
    def launches(self) -> pl.DataFrame:
        """Per (rank, correlation) of a kernel launch call: ``launch_ns``, its CPU start (ns); how kernels are
        tied to the profiler step that launched them (collective matching and the step breakdown)."""
        return launch_times(self.frames)

    @cached_property
    def match(self) -> CollectiveMatch:
        """NCCL kernels matched into collective instances, each split into transfer and wait (ns)."""
        return match_collectives(self.frames, self.launches)

    @cached_property
    def breakdown(self) -> Breakdown:
        """Per rank and step: where the step time went (:mod:`forensics.facts.breakdown`)."""
        return compute_breakdown(self.frames, self.match, self.launches)

    @property
    def steps(self) -> pl.DataFrame:
        """The breakdown frame: one row per (rank, step), ``step_ns = compute_ns + comm_exposed_ns +
        comm_wait_ns + other_ns + idle_ns`` and the per-PG-type columns (all ns)."""
        return self.breakdown.steps

    @property
    def step_windows(self) -> pl.DataFrame:
        """Per rank and step, the window the breakdown measures on the GPU timeline: rank, host, step,
        w_start, w_end (ns). Kernels belong to the ProfilerStep#N that launched them (correlation); step
        N's window starts at the later of its CPU start and the end of the earlier steps' GPU work (never
        after its first kernel) and runs to the next window, the last one to the later of its last kernel
        and its CPU end (see :mod:`forensics.facts.breakdown`); without profiler steps one window per rank
        (step -1)."""
        return self.breakdown.windows

    @cached_property
    def exposure(self) -> pl.DataFrame:
        """Per NCCL kernel: ``exposed_ns`` and ``structural_exposed_ns`` (transfer not under compute)."""
        return kernel_exposure(self.frames, self.match)

    @cached_property
    def kernel_categories(self) -> pl.DataFrame:
        """Every ranked kernel with its op ``category`` (:mod:`forensics.facts.op_categories`); NCCL kernels by the
        process-group type of the matched collectives. The kernels frame's columns but ``pg_id``."""
        return categorized_kernels(self.frames, self.match.kernels)

    @cached_property
    def categories(self) -> pl.DataFrame:
        """Per rank, step and op category: ``kernels`` and ``time_ns`` inside the step window, plus ``idle``
        from the breakdown (:func:`forensics.facts.op_categories.category_breakdown`)."""
        return category_breakdown(self.kernel_categories, self.step_windows, self.steps)

    @cached_property
    def op_attribution(self) -> pl.DataFrame:
        """Per rank, category and launching CPU op: kernels, time_ns, kernel_names (largest first)."""
        return op_attribution(self.kernel_categories, self.frames)

    @cached_property
    def op_throughput(self) -> pl.DataFrame:
        """GEMM and attention ops by shape: calls, kernel time, achieved TFLOP/s and share of the device's
        dense peak (:func:`forensics.facts.op_throughput.op_throughput`); empty when the trace recorded no shapes."""
        f = self.frames
        return op_throughput(f["op_shapes"], f["kernels"], f["cpu_ops"], f["ranks"])

    @cached_property
    def coverage(self) -> dict[str, Any]:
        """How much of the GPU time is attributed to ops, replayed from CUDA graphs, in each category, with a
        FLOP model, and what is not explained, in words (:func:`forensics.facts.op_categories.gpu_time_coverage`)."""
        return gpu_time_coverage(self.op_attribution, self.op_throughput)

    @cached_property
    def clock_offsets(self) -> ClockOffsets:
        """Per rank and per host clock offsets (ns) from collective end alignment (:class:`ClockOffsets`)."""
        return ClockOffsets(self.match.rank_offsets, self.match.host_offsets)

    @cached_property
    def stages(self) -> pl.DataFrame:
        """Pipeline stage map: rank, pp_stage (0-based position in its pipeline group), pp_size (stages),
        pp_key (the group's sorted member list). Empty without pipeline parallelism."""
        return _stage_map(self.frames, self.match)


def _pp_members(frames: JobFrames, match: CollectiveMatch) -> pl.DataFrame:
    """rank, pg_ranks of each rank's pipeline group: from the process groups, else from PP kernels."""
    pgs = frames["process_groups"]
    pp = pgs.filter(pl.col("declared") & (pg_type_expr(pl.col("pg_desc").fill_null("")) == "PP")).drop_nulls("rank")
    if pp.height == 0:
        k = match.kernels.filter(pl.col("pg_type") == "PP")
        if k.height == 0:
            return pl.DataFrame(schema={"rank": pl.Int32, "pg_ranks": pl.List(pl.Int64)})
        # the PP kernels' member lists, joined once the rows are few (each list is as long as the group)
        full = frames["kernels"].select("rank", "pg_name", "class", "pg_id").join(
            k.select("rank", "pg_name").unique(), on=["rank", "pg_name"], how="semi"
        ).filter(pl.col("class") == "comm")
        pp = (full.select("rank", "pg_name", "pg_id").join(pg_members(pgs), on="pg_id", how="left",
                                                            maintain_order="left")
              .select("rank", "pg_name", "pg_ranks").drop_nulls("pg_ranks"))
    return pp.unique(["rank"], keep="first").select("rank", "pg_ranks")


def _stage_map(frames: JobFrames, match: CollectiveMatch) -> pl.DataFrame:
    pp = _pp_members(frames, match)
    if pp.height == 0:
        return pl.DataFrame(schema=stages_schema())
    key = pl.col("pg_ranks").list.sort().cast(pl.List(pl.String)).list.join(",")
    sizes = pp.select("rank", key.alias("pp_key"), pl.col("pg_ranks").list.len().cast(pl.Int64).alias("pp_size"))
    # Stage = position of the rank in its (sorted) pipeline group.
    stage = (
        pp.explode("pg_ranks")
        .group_by("rank")
        .agg((pl.col("pg_ranks") < pl.col("rank")).sum().cast(pl.Int64).alias("pp_stage"))
    )
    return stage.join(sizes, on="rank").select("rank", "pp_stage", "pp_size", "pp_key").sort("rank")
