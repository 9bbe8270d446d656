"""What changed between a good run (BASE) and a bad one (NEW), and why NEW is slower or faster.

Each run is reduced to a :class:`RunProfile` read from its one JobContext: per profiler step, the mean over
ranks of the step breakdown's buckets (they add up to the step), of exposed and waiting communication per
process-group type and of the op categories; each kernel's time per step; its NCCL configuration (versions,
environment overrides, transports of the channels, algorithms and protocols named by the kernels); its
findings and incidents. :func:`align` pairs BASE's steps with NEW's (by step number where they share
numbers, else by order, after each run's warm-up steps); :func:`compare` takes, per aligned pair, the delta
of the step and of each part, and reports the median over the pairs with its range (min, max) and mean, so
one odd step does not drive the verdict. The parts' medians need not add up to the step's median: what they
leave is reported as its own part (``rest``); the parts' means do add up to the mean delta.

Kernels are keyed by name, NCCL kernels by their collective (``nccl allreduce``), so the two NCCL kernel
naming eras compare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics.facts.collectives import PG_TYPES, WHOLE_TRACE

if TYPE_CHECKING:
    from forensics.pipeline import Analysis

BUCKETS = ("compute", "comm_exposed", "comm_wait", "other", "idle")
"""The step breakdown's buckets (``<bucket>_ns``); they add up to ``step_ns``."""
NOISE = 0.03
"""A change of the median step smaller than this fraction is reported as no significant change."""
TOP_KERNELS = 15
WARMUP_MIN_STEPS = 3
"""By default each run's first step is warm-up, dropped, when both runs have at least this many steps."""


@dataclass
class RunProfile:
    name: str
    ranks: int
    steps: int
    per_step: pl.DataFrame
    """One row per profiler step: ``step``, ``ranks`` (ranks that have it), ``step_ms``, ``b:<bucket>``,
    ``x:<PG type>`` (exposed communication), ``w:<PG type>`` (waiting), ``c:<category>`` (kernel time):
    means over the ranks that have the step, ms."""
    kernels: pl.DataFrame
    """step, key, category, calls and ms summed over the ranks (key: kernel name, NCCL ones by collective)."""
    nccl: dict[str, list[str]]
    findings: dict[str, str]
    """Finding key (detector and title without numbers) -> title."""
    incidents: dict[str, str]
    whole_capture: bool = False
    """No profiler steps: the one "step" is the whole capture of each rank."""
    formats: list[str] = field(default_factory=list)
    """Trace formats the kernels came from (``kineto``, ``nsys``)."""
    versions: dict[str, list[str]] = field(default_factory=dict)
    """Software versions the inputs carry (CUDA runtime, driver, ...), sorted distinct values per component."""

    @property
    def step_ids(self) -> list[int]:
        return [int(s) for s in self.per_step["step"].to_list()]


@dataclass
class Alignment:
    """Which step of BASE is compared with which step of NEW."""

    how: str
    """``step number``, ``order``, ``whole capture``, or ``none`` (nothing comparable)."""
    pairs: list[tuple[int, int]]
    warmup: int
    """Steps dropped at the start of each run as warm-up."""
    dropped_base: list[int]
    """BASE's steps not compared: warm-up, or no partner in NEW."""
    dropped_new: list[int]


@dataclass
class Side:
    """One run over its compared steps: medians over those steps."""

    steps: list[int]
    step_ms: float
    buckets: dict[str, float]
    categories: dict[str, float]


