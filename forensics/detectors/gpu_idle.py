"""GPU idle: steps in which no kernel runs on any stream for a large share of the time, and why.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from forensics.base import frames as fr
from forensics.base.findings import Finding, FindingKind, Role, Severity, When
from forensics.base.intervals import clip_to_windows, merge
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.detectors._step_metrics import EVIDENCE_CAP, gpu_seconds, in_profile, ms, require_steps
from forensics.facts.collectives import WHOLE_TRACE
from forensics.facts.context import JobContext
from forensics.facts.coverage import gpus_of, rank_list

LOADER = r"(?i)dataloader|__next__"
SYNC = r"^(?:cuda|hip)(?:Stream|Device|Event)Synchronize$|^aten::(?:item|_local_scalar_dense)$|^(?:cuda|hip)Memcpy$"
ITEM = r"^aten::(?:item|_local_scalar_dense)$"
DEVICE_SYNC = r"^(?:cuda|hip)DeviceSynchronize$"
SYNC_COPY = r"^(?:cuda|hip)Memcpy$"
D2H = r"(?i)DtoH|Device-to-Host|Device -> (?:Pageable|Pinned)"
SYNC_CAUSES = ("d2h_copy", "sync_copy", "device_sync", "stream_sync")
"""What the host waited for in a sync gap: a device-to-host copy (``.item()``, ``.cpu()``), another
synchronous ``cudaMemcpy``, a device-wide synchronize, or a stream / event synchronize."""
PAUSE = r"(?i)checkpoint|torch\.save|(?:^|[^a-z])eval(?:uation)?(?:[^a-z]|$)|validat"
CPU_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")
CLASSES = ("input", "sync", "pause", "launch", "other")


@dataclass(frozen=True)
class GpuIdleConfig:
    """Thresholds of the GPU idle check (shares of the step time unless stated)."""

    min_idle: float = setting(0.10, unit="fraction of step", low=0.0, high=1.0,
                              doc="idle share of the step (no kernel on any stream) from which a rank is flagged")
    warning_idle: float = setting(0.20, unit="fraction of step", low=0.0, high=1.0,
                                  doc="median idle share of the flagged ranks from which the finding is a warning")
    critical_idle: float = setting(0.60, unit="fraction of step", low=0.0, high=1.0,
                                   doc="... and from which it is critical")
    input_cover: float = setting(0.5, unit="fraction of gap", low=0.0, high=1.0,
                                 doc="share of an idle gap that data-loader (or checkpoint/eval) ops must cover")
    pause_share: float = setting(0.5, unit="fraction of step", low=0.0, high=1.0,
                                 doc="a single idle gap at least this share of its step is a pause")
    short_kernel_us: float = setting(20.0, unit="us", low=0.0,
                                     doc="launch bound: median kernel duration of the rank below this ...")
    cpu_busy: float = setting(0.8, unit="fraction of step", low=0.0, high=1.0,
                              doc="... and CPU ops covering at least this share of the step ...")
    host_bound: float = setting(0.5, unit="fraction of idle", low=0.0, high=1.0,
                                doc="... or at least this share of the idle time host-bound (next kernel launched "
                                    "after the GPU went idle)")
    min_window_kernels: int = setting(5, unit="kernels", low=0,
                                      doc="without profiler steps: a rank whose capture holds fewer compute or NCCL "
                                          "kernels "
                                          "than this ran set-up or a one-off test, and its window is not judged")


def idle_table(steps: pl.DataFrame) -> pl.DataFrame:
    """Per rank (from the breakdown's ``steps``): host, steps, step_ns, idle_ns, host_bound_ns (sums), idle share."""
    return (
        steps.group_by("rank")
        .agg(pl.col("host").first(), pl.col("step").n_unique().alias("steps"),
             pl.col("step_ns").sum(), pl.col("idle_ns").sum(), pl.col("host_bound_ns").sum())
        .with_columns((pl.col("idle_ns") / pl.col("step_ns")).alias("idle"))
        .sort("rank")
    )


def idle_gaps(ctx: JobContext, ranks: list[int], whole: bool = False) -> pl.DataFrame:
    """rank, step, g_start, g_end, step_ns: the intervals of each step window with no kernel running. ``whole``
    (the profiled window as the unit): the host's synchronization records (class ``sync``: the time a host
    thread waited, as Nsight's CUPTI export lists it) are not GPU work and leave the GPU idle."""
    win = ctx.step_windows.filter(pl.col("rank").is_in(ranks)).select("rank", "step", "w_start", "w_end")
    # a graph replay is one host call for hundreds of kernels: its kernels say nothing of launch overhead
    kern = ctx.frames["kernels"].filter(pl.col("rank").is_in(ranks) & ~pl.col("graph_replay").fill_null(False))
    if whole:
        kern = kern.filter(pl.col("class") != "sync")
    kern = kern.select("rank", "start_ns", "end_ns")
    busy = merge(clip_to_windows(kern.lazy(), win.lazy(), on=["rank"]), ["rank", "step"]).collect()
    # Sentinels of zero length at both window edges; a gap is then "start minus the previous end".
    edges = pl.concat([
        win.select("rank", "step", pl.col("w_start").alias("start_ns"), pl.col("w_start").alias("end_ns")),
        win.select("rank", "step", pl.col("w_end").alias("start_ns"), pl.col("w_end").alias("end_ns")),
    ])
    allk = pl.concat([busy.select(edges.columns).cast(dict(edges.schema)), edges])  # type: ignore[arg-type]
    prev_end = pl.col("end_ns").cum_max().shift(1).over("rank", "step", order_by="start_ns")
    gaps = (
        allk.with_columns(prev_end.alias("g_start"))
        .select("rank", "step", "g_start", pl.col("start_ns").alias("g_end"))
        .filter(pl.col("g_end") > pl.col("g_start"))
    )
    return gaps.join(win.select("rank", "step", (pl.col("w_end") - pl.col("w_start")).alias("step_ns")),
                     on=["rank", "step"])


def _cover(gaps: pl.DataFrame, ops: pl.DataFrame, name: str) -> pl.DataFrame:
    """Per gap: ns of it covered by ``ops`` (merged per rank) as column ``name``."""
    if ops.height == 0:
        return gaps.with_columns(pl.lit(0, pl.Int64).alias(name))
    merged = merge(ops.select("rank", "start_ns", "end_ns"), ["rank"]).collect()
    keyed = gaps.with_row_index("_gid")
    cov = (
        clip_to_windows(merged.lazy(), keyed.lazy(), on=["rank"], window_cols=("g_start", "g_end"))
        .group_by("_gid").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias(name)).collect()
    )
    return keyed.join(cov, on="_gid", how="left").with_columns(pl.col(name).fill_null(0)).drop("_gid")


