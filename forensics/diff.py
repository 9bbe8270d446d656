"""What changed between a good run (BASE) and a bad one (NEW), and why NEW is slower or faster.

Each run is reduced to a :class:`RunProfile` read from its one JobContext: the mean over (rank, step) of
the step breakdown's buckets (they add up to the step, so their deltas add up to the step's delta), of
exposed and waiting communication per process-group type, of the op categories, and of each kernel's time;
its NCCL configuration (versions, environment overrides, transports of the channels, algorithms and
protocols named by the kernels); its findings and incidents. :func:`compare` lines them up and writes the
verdict: how much slower per step, the largest contributor, and the configuration change that explains it.

Means, not medians: only means keep the decomposition additive. Kernels are keyed by name, NCCL kernels by
their collective (``nccl allreduce``), so the two NCCL kernel naming eras compare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics.collectives import PG_TYPES, WHOLE_TRACE

if TYPE_CHECKING:
    from forensics.analyze import Analysis

BUCKETS = ("compute", "comm_exposed", "comm_wait", "other", "idle")
"""The step breakdown's buckets (``<bucket>_ns``); they add up to ``step_ns``."""
NOISE = 0.03
"""A change of the mean step smaller than this fraction is reported as no significant change."""
TOP_KERNELS = 15


@dataclass
class RunProfile:
    name: str
    ranks: int
    steps: int
    step_ms: float
    """Mean step time over (rank, step), ms."""
    buckets: dict[str, float]
    exposed: dict[str, float]
    """Mean exposed communication per PG type (DP, TP, ...), ms per step."""
    waiting: dict[str, float]
    categories: dict[str, float]
    kernels: pl.DataFrame
    """key, category, calls and ms per (rank, step), mean over the run's (rank, step) rows."""
    nccl: dict[str, list[str]]
    findings: dict[str, str]
    """Finding key (detector and title without numbers) -> title."""
    incidents: dict[str, str]
    whole_capture: bool = False
    """No profiler steps: the one "step" is the whole capture of each rank."""


@dataclass
class RunDiff:
    base: RunProfile
    new: RunProfile
    verdict: str
    delta_ms: float
    delta_frac: float | None
    contributors: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    nccl_changes: list[dict[str, Any]] = field(default_factory=list)
    findings: dict[str, list[str]] = field(default_factory=dict)
    incidents: dict[str, list[str]] = field(default_factory=dict)


def _means(steps: pl.DataFrame, cols: list[str]) -> dict[str, float]:
    if steps.height == 0:
        return dict.fromkeys(cols, 0.0)
    row = steps.select([(pl.col(c).cast(pl.Float64).mean() / 1e6).alias(c) for c in cols]).row(0, named=True)
    return {c: float(row[c] or 0.0) for c in cols}


def _kernel_table(analysis: Analysis, n_rows: int) -> pl.DataFrame:
    k = analysis.context.kernel_categories
    key = pl.when(pl.col("class") == "comm").then(pl.lit("nccl ") + pl.col("collective").fill_null("?")).otherwise(
        pl.col("name"))
    return (
        k.with_columns(key.alias("key"), (pl.col("end_ns") - pl.col("start_ns")).alias("_d"))
        .group_by("key")
        .agg(pl.col("category").first(), (pl.len() / max(n_rows, 1)).alias("calls"),
             (pl.col("_d").sum() / 1e6 / max(n_rows, 1)).alias("ms"))
    )


def _distinct(df: pl.DataFrame, expr: pl.Expr) -> list[str]:
    if df.height == 0:
        return []
    return sorted({str(v) for v in df.select(expr.alias("v"))["v"].drop_nulls().to_list()})


def nccl_config(analysis: Analysis) -> dict[str, list[str]]:
    """What NCCL was set up to do, as sorted distinct values per aspect."""
    f = analysis.frames
    ch = f["nccl_channels"]
    transport = pl.when(pl.col("net").is_not_null()).then(pl.col("transport") + "/" + pl.col("net")).otherwise(
        pl.col("transport"))
    kern = f["kernels"].filter(pl.col("class") == "comm")
    return {
        "version": _distinct(f["ranks"], pl.col("nccl_version")),
        "env": _distinct(f["nccl_env"], pl.col("var") + "=" + pl.col("value")),
        "transport": _distinct(ch, transport) if "net" in ch.columns else [],
        "algorithm": _distinct(kern, pl.col("collective").fill_null("?") + " " + pl.col("name_algo")),
        "protocol": _distinct(kern, pl.col("collective").fill_null("?") + " " + pl.col("name_proto")),
        "channels": _distinct(ch.group_by("rank").agg(pl.col("channel").n_unique().alias("n")), pl.col("n")),
    }


