"""Straggler ranks and nodes: the ranks that make the others wait.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import polars as pl

from forensics.base.findings import Finding, FindingKind, Role, Severity
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.detectors._step_metrics import EVIDENCE_CAP, gpu_seconds, in_profile, ms, require_steps
from forensics.facts.context import JobContext
from forensics.facts.coverage import Coverage, at_most, coverage, gpus_of


@dataclass(frozen=True)
class StragglerConfig:
    """Thresholds of the straggler tests (compute, host, arrival, stage) and of its severity."""

    compute_rho: float = setting(0.95, unit="ratio", low=0.0, high=1.0,
                                 doc="a step is slow when median(peers' compute) / own compute is at or below this")
    min_step_share: float = setting(0.5, unit="fraction of steps", low=0.0, high=1.0,
                                    doc="share of steps that must be slow (compute or host test)")
    min_z: float = setting(3.5, unit="robust z", low=0.0,
                           doc="robust z-score (0.6745 * (x - median) / MAD over peers) a rank must reach")
    host_min_excess: float = setting(0.02, unit="fraction of step", low=0.0, high=1.0,
                                     doc="host test: host-bound idle above the peers' median in a slow step")
    min_margin_us: float = setting(20.0, unit="us", low=0.0,
                                   doc="a rank 'arrived last' only if later than the next one by this much")
    max_p_value: float = setting(1e-3, unit="probability", low=0.0, high=1.0,
                                 doc="one-sided binomial p-value for a rank's last-arrival count against chance")
    min_last_share: float = setting(0.5, unit="fraction of instances", low=0.0, high=1.0,
                                    doc="arrival test: share of its instances a rank must arrive last at (and >= 3/n)")
    explain_share: float = setting(0.5, unit="fraction of lateness", low=0.0, high=1.0,
                                   doc="compute or host-bound excess must cover this share of a late arriver's "
                                       "lateness")
    host_slack_ratio: float = setting(0.5, unit="ratio", low=0.0,
                                      doc="a late arriver whose launch queue is at most this share of the job median "
                                          "is host-bound")
    stage_imbalance: float = setting(0.10, unit="fraction", low=0.0,
                                     doc="stage class: a stage's median compute at least this much above the mean of "
                                         "stages")
    min_impact: float = setting(0.03, unit="fraction of step", low=0.0, high=1.0,
                                doc="findings saving less than this share of the step are info (ByteDance's S >= 1.03)")
    critical_impact: float = setting(0.15, unit="fraction of step", low=0.0, high=1.0,
                                     doc="share of the step above which a straggler is critical")


def _num(x: object) -> float:
    """A polars scalar statistic (median, mean, max) as a float; mypy cannot narrow their union type."""
    return float(x)  # type: ignore[arg-type]


def _binom_sf(k: int, n: int, p: float) -> float:
    """P[X >= k] for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def _robust_flags(df: pl.DataFrame, value: str, cfg: StragglerConfig, slow_step: pl.Expr) -> pl.DataFrame:
    """Per rank: share of slow steps and robust z of the rank's median ``value`` within its peer class."""
    per_rank = df.group_by("rank", "peer").agg(
        slow_step.mean().alias("slow_share"), pl.col(value).median().alias("med")
    )
    med = pl.col("med").median().over("peer")
    mad = (pl.col("med") - med).abs().median().over("peer")
    z = (
        pl.when(mad > 0)
        .then(0.6745 * (pl.col("med") - med) / mad)
        .when(pl.col("med") > med)
        .then(pl.lit(float("inf")))
        .otherwise(0.0)
    )
    return per_rank.with_columns(z.alias("z"), med.alias("peer_med"))


@dataclass(frozen=True)
class _Scores:
    """Per-rank test results: compute and host scores (``_robust_flags`` rows plus the median rho /
    host excess), arrival counts, and the matched NCCL kernels they came from."""

    comp: pl.DataFrame
    host: pl.DataFrame
    arrivals: pl.DataFrame
    mk: pl.DataFrame


