"""Exposed communication: collective transfer time that compute does not hide, per process-group type.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from forensics.base.confidence import sizes_known
from forensics.base.findings import Finding, FindingKind, Role, Severity
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.detectors._step_metrics import EVIDENCE_CAP, gpu_seconds, in_profile, ms, require_steps
from forensics.facts.collectives import PG_TYPES, UNKNOWN_SPLIT, transfer_basis
from forensics.facts.context import JobContext
from forensics.facts.coverage import Coverage, at_most, coverage


@dataclass(frozen=True)
class ExposedCommConfig:
    """Thresholds of the exposed-communication check (shares of the step or of the transfer)."""

    dp_min_exposed: float = setting(0.05, unit="fraction of step", low=0.0, high=1.0,
                                    doc="DP/default: exposed transfer share of the step from which a step counts")
    dp_max_overlap: float = setting(0.5, unit="fraction of transfer", low=0.0, high=1.0,
                                    doc="DP/default: a step counts only if less than this share of the transfer "
                                        "overlaps compute")
    min_step_share: float = setting(0.5, unit="fraction of steps", low=0.0, high=1.0,
                                    doc="share of steps (on the median rank) that must count")
    tp_min_exposed: float = setting(0.15, unit="fraction of step", low=0.0, high=1.0,
                                    doc="TP+EP+CP exposed transfer share of the step for an informational finding")
    critical_exposed: float = setting(0.25, unit="fraction of step", low=0.0, high=1.0,
                                      doc="DP/default exposure share of the step above which the finding is critical")


def _num(x: object) -> float:
    """A polars scalar statistic (median, mean, max) as a float; mypy cannot narrow their union type."""
    return float(x)  # type: ignore[arg-type]


def exposure_table(ta: JobContext) -> pl.DataFrame:
    """Per rank, step and PG type: transfer, structural exposed transfer, overlap, wait (ns) and step_ns."""
    steps = ta.steps
    k = ta.exposure.filter(pl.col("step").is_not_null())
    per = k.group_by("rank", "step", "pg_type").agg(
        pl.col("transfer_ns").sum().alias("tx_ns"),
        pl.col("structural_exposed_ns").sum().alias("exposed_ns"),
        pl.col("exposed_ns").sum().alias("raw_exposed_ns"),
        pl.col("wait_ns").sum().alias("wait_ns"),
        pl.len().alias("kernels"),
    )
    return per.join(steps.select("rank", "step", "step_ns"), on=["rank", "step"], how="inner").with_columns(
        (pl.col("exposed_ns") / pl.col("step_ns")).alias("X"),
        (1 - pl.col("raw_exposed_ns") / pl.col("tx_ns")).alias("O"),
    )


EXPOSED_COMM = FindingKind(
    "exposed_communication", "communication time not hidden behind compute: the step waits for its collectives",
    Role.SYMPTOM, "Overlap communication with compute (bucket sizes, prefetch, async collectives) or make it faster.")


DOC = DetectorDoc(
    summary=(
        "Exposed communication: collective transfer time that compute does not hide, per process-group type."
    ),
    detects=(
        "Process-group types (DP/FSDP, TP, PP, EP, CP, or 'default') whose collectives' *transfer* time runs "
        "while no compute kernel runs, so the step waits for the network. DP/FSDP (and the default group) "
        "traffic is meant to overlap backward/forward compute: exposure there is a warning. TP/EP/CP "
        "collectives sit between dependent kernels and are exposed by design: reported for information."
    ),
    matters=(
        "Exposed transfer is step time spent only moving data. Gradient all-reduce / reduce-scatter and FSDP "
        "all-gathers that do not overlap cost their full transfer time every step."
    ),
    measures=(
        "Each NCCL kernel is split into wait and transfer (:mod:`forensics.facts.collectives`; transfer = the"
        " shortest duration of that collective across ranks, placed at the kernel's end; a collective only "
        "one rank's trace shows is estimated from the same-size kernels of the job, and without size metadata"
        " it is not split at all: all of it counts as transfer, and the finding says so, since a collective "
        "that never overlaps compute is exposed communication whether it moves data or waits for peers). "
        "Waiting is never counted as exposure: a victim of a straggler waits, it does not transfer. Exposure "
        "of a kernel = its transfer not under the rank's compute kernels, capped by the exposure of the same "
        "collective on its last-arriving rank (which waited for nobody), so lateness elsewhere cannot make a "
        "victim's transfer look exposed. Per rank and step, ``X_g = exposed transfer / step time`` and the "
        "overlap ``O_g = transfer under compute / transfer``. A DP/default group is flagged when, on the "
        "median rank, ``X_g >= dp_min_exposed`` and ``O_g < dp_max_overlap`` in at least ``min_step_share`` "
        "of the steps; TP+EP+CP together when their ``X`` reaches ``tp_min_exposed``, as a warning when most of their "
        "kernel time is TP communication fused with GEMMs (async TP's peer copies, symmetric-memory or userbuffers "
        "kernels: built to run beside the GEMMs, so its exposure is an overlap that failed, not a design). PP "
        "transfer belongs to "
        "the pipeline_bubble detector. Impact: the exposed transfer itself (what overlap could save), summed "
        "over ranks and steps. Confidence follows the evidence (:mod:`forensics.base.confidence`): ranks with"
        " data, collective sizes known, steps measured."
    ),
    todo=(
        "DDP: keep gradient bucketing on (``bucket_cap_mb``), avoid ``no_sync`` outside accumulation, make "
        "sure nothing synchronizes the stream before backward ends. FSDP: enable ``forward_prefetch`` and "
        "``backward_prefetch``. Megatron: ``--overlap-grad-reduce`` / ``--overlap-param-gather``. TP/EP: TP "
        "comm overlap, sequence parallelism, or a smaller TP degree across slower links."
    ),
)


@detector("exposed_comm", doc=DOC, settings=ExposedCommConfig, requires=("kernels",), kinds=(EXPOSED_COMM,),
          view="step-anatomy")
def detect(ctx: JobContext, cfg: ExposedCommConfig) -> list[Finding]:
    require_steps(ctx)
    if ctx.match.kernels.height == 0:
        raise Skip("no NCCL/RCCL kernels in the traces: nothing to measure overlap for")
    table = exposure_table(ctx)
    if table.height == 0:
        raise Skip("NCCL kernels could not be placed in any profiler step")
    return in_profile(ctx, [_finding(e) for e in _exposures(ctx, table, cfg)])


@dataclass(frozen=True)
class _Exposure:
    """What was measured for one process-group type (``DP``, ``default``, or ``TP/EP/CP`` summed): the median
    rank's exposed share of the step and overlap, the ranks that count, their transfer and wait, and how the
    transfer could be estimated."""

    g: str
    severity: Severity
    med_x: float
    med_o: float
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    n_steps: int
    tx_ns_per_step: float  # the median rank's transfer per step
    exposed_ns_per_step: float  # ... and its exposed transfer per step
    wait_ns: float  # kernel time of this type that was waiting, over all ranks
    gpu_ns: float  # the counted ranks' exposed transfer
    evidence: tuple[dict, ...]
    cov: Coverage
    sized: bool  # the kernels carry their sizes
    unsplit: bool  # most kernel time could not be split into wait and transfer
    transfer_basis: str  # the facts layer's sentence on how transfer was estimated
    process_group: str | None = None  # the one group its collectives ran in, if one
    fused: bool = False  # most of the kernel time is TP communication fused with GEMMs (async TP, userbuffers)

    @property
    def by_design(self) -> bool:
        return self.g == "TP/EP/CP"


def _exposures(ctx: JobContext, table: pl.DataFrame, cfg: ExposedCommConfig) -> list[_Exposure]:
    """DP and the default group when enough steps expose their transfer; TP+EP+CP together for information."""
    n_steps = table["step"].n_unique()
    out: list[_Exposure] = []
    for g in PG_TYPES:
        if g not in ("DP", "default"):
            continue  # PP goes to pipeline_bubble; TP/EP/CP are summed below
        t = table.filter(pl.col("pg_type") == g)
        if t.height == 0:
            continue
        counts = (pl.col("X") >= cfg.dp_min_exposed) & (pl.col("O") < cfg.dp_max_overlap)
        per_rank = t.group_by("rank").agg(counts.mean().alias("share"), *_rank_sums())
        if _num(per_rank["share"].median()) < cfg.min_step_share:
            continue
        sev = Severity.CRITICAL if _num(per_rank["X"].median()) >= cfg.critical_exposed else Severity.WARNING
        out.append(_measure(ctx, g, sev, per_rank, n_steps, cfg))
    design = _design_per_rank(table, cfg)
    if design is not None and _num(design["X"].median()) >= cfg.tp_min_exposed:
        e = _measure(ctx, "TP/EP/CP", Severity.INFO, design, n_steps, cfg)
        # an overlap built to hide the transfer that does not: not by design, worth a warning
        out.append(replace(e, severity=Severity.WARNING) if e.fused else e)
    return out


# a function, not a constant: importing this module runs no Polars code (`forensics rules`, frames.Dtype)
def _rank_sums() -> tuple[pl.Expr, ...]:
    return (pl.col("X").median(), pl.col("O").median(), pl.col("exposed_ns").sum(), pl.col("tx_ns").sum(),
            pl.col("wait_ns").sum(), pl.col("step_ns").sum())


def _design_per_rank(table: pl.DataFrame, cfg: ExposedCommConfig) -> pl.DataFrame | None:
    """Per rank, TP+EP+CP summed per step (they are exposed by design together); None without them."""
    design = table.filter(pl.col("pg_type").is_in(["TP", "EP", "CP"]))
    if design.height == 0:
        return None
    per_step = design.group_by("rank", "step").agg(pl.col("exposed_ns").sum(), pl.col("step_ns").first(),
                                                   pl.col("tx_ns").sum(), pl.col("raw_exposed_ns").sum(),
                                                   pl.col("wait_ns").sum())
    per_step = per_step.with_columns((pl.col("exposed_ns") / pl.col("step_ns")).alias("X"),
                                     (1 - pl.col("raw_exposed_ns") / pl.col("tx_ns")).alias("O"))
    return per_step.group_by("rank").agg((pl.col("X") >= cfg.tp_min_exposed).mean().alias("share"), *_rank_sums())


def _measure(ctx: JobContext, g: str, sev: Severity, per_rank: pl.DataFrame, n_steps: int,
             cfg: ExposedCommConfig) -> _Exposure:
    """The exposure of group type ``g`` from its per-rank table; the ranks that count are the culprits."""
    culprits = per_rank.filter(pl.col("share") >= cfg.min_step_share)
    ranks = tuple(sorted(int(r) for r in culprits["rank"].to_list()))
    host_of = dict(ctx.steps.select("rank", "host").unique("rank").iter_rows())
    types = g.split("/")
    kern = ctx.match.kernels.filter(
        pl.col("pg_type").is_in(types) & pl.col("rank").is_in(list(ranks)) & pl.col("step").is_not_null())
    cov = coverage(ctx)
    if cov.lone_rank and sev == Severity.CRITICAL:
        sev = Severity.WARNING  # one rank's wait/transfer split is a guess: not enough for critical
    return _Exposure(
        g=g, severity=sev, med_x=_num(per_rank["X"].median()), med_o=_num(per_rank["O"].median()), ranks=ranks,
        hosts=tuple(sorted({host_of[r] for r in ranks if host_of.get(r)})), n_steps=n_steps,
        tx_ns_per_step=_num(per_rank["tx_ns"].median()) / max(1, n_steps),
        exposed_ns_per_step=_num(per_rank["exposed_ns"].median()) / max(1, n_steps),
        wait_ns=float(per_rank["wait_ns"].sum()), gpu_ns=float(culprits["exposed_ns"].sum()),
        evidence=_evidence(ctx, types, ranks), cov=cov, sized=sizes_known(kern), unsplit=_unsplit(kern),
        transfer_basis=transfer_basis(kern), process_group=_one_group(kern), fused=_mostly_fused(kern),
    )


def _evidence(ctx: JobContext, types: list[str], ranks: tuple[int, ...]) -> tuple[dict, ...]:
    """The ranks' most exposed collectives of these group types."""
    top = (
        ctx.exposure.filter(pl.col("pg_type").is_in(types) & pl.col("rank").is_in(list(ranks)))
        .sort("structural_exposed_ns", descending=True)
        .head(EVIDENCE_CAP)
    )
    return tuple(
        {"rank": int(r), "step": st, "collective": c, "bytes": b, "pg": pg, "stream": stream,
         "transfer_ms": ms(x), "exposed_ms": ms(e), "wait_ms": ms(w)}
        for r, st, c, b, pg, stream, x, e, w in top.select(
            "rank", "step", "collective", "bytes", "pg_name", "stream", "transfer_ns", "structural_exposed_ns",
            "wait_ns"
        ).iter_rows()
    )