def _finding_key(detector: str, title: str) -> str:
    return f"{detector}: {re.sub(r'[0-9][0-9.,]*', '#', title)}"


def profile(analysis: Analysis, name: str) -> RunProfile:
    ctx = analysis.context
    steps = ctx.steps
    cats = ctx.categories
    n_rows = max(steps.height, 1)
    cat_ms = cats.group_by("category").agg((pl.col("time_ns").sum() / 1e6 / n_rows).alias("ms"))
    return RunProfile(
        name=name,
        ranks=steps["rank"].n_unique() if steps.height else 0,
        steps=steps["step"].n_unique() if steps.height else 0,
        step_ms=_means(steps, ["step_ns"])["step_ns"],
        buckets={b: v for b, v in zip(BUCKETS, _means(steps, [f"{b}_ns" for b in BUCKETS]).values())},
        exposed=dict(zip(PG_TYPES, _means(steps, [f"exposed_{g}_ns" for g in PG_TYPES]).values())),
        waiting=dict(zip(PG_TYPES, _means(steps, [f"wait_{g}_ns" for g in PG_TYPES]).values())),
        categories=dict(zip(cat_ms["category"].to_list(), cat_ms["ms"].to_list())),
        kernels=_kernel_table(analysis, n_rows),
        nccl=nccl_config(analysis),
        findings={_finding_key(f.detector, f.title): f.title for f in analysis.findings},
        incidents={_finding_key("incident", i.title): i.title for i in analysis.incidents},
        whole_capture=steps.height > 0 and bool((steps["step"] == WHOLE_TRACE).all()),
    )


_PG_NAMES = {"DP": "data-parallel", "TP": "tensor-parallel", "PP": "pipeline", "EP": "expert-parallel",
             "CP": "context-parallel", "default": "default-group"}


def contributors(base: RunProfile, new: RunProfile) -> list[dict[str, Any]]:
    """The step's delta split into additive parts, largest first; compute named by its largest category."""
    parts: list[dict[str, Any]] = []
    for g in PG_TYPES:
        parts.append(_part(f"exposed {_PG_NAMES[g]} communication", new.exposed[g] - base.exposed[g], "comm"))
    exposed_rest = (new.buckets["comm_exposed"] - base.buckets["comm_exposed"]) - sum(p["delta_ms"] for p in parts)
    parts.append(_part("exposed communication (not split by group)", exposed_rest, "comm"))
    parts.append(_part("waiting in NCCL for peers", new.buckets["comm_wait"] - base.buckets["comm_wait"], "wait"))
    parts.append(_part("GPU idle", new.buckets["idle"] - base.buckets["idle"], "idle"))
    parts.append(_part("memcpy / memset only", new.buckets["other"] - base.buckets["other"], "other"))
    parts.append(_part(_compute_label(base, new), new.buckets["compute"] - base.buckets["compute"], "compute"))
    return sorted((p for p in parts if abs(p["delta_ms"]) >= 1e-3), key=lambda p: -abs(p["delta_ms"]))


def _part(what: str, delta: float, kind: str) -> dict[str, Any]:
    return {"what": what, "kind": kind, "delta_ms": round(delta, 3)}


def _compute_label(base: RunProfile, new: RunProfile) -> str:
    compute = [c for c in set(base.categories) | set(new.categories) if not c.startswith("nccl") and c != "idle"]
    deltas = {c: new.categories.get(c, 0.0) - base.categories.get(c, 0.0) for c in compute}
    if not deltas:
        return "compute"
    top = max(deltas, key=lambda c: abs(deltas[c]))
    return f"compute (mostly {top} kernels, {deltas[top]:+.1f} ms of kernel time)"