def _peer_steps(ctx: JobContext, steps: pl.DataFrame) -> pl.DataFrame:
    """Steps with the peer class (pipeline stage, 0 without PP), rho and host-bound excess per step."""
    s = steps.join(ctx.stages.select("rank", "pp_stage"), on="rank", how="left").with_columns(
        pl.col("pp_stage").fill_null(0).alias("peer")
    )
    return s.with_columns(
        (pl.col("compute_ns").median().over("peer", "step") / pl.col("compute_ns")).alias("rho"),
        (pl.col("host_bound_ns") - pl.col("host_bound_ns").median().over("peer", "step")).alias("host_excess"),
    )


def _scores(ctx: JobContext, s: pl.DataFrame, cfg: StragglerConfig) -> _Scores:
    """Compute and host scores (peers = same pipeline stage) and arrival counts per rank."""
    comp = _robust_flags(s, "compute_ns", cfg, (pl.col("rho") <= cfg.compute_rho).cast(pl.Float64))
    comp = comp.join(s.group_by("rank").agg(pl.col("rho").median()), on="rank")
    host = _robust_flags(
        s, "host_bound_ns", cfg, (pl.col("host_excess") >= cfg.host_min_excess * pl.col("step_ns")).cast(pl.Float64)
    )
    host = host.join(s.group_by("rank").agg(pl.col("host_excess").median()), on="rank")
    mk = ctx.match.kernels.filter(pl.col("matched"))
    return _Scores(comp=comp, host=host, arrivals=_arrivals(ctx, mk, cfg), mk=mk)


def _arrivals(ctx: JobContext, mk: pl.DataFrame, cfg: StragglerConfig) -> pl.DataFrame:
    """Per rank: instances, times arrived last by the margin, share, and the binomial p-value of that count."""
    margin_ns = cfg.min_margin_us * 1e3
    arrivals = mk.group_by("rank").agg(
        pl.len().alias("n_inst"),
        (pl.col("is_last") & (pl.col("margin_ns") >= margin_ns)).sum().alias("n_last"),
        pl.col("pg_key").first(),
    )
    sizes = ctx.match.instances.group_by("pg_key").agg(pl.col("n_ranks").max())
    arrivals = arrivals.join(sizes, on="pg_key", how="left")
    p_vals = [
        _binom_sf(int(k), int(n), 1.0 / max(2, int(g)))
        for k, n, g in arrivals.select("n_last", "n_inst", "n_ranks").iter_rows()
    ]
    return arrivals.with_columns(
        pl.Series("p_value", p_vals, dtype=pl.Float64),
        (pl.col("n_last") / pl.col("n_inst")).alias("last_share"),
    )


def _flagged(df: pl.DataFrame, cfg: StragglerConfig) -> list[int]:
    """Ranks whose score is slow in enough steps and far enough from their peers."""
    return df.filter((pl.col("slow_share") >= cfg.min_step_share) & (pl.col("z") >= cfg.min_z))["rank"].to_list()