def _finding(e: _Exposure) -> Finding:
    """The measured exposure in words, with its typed facts."""
    title, summary, remediation = _words(e)
    return Finding(
        detector="exposed_comm",
        severity=e.severity,
        title=title,
        summary=summary,
        remediation=remediation,
        ranks=e.ranks,
        hosts=e.hosts,
        metrics={
            "pg_type": e.g, "exposed_fraction": round(e.med_x, 4), "overlap_fraction": round(e.med_o, 4),
            "transfer_ms_per_step": ms(e.tx_ns_per_step), "exposed_ms_per_step": ms(e.exposed_ns_per_step),
            "ranks_affected": len(e.ranks), "steps": e.n_steps,
            **(e.cov.metrics() if e.cov.missing else {}),
        },
        evidence=e.evidence,
        gpu_seconds_lost=gpu_seconds(e.gpu_ns),
        fraction_of_step=round(e.med_x, 4),
        key=e.g,
        confidence=at_most(e.cov.confidence(e.sized), "high" if not e.by_design else "medium"),
        kind=EXPOSED_COMM.name,
        process_group=e.process_group,
    )


def _one_group(kern: pl.DataFrame) -> str | None:
    """The process group (its name) of the measured collectives, when they all ran in one."""
    names = kern["pg_name"].drop_nulls().unique()
    return str(names[0]) if names.len() == 1 else None


