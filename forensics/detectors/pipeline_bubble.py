"""Pipeline bubbles: per PP stage, time with no compute against the schedule's theory; stage imbalance.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from forensics.base.findings import Finding, FindingKind, Role, Severity
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.detectors._step_metrics import EVIDENCE_CAP, gpu_seconds, in_profile, ms, require_steps
from forensics.facts.collectives import assign_steps, effective_steps
from forensics.facts.context import JobContext
from forensics.facts.coverage import rank_list


@dataclass(frozen=True)
class PipelineBubbleConfig:
    """The pipeline schedule (inferred when 0) and the thresholds of the bubble checks."""

    microbatches: int = setting(0, unit="micro-batches", low=0,
                                doc="micro-batches per step m; 0 = infer from pipeline send/recv counts")
    chunks: int = setting(0, unit="chunks", low=0, doc="model chunks per stage v (interleaving); 0 = 1 unless inferred")
    schedule: str = setting("1f1b", choices=("1f1b", "zb-h1", "zb"),
                            doc="1f1b (also GPipe and interleaved), zb-h1, or zb (zero bubble: theory 0)")
    excess_ratio: float = setting(1.5, unit="ratio", low=0.0,
                                  doc="excess bubble: measured f_B at least this times the theory ...")
    excess_floor: float = setting(0.05, unit="fraction of step", low=0.0, high=1.0,
                                  doc="... and at least this share of the step")
    imbalance: float = setting(0.10, unit="fraction", low=0.0,
                               doc="stage imbalance max_s C_s / mean_s C_s - 1 that is flagged")
    structural: float = setting(0.30, unit="fraction of step", low=0.0, high=1.0,
                                doc="theoretical bubble share at which the configuration itself is reported (info)")
    structural_warning: float = setting(0.50, unit="fraction of step", low=0.0, high=1.0,
                                        doc="... and at which that report is a warning")
    theory_tolerance: float = setting(0.5, unit="fraction of theory", low=0.0,
                                      doc="theory above the measured bubble by more than this share of it (and by more "
                                          "than excess_floor): the schedule is uncertain and only the measured bubble "
                                          "is reported")


def _num(x: object) -> float:
    """A polars scalar statistic (median, mean, max) as a float; mypy cannot narrow their union type."""
    return float(x)  # type: ignore[arg-type]


def theory(p: int, m: int, v: int, schedule: str) -> float:
    if p <= 1 or m <= 0:
        return 0.0
    if schedule == "zb":
        return 0.0
    if schedule == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (v * m + p - 1)


def theory_formula(schedule: str) -> str:
    """The formula :func:`theory` evaluates for ``schedule``, as the summary states it."""
    return {"zb": "0", "zb-h1": "(p-1)/(3m+p-1)"}.get(schedule, "(p-1)/(v*m+p-1)")


def stage_table(ta: JobContext) -> tuple[pl.DataFrame, int]:
    """Per stage: ranks, median compute per step, measured f_B (median), bubble wait/idle; and p."""
    steps = ta.steps
    st = ta.stages
    s = steps.join(st, on="rank", how="inner").with_columns(
        (pl.col("bubble_wait_ns") + pl.col("bubble_idle_ns")).alias("_bubble")
    )
    p = int(_num(st["pp_size"].max()))
    table = (
        s.group_by("pp_stage")
        .agg(
            pl.col("rank").unique().sort().alias("ranks"),
            pl.col("compute_ns").median().alias("compute_ns"),
            (pl.col("_bubble").sum() / pl.col("step_ns").sum()).alias("f_b"),
            pl.col("bubble_wait_ns").median(),
            pl.col("bubble_idle_ns").median(),
            pl.col("step_ns").median(),
            pl.col("step").n_unique().alias("steps"),
        )
        .sort("pp_stage")
    )
    return table, p


def infer_schedule(ta: JobContext) -> tuple[int, int]:
    """(m, v) from the order of pipeline send/recv kernels per step.

    One kernel per send or receive: stage 0 sends m*v activations and receives m*v gradients, and for
    chunks after the first also receives m*(v-1) activations from the last stage and sends m*(v-1)
    gradients back: 4mv - 2m kernels. A middle stage does all four for every chunk: 4mv. So
    m = (middle - first) / 2 and v = middle / 4m when there is a middle stage; with two stages v = 1 and
    m = first / 2. Engines that batch a send and a receive into one kernel per exchange (Megatron's
    batch_isend_irecv) break these counts; they show as sends and receives that no longer pair up (or
    kernels labelled sendrecv), and then for a non-interleaved schedule m is taken from the order instead
    (:func:`microbatches_from_order`) whenever that gives a number.
    """
    k = ta.match.kernels.filter(pl.col("is_p2p") & pl.col("step").is_not_null()).join(ta.stages, on="rank")
    if k.height == 0:
        return 0, 0
    per = k.group_by("rank", "step", "pp_stage", "pp_size").agg(pl.len().alias("n"))
    by_stage = per.group_by("pp_stage", "pp_size").agg(pl.col("n").median()).sort("pp_stage")
    counts = dict(by_stage.select("pp_stage", "n").iter_rows())
    p = int(_num(by_stage["pp_size"].max()))
    first = counts.get(0)
    if not first:
        return 0, 0
    m_c, v_c = max(1, int(round(first / 2))), 1
    middle = [counts[s] for s in range(1, p - 1) if s in counts]
    consistent = True
    if middle:
        mid = sorted(middle)[len(middle) // 2]
        m_mid = int(round((mid - first) / 2))
        if m_mid >= 1:
            m_c, v_c = m_mid, max(1, int(round(mid / (4 * m_mid))))
        # one kernel per transfer gives exactly 4mv on a middle stage and as many on the last stage as on the first
        consistent = m_mid >= 1 and 4 * m_c * v_c == mid and counts.get(p - 1, first) == first
    if not _batched(k):
        return m_c, v_c
    if consistent and middle:
        return m_c, v_c  # labelled as coalesced or sendrecv, but still one transfer per kernel
    m_o = microbatches_from_order(ta, k) if v_c == 1 else 0
    # several transfers per kernel and no order to read m from (an interleaved batched schedule): unknown
    return (m_o, 1) if m_o else (0, 0)


def _batched(p2p: pl.DataFrame) -> bool:
    """Whether sends and receives share kernels: with one kernel per send or receive every stage launches
    as many sends as receives (each transfer is sent once and received once per neighbour pair in 1F1B,
    GPipe and interleaved schedules alike); a batched exchange is labelled by one side only, or as sendrecv."""
    n = p2p.group_by("collective").agg(pl.len())
    c = dict(n.iter_rows())
    return bool(c.get("sendrecv")) or c.get("send", 0) != c.get("recv", 0)


def microbatches_from_order(ta: JobContext, p2p: pl.DataFrame) -> int:
    """m on the last stage of a non-interleaved schedule: the number of runs of compute kernels, in launch
    order, that sit between two pipeline send/recv kernels. There every micro-batch's forward and
    backward run back to back between receiving its activation and sending its gradient, whether each
    transfer is its own kernel or a send and a receive share one (batched); 0 when it cannot be told."""
    last = p2p.filter(pl.col("pp_stage") == pl.col("pp_size") - 1)
    ranks = last["rank"].unique().implode()
    if last.height == 0:
        return 0
    frames = ta.frames
    launches = ta.launches.filter(pl.col("rank").is_in(ranks))
    comp = frames["kernels"].select("rank", "class", "correlation", "start_ns").filter(
        pl.col("rank").is_in(ranks) & (pl.col("class") == "compute")).join(launches, on=["rank", "correlation"],
                                                                           how="left")
    comp = assign_steps(comp.with_columns(pl.coalesce("launch_ns", "start_ns").alias("_t")), effective_steps(frames),
                        "_t")
    items = pl.concat([
        comp.select("rank", "step", "_t", pl.col("start_ns").alias("_s"), pl.lit(False).alias("_p2p")),
        last.select("rank", "step", pl.coalesce("launch_ns", "start_ns").alias("_t"), pl.col("start_ns").alias("_s"),
                    pl.lit(True).alias("_p2p")),
    ]).drop_nulls("step")
    order = ["rank", "step"]
    runs = (
        items.sort(*order, "_t", "_s")
        .with_columns(
            pl.col("_p2p").shift(1).over(order).fill_null(False).alias("_prev_p2p"),
            pl.col("_p2p").cast(pl.Int32).reverse().cum_sum().reverse().over(order).alias("_p2p_from_here"),
        )
        .filter(~pl.col("_p2p") & pl.col("_prev_p2p") & (pl.col("_p2p_from_here") > 0))
        .group_by(order).agg(pl.len().alias("runs"))
    )
    return int(round(_num(runs["runs"].median()))) if runs.height else 0


@dataclass(frozen=True)
class _Pipeline:
    """The measured stages and the schedule they are compared with."""

    table: pl.DataFrame
    p: int
    m: int
    v: int
    m_src: str
    f_star: float
    n_ranks: int
    n_steps: int
    step_ns: float
    mean_c: float
    worst: dict
    sigma: float
    common: dict
    evidence: tuple[dict, ...]


def _pipeline(ctx: JobContext, cfg: PipelineBubbleConfig) -> _Pipeline:
    """Stage table, schedule (config or inferred) and theory; Skip when there is no pipeline to measure."""
    if ctx.stages.height == 0:
        raise Skip("no pipeline-parallel process group in the traces (no PP group description or PP send/recv)")
    table, p = stage_table(ctx)
    if p < 2 or table.height < 2:
        raise Skip(f"pipeline group of size {p} with {table.height} stage(s) in the traces: no pipeline to measure")
    m_inf, v_inf = infer_schedule(ctx)
    m = cfg.microbatches or m_inf
    v = cfg.chunks or (v_inf if not cfg.microbatches else 1) or 1
    m_src = "config" if cfg.microbatches else ("inferred from send/recv counts" if m > 0 else "unknown")
    # without m the stages' compute is still compared (imbalance); the schedule's theory is not
    f_star = theory(p, m, v, cfg.schedule) if m > 0 else 0.0
    mean_c = _num(table["compute_ns"].mean())
    worst = table.sort("compute_ns", descending=True).row(0, named=True)
    sigma = worst["compute_ns"] / mean_c - 1 if mean_c else 0.0
    common = {"p": p, "m": m, "v": v, "m_source": m_src, "schedule": cfg.schedule, "f_B_theory": round(f_star, 4),
              "f_B_measured": round(_num(table["f_b"].mean()), 4), "stage_imbalance": round(sigma, 4),
              "steps": int(_num(table["steps"].max()))}
    evidence = tuple(
        {"stage": int(r["pp_stage"]), "ranks": ",".join(map(str, r["ranks"][:8])), "compute_ms": ms(r["compute_ns"]),
         "bubble_wait_ms": ms(r["bubble_wait_ns"]), "bubble_idle_ms": ms(r["bubble_idle_ns"]),
         "f_B": round(r["f_b"], 4), "f_B_theory": round(f_star, 4)}
        for r in table.head(EVIDENCE_CAP).iter_rows(named=True)
    )
    return _Pipeline(
        table=table, p=p, m=m, v=v, m_src=m_src, f_star=f_star, n_ranks=int(table["ranks"].list.len().sum()),
        n_steps=int(_num(table["steps"].max())), step_ns=_num(table["step_ns"].median()), mean_c=mean_c,
        worst=worst, sigma=sigma, common=common, evidence=evidence,
    )


PIPELINE = FindingKind(
    "pipeline", "pipeline-parallel stages idle waiting for each other (bubble, imbalance) beyond the schedule's own",
    Role.SYMPTOM, "Balance the stages and raise the number of micro-batches (or interleave) to shrink the bubble.")


DOC = DetectorDoc(
    summary=(
        "Pipeline bubbles: per PP stage, time with no compute against the schedule's theory; stage imbalance."
    ),
    detects=(
        "(1) excess bubble: a pipeline stage idles (or only waits on pipeline send/recv) much more than the "
        "schedule's theoretical bubble for the inferred p (stages), m (micro-batches) and v (chunks per "
        "stage); (2) stage imbalance: one stage computes clearly more than the others and the whole pipeline "
        "runs at its pace, naming the slow stage; (3) a structural bubble: the configuration itself (small m "
        "for p) wastes a large share of every step."
    ),
    matters=(
        "Every stage waits ``(p-1)`` micro-batch slots per step in 1F1B: ``(p-1)/(v*m+p-1)`` of the step. An "
        "unbalanced stage adds its extra time to every micro-batch of every other stage."
    ),
    measures=(
        "Stage = position of the rank in its pipeline process group (PG description naming the pipeline "
        "group); p = group size. Per rank and step (:mod:`forensics.facts.breakdown`): bubble = time with no "
        "compute kernel, no non-pipeline NCCL kernel and no copy: either only PP send/recv kernels run (they "
        "spin until the peer is ready) or nothing runs (the host-bound part is reported alongside, since a "
        "host blocked in the pipeline flush also launches late); gaps between compute kernels shorter than 10"
        " µs are launch overhead and never bubble. Per stage ``f_B = bubble / step time`` summed over its "
        "ranks and steps; the job's measured bubble is the mean over stages (P2P latency moves bubble from "
        "one stage to another; the mean is what the schedule theory predicts). Theory ``f_B* = "
        "(p-1)/(v*m+p-1)`` for 1F1B / GPipe / interleaved, ``(p-1)/(3m+p-1)`` for ZB-H1, 0 for zero-bubble "
        "schedules. m and v come from the config when set; else they are inferred from the pipeline send/recv"
        " kernels per step: ``4mv - 2m`` on the first stage, ``4mv`` on a middle stage (one kernel per send "
        "or receive); when sends and receives share kernels (batched exchanges, as Megatron's "
        "batch_isend_irecv launches one SendRecv kernel per exchange, labelled ``coalesced`` under PyTorch's "
        "coalescing manager) the counts hold only when they are consistent (exactly 4mv on a middle stage, as "
        "many on the last stage as on the first); otherwise m comes from their order instead: the "
        "runs of compute kernels between two send/recv kernels on the last stage (see "
        ":func:`infer_schedule`). When m cannot be told (no P2P kernels in steps, or several transfers per "
        "kernel in an interleaved schedule) only the stage imbalance is checked, with its saving as a lower "
        "bound ``max C - mean C`` per step. When the theory exceeds the measured bubble by more than "
        "``theory_tolerance`` of itself (and by more than ``excess_floor``), the trace does not support the "
        "schedule: the only finding is then an info one with the measured bubble, saying the schedule "
        "inference is uncertain (no structural claim). Flags: excess when a stage's ``f_B >= "
        "max(excess_floor, excess_ratio * f_B*)``; imbalance when ``max_s C_s / mean_s C_s - 1 >= imbalance``"
        " (C_s = median compute per step of stage s); structural when ``f_B* >= structural`` (info) and the "
        "measured bubble agrees. Impact: imbalance ``(max C - mean C)(m+p-1)/m`` per step, excess ``(f_B - "
        "f_B*) * step`` per step, structural ``f_B* * step``, times the ranks and the steps."
    ),
    todo=(
        "Excess: look for a slow rank or slow P2P link in the pipeline. Imbalance: move layers off the slow "
        "stage (Megatron ``--decoder-first/last-pipeline-num-layers``), account for embedding and loss on the"
        " first/last stage. Structural: raise the number of micro-batches (m >= 4p), use interleaving "
        "(``--num-layers-per-virtual-pipeline-stage``) or a zero-bubble schedule."
    ),
)


@detector("pipeline_bubble", doc=DOC, settings=PipelineBubbleConfig, requires=("kernels",), kinds=(PIPELINE,),
          view="timeline")
def detect(ctx: JobContext, cfg: PipelineBubbleConfig) -> list[Finding]:
    require_steps(ctx)
    pl_ = _pipeline(ctx, cfg)
    if pl_.m <= 0:
        if pl_.sigma >= cfg.imbalance:
            return in_profile(ctx, [_finding(_imbalance(pl_))])
        raise Skip("cannot tell the number of micro-batches (no PP send/recv kernels in steps, or several transfers "
                   "per kernel in an interleaved schedule); set pipeline_bubble.microbatches")
    bubbles: list[_Bubble] = []
    if pl_.sigma >= cfg.imbalance:
        bubbles.append(_imbalance(pl_))
    else:
        bubbles += _excess(pl_, cfg)
    measured = _num(pl_.table["f_b"].mean())
    if pl_.f_star - measured > max(cfg.excess_floor, cfg.theory_tolerance * pl_.f_star):
        bubbles.append(_uncertain(pl_, measured))
    elif pl_.f_star >= cfg.structural:
        bubbles.append(_structural(pl_, cfg))
    return in_profile(ctx, [_finding(b) for b in bubbles])


@dataclass(frozen=True)
class _Bubble:
    """One measured claim about the pipeline (``claim``: imbalance, excess, structural, or uncertain: only the
    measured bubble), with the share of the step it is about, the stages and ranks it names and what it costs."""

    claim: str
    pp: _Pipeline
    severity: Severity
    share: float  # uncertain: the measured bubble; excess: the worst stage's f_B; structural: the theory
    stages: tuple[int, ...]  # the stages it names (imbalance: the slow one; excess: those above the limit)
    ranks: tuple[int, ...]
    lost_ns: float  # GPU time lost over the ranks and steps
    fraction: float | None  # share of the step it costs
    key: str
    confidence: str
    extra: dict  # metrics beyond the schedule's (pp.common)
    saving_ns: float = 0.0  # imbalance: what balancing would save per step


def _uncertain(pp: _Pipeline, measured: float) -> _Bubble:
    """The schedule's theory claims far more bubble than the trace shows: report what was measured only."""
    return _Bubble("uncertain", pp, Severity.INFO, measured, (), (),
                   lost_ns=measured * pp.step_ns * pp.n_ranks * pp.n_steps, fraction=measured, key="measured",
                   confidence="low", extra={"schedule_uncertain": True})