def _late_classes(s: pl.DataFrame, sc: _Scores, cfg: StragglerConfig) -> dict[int, str]:
    """Class of each rank that passes the arrival test: whichever excess explains its lateness."""
    arr = sc.arrivals
    late = arr.filter(
        (pl.col("last_share") >= pl.max_horizontal(pl.lit(cfg.min_last_share), 3.0 / pl.col("n_ranks")))
        & (pl.col("p_value") < cfg.max_p_value)
    )["rank"].to_list()
    margin_ns = cfg.min_margin_us * 1e3
    comp_ex = dict(
        s.with_columns((pl.col("compute_ns") - pl.col("compute_ns").median().over("peer", "step")).alias("_ex"))
        .group_by("rank")
        .agg(pl.col("_ex").clip(lower_bound=0).median())
        .iter_rows()
    )
    host_ex = dict(sc.host.select("rank", pl.col("host_excess").clip(lower_bound=0)).iter_rows())
    lateness = dict(
        sc.mk.filter(pl.col("is_last") & (pl.col("margin_ns") >= margin_ns))
        .group_by("rank", "step").agg(pl.col("margin_ns").max())
        .group_by("rank").agg(pl.col("margin_ns").median()).iter_rows()
    )
    # How far ahead of the GPU the host runs when it launches collectives: a host-bound rank has
    # little or no launch queue left, a GPU-bound one a long one.
    slack = sc.mk.filter(pl.col("launch_ns").is_not_null()).group_by("rank").agg(
        (pl.col("start_ns") - pl.col("launch_ns")).median().alias("slack")
    )
    slack = slack.with_columns((pl.col("slack") / pl.col("slack").median()).alias("slack_ratio"))
    slack_d = dict(slack.select("rank", "slack_ratio").iter_rows())
    classes: dict[int, str] = {}
    for r in late:
        ec, eh, lt = comp_ex.get(r, 0.0) or 0.0, host_ex.get(r, 0.0) or 0.0, lateness.get(r, 0.0) or 0.0
        sr = slack_d.get(r)
        if lt > 0 and ec >= cfg.explain_share * lt and ec >= eh:
            classes[r] = "compute"
        elif (lt > 0 and eh >= cfg.explain_share * lt) or (sr is not None and sr <= cfg.host_slack_ratio):
            classes[r] = "host"
        else:
            classes[r] = "late_arrival"
    return classes


def _classify(s: pl.DataFrame, sc: _Scores, cfg: StragglerConfig) -> dict[int, str]:
    """Culprit rank -> class; the compute test wins over the host test, which wins over lateness alone."""
    classes = _late_classes(s, sc, cfg)
    classes.update({r: "host" for r in _flagged(sc.host, cfg)})
    classes.update({r: "compute" for r in _flagged(sc.comp, cfg)})
    # A culprit makes others wait; a rank that itself waits more than the typical member of its groups
    # is a victim whatever its kernels look like (e.g. it simply has more work that others wait out).
    waits = sc.mk.group_by("rank").agg(pl.col("wait_ns").sum())
    if waits.height:
        med_wait = _num(waits["wait_ns"].median())
        victims_like = set(waits.filter(pl.col("wait_ns") > med_wait)["rank"].to_list())
        classes = {r: c for r, c in classes.items() if r not in victims_like}
    return classes


def _by_node(classes: dict[int, str], host_of: dict[int, str | None]) -> list[tuple[str | None, str, list[int]]]:
    """Culprits grouped by (host, class); ranks on an unknown host are never rolled up into a "node"."""
    by_node: dict[tuple[str | None, str], list[int]] = {}
    for r, c in sorted(classes.items()):
        h = host_of.get(r)
        by_node.setdefault((h, c) if h else (f"?{r}", c), []).append(r)
    return [(h, c, rs) for (h, c), rs in sorted(by_node.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))]


@dataclass(frozen=True)
class _Job:
    """Job-wide numbers every straggler finding is scaled by."""

    host_of: dict[int, str | None]
    step_med: float
    n_steps: int
    n_ranks: int
    cov: Coverage
    gpu_of: dict[int, str]


SLOW_RANK = FindingKind(
    "slow_rank", "a rank (or a node's ranks, or a pipeline stage) that makes its peers wait at collectives",
    Role.SLOWDOWN, "Find why that rank is slow (its GPU, its host, its input pipeline) and fix or drain it.")