def _words(e: _Exposure) -> tuple[str, str, str]:
    """(title, summary, remediation) of one group type's measured exposure."""
    if e.fused:
        return (f"TP communication fused with GEMMs not hidden by them: {e.med_x:.1%} of the step",
                _fused_summary(e) + e.cov.sentence(), _REMEDY_FUSED)
    what = "exposed by design (between dependent kernels)" if e.by_design else "not overlapped with compute"
    label = "default-group" if e.g == "default" else e.g
    summary = _summary(e) + f"{_LONE if e.cov.lone_rank and not e.unsplit else ''}{e.cov.sentence()}"
    return (f"{label} collectives {what}: {e.med_x:.1%} of the step", summary,
            _REMEDY_TP if e.by_design else _REMEDY_DP)


def _fused_summary(e: _Exposure) -> str:
    """Comm-GEMM overlap (async TP's peer copies, symmetric-memory or userbuffers kernels) that did not overlap."""
    return (
        f"On the median rank, {e.med_x:.1%} of each step is TP communication fused with GEMMs (async TP's peer "
        "copies, symmetric-memory or TransformerEngine userbuffers kernels) with no compute running (overlap with "
        f"compute {e.med_o:.0%}), on {len(e.ranks)} rank(s). These transfers are built to run beside the GEMM "
        "chunks they feed or drain; each is counted whole (no peer instance splits waiting from transfer)."
    )