def _in_sync(gaps: pl.DataFrame, sync: pl.DataFrame, name: str = "in_sync") -> pl.DataFrame:
    """Per gap: whether it starts while the host is inside one of the calls ``sync`` (column ``name``)."""
    if sync.height == 0:
        return gaps.with_columns(pl.lit(False).alias(name))
    calls = merge(sync.select("rank", "start_ns", "end_ns"), ["rank"]).collect().sort("start_ns")
    j = gaps.with_row_index("_gid").sort("g_start").join_asof(
        calls, left_on="g_start", right_on="start_ns", by="rank", strategy="backward", check_sortedness=False,
    )
    return j.with_columns((pl.col("end_ns").is_not_null() & (pl.col("end_ns") >= pl.col("g_start"))).alias(name)).sort(
        "_gid").drop("_gid", "start_ns", "end_ns")


def _after_d2h(ctx: JobContext, gaps: pl.DataFrame) -> pl.DataFrame:
    """Per gap: whether the GPU's last work before it was a device-to-host copy (``_d2h``)."""
    copies = ctx.frames["kernels"].filter(
        (pl.col("class") == "memcpy") & fr.text_contains("name", D2H)
        & pl.col("rank").is_in(gaps["rank"].unique().implode())
    ).select("rank", pl.col("end_ns").alias("g_start"), pl.lit(True).alias("_d2h")).unique(["rank", "g_start"])
    return gaps.join(copies, on=["rank", "g_start"], how="left").with_columns(pl.col("_d2h").fill_null(False))


