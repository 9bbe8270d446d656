"""Busy-wait "utilization": GPUs that look busy because NCCL kernels spin waiting for a peer.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from forensics.base.confidence import sizes_known
from forensics.base.findings import Finding, FindingKind, Role, Severity, When
from forensics.base.frames import JobFrames
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.detectors._step_metrics import EVIDENCE_CAP, gpu_seconds, ms, profiled_window, require_steps
from forensics.facts.collectives import CollectiveMatch, transfer_basis
from forensics.facts.context import JobContext
from forensics.facts.coverage import Coverage, at_most, coverage, gpus_of, rank_list
from forensics.facts.gpu_metrics import has_metric, sm_active_in_windows


@dataclass(frozen=True)
class BusyWaitConfig:
    """Thresholds of the busy-wait check (shares of the step time)."""

    min_util_any: float = setting(0.8, unit="fraction of step", low=0.0, high=1.0,
                                  doc="any-kernel active share (nvidia-smi utilization) from which a rank can be "
                                      "flagged")
    min_wait: float = setting(0.15, unit="fraction of step", low=0.0, high=1.0,
                              doc="wait fraction W that flags a rank with U_any at or above min_util_any")
    min_gap: float = setting(0.2, unit="fraction of step", low=0.0, high=1.0,
                             doc="second rule: U_any - U_compute at or above this ...")
    min_wait_share_of_gap: float = setting(0.5, unit="fraction of gap", low=0.0, high=1.0,
                                           doc="... with W at least this share of that gap ...")
    min_wait_floor: float = setting(0.05, unit="fraction of step", low=0.0, high=1.0,
                                    doc="... and W at least this share of the step")
    critical_wait: float = setting(0.4, unit="fraction of step", low=0.0, high=1.0,
                                   doc="wait fraction W above which the finding is critical")
    culprit_min_share: float = setting(0.2, unit="fraction of wait", low=0.0, high=1.0,
                                       doc="a rank with data is named as culprit when at least this share of the "
                                           "flagged ranks' wait was for it")


def waits_by_culprit(match: CollectiveMatch) -> pl.DataFrame:
    """(rank, last_rank, wait_ns, never): whom each rank's NCCL wait was for.

    A matched collective's wait is for its last arrival. In an instance some members never joined (a
    hung or dead rank), the whole wait is for the missing members, shared equally among them
    (``never`` is true on those rows).
    """
    matched = match.kernels.filter(pl.col("matched") & (pl.col("rank") != pl.col("last_rank"))).select(
        "rank", pl.col("last_rank").cast(pl.Int32), pl.col("wait_ns").cast(pl.Float64), pl.lit(False).alias("never")
    )
    if match.incomplete.height == 0:
        return matched
    missing = match.incomplete.filter(pl.col("missing_ranks").list.len() > 0).select(
        "instance_key", "missing_ranks"
    )
    never_arrived = (
        match.kernels.filter(~pl.col("matched") & pl.col("instance_key").is_not_null())
        .join(missing, on="instance_key", how="inner")
        .with_columns((pl.col("wait_ns") / pl.col("missing_ranks").list.len()).alias("wait_ns"))
        .explode("missing_ranks")
        .select("rank", pl.col("missing_ranks").cast(pl.Int32).alias("last_rank"), pl.col("wait_ns").cast(pl.Float64),
                pl.lit(True).alias("never"))
    )
    return pl.concat([matched, never_arrived], how="vertical")


def utilization_table(steps: pl.DataFrame) -> pl.DataFrame:
    """Per rank: median over steps of U_any, U_compute, U_SM and W, and total wait (ns)."""
    T = pl.col("step_ns").cast(pl.Float64)
    return (
        steps.with_columns(
            ((pl.col("step_ns") - pl.col("idle_ns")) / T).alias("u_any"),
            (pl.col("compute_ns") / T).alias("u_compute"),
            (pl.col("u_sm_ns") / T).alias("u_sm"),
            (pl.col("busy_wait_ns") / T).alias("w"),
        )
        .group_by("rank", "host")
        .agg(
            pl.col("u_any").median(), pl.col("u_compute").median(), pl.col("u_sm").median(), pl.col("w").median(),
            pl.col("busy_wait_ns").sum().alias("wait_ns"), pl.col("step").n_unique().alias("steps"),
        )
        .sort("rank")
    )


def measured_u_sm(frames: JobFrames, min_coverage: float = 0.9) -> pl.DataFrame:
    """Per rank: median over its steps of measured SM Active (fraction), from the ``gpu_metrics`` frame,
    using only steps the samples cover for at least ``min_coverage`` of their length. Empty when the
    job has no SM Active counter."""
    schema = {"rank": pl.Int32(), "u_sm_measured": pl.Float64()}
    if not has_metric(frames, "sm_active"):
        return pl.DataFrame(schema=schema)
    gpus = (
        frames["gpu_metrics"].filter(pl.col("rank").is_not_null() & pl.col("sm_active").is_not_null())
        .select("rank", "source", "device").unique().sort("source", "device").unique("rank", keep="first")
    )
    windows = frames["steps"].select("rank", "step", "start_ns", "end_ns").join(gpus, on="rank", how="inner")
    measured = sm_active_in_windows(frames, windows, "sm_active").filter(
        pl.col("sm_active_covered_ns") >= min_coverage * (pl.col("end_ns") - pl.col("start_ns"))
    )
    return measured.group_by("rank").agg(pl.col("sm_active").median().alias("u_sm_measured")).select(
        pl.col("rank").cast(pl.Int32), "u_sm_measured")


def _rank_table(ctx: JobContext) -> pl.DataFrame:
    """Per rank: utilization and wait (``utilization_table``), with measured SM Active replacing the
    blocks-per-SM estimate of U_SM where the job has it (``u_sm_source`` says which)."""
    u = utilization_table(require_steps(ctx))
    return u.join(measured_u_sm(ctx.frames), on="rank", how="left").with_columns(
        pl.when(pl.col("u_sm_measured").is_not_null()).then(pl.lit("sm_active")).otherwise(pl.lit("blocks_estimate"))
        .alias("u_sm_source"),
        pl.coalesce("u_sm_measured", "u_sm").alias("u_sm"),
    )


def _flagged(u: pl.DataFrame, cfg: BusyWaitConfig) -> pl.DataFrame:
    """Ranks that look busy while waiting: high U_any with enough wait, or a large busy-but-not-computing
    gap mostly made of wait."""
    rule1 = (pl.col("u_any") >= cfg.min_util_any) & (pl.col("w") >= cfg.min_wait)
    gap = pl.col("u_any") - pl.col("u_compute")
    rule2 = ((gap >= cfg.min_gap) & (pl.col("w") >= cfg.min_wait_share_of_gap * gap)
             & (pl.col("w") >= cfg.min_wait_floor))
    return u.filter(rule1 | rule2)


MAX_CULPRITS = 5


def _blame(match: CollectiveMatch, victims: list[int], with_data: tuple[int, ...]) -> pl.DataFrame:
    """Per waited-for rank: the wait (ns) the ``victims`` spent on it (``never_ns`` of it in collectives
    the rank never reached), its share of their wait, whether the rank has data, and how many matched
    collectives it arrived last at; most waited-for first."""
    mk = waits_by_culprit(match).filter(pl.col("rank").is_in(victims))
    last = match.kernels.filter(pl.col("is_last")).group_by(pl.col("rank").cast(pl.Int32).alias("last_rank")).agg(
        pl.len().alias("arrived_last"))
    return (
        mk.group_by("last_rank").agg(pl.col("wait_ns").sum(),
                                     pl.col("wait_ns").filter(pl.col("never")).sum().alias("never_ns"))
        .with_columns(
            (pl.col("wait_ns") / pl.col("wait_ns").sum()).alias("share"),
            pl.col("last_rank").is_in(list(with_data)).alias("has_data"),
        )
        .join(last, on="last_rank", how="left")
        .sort(["wait_ns", "last_rank"], descending=[True, False])
    )


def _main_culprit(match: CollectiveMatch, victims: list[int]) -> dict[int, tuple[int, float]]:
    """Per waiting rank: the rank it waited for most, with that wait (ns)."""
    per_pair = (
        waits_by_culprit(match).filter(pl.col("rank").is_in(victims))
        .group_by("rank", "last_rank").agg(pl.col("wait_ns").sum()).sort(["wait_ns", "last_rank"],
                                                                         descending=[True, False])
        .unique("rank", keep="first").sort("rank")
    )
    return {int(r): (int(q), w) for r, q, w in per_pair.iter_rows()}


def _victim_rows(flagged: pl.DataFrame, pair_d: dict[int, tuple[int, float]], cap: int) -> list[dict]:
    """The waiting ranks, most waiting first, with their utilization and whom they waited for."""
    return [
        {"role": "victim", "rank": int(r), "host": h, "U_any": round(a, 4), "U_compute": round(c, 4),
         "U_SM": round(sm, 4), "W": round(w, 4), "U_SM_source": src, "waited_for": pair_d.get(int(r), (None, 0))[0],
         "waited_for_ms": ms(pair_d.get(int(r), (None, 0))[1])}
        for r, h, a, c, sm, w, src in flagged.sort("w", descending=True)
        .select("rank", "host", "u_any", "u_compute", "u_sm", "w", "u_sm_source").head(cap).iter_rows()
    ]


def _culprit_rows(guilty: pl.DataFrame, host_of: dict, gpu_of: dict[int, str]) -> list[dict]:
    """The culprits: ranks with data that the waiting ranks waited for."""
    return [
        {"role": "culprit", "rank": int(r), "host": host_of.get(int(r)), "gpu": gpu_of.get(int(r)),
         "waited_for_ms": ms(w), "share_of_wait": round(float(sh), 4), "arrived_last": int(n or 0),
         "never_arrived_ms": ms(nv)}
        for r, w, sh, n, nv in guilty.select("last_rank", "wait_ns", "share", "arrived_last", "never_ns").iter_rows()
    ]


@dataclass(frozen=True)
class _Blame:
    """Whom the waiting ranks waited for: culprits with data and their share of the wait, whether that was
    mostly in collectives they never reached, the ranks without data and their share, evidence rows."""

    culprits: list[int]
    share: float
    never: bool
    absent: list[int]
    absent_share: float
    rows: list[dict]


def _who(ctx: JobContext, flagged: pl.DataFrame, cov: Coverage, min_share: float) -> _Blame:
    victims = [int(r) for r in flagged["rank"].to_list()]
    blame = _blame(ctx.match, victims, cov.with_data)
    guilty = blame.filter(pl.col("has_data") & (pl.col("share") >= min_share)).head(MAX_CULPRITS)
    # A rank without data is never blamed: the wait for it is reported, not pinned on it.
    absent = blame.filter(~pl.col("has_data"))
    culprits = [int(r) for r in guilty["last_rank"].to_list()]
    host_of = dict(ctx.steps.select("rank", "host").unique("rank").iter_rows())
    rows = _culprit_rows(guilty, host_of, gpus_of(ctx, culprits))
    absent_ranks = sorted(int(r) for r in absent["last_rank"].to_list())
    if absent_ranks:
        rows.append({"role": "no_data", "ranks": rank_list(absent_ranks),
                     "waited_for_ms": ms(float(absent["wait_ns"].sum())),
                     "share_of_wait": round(float(absent["share"].sum()), 4)})
    rows += _victim_rows(flagged, _main_culprit(ctx.match, victims), max(0, EVIDENCE_CAP - len(rows)))
    # Mostly waited out in collectives the culprits never reached (a hang), rather than arrived late at.
    never = float(guilty["never_ns"].sum()) > 0.5 * float(guilty["wait_ns"].sum())
    return _Blame(culprits=culprits, share=float(guilty["share"].sum()), never=never, absent=absent_ranks,
                  absent_share=float(absent["share"].sum()), rows=rows)


@dataclass(frozen=True)
class _BusyWait:
    """What busy_wait measured: the waiting ranks' medians of U_any, U_compute, U_SM and W, where U_SM came from,
    their total wait, whom they waited for, and how well the evidence covers the job."""

    victims: tuple[int, ...]
    u_any: float
    u_compute: float
    u_sm: float
    w: float
    sm_source: str  # sm_active, blocks_estimate or mixed
    wait_ns: float
    blame: _Blame
    cov: Coverage
    sized: bool  # the waiting ranks' collectives carry their sizes
    transfer_basis: str  # the facts layer's sentence on how transfer was estimated without sizes


def _sm_source(flagged: pl.DataFrame) -> str:
    """Where U_SM came from across the flagged ranks (``mixed`` when they differ)."""
    sources = set(flagged["u_sm_source"].to_list())
    return sources.pop() if len(sources) == 1 else "mixed"


def _measure(ctx: JobContext, flagged: pl.DataFrame, cfg: BusyWaitConfig) -> _BusyWait:
    """The flagged ranks' utilization and wait, and whom they waited for."""
    cov = coverage(ctx)
    victims = [int(r) for r in flagged["rank"].to_list()]
    med = flagged.select(pl.col("u_any", "u_compute", "u_sm", "w").median()).row(0, named=True)
    waiting = ctx.match.kernels.filter(pl.col("rank").is_in(victims) & ~pl.col("is_p2p") & pl.col("step").is_not_null())
    return _BusyWait(
        victims=tuple(victims), u_any=med["u_any"], u_compute=med["u_compute"], u_sm=med["u_sm"], w=med["w"],
        sm_source=_sm_source(flagged), wait_ns=float(flagged["wait_ns"].sum()),
        blame=_who(ctx, flagged, cov, cfg.culprit_min_share), cov=cov, sized=sizes_known(waiting),
        transfer_basis=transfer_basis(waiting),
    )