@dataclass
class RunDiff:
    base: RunProfile
    new: RunProfile
    verdict: str
    delta_ms: float
    """Median over the aligned pairs of NEW's step minus BASE's, ms."""
    delta_frac: float | None
    """``delta_ms`` over BASE's median step."""
    alignment: Alignment = field(default_factory=lambda: Alignment("none", [], 0, [], []))
    spread_ms: list[float] = field(default_factory=list)
    """[min, max] of the per-pair step deltas."""
    delta_ms_mean: float = 0.0
    base_side: Side | None = None
    new_side: Side | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Per aligned pair: base_step, new_step, base_ms, new_ms, delta_ms."""
    contributors: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    nccl_changes: list[dict[str, Any]] = field(default_factory=list)
    version_changes: list[dict[str, Any]] = field(default_factory=list)
    findings: dict[str, list[str]] = field(default_factory=dict)
    incidents: dict[str, list[str]] = field(default_factory=dict)


def _per_step(analysis: Analysis) -> pl.DataFrame:
    """Per step, means over the ranks that have it (see :attr:`RunProfile.per_step`)."""
    ctx = analysis.context
    steps = ctx.steps
    if steps.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "ranks": pl.UInt32, "step_ms": pl.Float64})
    ms = [(pl.col("step_ns").cast(pl.Float64).mean() / 1e6).alias("step_ms")]
    ms += [(pl.col(f"{b}_ns").cast(pl.Float64).mean() / 1e6).alias(f"b:{b}") for b in BUCKETS]
    ms += [(pl.col(f"exposed_{g}_ns").cast(pl.Float64).mean() / 1e6).alias(f"x:{g}") for g in PG_TYPES]
    ms += [(pl.col(f"wait_{g}_ns").cast(pl.Float64).mean() / 1e6).alias(f"w:{g}") for g in PG_TYPES]
    out = steps.group_by("step").agg(pl.col("rank").n_unique().cast(pl.UInt32).alias("ranks"), *ms)
    cats = ctx.categories
    if cats.height:
        per = (cats.group_by("step", "category").agg(pl.col("time_ns").sum().cast(pl.Float64).alias("ns"))
               .join(out.select("step", "ranks"), on="step")
               .with_columns(("c:" + pl.col("category")).alias("category"),
                             (pl.col("ns") / pl.col("ranks") / 1e6).alias("ms"))
               .pivot(on="category", index="step", values="ms"))
        out = out.join(per, on="step", how="left")
    return out.with_columns(pl.col(pl.Float64).fill_null(0.0)).sort("step")


_COPY_DIRECTIONS = {"Host-to-Device": "HtoD", "Device-to-Host": "DtoH", "Device-to-Device": "DtoD",
                    "Peer-to-Peer": "PtoP", "Host-to-Host": "HtoH"}
"""Nsight Systems' copy kinds as Kineto names them (``[CUDA memcpy Host-to-Device]`` = ``Memcpy HtoD (...)``)."""


def kernel_key() -> pl.Expr:
    """What a kernel is compared by: its name; NCCL kernels by collective (``nccl allreduce``: the naming eras
    compare); copies by direction (``memcpy HtoD``) and memsets as one (Kineto and Nsight Systems name them
    differently)."""
    cls = pl.col("class").cast(pl.String)
    name = pl.col("name").cast(pl.String)  # Categorical in the frames
    direction = name.str.extract(r"(?i)memcpy\s+([A-Za-z-]+)", 1)
    direction = direction.replace(_COPY_DIRECTIONS).fill_null("?")
    return (pl.when(cls == "comm").then(pl.lit("nccl ") + pl.col("collective").fill_null("?"))
            .when(cls == "memcpy").then(pl.lit("memcpy ") + direction)
            .when(cls == "memset").then(pl.lit("memset"))
            .otherwise(name))


def short_key() -> pl.Expr:
    """:func:`kernel_key` with compute kernels by their qualified function name alone (no template arguments or
    parameters): Kineto (cxxabi) and Nsight Systems demangle those differently (``128`` / ``(int)128``,
    ``(anonymous namespace)`` / ``<unnamed>``, ``{lambda()#1}`` / ``[lambda() (instance 1)]``)."""
    name = pl.col("name").cast(pl.String)  # Categorical in the frames
    fn = (name.str.replace_all(r"\(anonymous namespace\)|<unnamed>", "anon")
          .str.replace(r"^void\s+", "").str.extract(r"^([^<(]+)", 1).str.strip_chars())
    return pl.when(pl.col("class").cast(pl.String) == "compute").then(pl.coalesce(fn, name)).otherwise(
        kernel_key())