def sync_causes(ctx: JobContext, gaps: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """``gaps`` (classified) with ``cause``: for a sync gap, what the host waited for (one of
    :data:`SYNC_CAUSES`: a device-to-host copy when the GPU's last work was one or the host is in
    ``.item()``, else a device synchronize, else a stream or event synchronize); null for other gaps."""
    g = _after_d2h(ctx, gaps)
    g = _in_sync(g, ops.filter(fr.text_contains("name", ITEM)), "_item")
    g = _in_sync(g, ops.filter(fr.text_contains("name", DEVICE_SYNC)), "_dev")
    g = _in_sync(g, ops.filter(fr.text_contains("name", SYNC_COPY)), "_copy")
    cause = (
        pl.when(pl.col("cls") != "sync").then(pl.lit(None, pl.String))
        .when(pl.col("_d2h") | pl.col("_item")).then(pl.lit("d2h_copy"))
        .when(pl.col("_copy")).then(pl.lit("sync_copy"))
        .when(pl.col("_dev")).then(pl.lit("device_sync"))
        .otherwise(pl.lit("stream_sync"))
    )
    return g.with_columns(cause.alias("cause")).drop("_d2h", "_item", "_dev", "_copy")


def classify_gaps(ctx: JobContext, gaps: pl.DataFrame, launch_ranks: list[int], cfg: GpuIdleConfig) -> pl.DataFrame:
    """``gaps`` with a ``cls`` column (one of :data:`CLASSES`), by the CPU-side evidence during each gap."""
    ops = ctx.frames["cpu_ops"].select("rank", "name", "start_ns", "end_ns").filter(
        pl.col("rank").is_in(gaps["rank"].unique().implode()))
    g = _cover(gaps, ops.filter(fr.text_contains("name", LOADER)), "_loader")
    g = _cover(g, ops.filter(fr.text_contains("name", PAUSE)), "_pause")
    g = _in_sync(g, ops.filter(fr.text_contains("name", SYNC)))
    length = (pl.col("g_end") - pl.col("g_start")).cast(pl.Float64)
    cls = (
        pl.when(pl.col("_loader") >= cfg.input_cover * length).then(pl.lit("input"))
        .when(pl.col("in_sync")).then(pl.lit("sync"))
        .when((length >= cfg.pause_share * pl.col("step_ns"))
              | (pl.col("_pause") >= cfg.input_cover * length)).then(pl.lit("pause"))
        .when(pl.col("rank").is_in(launch_ranks)).then(pl.lit("launch"))
        .otherwise(pl.lit("other"))
    )
    g = g.with_columns(cls.alias("cls"), length.cast(pl.Int64).alias("gap_ns")).drop("_loader", "_pause", "in_sync")
    return sync_causes(ctx, g, ops)


def launch_facts(ctx: JobContext, ranks: list[int]) -> pl.DataFrame:
    """Per rank: median kernel duration (us) and the share of its step time covered by CPU ops."""
    win = ctx.step_windows.filter(pl.col("rank").is_in(ranks))
    # a graph replay is one host call for hundreds of kernels: its kernels say nothing of launch overhead
    kern = ctx.frames["kernels"].select("rank", "start_ns", "end_ns", "graph_replay").filter(
        pl.col("rank").is_in(ranks) & ~pl.col("graph_replay").fill_null(False))
    med = kern.group_by("rank").agg(((pl.col("end_ns") - pl.col("start_ns")).median() / 1e3).alias("median_kernel_us"))
    ops = ctx.frames["cpu_ops"].select("rank", "category", "start_ns", "end_ns").filter(
        pl.col("rank").is_in(ranks) & pl.col("category").cast(pl.String).is_in(CPU_CATEGORIES))
    # A rank's step windows are disjoint (forensics.facts.breakdown.step_windows), so clipping the ops to them and
    # then merging gives the same time as merging first and clipping the merged blocks (a few hundred), without
    # joining every op with every window (100k host ops x 5 steps)
    blocks = merge(ops.select("rank", "start_ns", "end_ns"), ["rank"])
    clipped = clip_to_windows(blocks, win.select("rank", "step", "w_start", "w_end").lazy(), on=["rank"])
    cpu = clipped.group_by("rank").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_cpu")).collect()
    span = win.group_by("rank").agg((pl.col("w_end") - pl.col("w_start")).sum().alias("_span"))
    return (
        med.join(cpu, on="rank", how="left").join(span, on="rank", how="left")
        .select("rank", "median_kernel_us", (pl.col("_cpu").fill_null(0) / pl.col("_span")).alias("cpu_busy"))
    )


def rank_classes(ctx: JobContext, flagged: pl.DataFrame, cfg: GpuIdleConfig, whole: bool = False) -> pl.DataFrame:
    """``flagged`` (from :func:`idle_table` or :func:`window_table`) with the idle ns of each class, the
    longest gap, the launch facts, the sync gaps by cause (``<cause>_n``, ``<cause>_ns``) and ``cls`` (the
    class holding most of the rank's idle time)."""
    ranks = [int(r) for r in flagged["rank"].to_list()]
    facts = launch_facts(ctx, ranks)
    facts = facts.join(flagged.select("rank", (pl.col("host_bound_ns") / pl.col("idle_ns")).alias("_hb")), on="rank")
    busy_host = (pl.col("cpu_busy") >= cfg.cpu_busy) | (pl.col("_hb") >= cfg.host_bound)
    launch = facts.filter((pl.col("median_kernel_us") < cfg.short_kernel_us) & busy_host)
    facts = facts.drop("_hb")
    gaps = classify_gaps(ctx, idle_gaps(ctx, ranks, whole), [int(r) for r in launch["rank"].to_list()], cfg)
    per = gaps.group_by("rank").agg(
        *[pl.col("gap_ns").filter(pl.col("cls") == c).sum().alias(f"{c}_ns") for c in CLASSES],
        *[pl.col("gap_ns").filter(pl.col("cause") == c).sum().alias(f"{c}_ns") for c in SYNC_CAUSES],
        *[(pl.col("cause") == c).sum().alias(f"{c}_n") for c in SYNC_CAUSES],
        pl.col("gap_ns").max().alias("longest_gap_ns"), pl.len().alias("gaps"),
        pl.col("g_start").sort_by("gap_ns").last().alias("longest_gap_from_ns"),
        pl.col("g_end").sort_by("gap_ns").last().alias("longest_gap_to_ns"),
    )
    top = pl.concat_list([pl.col(f"{c}_ns") for c in CLASSES]).list.arg_max()
    return (
        flagged.join(per, on="rank", how="left").join(facts, on="rank", how="left")
        .with_columns(top.replace_strict(dict(enumerate(CLASSES)), return_dtype=pl.String).alias("cls"))
    )


IDLE_GPU = FindingKind(
    "idle_gpu", "GPUs idle inside the step (no kernel running), classed by what the host was doing",
    Role.SYMPTOM, "Remove the host-side stall the class names (data loading, synchronisation, launch overhead).",
    stage=4)


DOC = DetectorDoc(
    summary=(
        "GPU idle: steps in which no kernel runs on any stream for a large share of the time, and why."
    ),
    detects=(
        "Ranks whose GPU runs no kernel at all (compute, NCCL or copy, on any stream) for at least "
        "``min_idle`` of the step time, classified by what the host was doing meanwhile: ``input`` (the host "
        "was in the data loader while the GPU waited: input bound), ``sync`` (the host had blocked in "
        "``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` / ``.item()``, so nothing was queued when the "
        "GPU drained: sync bound), ``pause`` (one long gap: a checkpoint, an evaluation, a logging stall), "
        "``launch`` (many short kernels and a host busy for nearly the whole step: launch bound), or "
        "``other`` (idle the CPU-side evidence does not explain)."
    ),
    matters=(
        "Idle GPU time is lost outright, and nvidia-smi utilization hides none of it only when it is read per"
        " step. Each class has a different fix, so naming the class is most of the diagnosis."
    ),
    measures=(
        "The unit is the profiler step; a capture without steps (no ``ProfilerStep#``, an Nsight export "
        "without NVTX step ranges) is measured over its profiled window instead, from the rank's first to its "
        "last GPU activity, and the finding says so (``unit`` = ``profiled_window``; the window may hold "
        "start-up or phases the trace does not name, so confidence is medium at most; a rank with fewer than "
        "``min_window_kernels`` compute or NCCL kernels ran set-up or a one-off test and is not judged). The "
        "idle time per rank and step is the breakdown's ``idle_ns`` (:mod:`forensics.facts.breakdown`: time "
        "in the step window with no kernel, copy or NCCL kernel running); over a profiled window it is the "
        "window less the union of kernels, copies and memsets, the host's synchronization records (Nsight's "
        "CUPTI synchronization rows: time a host thread waited) left out. A rank is flagged when its idle time "
        "over all its steps (or its window) is at least ``min_idle`` of it. Its idle gaps (between the union of its "
        "kernels, inside the step windows) are each put in"
        " one class, first match wins: ``input`` when data-loader ops (``enumerate(DataLoader)``, "
        "``DataLoader``, ``__next__``) cover at least ``input_cover`` of the gap; ``sync`` when the gap "
        "starts while the host is inside a synchronizing call (the host waited for the GPU to drain, then had"
        " nothing queued; the cause is named per gap: ``d2h_copy`` when the GPU's last work was a "
        "device-to-host copy or the host is in ``.item()``, ``sync_copy`` for another synchronous "
        "``cudaMemcpy``, ``device_sync``, else ``stream_sync``, with the count of gaps and their share of the "
        "idle time for each); ``pause`` when the gap alone is at least ``pause_share`` of its step or checkpoint"
        " / evaluation ops (``checkpoint``, ``torch.save``, ``eval``, ``validat``) cover ``input_cover`` of "
        "it; ``launch`` for the rest when the rank's median kernel is shorter than ``short_kernel_us`` and "
        "either its CPU ops (cpu_op and CUDA API calls, union over threads) cover at least ``cpu_busy`` of "
        "the step or at least ``host_bound`` of its idle time is host-bound (the breakdown's "
        "``host_bound_ns``: the next kernel's launch call began only after the GPU had gone idle); ``other`` "
        "otherwise. A rank's class is the one holding most of its idle time; one finding per class names its "
        "ranks, hosts and GPUs. Impact: the idle time itself (``gpu_seconds_lost`` = summed idle of the ranks"
        " over the profiled steps; ``fraction_of_step`` = their median idle share). Severity: info from "
        "``min_idle``, warning from ``warning_idle``, critical from ``critical_idle`` (median idle share of "
        "the ranks)."
    ),
    todo=(
        "input: more data-loader workers (``num_workers``), ``pin_memory=True``, ``prefetch_factor``, faster "
        "storage or pre-processed data. sync: remove ``.item()`` / ``.cpu()`` / ``print(loss)`` from the hot "
        "loop, log asynchronously every N steps. pause: make checkpoints asynchronous (e.g. "
        "``torch.distributed.checkpoint`` async save) and evaluate less often. launch: CUDA graphs "
        "(``torch.compile(mode=\"reduce-overhead\")``), fused kernels, larger batches per step."
    ),
)


def window_table(ctx: JobContext, cfg: GpuIdleConfig) -> pl.DataFrame:
    """Per rank of a capture without profiler steps, :func:`idle_table`'s columns over its one profiled window
    (first to last GPU activity): idle = the window less the union of kernels, copies and memsets (the
    host's synchronization records left out), host-bound idle as the breakdown measured it, at most that.
    Only ranks that ran at least ``min_window_kernels`` compute or NCCL kernels; Skip when none did."""
    work = ctx.frames["kernels"].filter(pl.col("class").is_in(["compute", "comm"])).group_by("rank").len()
    enough = work.filter(pl.col("len") >= cfg.min_window_kernels)["rank"]
    if enough.len() == 0:
        raise Skip(f"no profiler steps, and no rank ran {cfg.min_window_kernels} compute or NCCL kernels in its "
                   f"capture "
                   "(set-up or a one-off test): no window to judge idle time in")
    win = ctx.step_windows.filter(pl.col("rank").is_in(enough.implode())).select(
        "rank", "host", (pl.col("w_end") - pl.col("w_start")).alias("step_ns"))
    ranks = [int(r) for r in win["rank"].to_list()]
    idle = idle_gaps(ctx, ranks,
                     whole=True).group_by("rank").agg((pl.col("g_end") - pl.col("g_start")).sum().alias("idle_ns"))
    hb = ctx.steps.group_by("rank").agg(pl.col("host_bound_ns").sum())
    return (
        win.join(idle, on="rank", how="left").join(hb, on="rank", how="left")
        .with_columns(pl.col("idle_ns").fill_null(0), pl.lit(1, pl.UInt32).alias("steps"))
        .with_columns(pl.min_horizontal(pl.col("host_bound_ns").fill_null(0), "idle_ns").alias("host_bound_ns"))
        .with_columns((pl.col("idle_ns") / pl.col("step_ns")).alias("idle"))
        .filter(pl.col("step_ns") > 0)
        .select("rank", "host", "steps", "step_ns", "idle_ns", "host_bound_ns", "idle")
        .sort("rank")
    )


@detector("gpu_idle", doc=DOC, settings=GpuIdleConfig, requires=("kernels",), kinds=(IDLE_GPU,), view="step-anatomy")
def detect(ctx: JobContext, cfg: GpuIdleConfig) -> list[Finding]:
    require_steps(ctx)
    # Without profiler steps the unit is the profiled window (first to last GPU activity of the rank): it
    # may hold start-up or pauses between phases, which the pause class and the finding's wording name.
    whole = bool((ctx.steps["step"] == WHOLE_TRACE).all())
    table = window_table(ctx, cfg) if whole else idle_table(ctx.steps.filter(pl.col("step") != WHOLE_TRACE))
    flagged = table.filter(pl.col("idle") >= cfg.min_idle)
    if flagged.height == 0:
        return []
    table = rank_classes(ctx, flagged, cfg, whole)
    found = in_profile(ctx, [_finding(_measure(ctx, table.filter(pl.col("cls") == c), c, whole), cfg)
                             for c in CLASSES if (table["cls"] == c).any()])
    return [_at_longest_gaps(f) for f in found]


def _at_longest_gaps(f: Finding) -> Finding:
    """Place the finding at its ranks' longest idle gaps (trace clock, epoch ns): what a fault that stopped the
    rank explains is the gap that began at or after it, not the whole profiled window."""
    spans = [(e["longest_gap_from_ns"], e["longest_gap_to_ns"]) for e in f.evidence
             if isinstance(e.get("longest_gap_from_ns"), int) and isinstance(e.get("longest_gap_to_ns"), int)]
    if not spans:
        return f
    return replace(f, when=When.span(min(a for a, _ in spans), max(b for _, b in spans),
                                     "the flagged ranks' longest idle gaps on the trace clock"))


_TITLE = {
    "input": "input bound: GPU idle while the host waits for the data loader",
    "sync": "sync bound: GPU idle after the host blocks in a synchronization",
    "pause": "paused: one long GPU gap per step (checkpoint, evaluation or a host stall)",
    "launch": "launch bound: the host cannot launch kernels fast enough",
    "other": "GPU idle without CPU-side evidence of the cause",
}
_WHY = {
    "input": "data-loader ops cover the idle gaps (most of them at the step start)",
    "sync": "the gaps start while the host is inside a synchronizing call (cudaStreamSynchronize, "
            "cudaDeviceSynchronize, .item()), so no work was queued when the GPU drained",
    "pause": "most of the idle time is one gap per step",
    "launch": "kernels are short and the host's CPU ops fill nearly the whole step",
    "other": "neither the data loader, a synchronization, one long pause nor a busy launching host explains the gaps",
}
_DO = {
    "input": "Feed the GPU faster: more DataLoader workers (num_workers), pin_memory=True, prefetch_factor, "
             "faster storage or pre-processed/cached data.",
    "sync": "Remove host synchronizations from the training loop (.item(), .cpu(), print(loss), "
            "torch.cuda.synchronize()); accumulate metrics on the GPU and read them every N steps.",
    "pause": "Make checkpoints asynchronous (torch.distributed.checkpoint async save), evaluate less often, "
             "and check what the host does in the gap.",
    "launch": "Cut launch overhead: CUDA graphs (torch.compile mode='reduce-overhead'), fused kernels, "
              "larger micro-batches; check for Python overhead in the step.",
    "other": "Look at the host timeline of these ranks during the gaps (profiler CPU view): what runs "
             "instead of launching work.",
}


def _severity(share: float, cfg: GpuIdleConfig) -> Severity:
    if share >= cfg.critical_idle:
        return Severity.CRITICAL
    return Severity.WARNING if share >= cfg.warning_idle else Severity.INFO


_CAUSE_TEXT = {"d2h_copy": "device-to-host copies (.item(), .cpu(), .tolist(), cudaMemcpy to the host)",
               "sync_copy": "other synchronous copies (cudaMemcpy host-to-device or device-to-device)",
               "device_sync": "device synchronizes (torch.cuda.synchronize(), cudaDeviceSynchronize)",
               "stream_sync": "stream or event synchronizes (cudaStreamSynchronize, cudaEventSynchronize)"}


def _rows(t: pl.DataFrame, gpu_of: dict[int, str], cls: str) -> tuple[dict, ...]:
    causes = SYNC_CAUSES if cls == "sync" else ()
    return tuple(
        {"rank": int(r["rank"]), "host": r["host"], "gpu": gpu_of.get(int(r["rank"])),
         "idle": round(float(r["idle"]), 4),
         "idle_ms_per_step": ms(r["idle_ns"] / r["steps"]),
         **{f"{c}_share": round(float(r[f"{c}_ns"] or 0) / float(r["idle_ns"]), 4) for c in CLASSES},
         **{f"{c}_syncs": int(r[f"{c}_n"] or 0) for c in causes},
         "host_bound_share": round(float(r["host_bound_ns"]) / float(r["idle_ns"]), 4),
         "longest_gap_ms": ms(r["longest_gap_ns"]), "longest_gap_from_ns": r["longest_gap_from_ns"],
         "longest_gap_to_ns": r["longest_gap_to_ns"], "median_kernel_us": round(float(r["median_kernel_us"] or 0), 2),
         "cpu_busy": round(float(r["cpu_busy"] or 0), 4), "gpu_seconds_lost": gpu_seconds(r["idle_ns"])}
        for r in t.sort("idle", descending=True).head(EVIDENCE_CAP).iter_rows(named=True)
    )


@dataclass(frozen=True)
class _Idle:
    """What was measured for the ranks of one idle class: their median idle share and idle per step, the
    class's share of their idle time, the unit (steps, or the profiled window without them), and for the sync
    class what the host waited for."""

    cls: str
    whole: bool  # the unit is the profiled window (no profiler steps)
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    gpus: tuple[str, ...]
    share: float  # median idle share of the unit
    cls_share: float  # the class's share of the ranks' idle time
    per_step_ns: float  # median idle per step (or window)
    window_ns: float | None  # median window length, when the unit is the profiled window
    idle_ns: float  # summed idle of the ranks
    steps: int  # most steps of one rank
    ranks_with_data: int
    sync_n: dict[str, int]  # sync gaps by cause (SYNC_CAUSES), for the sync class
    sync_share: dict[str, float]  # ... and their share of the idle time
    evidence: tuple[dict, ...]


def _measure(ctx: JobContext, t: pl.DataFrame, cls: str, whole: bool) -> _Idle:
    """The idle time of ``t``'s ranks (rows of :func:`rank_classes` whose class is ``cls``)."""
    ranks = [int(r) for r in t["rank"].to_list()]
    gpu_of = gpus_of(ctx, ranks)
    idle = float(t["idle_ns"].sum())
    sync = cls == "sync"
    return _Idle(
        cls=cls, whole=whole, ranks=tuple(ranks),
        hosts=tuple(sorted({str(h) for h in t["host"].drop_nulls().to_list()})),
        gpus=tuple(sorted(set(gpu_of.values()))), share=float(t["idle"].median()),  # type: ignore[arg-type]
        cls_share=float(t[f"{cls}_ns"].sum()) / idle,
        per_step_ns=float((t["idle_ns"] / t["steps"]).median()),  # type: ignore[arg-type]
        window_ns=float(t["step_ns"].median()) if whole else None,  # type: ignore[arg-type]
        idle_ns=idle, steps=int(t["steps"].max()), ranks_with_data=ctx.steps["rank"].n_unique(),  # type: ignore[arg-type]
        sync_n={c: int(t[f"{c}_n"].sum()) for c in SYNC_CAUSES} if sync else {},
        sync_share={c: float(t[f"{c}_ns"].sum()) / idle for c in SYNC_CAUSES} if sync else {},
        evidence=_rows(t, gpu_of, cls),
    )


def _sync_metrics(m: _Idle) -> dict:
    """The sync gaps by cause, for the metrics."""
    n, share = m.sync_n, m.sync_share
    return {"sync_gaps": sum(n.values()), **{f"{c}_syncs": n[c] for c in SYNC_CAUSES},
            **{f"{c}_share_of_idle": round(share[c], 4) for c in SYNC_CAUSES}}


def _sync_text(m: _Idle) -> str:
    """A sentence on what the host waited for in the sync gaps, by cause."""
    n, share = m.sync_n, m.sync_share
    parts = [f"{n[c]:,} {_CAUSE_TEXT[c]} ({share[c]:.0%} of the idle time)" for c in SYNC_CAUSES if n[c]]
    return f" {sum(n.values()):,} idle gap(s) follow a host synchronization: {'; '.join(parts)}."


def _unit_text(m: _Idle) -> tuple[str, str]:
    """The unit the idle share is of (step or profiled window) and the sentence that says what it is."""
    if m.window_ns is None:
        return "step", f"{ms(m.per_step_ns)} ms per step"
    return "profiled window", (f"{ms(m.per_step_ns)} ms of a {ms(m.window_ns)} ms window; the trace has no profiler "
                               "steps, so the unit is the profiled window, from the rank's first to its last GPU "
                               "activity")


def _words(m: _Idle) -> tuple[str, str, str]:
    """(title, summary, remediation) of one class's measured idle time."""
    unit, unit_text = _unit_text(m)
    cause_text = _sync_text(m) if m.cls == "sync" else ""
    title = f"GPU idle {m.share:.0%} of the {unit} on {len(m.ranks)} rank(s), {_in_unit(_TITLE[m.cls], m.whole)}"
    summary = (
        f"Rank(s) {rank_list(m.ranks)} run no kernel on any stream for {m.share:.1%} of the {unit} (median; "
        f"{unit_text}); {m.cls_share:.0%} of that idle time is classed {m.cls}: "
        f"{_in_unit(_WHY[m.cls], m.whole)}.{cause_text}"
    )
    return title, summary, _DO[m.cls]


def _finding(m: _Idle, cfg: GpuIdleConfig) -> Finding:
    """The measured idle time of one class in words, with its typed facts."""
    extra = _sync_metrics(m) if m.cls == "sync" else {}
    if m.whole:
        extra["unit"] = "profiled_window"
    title, summary, remediation = _words(m)
    return Finding(
        detector="gpu_idle",
        kind=IDLE_GPU.name,
        severity=_severity(m.share, cfg),
        title=title,
        summary=summary,
        remediation=remediation,
        ranks=m.ranks,
        hosts=m.hosts,
        gpus=m.gpus,
        metrics={"class": m.cls, "idle_share": round(m.share, 4), "class_share_of_idle": round(m.cls_share, 4),
                 "idle_ms_per_step": ms(m.per_step_ns), "ranks_flagged": len(m.ranks),
                 "ranks_with_data": m.ranks_with_data, "steps": 0 if m.whole else m.steps, "min_idle": cfg.min_idle,
                 **extra},
        evidence=m.evidence,
        gpu_seconds_lost=gpu_seconds(m.idle_ns),
        fraction_of_step=round(m.share, 4),
        key=f"class-{m.cls}",
        confidence=_confidence(m),
    )


def _in_unit(text: str, whole: bool) -> str:
    """A class's wording, said of the profiled window when there are no steps."""
    return text.replace("per step", "in the window").replace("whole step", "whole window") if whole else text


def _confidence(m: _Idle) -> str:
    """High with two steps or more and one class holding most of the idle time; a profiled window without
    steps may hold start-up or phases the trace does not name: medium at most."""
    if m.cls_share < 0.7:
        return "medium"
    return "medium" if m.whole or m.steps < 2 else "high"