DOC = DetectorDoc(
    summary=(
        "Straggler ranks and nodes: the ranks that make the others wait."
    ),
    detects=(
        "Ranks (and nodes, when two or more of a node's ranks are implicated) whose lateness makes the rest "
        "of the job wait at collectives, classed as ``compute`` (its GPU kernels run slower than its peers'),"
        " ``host`` (its GPU sat idle waiting for the CPU to launch work) or ``stage`` (a whole pipeline stage"
        " does more compute than the others). The ranks that waited are the victims: they are listed in the "
        "evidence, never as culprits. Slow network links are the ``slow_link`` detector's."
    ),
    matters=(
        "A synchronous job runs at the pace of its slowest rank. One GPU 10% slow among 512 costs the other "
        "511 GPUs 10% of their time, and every one of them looks \"100% utilized\" while it waits."
    ),
    measures=(
        "Compute score per rank and step, nvidia-resiliency-ext style, on compute kernels only (NCCL kernels "
        "are mostly waiting and are never scored): ``rho = median(peers' compute) / own compute``, peers = "
        "ranks of the same pipeline stage. A rank is a compute straggler when ``rho <= compute_rho`` in at "
        "least ``min_step_share`` of the steps and its robust z-score (median/MAD over peers) is at least "
        "``min_z``. Host: the same test on host-bound idle time (GPU idle before a kernel whose launch began "
        "after the GPU went idle). A rank that waits at collectives more than the median member is a victim, "
        "never a culprit. Arrival: from the matched collectives (:mod:`forensics.facts.collectives`), the "
        "share of instances where the rank arrived last (least wait) by a margin of at least "
        "``min_margin_us``, tested against chance (one-sided binomial, ``max_p_value``). Stage: median "
        "compute per pipeline stage at least ``stage_imbalance`` above the mean of stages. A late arriver "
        "that passes neither test on its own is classed by whichever excess (compute or host-bound idle) "
        "explains at least ``explain_share`` of its lateness margin, or as host when its launch queue (NCCL "
        "kernel start minus its launch call) is at most ``host_slack_ratio`` of the job's median: its CPU "
        "barely keeps ahead of its GPU, so its collectives are issued late. Impact (GPU-seconds lost): had "
        "the culprits arrived with the latest other member, every other member would have waited that much "
        "less; per step the largest such saving (waits at successive collectives overlap in time), times the "
        "other members, summed over steps. Findings below ``min_impact`` of a step are reported as ``info``. "
        "A rank finding names the culprits' hosts and GPUs (PCI bus id through the NCCL init lines, when the "
        "job has them). Only ranks with data can be culprits; the ranks the job has without data are in the "
        "metrics, and confidence (high for the compute and host classes, low for an unclassified late "
        "arrival) drops to medium with at least half of the ranks or a single step, low below that."
    ),
    todo=(
        "Compute: check the GPU (clocks, power, temperature, Xid/ECC lines in the kernel log; run a burn-in),"
        " and drain the node if it persists. Host: look for data-loader stalls, garbage collection, CPU "
        "contention or a slow file system on that host (py-spy, the CPU side of the trace). Stage: rebalance "
        "layers across pipeline stages."
    ),
)


@detector("straggler", doc=DOC, settings=StragglerConfig, requires=("kernels",), kinds=(SLOW_RANK,),
          view="rank-step-heatmap")
def detect(ctx: JobContext, cfg: StragglerConfig) -> list[Finding]:
    steps = require_steps(ctx)
    ranks = steps["rank"].unique()
    if ranks.len() < 2:
        raise Skip("only one rank in the traces: a straggler needs peers to compare with")
    s = _peer_steps(ctx, steps)
    sc = _scores(ctx, s, cfg)
    classes = _classify(s, sc, cfg)
    job = _Job(
        host_of=dict(steps.select("rank", "host").unique("rank").iter_rows()),
        step_med=_num(s["step_ns"].median()),
        n_steps=s["step"].n_unique(),
        n_ranks=ranks.len(),
        cov=coverage(ctx),
        gpu_of=gpus_of(ctx, classes),
    )
    findings = [_rank_finding(_measure(c, rs, sc, job, cfg)) for _, c, rs in _by_node(classes, job.host_of)]
    extra = _stages(s, cfg)
    # Confidence from the evidence (forensics.base.confidence): never above what the ranks and steps support.
    return in_profile(ctx, findings + [replace(f, confidence=at_most(f.confidence, job.cov.confidence()))
                                       for f in extra])


def _rows(df: pl.DataFrame) -> dict[int, dict]:
    return {row["rank"]: row for row in df.iter_rows(named=True)}