def _kernel_steps(analysis: Analysis) -> pl.DataFrame:
    """Per step and kernel key: calls and ms summed over ranks; a kernel is in the step window it starts in."""
    ctx = analysis.context
    k = ctx.kernel_categories
    w = ctx.step_windows.select("rank", "step", "w_start", "w_end").sort("w_start")
    empty = pl.DataFrame(schema={"step": pl.Int64, "key": pl.String, "short": pl.String, "category": pl.String,
                                 "calls": pl.Float64, "ms": pl.Float64})
    if k.height == 0 or w.height == 0:
        return empty
    k = k.select(kernel_key().alias("key"), short_key().alias("short"), "category", "rank", "start_ns",
                 "end_ns").sort("start_ns")
    j = k.join_asof(w, left_on="start_ns", right_on="w_start", by="rank", strategy="backward",
                    check_sortedness=False)  # both sorted above; the check cannot run with by
    j = j.filter(pl.col("step").is_not_null() & (pl.col("start_ns") < pl.col("w_end")))
    return j.group_by("step", "key", "short").agg(
        pl.col("category").first(), pl.len().cast(pl.Float64).alias("calls"),
        ((pl.col("end_ns") - pl.col("start_ns")).sum() / 1e6).alias("ms"))


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
    versions = sorted(set(_distinct(f["ranks"], pl.col("nccl_version")))
                      | set(_distinct(f["nccl_files"], pl.col("nccl_version"))))  # the traces', then the logs' banners
    return {
        "version": versions,
        "env": _distinct(f["nccl_env"], pl.col("var") + "=" + pl.col("value")),
        "transport": _distinct(ch, transport) if "net" in ch.columns else [],
        "algorithm": _distinct(kern, pl.col("collective").fill_null("?") + " " + pl.col("name_algo")),
        "protocol": _distinct(kern, pl.col("collective").fill_null("?") + " " + pl.col("name_proto")),
        "channels": _distinct(ch.group_by("rank").agg(pl.col("channel").n_unique().alias("n")), pl.col("n")),
    }


def _finding_key(detector: str, title: str) -> str:
    return f"{detector}: {re.sub(r'[0-9][0-9.,]*', '#', title)}"


def profile(analysis: Analysis, name: str) -> RunProfile:
    steps = analysis.context.steps
    return RunProfile(
        name=name,
        ranks=steps["rank"].n_unique() if steps.height else 0,
        steps=steps["step"].n_unique() if steps.height else 0,
        per_step=_per_step(analysis),
        kernels=_kernel_steps(analysis),
        nccl=nccl_config(analysis),
        findings={_finding_key(f.detector, f.title): f.title for f in analysis.findings},
        incidents={_finding_key("incident", i.title): i.title for i in analysis.incidents},
        whole_capture=steps.height > 0 and bool((steps["step"] == WHOLE_TRACE).all()),
        formats=_formats(analysis),
        versions=software_versions(analysis.frames["ranks"]),
    )


_COMPONENTS: dict[str, tuple[str, bool]] = {
    "cuda_runtime_version": ("CUDA runtime", True), "cuda_driver_version": ("CUDA driver API", True),
    "CudaDriverVersion": ("CUDA driver API", True), "cupti_version": ("CUPTI API", False),
    "NvDriverVersion": ("NVIDIA driver", False), "OfedDriverVersion": ("OFED", False),
    "SoftwareReleaseVersion": ("Linux kernel", False), "hip_runtime_version": ("HIP runtime", False),
    "hip_driver_version": ("HIP driver", False), "roctracer_version": ("roctracer", False),
    "pytorch_version": ("PyTorch", False), "torch_version": ("PyTorch", False),
}
"""Version keys of the ranks frame -> (component, written as CUDA's integer 1000 * major + 10 * minor)."""


def _version_value(raw: str, cuda_int: bool) -> str:
    if cuda_int and raw.isdigit():
        v = int(raw)
        return f"{v // 1000}.{v % 1000 // 10}"
    return raw


def software_versions(ranks: pl.DataFrame) -> dict[str, list[str]]:
    """Component -> sorted distinct versions over the ranks (CUDA runtime and driver API, CUPTI, NVIDIA driver,
    OFED, Linux kernel, HIP, PyTorch where the inputs carry them), and the distributed backend."""
    out: dict[str, set[str]] = {}
    if "versions" in ranks.columns:
        for kv in ranks["versions"].explode().drop_nulls().unique().to_list():
            key, _, raw = str(kv).partition("=")
            name, cuda_int = _COMPONENTS.get(key, (key, False))
            out.setdefault(name, set()).add(_version_value(raw, cuda_int))
    backends = _distinct(ranks, pl.col("backend")) if "backend" in ranks.columns else []
    if backends:
        out["distributed backend"] = set(backends)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _formats(analysis: Analysis) -> list[str]:
    src = analysis.frames["sources"].filter(pl.col("status").cast(pl.String).is_in(["ok", "partial"]))
    return sorted({str(k) for k in src["kind"].cast(pl.String).to_list()} & {"kineto", "nsys"})