_SM_TEXT = {"sm_active": "measured SM Active", "blocks_estimate": "SM-weighted estimate"}


def _words(m: _BusyWait, min_share: float) -> tuple[str, str, str]:
    """(title, summary, remediation) of the measured busy-wait."""
    who, do = _texts(m.blame, m.cov, min_share)
    summary = (
        f"Rank(s) {rank_list(m.victims)} look {m.u_any:.0%} busy (what nvidia-smi shows), but compute runs only "
        f"{m.u_compute:.0%} of the step ({_SM_TEXT.get(m.sm_source, 'SM Active or estimate')} {m.u_sm:.0%}); "
        f"{m.w:.0%} of the step is NCCL kernels spinning while waiting, {who}. The wait is a symptom: its GPU time "
        f"is not counted here.{'' if m.sized else m.transfer_basis}{m.cov.sentence()}"
    )
    return (f"GPU utilization inflated by NCCL busy-waiting on {len(m.victims)} rank(s)", summary,
            f"Treat GPU utilization as 'some kernel was running', not as work done. {do}")


def _texts(b: _Blame, cov: Coverage, min_share: float) -> tuple[str, str]:
    """(what the waiting was for, what to do) from the evidence: culprits, ranks without data, or neither."""
    if b.culprits and b.never:
        who = (f"mostly for rank(s) {rank_list(b.culprits)} ({b.share:.0%} of the wait), which never reached the "
               "collective the others spun in")
        do = (f"Find out why rank(s) {rank_list(b.culprits)} stopped: its GPU and host logs (Xid, NCCL watchdog, "
              "process exit) around the hang.")
    elif b.culprits:
        who = (f"mostly for rank(s) {rank_list(b.culprits)} ({b.share:.0%} of the wait), which arrived last at the "
               "collectives the others spun in")
        do = f"Find out why rank(s) {rank_list(b.culprits)} arrive late (GPU speed, host stalls, data loading on it)."
    elif b.absent_share >= 0.5:
        who = (f"{b.absent_share:.0%} of it for rank(s) {rank_list(b.absent)}, which have no trace here, so the cause "
               "cannot be placed")
        do = f"Collect traces of rank(s) {rank_list(b.absent)} to see why the others wait for them."
    else:
        who = (f"spread over late ranks none of which accounts for {min_share:.0%} of it (each waiting "
               "rank's main wait is in the evidence)")
        do = "Look at the ranks in the evidence's waited_for column: none of them dominates."
    if b.culprits and b.absent_share >= min_share:
        who += f"; {b.absent_share:.0%} of it was for rank(s) {rank_list(b.absent)}, which have no trace here"
    if cov.lone_rank:
        who += ("; with one rank's trace the wait/transfer split of its collectives is estimated from its own "
                "kernels alone")
    return who, do