def _rank_evidence(rs: list[int], c: str, sc: _Scores, vic: pl.DataFrame, host_of: dict,
                   gpu_of: dict[int, str]) -> list[dict]:
    """The culprits with their scores, then the victims with how long they waited."""
    comp_d, host_d, arr_d = _rows(sc.comp), _rows(sc.host), _rows(sc.arrivals)
    evidence: list[dict] = []
    for r in rs[:EVIDENCE_CAP]:
        evidence.append({
            "role": "culprit", "rank": r, "host": host_of.get(r), "gpu": gpu_of.get(r), "class": c,
            "compute_ms": ms(comp_d.get(r, {}).get("med")), "peer_compute_ms": ms(comp_d.get(r, {}).get("peer_med")),
            "rho": round(float(comp_d.get(r, {}).get("rho") or float("nan")), 4),
            "host_bound_excess_ms": ms(host_d.get(r, {}).get("host_excess")),
            "arrived_last": int(arr_d.get(r, {}).get("n_last") or 0),
            "collectives": int(arr_d.get(r, {}).get("n_inst") or 0),
        })
    for vr, w in vic.head(max(0, EVIDENCE_CAP - len(evidence))).iter_rows():
        evidence.append({"role": "victim", "rank": vr, "host": host_of.get(vr), "waited_ms": ms(w)})
    return evidence


@dataclass(frozen=True)
class _Straggler:
    """One measured straggler: the culprit ranks ``ranks`` of class ``cls`` (a node's when there are several),
    the first culprit's scores against its peers, whom they made wait and what removing them would save."""

    cls: str
    ranks: tuple[int, ...]
    host: str | None
    severity: Severity
    compute_ns: float | None  # the first culprit's median compute per step ...
    peer_compute_ns: float | None  # ... its peers' median ...
    host_excess_ns: float | None  # ... and its host-bound idle above its peers
    rho: float
    z: float
    last_share: float
    p_value: float
    arrived_last: int  # collectives the culprits arrived last at
    saving_ns: float  # per step
    frac: float  # the saving's share of the median step
    gpu_ns: float  # GPU time lost by the others
    victims: tuple[int, ...]  # most waiting first
    evidence: tuple[dict, ...]
    job: _Job

    @property
    def node(self) -> bool:
        return len(self.ranks) >= 2


def _measure(c: str, rs: list[int], sc: _Scores, job: _Job, cfg: StragglerConfig) -> _Straggler:
    """The culprit ranks ``rs`` of class ``c``: their scores, victims and saving."""
    comp_d, host_d, arr_d = _rows(sc.comp), _rows(sc.host), _rows(sc.arrivals)
    gpu_ns, wall_ns, vic = _impact(sc.mk, rs)
    wall_ns /= max(1, job.n_steps)
    if c != "late_arrival" and wall_ns == 0:
        # Slower but nobody waited for it (e.g. its lateness is hidden): extra compute is the bound.
        ex = [max(0.0, comp_d[r]["med"] - comp_d[r]["peer_med"]) if c == "compute" else host_d[r]["host_excess"]
              for r in rs]
        wall_ns = max(ex)
    frac = wall_ns / job.step_med if job.step_med else 0.0
    r0 = rs[0]
    return _Straggler(
        cls=c, ranks=tuple(rs), host=job.host_of.get(r0), severity=_severity(frac, cfg),
        compute_ns=comp_d.get(r0, {}).get("med"), peer_compute_ns=comp_d.get(r0, {}).get("peer_med"),
        host_excess_ns=host_d.get(r0, {}).get("host_excess"),
        rho=float(comp_d.get(r0, {}).get("rho") or float("nan")), z=float(comp_d.get(r0, {}).get("z") or 0.0),
        last_share=float(arr_d.get(r0, {}).get("last_share") or 0.0),
        p_value=float(arr_d.get(r0, {}).get("p_value") or 1.0),
        arrived_last=sum(int(arr_d.get(r, {}).get("n_last") or 0) for r in rs), saving_ns=wall_ns, frac=frac,
        gpu_ns=gpu_ns if gpu_ns else wall_ns * job.n_steps * job.n_ranks,
        victims=tuple(int(r) for r in vic["rank"].to_list()),
        evidence=tuple(_rank_evidence(rs, c, sc, vic, job.host_of, job.gpu_of)), job=job,
    )