def align(base_steps: list[int], new_steps: list[int], warmup: int | None = None) -> Alignment:
    """Pair BASE's steps with NEW's. Each run's first ``warmup`` steps are dropped (default: 1 when both runs
    have at least :data:`WARMUP_MIN_STEPS`, else 0); the rest pair by step number where they share numbers,
    else by order. A step-less capture (step -1) compares only with another one."""
    b, n = sorted(set(base_steps)), sorted(set(new_steps))
    whole_b, whole_n = b == [WHOLE_TRACE], n == [WHOLE_TRACE]
    if whole_b or whole_n:
        pairs = [(WHOLE_TRACE, WHOLE_TRACE)] if whole_b and whole_n else []
        return Alignment("whole capture" if pairs else "none", pairs, 0, [] if pairs else b, [] if pairs else n)
    if warmup is None:
        warmup = 1 if min(len(b), len(n)) >= WARMUP_MIN_STEPS else 0
    bk, nk = b[warmup:], n[warmup:]
    common = sorted(set(bk) & set(nk))
    if common:
        how, pairs = "step number", [(s, s) for s in common]
    else:
        how, pairs = "order", list(zip(bk, nk))
    if not pairs:
        how = "none"
    used_b, used_n = {p[0] for p in pairs}, {p[1] for p in pairs}
    return Alignment(how, pairs, warmup, [s for s in b if s not in used_b], [s for s in n if s not in used_n])


_PG_NAMES = {"DP": "data-parallel", "TP": "tensor-parallel", "PP": "pipeline", "EP": "expert-parallel",
             "CP": "context-parallel", "default": "default-group"}