def _imbalance(pp: _Pipeline) -> _Bubble:
    """The slowest stage sets the pace: every other stage waits its extra compute per micro-batch."""
    worst, p, m = pp.worst, pp.p, pp.m
    # with m unknown, (m+p-1)/m >= 1: the stage's extra compute per step is a lower bound of the saving
    delta = (worst["compute_ns"] - pp.mean_c) * ((m + p - 1) / m if m > 0 else 1.0)
    return _Bubble("imbalance", pp, Severity.WARNING, pp.sigma, (int(worst["pp_stage"]),),
                   tuple(int(r) for r in worst["ranks"]), lost_ns=delta * pp.n_ranks * pp.n_steps,
                   fraction=delta / pp.step_ns if pp.step_ns else None, key=f"imbalance-stage{worst['pp_stage']}",
                   confidence="high", extra={"slow_stage": int(worst["pp_stage"]), "saving_per_step_ms": ms(delta)},
                   saving_ns=delta)


def _excess(pp: _Pipeline, cfg: PipelineBubbleConfig) -> list[_Bubble]:
    """Balanced stages that still idle well beyond the schedule's theoretical bubble."""
    limit = max(cfg.excess_floor, cfg.excess_ratio * pp.f_star)
    bad = pp.table.filter(pl.col("f_b") >= limit)
    if bad.height == 0:
        return []
    excess = _num((bad["f_b"] - pp.f_star).max())
    return [_Bubble("excess", pp, Severity.WARNING, _num(bad["f_b"].max()), tuple(bad["pp_stage"].to_list()),
                    tuple(sorted(int(r) for rs in bad["ranks"].to_list() for r in rs)),
                    lost_ns=excess * pp.step_ns * pp.n_ranks * pp.n_steps, fraction=excess, key="excess",
                    confidence="medium", extra={})]