def _mostly_fused(kern: pl.DataFrame) -> bool:
    """Most of the kernel time is communication fused with GEMMs, built to run beside them."""
    return kern.height > 0 and float(kern.filter(pl.col("fused"))["dur_ns"].sum()) > 0.5 * float(kern["dur_ns"].sum())


def _unsplit(kern: pl.DataFrame) -> bool:
    """Most of the kernel time could not be split into wait and transfer (one rank, no sizes)."""
    unknown = float(kern.filter(pl.col("transfer_how") == UNKNOWN_SPLIT)["dur_ns"].sum())
    return kern.height > 0 and unknown > 0.5 * float(kern["dur_ns"].sum())


def _summary(e: _Exposure) -> str:
    """What was measured, and how the transfer part was estimated when collectives carry no sizes."""
    g, med_x, med_o = e.g, e.med_x, e.med_o
    if e.unsplit:
        # No peer and no size to split the kernels with: all of it runs without compute, so the step waits
        # for communication either way (transfer or waiting for the ranks without data).
        return (
            f"On the median rank, {med_x:.1%} of each step is {g} NCCL kernel time with no compute running "
            f"(overlap with compute {med_o:.0%}), on {len(e.ranks)} rank(s): exposed communication. With one rank's "
            "trace and no size metadata, the kernels cannot be split into waiting for peers and transfer, so "
            f"this counts both.{e.transfer_basis}"
        )
    return (
        f"On the median rank, {med_x:.1%} of each step is {g} transfer with no compute running "
        f"(overlap of transfer with compute {med_o:.0%}), on {len(e.ranks)} rank(s). Waiting for late peers is "
        f"not counted here ({ms(e.wait_ns)} ms of {g} kernel time in total was waiting, not transfer)."
        f"{'' if e.sized else e.transfer_basis}"
    )


_LONE = (
    " With one rank's trace, the transfer time of each collective is estimated from that rank's own kernels: "
    "what looks like exposed transfer may be waiting for peers without data."
)
_REMEDY_DP = (
    "Overlap gradient/parameter traffic with compute: DDP bucketing (bucket_cap_mb) and no stream sync before "
    "backward ends; FSDP forward_prefetch/backward_prefetch; Megatron --overlap-grad-reduce and "
    "--overlap-param-gather. Check that the collective runs on its own stream, not the compute stream."
)
_REMEDY_FUSED = (
    "The comm-GEMM overlap is not hiding the transfer: check that the copies run beside the GEMM chunks (on the "
    "backend stream, not queued after them), that each GEMM chunk is long enough to hide one shard's copy (larger "
    "micro-batches or sequence, or a smaller TP degree), and that the TP group sits inside one NVLink domain."
)
_REMEDY_TP = (
    "Expected for tensor/expert parallel traffic; to cut it, enable TP communication overlap "
    "(e.g. Megatron --tp-comm-overlap), sequence parallelism, or keep TP/EP groups inside a node (NVLink)."
)