def _severity(frac: float, cfg: StragglerConfig) -> Severity:
    """By the share of the step that removing the straggler would save."""
    if frac >= cfg.critical_impact:
        return Severity.CRITICAL
    return Severity.WARNING if frac >= cfg.min_impact else Severity.INFO


_LABEL = {"compute": "slow GPU compute", "host": "host-bound (GPU starved by the CPU)",
          "late_arrival": "arrives last at collectives (cause not classified)"}


def _words(s: _Straggler) -> tuple[str, str, str]:
    """(title, summary, remediation) of a measured straggler."""
    who = f"node {s.host} (ranks {', '.join(map(str, s.ranks))})" if s.node else f"rank {s.ranks[0]}"
    summary = (
        f"{who} made {len(s.victims)} other rank(s) wait: arrived last at {s.arrived_last} collective(s); "
        f"compute {ms(s.compute_ns)} ms vs peers {ms(s.peer_compute_ns)} ms "
        f"per step, host-bound idle {ms(s.host_excess_ns)} ms above peers. "
        f"Removing it would save about {s.frac:.1%} of the step.{s.job.cov.sentence()}"
    )
    return f"Straggler {who}: {_LABEL[s.cls]}", summary, _REMEDY[s.cls]


def _rank_finding(s: _Straggler) -> Finding:
    """One straggler finding for the culprit ranks of one class (a node when there are several)."""
    job = s.job
    title, summary, remediation = _words(s)
    return Finding(
        detector="straggler",
        severity=s.severity,
        title=title,
        summary=summary,
        remediation=remediation,
        ranks=s.ranks,
        hosts=(s.host,) if s.host else (),
        gpus=tuple(sorted({job.gpu_of[r] for r in s.ranks if r in job.gpu_of})),
        metrics={
            "class": s.cls, "ranks_implicated": len(s.ranks), "node": s.node,
            "rho_median": round(s.rho, 4), "compute_z": s.z,
            "last_arrival_share": round(s.last_share, 4), "last_arrival_p_value": s.p_value,
            "saving_per_step_ms": ms(s.saving_ns), "victims": len(s.victims), "steps": job.n_steps,
            **job.cov.metrics(),
        },
        evidence=s.evidence,
        gpu_seconds_lost=gpu_seconds(s.gpu_ns),
        fraction_of_step=round(s.frac, 4),
        key=s.cls,
        # A late arrival without its cause classified is weak evidence; any class weakens with missing ranks.
        confidence=at_most(job.cov.confidence(), "high" if s.cls in ("compute", "host") else "low"),
        kind=SLOW_RANK.name, waited_for=s.ranks, victims=s.victims,
    )


def _impact(mk: pl.DataFrame, rs: list[int]) -> tuple[float, float, pl.DataFrame]:
    """What the culprits ``rs`` cost: had they arrived with the latest other member, every other member
    would have waited ``d_min(others) - x`` less at each instance. Returns (GPU-ns, wall-ns, victims)."""
    inside = pl.col("rank").is_in(rs)
    per = (
        mk.group_by("instance")
        .agg(
            pl.col("step").first(),
            pl.col("dur_ns").filter(~inside).min().alias("_dmin_out"),
            pl.col("transfer_ns").first().alias("_x"),
            (~inside).sum().alias("_n_out"),
            inside.any().alias("_hit"),
        )
        .filter(pl.col("_hit") & pl.col("_dmin_out").is_not_null())
        .with_columns((pl.col("_dmin_out") - pl.col("_x")).clip(lower_bound=0).alias("_saving"))
        .filter(pl.col("_saving") > 0)
    )
    # Within a step, the waits at successive collectives (e.g. DDP buckets) overlap in time: the step ends
    # late by the largest of them, not by their sum.
    per_step = per.group_by("step").agg(pl.col("_saving").max(), pl.col("_n_out").max())
    gpu = float((per_step["_saving"] * per_step["_n_out"]).sum()) if per.height else 0.0
    wall = float(per_step["_saving"].sum()) if per.height else 0.0
    victims = (
        mk.filter(~inside & pl.col("instance").is_in(per["instance"].implode()))
        .group_by("rank")
        .agg(pl.col("wait_ns").sum())
        .sort("wait_ns", descending=True)
    )
    return gpu, wall, victims