def _structural(pp: _Pipeline, cfg: PipelineBubbleConfig) -> _Bubble:
    """The configuration itself (few micro-batches for the stages) wastes a large share of every step."""
    f_star = pp.f_star
    return _Bubble("structural", pp, Severity.WARNING if f_star >= cfg.structural_warning else Severity.INFO, f_star,
                   (), (), lost_ns=f_star * pp.step_ns * pp.n_ranks * pp.n_steps, fraction=f_star, key="structural",
                   confidence="medium" if cfg.microbatches else "low", extra={})


def _finding(b: _Bubble) -> Finding:
    """A measured pipeline claim in words, with its typed facts."""
    title, summary = _TEXT[b.claim](b)
    return Finding(
        detector="pipeline_bubble",
        kind=PIPELINE.name,
        severity=b.severity,
        title=title,
        summary=summary,
        remediation=_REMEDY[b.claim],
        ranks=b.ranks,
        metrics={**b.pp.common, **b.extra},
        evidence=b.pp.evidence,
        gpu_seconds_lost=gpu_seconds(b.lost_ns),
        fraction_of_step=None if b.fraction is None else round(b.fraction, 4),
        key=b.key,
        confidence=b.confidence,
    )


def _uncertain_text(b: _Bubble) -> tuple[str, str]:
    pp = b.pp
    return (f"Pipeline bubble measured at {b.share:.0%} of the step; the schedule inference is uncertain", (
        f"The stages spend {b.share:.1%} of the step without compute (mean over stages), while p={pp.p}, "
        f"m={pp.m} ({pp.m_src}), v={pp.v} would give {pp.f_star:.1%}. The trace does not support that "
        "schedule (e.g. batched send/recv or interleaving read as fewer micro-batches), so the schedule "
        "inference is uncertain and only the measured bubble is reported."
    ))


