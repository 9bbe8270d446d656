"""Exposed communication: collective transfer time that compute does not hide, per process-group type.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from forensics.base.confidence import sizes_known
from forensics.base.findings import Finding, FindingKind, Role, Severity
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.detectors._step_metrics import EVIDENCE_CAP, gpu_seconds, in_profile, ms, require_steps
from forensics.facts.collectives import PG_TYPES, UNKNOWN_SPLIT, transfer_basis
from forensics.facts.context import JobContext
from forensics.facts.coverage import at_most, coverage


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
        "of the steps; TP+EP+CP together when their ``X`` reaches ``tp_min_exposed``. PP transfer belongs to "
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
    ta = ctx
    require_steps(ta)
    if ta.match.kernels.height == 0:
        raise Skip("no NCCL/RCCL kernels in the traces: nothing to measure overlap for")
    table = exposure_table(ta)
    if table.height == 0:
        raise Skip("NCCL kernels could not be placed in any profiler step")
    n_steps = table["step"].n_unique()
    findings: list[Finding] = []
    host_of = dict(ta.steps.select("rank", "host").unique("rank").iter_rows())

    for g in PG_TYPES:
        if g not in ("DP", "default"):
            continue  # PP goes to pipeline_bubble; TP/EP/CP are summed below
        t = table.filter(pl.col("pg_type") == g)
        if t.height == 0:
            continue
        counts = (pl.col("X") >= cfg.dp_min_exposed) & (pl.col("O") < cfg.dp_max_overlap)
        per_rank = t.group_by("rank").agg(
            counts.mean().alias("share"),
            pl.col("X").median(),
            pl.col("O").median(),
            pl.col("exposed_ns").sum(),
            pl.col("tx_ns").sum(),
            pl.col("wait_ns").sum(),
            pl.col("step_ns").sum(),
        )
        med_x = _num(per_rank["X"].median())
        med_o = _num(per_rank["O"].median())
        med_share = _num(per_rank["share"].median())
        if med_share < cfg.min_step_share:
            continue
        sev = Severity.CRITICAL if med_x >= cfg.critical_exposed else Severity.WARNING
        culprits = per_rank.filter(pl.col("share") >= cfg.min_step_share)
        findings.append(_finding(ta, g, sev, per_rank, culprits, med_x, med_o, n_steps, host_of, table))

    design = table.filter(pl.col("pg_type").is_in(["TP", "EP", "CP"]))
    if design.height:
        per_step = design.group_by("rank", "step").agg(pl.col("exposed_ns").sum(), pl.col("step_ns").first(),
                                                       pl.col("tx_ns").sum(), pl.col("raw_exposed_ns").sum(),
                                                       pl.col("wait_ns").sum())
        per_step = per_step.with_columns((pl.col("exposed_ns") / pl.col("step_ns")).alias("X"),
                                         (1 - pl.col("raw_exposed_ns") / pl.col("tx_ns")).alias("O"))
        per_rank = per_step.group_by("rank").agg(
            (pl.col("X") >= cfg.tp_min_exposed).mean().alias("share"), pl.col("X").median(), pl.col("O").median(),
            pl.col("exposed_ns").sum(), pl.col("tx_ns").sum(), pl.col("wait_ns").sum(), pl.col("step_ns").sum(),
        )
        med_x = _num(per_rank["X"].median())
        if med_x >= cfg.tp_min_exposed:
            culprits = per_rank.filter(pl.col("share") >= cfg.min_step_share)
            findings.append(_finding(ta, "TP/EP/CP", Severity.INFO, per_rank, culprits, med_x,
                                     _num(per_rank["O"].median()), n_steps, host_of, design))
    return in_profile(ctx, findings)


def _finding(ta: JobContext, g: str, sev: Severity, per_rank: pl.DataFrame, culprits: pl.DataFrame, med_x: float,
             med_o: float,
             n_steps: int, host_of: dict, table: pl.DataFrame) -> Finding:
    ranks = tuple(sorted(int(r) for r in culprits["rank"].to_list()))
    hosts = tuple(sorted({host_of[r] for r in ranks if host_of.get(r)}))
    gpu_ns = float(culprits["exposed_ns"].sum())
    types = g.split("/")
    top = (
        ta.exposure.filter(pl.col("pg_type").is_in(types) & pl.col("rank").is_in(list(ranks)))
        .sort("structural_exposed_ns", descending=True)
        .head(EVIDENCE_CAP)
    )
    evidence = tuple(
        {"rank": int(r), "step": st, "collective": c, "bytes": b, "pg": pg, "stream": stream,
         "transfer_ms": ms(x), "exposed_ms": ms(e), "wait_ms": ms(w)}
        for r, st, c, b, pg, stream, x, e, w in top.select(
            "rank", "step", "collective", "bytes", "pg_name", "stream", "transfer_ns", "structural_exposed_ns",
            "wait_ns"
        ).iter_rows()
    )
    by_design = g == "TP/EP/CP"
    cov = coverage(ta)
    if cov.lone_rank and sev == Severity.CRITICAL:
        sev = Severity.WARNING  # one rank's wait/transfer split is a guess: not enough for critical
    what = "exposed by design (between dependent kernels)" if by_design else "not overlapped with compute"
    label = "default-group" if g == "default" else g
    kern = ta.match.kernels.filter(
        pl.col("pg_type").is_in(types) & pl.col("rank").is_in(list(ranks)) & pl.col("step").is_not_null())
    return Finding(
        detector="exposed_comm",
        severity=sev,
        title=f"{label} collectives {what}: {med_x:.1%} of the step",
        summary=_summary(g, med_x, med_o, len(ranks), float(per_rank["wait_ns"].sum()), kern)
        + f"{_LONE if cov.lone_rank and not _unsplit(kern) else ''}{cov.sentence()}",
        remediation=_REMEDY_TP if by_design else _REMEDY_DP,
        ranks=ranks,
        hosts=hosts,
        metrics={
            "pg_type": g, "exposed_fraction": round(med_x, 4), "overlap_fraction": round(med_o, 4),
            "transfer_ms_per_step": ms(_num(per_rank["tx_ns"].median()) / max(1, n_steps)),
            "exposed_ms_per_step": ms(_num(per_rank["exposed_ns"].median()) / max(1, n_steps)),
            "ranks_affected": len(ranks), "steps": n_steps,
            **(cov.metrics() if cov.missing else {}),
        },
        evidence=evidence,
        gpu_seconds_lost=gpu_seconds(gpu_ns),
        fraction_of_step=round(med_x, 4),
        key=g,
        confidence=at_most(cov.confidence(sizes_known(kern)), "high" if not by_design else "medium"),
        kind=EXPOSED_COMM.name,
        process_group=_one_group(kern),
    )


def _one_group(kern: pl.DataFrame) -> str | None:
    """The process group (its name) of the measured collectives, when they all ran in one."""
    names = kern["pg_name"].drop_nulls().unique()
    return str(names[0]) if names.len() == 1 else None


def _unsplit(kern: pl.DataFrame) -> bool:
    """Most of the kernel time could not be split into wait and transfer (one rank, no sizes)."""
    unknown = float(kern.filter(pl.col("transfer_how") == UNKNOWN_SPLIT)["dur_ns"].sum())
    return kern.height > 0 and unknown > 0.5 * float(kern["dur_ns"].sum())


def _summary(g: str, med_x: float, med_o: float, n_ranks: int, wait_ns: float, kern: pl.DataFrame) -> str:
    """What was measured, and how the transfer part was estimated when collectives carry no sizes."""
    if _unsplit(kern):
        # No peer and no size to split the kernels with: all of it runs without compute, so the step waits
        # for communication either way (transfer or waiting for the ranks without data).
        return (
            f"On the median rank, {med_x:.1%} of each step is {g} NCCL kernel time with no compute running "
            f"(overlap with compute {med_o:.0%}), on {n_ranks} rank(s): exposed communication. With one rank's "
            "trace and no size metadata, the kernels cannot be split into waiting for peers and transfer, so "
            f"this counts both.{transfer_basis(kern)}"
        )
    return (
        f"On the median rank, {med_x:.1%} of each step is {g} transfer with no compute running "
        f"(overlap of transfer with compute {med_o:.0%}), on {n_ranks} rank(s). Waiting for late peers is "
        f"not counted here ({ms(wait_ns)} ms of {g} kernel time in total was waiting, not transfer)."
        f"{'' if sizes_known(kern) else transfer_basis(kern)}"
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
_REMEDY_TP = (
    "Expected for tensor/expert parallel traffic; to cut it, enable TP communication overlap "
    "(e.g. Megatron --tp-comm-overlap), sequence parallelism, or keep TP/EP groups inside a node (NVLink)."
)