_REMEDY = {
    "compute": "Check this GPU: clocks, power and temperature (nvidia-smi -q -d PERFORMANCE), Xid/ECC lines in the "
    "kernel log; run a burn-in or DCGM diagnostic and drain the node if the slowdown persists.",
    "host": "Profile the CPU side on this host: data-loader workers, garbage collection, CPU affinity and "
    "contention, slow storage; the GPU idles until the host launches work.",
    "late_arrival": "Follow the dependency upstream: this rank arrives late without slower kernels or host "
    "stalls of its own, so it is probably waiting on another group (pipeline peer) or on I/O.",
    "stage": "Rebalance the pipeline: move layers off the slow stage (e.g. --decoder-first/last-pipeline-num-layers), "
    "or account for the embedding/loss on the first/last stage.",
}


@dataclass(frozen=True)
class _Stage:
    """The pipeline stage that computes most, against the mean of stages."""

    stage: int
    ranks: tuple[int, ...]
    compute_ns: float  # its median compute per step
    mean_ns: float  # the stages' mean of that
    sigma: float  # compute_ns / mean_ns - 1
    evidence: tuple[dict, ...]


def _stages(s: pl.DataFrame, cfg: StragglerConfig) -> list[Finding]:
    st = _slow_stage(s, cfg)
    return [] if st is None else [_stage_finding(st)]


def _slow_stage(s: pl.DataFrame, cfg: StragglerConfig) -> _Stage | None:
    """The stage computing at least ``stage_imbalance`` above the mean of stages; None without one."""
    if s["pp_stage"].null_count() == s.height or s["pp_stage"].n_unique() < 2:
        return None
    st = s.group_by("pp_stage").agg(pl.col("compute_ns").median().alias("c"),
                                    pl.col("rank").unique().sort().alias("ranks"))
    mean_c = _num(st["c"].mean())
    worst = st.sort("c", descending=True).row(0, named=True)
    sigma = worst["c"] / mean_c - 1 if mean_c else 0.0
    if sigma < cfg.stage_imbalance:
        return None
    return _Stage(stage=worst["pp_stage"], ranks=tuple(int(r) for r in worst["ranks"]), compute_ns=worst["c"],
                  mean_ns=mean_c, sigma=sigma,
                  evidence=tuple({"stage": int(a), "compute_ms": ms(b)} for a, b,
                                 _ in st.sort("pp_stage").head(EVIDENCE_CAP).iter_rows()))


def _stage_words(st: _Stage) -> tuple[str, str]:
    """(title, summary) of a slow pipeline stage."""
    return (f"Straggler: pipeline stage {st.stage} computes {st.sigma:.0%} more than the mean stage", (
        f"Stage {st.stage} (ranks {', '.join(map(str, st.ranks[:16]))}) spends "
        f"{ms(st.compute_ns)} ms per step in compute against a stage mean of {ms(st.mean_ns)} ms; the pipeline runs "
        "at its pace. Its cost is the other stages' wait for it (pipeline bubble), not counted here."
    ))


def _stage_finding(st: _Stage) -> Finding:
    title, summary = _stage_words(st)
    return Finding(
        detector="straggler",
        severity=Severity.WARNING,
        title=title,
        summary=summary,
        remediation=_REMEDY["stage"],
        ranks=st.ranks,
        metrics={"class": "stage", "stage": int(st.stage), "stage_imbalance": round(st.sigma, 4)},
        evidence=st.evidence,
        gpu_seconds_lost=None,
        fraction_of_step=None,
        key=f"stage{st.stage}",
        confidence="medium",
        kind=SLOW_RANK.name,
    )