def _imbalance_text(b: _Bubble) -> tuple[str, str]:
    pp = b.pp
    worst, p, m, v, f_star = pp.worst, pp.p, pp.m, pp.v, pp.f_star
    (stage,) = b.stages
    theory_text = (f"vs {f_star:.1%} in theory for p={p}, m={m}, v={v}" if m > 0 else
                   f"p={p}; the number of micro-batches could not be told, so no theory is compared")
    return (f"Pipeline stage {stage} is {b.share:.0%} slower than the mean stage", (
        f"Stage {stage} (rank(s) {rank_list(b.ranks)}) computes "
        f"{ms(worst['compute_ns'])} ms per step against a stage mean of "
        f"{ms(pp.mean_c)} ms; every other stage waits for it (measured bubble {pp.common['f_B_measured']:.1%} of "
        f"the step {theory_text}). Balancing would save {'about' if m > 0 else 'at least'} "
        f"{ms(b.saving_ns)} ms per step."
    ))


def _excess_text(b: _Bubble) -> tuple[str, str]:
    pp = b.pp
    return (f"Pipeline bubble {b.share:.0%} of the step, theory {pp.f_star:.0%}", (
        f"Stage(s) {', '.join(str(x) for x in b.stages)} spend "
        f"{b.share:.1%} of the step without compute (waiting on pipeline peers or idle), "
        f"against {pp.f_star:.1%} expected for p={pp.p}, m={pp.m} ({pp.m_src}), v={pp.v}; stages are balanced "
        f"(imbalance {pp.sigma:.1%}), so look for a straggler or slow P2P link."
    ))