def _paired(base: RunProfile, new: RunProfile, al: Alignment) -> pl.DataFrame:
    """One row per aligned pair: BASE's per-step columns and NEW's (suffix ``_new``), missing ones as 0."""
    cols = sorted((set(base.per_step.columns) | set(new.per_step.columns)) - {"step", "ranks"})

    def full(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns([pl.lit(0.0).alias(c) for c in cols if c not in df.columns])

    order = pl.DataFrame({"_pair": range(len(al.pairs)), "_b": [p[0] for p in al.pairs],
                          "_n": [p[1] for p in al.pairs]},
                         schema={"_pair": pl.Int64, "_b": pl.Int64, "_n": pl.Int64})
    return (order.join(full(base.per_step), left_on="_b", right_on="step", how="left")
            .join(full(new.per_step), left_on="_n", right_on="step", how="left", suffix="_new")
            .sort("_pair").with_columns(pl.col(pl.Float64).fill_null(0.0)))


def _delta(col: str) -> pl.Expr:
    return pl.col(f"{col}_new") - pl.col(col)


def _part_exprs() -> dict[str, tuple[str, pl.Expr]]:
    """Each additive part of the step's delta: name -> (kind, per-pair delta)."""
    parts: dict[str, tuple[str, pl.Expr]] = {
        f"exposed {_PG_NAMES[g]} communication": ("comm", _delta(f"x:{g}")) for g in PG_TYPES}
    split = pl.sum_horizontal([_delta(f"x:{g}") for g in PG_TYPES])
    parts["exposed communication (not split by group)"] = ("comm", _delta("b:comm_exposed") - split)
    parts["waiting in NCCL for peers"] = ("wait", _delta("b:comm_wait"))
    parts["GPU idle"] = ("idle", _delta("b:idle"))
    parts["memcpy / memset only"] = ("other", _delta("b:other"))
    parts["compute"] = ("compute", _delta("b:compute"))
    return parts


def _stats(values: pl.Series) -> dict[str, Any]:
    v = values.cast(pl.Float64)
    return {"delta_ms": _r0(v.median()), "mean_ms": _r0(v.mean()), "spread_ms": [_r0(v.min()), _r0(v.max())]}


def _r0(v: Any) -> float:
    return round(float(v), 3) if v is not None else 0.0


def contributors(pairs: pl.DataFrame, categories: dict[str, float]) -> list[dict[str, Any]]:
    """The step's delta split into parts, largest median first; compute named by its largest category; what
    the medians leave of the step's median delta last (``rest``)."""
    exprs = _part_exprs()
    d = pairs.select([e.alias(name) for name, (_, e) in exprs.items()] + [_delta("step_ms").alias("_step")])
    parts = []
    for name, (kind, _) in exprs.items():
        st = _stats(d[name])
        if max(abs(st["delta_ms"]), *map(abs, st["spread_ms"])) < 1e-3:
            continue
        what = _compute_label(categories) if kind == "compute" else name
        parts.append({"what": what, "kind": kind, **st})
    parts.sort(key=lambda p: (-abs(p["delta_ms"]), -abs(p["mean_ms"])))
    step = _stats(d["_step"])
    rest = round(step["delta_ms"] - sum(p["delta_ms"] for p in parts), 3)
    rest_mean = round(step["mean_ms"] - sum(p["mean_ms"] for p in parts), 3)
    if abs(rest) >= 1e-3 or abs(rest_mean) >= 1e-3:
        parts.append({"what": "rest (the parts' medians do not add up to the step's)", "kind": "rest",
                      "delta_ms": rest, "mean_ms": rest_mean, "spread_ms": [rest, rest]})
    return parts


def _category_deltas(pairs: pl.DataFrame) -> dict[str, float]:
    """Median per-pair delta of each compute category's kernel time."""
    cats = [c[2:] for c in pairs.columns if c.startswith("c:") and not c.endswith("_new")]
    cats = [c for c in cats if not c.startswith("nccl") and c != "idle"]
    if not cats or pairs.height == 0:
        return {}
    row = pairs.select([_delta(f"c:{c}").median().alias(c) for c in cats]).row(0, named=True)
    return {c: float(row[c] or 0.0) for c in cats}


def _compute_label(deltas: dict[str, float]) -> str:
    if not deltas:
        return "compute"
    top = max(sorted(deltas), key=lambda c: abs(deltas[c]))
    return f"compute (mostly {top} kernels, {deltas[top]:+.1f} ms of kernel time)"


def _kernel_means(p: RunProfile, steps: list[int], by: str) -> pl.DataFrame:
    """Calls and ms per rank and step over ``steps``, per ``by`` (``key`` or ``short``) as ``key``."""
    rows = float(p.per_step.filter(pl.col("step").is_in(steps))["ranks"].sum() or 0) or 1.0
    return (p.kernels.filter(pl.col("step").is_in(steps)).group_by(pl.col(by).alias("key"))
            .agg(pl.col("category").first(), (pl.col("calls").sum() / rows).alias("calls"),
                 (pl.col("ms").sum() / rows).alias("ms")))


def kernel_changes(base: RunProfile, new: RunProfile, al: Alignment, n: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """Kernels (NCCL ones by collective) that appeared, vanished or changed over the compared steps, by
    |time per rank and step delta|; by function name alone when the runs come from different trace formats."""
    cols = ["key", "category", "calls", "ms"]
    by = "key" if base.formats == new.formats else "short"
    b = _kernel_means(base, [p[0] for p in al.pairs], by).select(cols)
    nw = _kernel_means(new, [p[1] for p in al.pairs], by).select(cols)
    j = b.join(nw, on="key", how="full", coalesce=True, suffix="_new")
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


def _side(p: RunProfile, steps: list[int]) -> Side:
    """Medians over the compared ``steps`` of one run."""
    ps = p.per_step.filter(pl.col("step").is_in(steps))
    cols = ["step_ms", *[f"b:{b}" for b in BUCKETS], *[c for c in ps.columns if c.startswith("c:")]]
    row = ps.select([pl.col(c).median() for c in cols]).row(0, named=True) if ps.height else {}
    med = {c: _r0(row.get(c)) for c in cols}
    return Side(steps, med["step_ms"], {b: med[f"b:{b}"] for b in BUCKETS},
                {c[2:]: v for c, v in sorted(med.items()) if c.startswith("c:")})


def _step_rows(pairs: pl.DataFrame) -> list[dict[str, Any]]:
    return [{"base_step": int(r["_b"]), "new_step": int(r["_n"]), "base_ms": _r0(r["step_ms"]),
             "new_ms": _r0(r["step_ms_new"]), "delta_ms": _r0(r["step_ms_new"] - r["step_ms"])}
            for r in pairs.iter_rows(named=True)]


def compare(base: RunProfile, new: RunProfile, noise: float = NOISE, warmup: int | None = None) -> RunDiff:
    """Align the steps, take the per-pair deltas, and write the verdict (see the module's doc)."""
    al = align(base.step_ids, new.step_ids, warmup)
    pairs = _paired(base, new, al)
    bs, ns = _side(base, [p[0] for p in al.pairs]), _side(new, [p[1] for p in al.pairs])
    step = _stats(pairs.select(_delta("step_ms"))["step_ms_new"]) if pairs.height else _stats(pl.Series([0.0]))
    frac = step["delta_ms"] / bs.step_ms if pairs.height and bs.step_ms > 0 else None
    d = RunDiff(base, new, "", step["delta_ms"], None if frac is None else round(frac, 4), al, step["spread_ms"],
                step["mean_ms"], bs, ns, _step_rows(pairs),
                contributors(pairs, _category_deltas(pairs)) if pairs.height else [],
                kernel_changes(base, new, al), nccl_changes(base, new), version_changes(base, new),
                _set_change(base.findings, new.findings), _set_change(base.incidents, new.incidents))
    d.verdict = verdict(d, noise)
    return d


def version_changes(base: RunProfile, new: RunProfile) -> list[dict[str, Any]]:
    """Software components whose versions differ between the runs (only where both runs report them)."""
    out = []
    for comp in sorted(set(base.versions) & set(new.versions)):
        b, n = base.versions[comp], new.versions[comp]
        if b != n:
            out.append({"component": comp, "base": b, "new": n})
    return out


def _no_comparison(d: RunDiff) -> str | None:
    if d.base.steps == 0 or d.new.steps == 0:
        return "No comparison: a run has no measured steps (no GPU kernels in steps)."
    if not d.alignment.pairs:
        return ("No comparison: one run has profiler steps and the other none (a whole capture); "
                "compare runs profiled the same way.")
    if d.delta_frac is None:
        return "No comparison: BASE's compared steps have no duration."
    return None


def _how_many(d: RunDiff) -> str:
    n = len(d.alignment.pairs)
    if d.alignment.how == "whole capture":
        return f"{d.delta_ms:+.1f} ms"
    lo, hi = d.spread_ms
    return f"{d.delta_ms:+.1f} ms, median of {n} aligned step{'s' if n != 1 else ''}, {lo:+.1f} to {hi:+.1f} ms"


def verdict(d: RunDiff, noise: float = NOISE) -> str:
    """One line: how much slower or faster per step (median over the aligned steps, with their range), the
    largest contributor, and the configuration change behind it."""
    no = _no_comparison(d)
    if no is not None:
        return no
    assert d.delta_frac is not None and d.base_side is not None and d.new_side is not None
    why, sw = _config_reason(d), _version_reason(d)
    per = "over the capture (no profiler steps)" if d.alignment.how == "whole capture" else "per step"
    if abs(d.delta_frac) < noise:
        tail = "".join(f"; {r}" for r in (why, sw) if r)
        return (f"No significant change: NEW is within {noise:.0%} of BASE {per} "
                f"({d.new_side.step_ms:.1f} ms vs {d.base_side.step_ms:.1f} ms; {_how_many(d)}){tail}.")
    word = "slower" if d.delta_ms > 0 else "faster"
    head = f"NEW is {abs(d.delta_frac):.0%} {word} {per} ({_how_many(d)})"
    causes = [c for c in d.contributors if c["kind"] != "rest"]
    if not causes:
        return head + "."
    top = causes[0]
    cause = f"{top['delta_ms']:+.1f} ms {top['what']}"
    if why and top["kind"] in ("comm", "wait"):
        return f"{head}: {why} ({cause})."
    new_incidents = d.incidents.get("appeared") or []
    extra = [sw] if sw else []
    extra += [f"new: {new_incidents[0]}"] if new_incidents else []
    return f"{head}: {cause}" + "".join(f"; {e}" for e in extra) + "."


def _version_reason(d: RunDiff) -> str | None:
    if not d.version_changes:
        return None
    return "software changed: " + ", ".join(
        f"{c['component']} {'/'.join(c['base'])} -> {'/'.join(c['new'])}" for c in d.version_changes[:3])


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