def kernel_changes(base: RunProfile, new: RunProfile, n: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """Kernels (NCCL ones by collective) that appeared, vanished or changed, by |time per step delta|."""
    cols = ["key", "category", "calls", "ms"]
    j = base.kernels.select(cols).join(new.kernels.select(cols), on="key", how="full", coalesce=True, suffix="_new")
    j = j.with_columns(
        pl.coalesce("category", "category_new").alias("category"),
        (pl.col("ms_new").fill_null(0.0) - pl.col("ms").fill_null(0.0)).alias("delta_ms"),
        pl.when(pl.col("ms").is_null()).then(pl.lit("appeared"))
        .when(pl.col("ms_new").is_null()).then(pl.lit("vanished"))
        .otherwise(pl.lit("changed")).alias("change"),
    )
    j = j.filter(pl.col("delta_ms").abs() >= 1e-3).sort(pl.col("delta_ms").abs(), "key", descending=[True, False])
    j = j.head(n)
    return [
        {"kernel": r["key"], "category": r["category"], "change": r["change"], "base_ms": _r(r["ms"]),
         "new_ms": _r(r["ms_new"]), "delta_ms": _r(r["delta_ms"]), "base_calls": _r(r["calls"]),
         "new_calls": _r(r["calls_new"])}
        for r in j.iter_rows(named=True)
    ]


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 3)


def nccl_changes(base: RunProfile, new: RunProfile) -> list[dict[str, Any]]:
    out = []
    for aspect in base.nccl:
        b, n = base.nccl[aspect], new.nccl[aspect]
        if b != n:
            out.append({"aspect": aspect, "base": b, "new": n,
                        "removed": sorted(set(b) - set(n)), "added": sorted(set(n) - set(b))})
    return out


def _set_change(base: dict[str, str], new: dict[str, str]) -> dict[str, list[str]]:
    return {"appeared": [new[k] for k in sorted(set(new) - set(base))],
            "resolved": [base[k] for k in sorted(set(base) - set(new))]}


def compare(base: RunProfile, new: RunProfile, noise: float = NOISE) -> RunDiff:
    delta = new.step_ms - base.step_ms
    frac = delta / base.step_ms if base.step_ms > 0 else None
    d = RunDiff(base, new, "", round(delta, 3), None if frac is None else round(frac, 4),
                contributors(base, new), kernel_changes(base, new), nccl_changes(base, new),
                _set_change(base.findings, new.findings), _set_change(base.incidents, new.incidents))
    d.verdict = verdict(d, noise)
    return d


def verdict(d: RunDiff, noise: float = NOISE) -> str:
    """One line: how much slower or faster per step, the largest contributor, and the change behind it."""
    if d.delta_frac is None or d.base.steps == 0 or d.new.steps == 0:
        return "No comparison: a run has no measured steps (no GPU kernels in steps)."
    why = _config_reason(d)
    per = "over the capture (no profiler steps)" if d.base.whole_capture or d.new.whole_capture else "per step"
    if abs(d.delta_frac) < noise:
        tail = f"; {why}" if why else ""
        return (f"No significant change: NEW is within {noise:.0%} of BASE {per} "
                f"({d.new.step_ms:.1f} ms vs {d.base.step_ms:.1f} ms){tail}.")
    word = "slower" if d.delta_ms > 0 else "faster"
    head = f"NEW is {abs(d.delta_frac):.0%} {word} {per} ({d.delta_ms:+.1f} ms)"
    if not d.contributors:
        return head + "."
    top = d.contributors[0]
    cause = f"{top['delta_ms']:+.1f} ms {top['what']}"
    if why and top["kind"] in ("comm", "wait"):
        return f"{head}: {why} ({cause})."
    new_incidents = d.incidents.get("appeared") or []
    return f"{head}: {cause}" + (f"; new: {new_incidents[0]}." if new_incidents else ".")


def _config_reason(d: RunDiff) -> str | None:
    by = {c["aspect"]: c for c in d.nccl_changes}
    if "transport" in by:
        c = by["transport"]
        return f"NCCL traffic now runs over {', '.join(c['added']) or 'fewer transports'} " \
               f"instead of {', '.join(c['removed']) or 'the same transports'}"
    for aspect in ("env", "algorithm", "protocol", "version", "channels"):
        if aspect in by:
            c = by[aspect]
            return f"NCCL {aspect} changed: {', '.join(c['removed']) or '-'} -> {', '.join(c['added']) or '-'}"
    return None