def _structural_text(b: _Bubble) -> tuple[str, str]:
    pp = b.pp
    return (f"Pipeline schedule wastes {b.share:.0%} of each step by construction (p={pp.p}, m={pp.m}, v={pp.v})", (
        f"With {pp.p} stages and {pp.m} micro-batches ({pp.m_src}) the {pp.common['schedule']} bubble is "
        f"{theory_formula(pp.common['schedule'])} = {b.share:.1%} of the step on every stage "
        f"(measured {pp.common['f_B_measured']:.1%})."
    ))


_TEXT: dict[str, Callable[[_Bubble], tuple[str, str]]] = {
    "uncertain": _uncertain_text, "imbalance": _imbalance_text, "excess": _excess_text,
    "structural": _structural_text,
}


_REMEDY_IMB = (
    "Rebalance layers across pipeline stages (Megatron --decoder-first-pipeline-num-layers / "
    "--decoder-last-pipeline-num-layers, or a custom split); the first and last stages carry embedding and loss."
)
_REMEDY_EXCESS = (
    "The stages are balanced, so the extra bubble comes from elsewhere: look for a slow rank in this pipeline "
    "(a GPU or host that arrives late at its sends) and at the P2P transfer times between stages."
)
_REMEDY_UNCERTAIN = (
    "Set the schedule explicitly (pipeline_bubble.microbatches / chunks / schedule) to compare the measured "
    "bubble with its theory; if the measured bubble is large, raise the number of micro-batches or use interleaving."
)
_REMEDY_STRUCT = (
    "Raise the number of micro-batches (m >= 4p keeps the 1F1B bubble under ~20%), use interleaving "
    "(--num-layers-per-virtual-pipeline-stage) or a zero-bubble schedule."
)
_REMEDY = {"imbalance": _REMEDY_IMB, "excess": _REMEDY_EXCESS, "uncertain": _REMEDY_UNCERTAIN,
           "structural": _REMEDY_STRUCT}