BUSY_WAIT = FindingKind(
    "spin_wait", "ranks whose GPUs look busy only because NCCL kernels spin while waiting for a peer",
    Role.SYMPTOM, "Treat GPU utilization as 'some kernel was running'; fix the ranks they waited for.")


DOC = DetectorDoc(
    summary=(
        "Busy-wait \"utilization\": GPUs that look busy because NCCL kernels spin waiting for a peer."
    ),
    detects=(
        "Ranks whose GPU is almost always running some kernel (what nvidia-smi / DCGM GPU_UTIL report) while "
        "a large share of that time is NCCL kernels spinning until another rank arrives, not computing."
    ),
    matters=(
        "\"99% GPU utilization\" is then a wrong reassurance: the GPU is waiting, and the time is lost to "
        "whoever it waits for. A spinning NCCL kernel occupies only a few SMs (one block per channel), so "
        "SM-level activity and power stay low while utilization reads full."
    ),
    measures=(
        "Per rank and step (interval algebra, :mod:`forensics.facts.breakdown`): ``U_any`` = time any kernel "
        "runs / step (the nvidia-smi quantity), ``U_compute`` = time compute kernels run / step, ``U_SM`` = "
        "kernel time weighted by ``min(1, blocks / SMs)`` / step, and the wait fraction ``W`` = time when "
        "only non-pipeline NCCL kernels run and they are in their waiting part (duration minus the "
        "collective's transfer time, :mod:`forensics.facts.collectives`) / step. When the job was profiled "
        "with GPU metrics (Nsight Systems ``--gpu-metrics-device``), ``U_SM`` is instead the measured SM "
        "Active over each step (:mod:`forensics.facts.gpu_metrics`), and the finding says which one it used "
        "(``U_SM_source``: ``sm_active`` or ``blocks_estimate``). Pipeline (PP) waiting is the bubble and is "
        "left to the pipeline_bubble detector. A rank is flagged when, over its steps' medians, ``U_any >= "
        "min_util_any`` and ``W >= min_wait``, or ``U_any - U_compute >= min_gap`` with ``W`` at least "
        "``min_wait_share_of_gap`` of that gap (and ``W >= min_wait_floor``). Who they waited for: each wait "
        "is charged to the instance's last-arriving rank, or shared among the members that never joined it (a"
        " hang). The finding's ``ranks`` are the culprits, not the waiting ranks: the ranks with data that at"
        " least ``culprit_min_share`` (default 20%) of the flagged ranks' wait was for (at most 5), with "
        "their host and GPU; the waiting ranks are in the metrics (``ranks_waiting``) and the evidence (role "
        "``victim``). A rank without data is never blamed: wait for ranks without a trace is reported as such"
        " (evidence role ``no_data``), and then the finding is at most a warning. Partial inputs: the ranks "
        "the job has (world size from trace metadata or NCCL init lines, process-group members) against the "
        "ranks with data are in the metrics; confidence follows the evidence "
        "(:mod:`forensics.base.confidence`): high with every rank, two steps or more and collective sizes "
        "known, medium with at least half of the ranks, low below that, and at most medium without a culprit."
        " Without size metadata the transfer of a matched collective is its shortest duration across ranks "
        "(the finding says so). A lone rank of a multi-rank job has no peer to split its collectives into "
        "wait and transfer with, so its finding is information only at low confidence; without sizes either, "
        "its collectives are not split at all (:mod:`forensics.facts.collectives`), so no wait is claimed. "
        "Impact: this is a symptom; the lost GPU time belongs to the cause (the late rank, or the pipeline "
        "bubble), so ``gpu_seconds_lost`` is left empty here and the wait is in the metrics."
    ),
    todo=(
        "Do not read GPU utilization as efficiency. Find out why the culprit rank arrives late (its GPU "
        "speed, host stalls, data loading); for a hang-like 100% at idle power, look at the rank that never "
        "joined (its GPU and host logs)."
    ),
)


@detector("busy_wait", doc=DOC, settings=BusyWaitConfig, requires=("kernels",), kinds=(BUSY_WAIT,), view="collectives")
def detect(ctx: JobContext, cfg: BusyWaitConfig) -> list[Finding]:
    require_steps(ctx)
    if ctx.match.kernels.height == 0:
        raise Skip("no NCCL/RCCL kernels in the traces: no waiting to measure")
    flagged = _flagged(_rank_table(ctx), cfg)
    if flagged.height == 0:
        return []
    return [_finding(_measure(ctx, flagged, cfg), cfg, profiled_window(ctx))]


def _finding(m: _BusyWait, cfg: BusyWaitConfig, when: When) -> Finding:
    """The measured busy-wait in words, with its typed facts."""
    b, cov = m.blame, m.cov
    title, summary, remediation = _words(m, cfg.culprit_min_share)
    return Finding(
        detector="busy_wait", severity=_severity(m.w, b, cov, cfg), title=title, summary=summary,
        remediation=remediation,
        ranks=tuple(b.culprits),
        hosts=tuple(sorted({r["host"] for r in b.rows if r["role"] == "culprit" and r["host"]})),
        gpus=tuple(sorted({r["gpu"] for r in b.rows if r["role"] == "culprit" and r["gpu"]})),
        metrics={
            "U_any": round(m.u_any, 4), "U_compute": round(m.u_compute, 4), "U_SM": round(m.u_sm, 4),
            "U_SM_source": m.sm_source,
            "wait_fraction": round(m.w, 4), "wait_gpu_seconds": gpu_seconds(m.wait_ns),
            "waited_for": rank_list(b.culprits), "waited_for_without_data": rank_list(b.absent),
            "culprit_wait_share": round(b.share, 4),
            "ranks_affected": len(m.victims), "ranks_waiting": rank_list(m.victims), "steps": cov.steps,
            **cov.metrics(),
        },
        evidence=tuple(b.rows),
        gpu_seconds_lost=None,
        fraction_of_step=round(m.w, 4),
        key="busy_wait",
        confidence=at_most(cov.confidence(m.sized), "high" if b.culprits else "medium"),
        kind=BUSY_WAIT.name, when=when, waited_for=_waited_for(b), victims=m.victims,
    )


def _waited_for(b: _Blame) -> tuple[int, ...]:
    """The culprits, and the rank each waiting rank in the evidence waited for most."""
    out = set(b.culprits)
    out |= {r["waited_for"] for r in b.rows if r["role"] == "victim" and isinstance(r.get("waited_for"), int)}
    return tuple(sorted(out))


def _severity(w: float, b: _Blame, cov: Coverage, cfg: BusyWaitConfig) -> Severity:
    """Critical by the wait, but never on ranks without data: without a culprit that has data at most a
    warning, and a lone rank's wait (its split into wait and transfer is a guess) is information."""
    if cov.lone_rank:
        return Severity.INFO
    if w >= cfg.critical_wait and b.culprits:
        return Severity.CRITICAL
    return Severity.WARNING
