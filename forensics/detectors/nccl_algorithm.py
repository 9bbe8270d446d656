"""NCCL algorithm / protocol choices that cost time: user overrides, model-vs-measurement gaps.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, cast

import polars as pl

from forensics.base.findings import Finding, FindingKind, Role, Severity
from forensics.base.frames import JobFrames
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.facts import nccl_cost as nc
from forensics.facts.context import JobContext
from forensics.facts.nccl_setup import JobNccl, evidence, where

FORCING = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS", "NCCL_NTHREADS",
           "NCCL_LL_THRESHOLD", "NCCL_TREE_THRESHOLD", "NCCL_LL128_NTHREADS")
# algorithm switches only: transport switches (P2P, SHM, IB, GDR) are nccl_transport's
DISABLES = ("NCCL_NVLS_ENABLE", "NCCL_PAT_ENABLE", "NCCL_CUMEM_ENABLE")
#: Expected nccl-tests bus bandwidth on one node, largest sizes, by GPU model (first match; every GPU of the job
# : must match; PCIe cards have no NVSwitch and are not in it): (regular expression on the GPU name, GB/s, source). The
# NVSwitch H100/H200 figure is the
#: non-NVLS class (AllReduce with NVLS reaches ~480): a run below half of it is wrong whatever the algorithm.
#: Across nodes a node's NICs bound it: the sum of their speeds in NCCL's topology print (see _nic_busbw), else the
#: expectation is unknown (no guess) unless nccl_algorithm.expected_busbw_gbps gives it.
EXPECTED_BUSBW: tuple[tuple[str, float, str], ...] = (
    (r"H800(?!.*PCIe)", 215.0, "8x H800, users' nccl-tests (NVIDIA/nccl#1374)"),
    (r"(?:H100|H200)(?!.*(?:PCIe|NVL))", 370.0,
     "8x H100/H200 NVSwitch, NCCL maintainer: ~370 GB/s for non-AllReduce or "
                                "NCCL_ALGO=RING (NVIDIA/nccl-tests#212)"),
    (r"A800(?!.*PCIe)", 160.0, "8x A800, NCCL maintainer: ~160 GB/s intra-node (NVIDIA/nccl#412)"),
    (r"A100-SXM|A100 SXM", 200.0, "8x A100 SXM NVSwitch, users report 200-232 GB/s (NVIDIA/nccl-tests#149, #175)"),
)
#: Environment settings that reduce channels or bandwidth -> whether the value reduces them (named as the cause)
CHANNEL_CAPS: dict[str, Callable[[str], bool]] = {
    "NCCL_TOPO_FILE": lambda v: bool(v),
    "NCCL_P2P_LEVEL": lambda v: v.upper() not in ("SYS", "4", "5"),  # the widest level (legacy numbers 4/5)
    "NCCL_P2P_DISABLE": lambda v: v != "0",
    "NCCL_MIN_NCHANNELS": lambda v: True,
    "NCCL_MAX_NCHANNELS": lambda v: True,
    "NCCL_MIN_CTAS": lambda v: True,
    "NCCL_MAX_CTAS": lambda v: True,
    "NCCL_NCHANNELS_PER_NET_PEER": lambda v: True,
    "NCCL_BUFFSIZE": lambda v: not v.isdigit() or int(v) < (4 << 20),
    "NCCL_NVLS_ENABLE": lambda v: v == "0",
}
_ALGO_NAMES = {a.lower(): a for a in nc.ALGOS} | {"nvls_tree": "NVLSTree", "nvlstree": "NVLSTree"}
_PROTO_NAMES = {p.lower(): p for p in nc.PROTOS}


@dataclass(frozen=True)
class NcclAlgorithmConfig:
    """Thresholds of the algorithm checks."""

    min_measured_over_predicted: float = setting(3.0, unit="ratio", low=1.0,
                                                 doc="a measured time this many times NCCL's predicted time is flagged")
    min_bytes_for_gap: int = setting(1 << 20, unit="bytes", low=0,
                                     doc="... for messages at least this large (tiny ops are launch-latency bound)")
    min_busbw_cliff: float = setting(3.0, unit="ratio", low=1.0,
                                     doc="a busbw drop by this factor between adjacent nccl-tests sizes is a cliff")
    min_forced_slowdown: float = setting(1.25, unit="ratio", low=1.0,
                                         doc="model time ratio (forced / default) from which a forced choice is slower")
    expected_busbw_gbps: float = setting(0.0, unit="GB/s", low=0.0,
                                         doc="the hardware's expected nccl-tests bus bandwidth (0 = unknown, check "
                                             "off)")
    min_busbw_fraction: float = setting(0.5, unit="fraction", low=0.0, high=1.0,
                                        doc="peak busbw below this share of the expected bus bandwidth is flagged")
    min_busbw_bytes: int = setting(128 << 20, unit="bytes", low=1,
                                   doc="bus bandwidth is judged on messages at least this large (smaller ones are "
                                       "latency-bound; the expected figures are for the largest sizes)")


def _names(value: str, table: dict[str, str]) -> frozenset[str] | None:
    """NCCL_ALGO/NCCL_PROTO value -> enabled set (`^` excludes; 2.24 `func:list;...` takes the union)."""
    v = value.strip().strip('"')
    parts = [p.split(":", 1)[-1] for p in v.split(";")]
    out: set[str] = set()
    for part in parts:
        neg = part.startswith("^")
        items = {table[x.strip().lower()] for x in part.lstrip("^").split(",") if x.strip().lower() in table}
        out |= (set(table.values()) - items) if neg else items
    return frozenset(out) or None


def _comm_for(j: JobNccl, frames: JobFrames) -> nc.Comm | None:
    """A model of the job's main communicator from what the logs say, or None when too little is known."""
    if not j.nranks or not j.archs:
        return None
    arch = min(j.archs.values(), key=lambda a: nc.ARCH_INDEX[a])
    nnodes = j.nnodes or 1
    chan = frames["nccl_events"].filter(pl.col("kind") == "channels")["value"].drop_nulls()
    nch = int(cast(float, chan.max())) if chan.len() else 2
    # per-channel bandwidths are estimates unless GRAPH `Pattern` lines say (nccl.md §B.7)
    intra = {"ampere": 20.0, "hopper": 20.6, "blackwell": 40.0}.get(arch, 12.0)
    return nc.Comm(nranks=j.nranks, nnodes=nnodes, arch=arch, ring=nc.Graph(nch, intra, 12.0),
                   ll128=len(set(j.archs.values())) == 1 and nc.ARCH_INDEX[arch] >= 1)


_COLL = {"allreduce": "AllReduce", "allgather": "AllGather", "reduce_scatter": "ReduceScatter",
         "broadcast": "Broadcast", "reduce": "Reduce"}


def _traced_collectives(frames: JobFrames) -> pl.DataFrame:
    """Transfer time of every matched traced collective: the minimum kernel duration across its ranks (µs)."""
    # only the columns read: a filter copies every list value it keeps (the rank lists are the square of the ranks)
    k = frames["kernels"].select("class", "pg_name", "seq", "collective", "bytes", "start_ns", "end_ns").filter(
        (pl.col("class") == "comm") & pl.col("bytes").is_not_null() & pl.col("seq").is_not_null())
    return (k.group_by("pg_name", "seq", "collective", "bytes")
            .agg(((pl.col("end_ns") - pl.col("start_ns")).min() / 1e3).alias("time_us")))


def _measured(frames: JobFrames, tests: pl.DataFrame) -> list[tuple[str, int, float, str]]:
    """(collective, bytes, µs, measured by) from nccl-tests rows and traced NCCL kernels."""
    measured: list[tuple[str, int, float, str]] = []
    for r in tests.filter(pl.col("time_us").is_not_null()).iter_rows(named=True):
        coll = r["collective"] or ("AllReduce" if (r["algbw_gbps"] or 0) and r["busbw_gbps"] > r["algbw_gbps"]
                                   else None)
        if coll:
            measured.append((coll, r["size_bytes"], r["time_us"], "nccl-tests"))
    if frames.has("kernels"):
        for r in _traced_collectives(frames).iter_rows(named=True):
            if r["collective"] in _COLL:
                measured.append((_COLL[r["collective"]], r["bytes"], r["time_us"], "trace"))
    return measured


def _table_predictions(frames: JobFrames, j: JobNccl, calls: pl.DataFrame, tests: pl.DataFrame) -> pl.DataFrame | None:
    """Predicted times from a logged TUNING table (replayed, not modelled) for the sizes the job measured,
    for the (algo, proto) NCCL logged for that size (2.24+ lines carry no time), else the table's argmin.
    Only used where no per-op line already carries NCCL's predicted time."""
    tun = frames["nccl_tuning"]
    if tun.height == 0:
        return None
    first = tun.filter(pl.col("table") == tun["table"].min())
    timed = set(calls.filter(pl.col("predicted_us").is_not_null())["bytes"].to_list())
    chosen = {
        (r["op"] or "AllReduce", r["bytes"]): (r["algo"], r["proto"])
        for r in calls.filter((pl.col("kind") == "tuning") & pl.col("algo").is_not_null()).iter_rows(named=True)
    }
    base = _comm_for(j, frames)
    rows = []
    for coll, nbytes, t_us, by in _measured(frames, tests):
        if nbytes in timed:
            continue
        tab = {(r["algo"], r["proto"]): (r["latency_us"], r["bw_gbps"])
               for r in first.filter(pl.col("collective") == coll).iter_rows(named=True) if r["algo"]}
        if not tab:
            continue
        want = chosen.get((coll, nbytes))
        try:
            a, p, t, cands = nc.choose_from_table(tab, coll, int(nbytes), base)
        except ValueError:
            continue
        if want in cands:
            a, p, t = want[0], want[1], cands[want]
        rows.append({"size_bytes": int(nbytes), "time_us": float(t_us), "predicted_us": t, "ratio": t_us / t,
                     "algo": a, "proto": p, "measured_by": by + " vs TUNING table"})
    return pl.DataFrame(rows) if rows else None


@dataclass
class _Algo:
    """What the checks read: the frames, the job's NCCL facts, and NCCL's own predictions (computed once)."""

    frames: JobFrames
    j: JobNccl
    cfg: NcclAlgorithmConfig

    @property
    def env(self) -> pl.DataFrame:
        return self.frames["nccl_env"]

    @property
    def calls(self) -> pl.DataFrame:
        return self.frames["nccl_calls"]

    @property
    def tests(self) -> pl.DataFrame:
        return self.frames["nccl_tests"]

    @cached_property
    def pred(self) -> pl.DataFrame:
        """NCCL's predicted time per message size (TUNING lines that carry one)."""
        return (self.calls.filter((pl.col("kind") == "tuning") & pl.col("predicted_us").is_not_null())
                .group_by("bytes").agg(pl.col("predicted_us").first(), pl.col("algo").first(), pl.col("proto").first(),
                                       pl.col("host").first(), pl.col("pid").first(), pl.col("cuda_dev").first()))

    @cached_property
    def table_pred(self) -> pl.DataFrame | None:
        return _table_predictions(self.frames, self.j, self.calls, self.tests)

    @property
    def looked(self) -> bool:
        """Whether the logs hold anything to judge the choice from."""
        tp = self.table_pred
        return self.env.height > 0 or self.pred.height > 0 or (tp is not None
                                                               and tp.height > 0) or self.tests.height > 0


def _forced_env(env: pl.DataFrame) -> pl.DataFrame:
    """NCCL_* settings that force a choice; *_DISABLE counts when not 0, *_ENABLE when 0 (NCCL_NVLS_ENABLE=0)."""
    is_enable = pl.col("var").str.ends_with("_ENABLE")
    return env.filter(pl.col("origin") != "plugin").filter(
        pl.col("var").is_in(FORCING)
        | (pl.col("var").is_in(DISABLES)
           & pl.when(is_enable).then(pl.col("value") == "0").otherwise(pl.col("value") != "0"))
    )


def _observed_sizes(frames: JobFrames, calls: pl.DataFrame) -> tuple[pl.DataFrame, int, float | None]:
    """(op, bytes) of the observed calls, the profiled steps and their mean length (µs)."""
    sizes = calls.filter(pl.col("kind") == "coll").select("op", "bytes").drop_nulls()
    if not frames.has("comms"):
        return sizes, 0, None
    # one rank's collectives in the profiled window stand for every rank's
    cm = frames["comms"].select("rank", "collective", "bytes").filter(
        pl.col("bytes").is_not_null() & pl.col("collective").is_in(list(_COLL)))
    if not cm.height:
        return sizes, 0, None
    r0 = cm["rank"].drop_nulls().min()
    cm = cm.filter(pl.col("rank") == r0) if r0 is not None else cm
    sizes = pl.concat([sizes, cm.select(pl.col("collective").replace_strict(_COLL).alias("op"), "bytes")])
    st = frames["steps"].filter(pl.col("rank") == r0) if r0 is not None else frames["steps"]
    step_us = float(cast(float, (st["end_ns"] - st["start_ns"]).mean())) / 1e3 if st.height else None
    return sizes, st.height, step_us


def _forced_cost(base: nc.Comm, settings: dict[str, str], sizes: pl.DataFrame) -> tuple[float, float]:
    """Model time lost (µs) over the observed calls by the user's choice against NCCL's, and the worst ratio."""
    algos = _names(settings["NCCL_ALGO"], _ALGO_NAMES) if "NCCL_ALGO" in settings else None
    protos = _names(settings["NCCL_PROTO"], _PROTO_NAMES) if "NCCL_PROTO" in settings else None
    user = nc.Comm(**{**base.__dict__, "algos": algos, "protos": protos})
    lost_us, worst = 0.0, 1.0
    for op, nbytes in sizes.iter_rows():
        coll = op if op in nc.COLLECTIVES else "AllReduce"
        try:
            t_def = nc.choose(base, coll, int(nbytes))[2]
            t_user = nc.choose(user, coll, int(nbytes))[2]
        except ValueError:
            continue
        lost_us += max(0.0, t_user - t_def)
        worst = max(worst, t_user / t_def)
    return lost_us, worst


@dataclass
class _Impact:
    """What a forced choice costs, as far as the model can tell."""

    detail: str = "impact not quantified: the logs give no message sizes or too little topology for the model"
    confidence: str = "medium"
    gpu_s: float | None = None
    frac: float | None = None
    harmless: bool = False


def _forced_impact(a: _Algo, settings: dict[str, str], metrics: dict[str, Any]) -> _Impact:
    """The model's verdict on a forced algorithm/protocol at this job's sizes (fills ``metrics``)."""
    out = _Impact()
    base = _comm_for(a.j, a.frames)
    sizes, nsteps, step_us = _observed_sizes(a.frames, a.calls)
    if base is None or not sizes.height or not ("NCCL_ALGO" in settings or "NCCL_PROTO" in settings):
        return out
    lost_us, worst = _forced_cost(base, settings, sizes)
    metrics |= {"predicted_lost_us": round(lost_us, 1), "worst_slowdown": round(worst, 2)}
    out.detail = (f"the cost model (estimated topology) predicts {lost_us / 1e3:.1f} ms lost over the "
                  f"{sizes.height} observed calls, up to {worst:.2f}x slower than NCCL's default choice")
    if nsteps:
        per_step = lost_us / nsteps
        metrics["predicted_lost_us_per_step"] = round(per_step, 1)
        out.detail += f" ({per_step / 1e3:.2f} ms per step)"
        out.gpu_s = lost_us * (a.j.nranks or 1) / 1e6
        out.frac = per_step / step_us if step_us else None
    out.confidence = "low"
    if worst < a.cfg.min_forced_slowdown:
        out.detail = "the cost model predicts no significant loss for the observed sizes"
        out.gpu_s = out.frac = None
        out.harmless = True
    return out


# PyTorch's OpType names (watchdog lines) of the collectives an NCCL algorithm runs; a barrier is an all-reduce
_OP_TYPES = {"ALLREDUCE": "AllReduce", "ALLREDUCE_COALESCED": "AllReduce", "BARRIER": "AllReduce",
             "ALLGATHER": "AllGather", "_ALLGATHER_BASE": "AllGather", "ALLGATHER_COALESCED": "AllGather",
             "ALLGATHER_INTO_TENSOR_COALESCED": "AllGather", "REDUCE_SCATTER": "ReduceScatter",
             "_REDUCE_SCATTER_BASE": "ReduceScatter", "REDUCE_SCATTER_TENSOR_COALESCED": "ReduceScatter",
             "BROADCAST": "Broadcast", "REDUCE": "Reduce"}
_ANY = "collective"  # a collective ran whose name the source does not give (an nccl-tests row without its command)


@dataclass(frozen=True)
class Ran:
    """What the job's logs and traces show ran: the collectives (NCCL names, ``_ANY`` when a source does not say
    which), where they were seen, and the (algorithm, protocol) pairs NCCL logged for them (TUNING per-op lines).
    A kernel's name is never read as its algorithm: NCCL's maintainers say a kernel named ``..._RING_LL`` can run
    any algorithm and protocol (NVIDIA/nccl#1595, #2196), so a traced kernel only says that its collective ran."""

    collectives: frozenset[str]
    seen_in: tuple[str, ...]
    choices: frozenset[tuple[str, str]]


def what_ran(frames: JobFrames) -> Ran:
    """The collectives that ran, from COLL and TUNING lines, nccl-tests rows, traced NCCL kernels and the ops the
    PyTorch watchdog reports (an op it timed out on was enqueued with NCCL's choice, so it ran under it)."""
    calls = frames["nccl_calls"]
    parts: dict[str, set[str]] = {}
    coll = calls.filter((pl.col("kind") == "coll") & pl.col("op").is_in(list(nc.COLLECTIVES)))["op"]
    parts["COLL lines"] = set(coll.to_list())
    tuning = calls.filter(pl.col("kind") == "tuning")
    parts["TUNING lines"] = {o if o in nc.COLLECTIVES else _ANY for o in tuning["op"].to_list()}
    tests = frames["nccl_tests"]
    parts["nccl-tests rows"] = {c or _ANY for c in tests["collective"].to_list()}
    traced: set[str] = set()
    if frames.has("kernels") and "collective" in frames["kernels"].columns:
        k = frames["kernels"].select("class", "collective").filter(pl.col("class") == "comm")["collective"]
        traced |= {_COLL[c] for c in k.unique().to_list() if c in _COLL}
    if frames.has("comms"):
        traced |= {_COLL[c] for c in frames["comms"]["collective"].unique().to_list() if c in _COLL}
    parts["trace"] = traced
    ops = frames["collective_timeouts"]["op_type"].drop_nulls().str.to_uppercase().unique().to_list()
    parts["watchdog reports"] = {_OP_TYPES[o] for o in ops if o in _OP_TYPES}
    choices = {(_ALGO_NAMES.get(str(a).lower(), a), _PROTO_NAMES.get(str(p).lower(), p))
               for a, p in tuning.select("algo", "proto").drop_nulls().iter_rows()
               if str(p).lower() in _PROTO_NAMES}
    ran = set().union(*parts.values())
    named = ran - {_ANY}  # a named collective says more than an unnamed one (TUNING lines of 2.20-2.22 name none)
    return Ran(frozenset(named or ran), tuple(k for k, v in parts.items() if v), frozenset(choices))


def _named(collectives: tuple[str, ...] | frozenset[str]) -> str:
    return ", ".join(sorted(collectives)).replace(_ANY, "collectives the logs do not name")


@dataclass(frozen=True)
class Forced:
    """A forced choice as measured: the settings, the collectives that ran under them (those the forced
    algorithms implement), NCCL's logged choices that the settings do not allow (the setting did not govern those
    communicators), and what the cost model says it cost."""

    settings: tuple[tuple[str, str], ...]
    rows: pl.DataFrame  # the settings' lines
    ran: Ran
    under: tuple[str, ...]
    outside: tuple[tuple[str, str], ...]
    impact: _Impact
    metrics: dict[str, Any]
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    gpus: tuple[str, ...]

    @property
    def cost_this_job(self) -> bool:
        return bool(self.under) and not self.impact.harmless


def _ran_under(settings: dict[str, str], ran: Ran) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(collectives that ran under the settings, NCCL's logged choices outside them)."""
    algos = _names(settings["NCCL_ALGO"], _ALGO_NAMES) if "NCCL_ALGO" in settings else None
    protos = _names(settings["NCCL_PROTO"], _PROTO_NAMES) if "NCCL_PROTO" in settings else None
    outside = tuple(sorted(c for c in ran.choices
                           if (algos is not None and c[0] not in algos) or (protos is not None and c[1] not in protos)))
    if ran.choices and len(outside) == len(ran.choices):
        return (), outside  # every choice NCCL logged ignores the setting: it did not govern what ran
    under = tuple(sorted(c for c in ran.collectives
                         if algos is None or c not in nc.COLLECTIVES or any(nc.applicable(c, x) for x in algos)))
    return under, outside


def forced(a: _Algo) -> Forced | None:
    """The user's forced choices and what ran under them; None when nothing is forced."""
    rows = _forced_env(a.env)
    if not rows.height:
        return None
    settings = {r["var"]: r["value"] for r in rows.sort("line").iter_rows(named=True)}
    ran = what_ran(a.frames)
    under, outside = _ran_under(settings, ran)
    metrics: dict[str, Any] = dict(settings) | {"ran_under": ",".join(under) or None}
    imp = _forced_impact(a, settings, metrics) if under else _Impact(detail="", confidence="medium")
    return Forced(tuple(settings.items()), rows, ran, under, outside, imp, metrics, *where(rows, a.j.ident))


def _not_ran_text(f: Forced) -> str:
    if f.outside:
        return ("NCCL's logged choices (" + ", ".join(f"{x}/{y}" for x, y in f.outside) + ") are not among those "
                "it allows, so it did not govern the communicators that logged them")
    if f.ran.collectives:
        return (f"the collectives that ran ({_named(f.ran.collectives)}; {', '.join(f.ran.seen_in)}) are "
                "not ones the forced algorithm implements")
    return ("no collective is known to have run under it (the logs hold no COLL or TUNING line, nccl-tests row, "
            "traced NCCL kernel or watchdog report of a collective), so it cost nothing the logs can show")


def _forced_finding(f: Forced) -> Finding:
    """The forced choice in words: a warning only when collectives ran under it and the model does not find it
    harmless; information when none ran under it (said so) or the model predicts no loss."""
    said = ", ".join(f"{k}={v}" for k, v in f.settings)
    if not f.under:
        return Finding(
            "nccl_algorithm", Severity.INFO, "NCCL algorithm or protocol setting no logged collective ran under",
            f"Set by the user: {said}; {_not_ran_text(f)}.", ALGORITHM_SETTING.remediation,
            ranks=f.ranks, hosts=f.hosts, gpus=f.gpus, key="forced", kind=ALGORITHM_SETTING.name,
            metrics=f.metrics, confidence="medium",
            evidence=evidence(f.rows, ("host", "line", "var", "value", "origin")))
    ran = f"collectives ran under it ({_named(f.under)}; {', '.join(f.ran.seen_in)})"
    # an override the model finds harmless at this job's sizes is reported, not warned about
    return Finding(
        "nccl_algorithm", Severity.WARNING if f.cost_this_job else Severity.INFO,
        "NCCL algorithm or protocol choice forced by environment",
        f"Set by the user: {said}; {ran}; {f.impact.detail}.",
        "Remove the override unless a benchmark on this cluster shows it is faster at the job's message "
        "sizes; NCCL's own choice is usually within a few percent of the best.",
        ranks=f.ranks, hosts=f.hosts, gpus=f.gpus, key="forced", kind=FORCED_ALGORITHM.name, metrics=f.metrics,
        confidence=f.impact.confidence, gpu_seconds_lost=f.impact.gpu_s, fraction_of_step=f.impact.frac,
        evidence=evidence(f.rows, ("host", "line", "var", "value", "origin")),
    )


def check_forced(a: _Algo) -> list[Finding]:
    """1. User overrides of the algorithm, protocol or channels, judged on the collectives that ran under them."""
    f = forced(a)
    return [] if f is None else [_forced_finding(f)]


def _gaps(a: _Algo) -> list[pl.DataFrame]:
    """Measured time against NCCL's prediction: TUNING tables, nccl-tests rows, traced kernels."""
    pred, tests, gaps = a.pred, a.tests, []
    if a.table_pred is not None and a.table_pred.height:
        gaps.append(a.table_pred)
    if pred.height and tests.height:
        m = tests.join(pred, left_on="size_bytes", right_on="bytes").with_columns(
            (pl.col("time_us") / pl.col("predicted_us")).alias("ratio"), pl.lit("nccl-tests").alias("measured_by"))
        gaps.append(m.select("size_bytes", "time_us", "predicted_us", "ratio", "algo", "proto", "measured_by"))
    if pred.height and a.frames.has("kernels"):
        per = _traced_collectives(a.frames)
        if per.height:
            m = per.join(pred, on="bytes").with_columns(
                (pl.col("time_us") / pl.col("predicted_us")).alias("ratio"), pl.lit("trace").alias("measured_by"))
            gaps.append(m.select(pl.col("bytes").alias("size_bytes"), "time_us", "predicted_us", "ratio", "algo",
                                 "proto", "measured_by"))
    return gaps


@dataclass(frozen=True)
class Gap:
    """Measured time far above NCCL's prediction: the flagged sizes (worst first), where NCCL's choices were
    logged, the threshold, the communicator size, and whether the hardware's cross-node bound is unknown."""

    flagged: pl.DataFrame  # size_bytes, time_us, predicted_us, ratio, algo, proto, measured_by
    threshold: float
    nranks: int | None
    where: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]
    unknown: str  # the sentence saying the cross-node expectation is unknown, or ""

    @property
    def predicted_busbw(self) -> float | None:
        """The bus bandwidth NCCL's model assumed for the worst size as an AllReduce: 2(n-1)/n x bytes / time."""
        top, n = self.flagged.row(0, named=True), self.nranks
        return round(2 * (n - 1) / n * top["size_bytes"] / (top["predicted_us"] * 1e3), 1) if n else None


def model_gap(a: _Algo) -> Gap | None:
    cfg, gaps = a.cfg, _gaps(a)
    if not gaps:
        return None
    g = pl.concat(gaps).filter((pl.col("size_bytes") >= cfg.min_bytes_for_gap)
                               & (pl.col("ratio") >= cfg.min_measured_over_predicted)).sort("ratio", descending=True)
    if not g.height:
        return None
    return Gap(g, cfg.min_measured_over_predicted, a.j.nranks, where(a.pred.select("host", "pid", "cuda_dev"),
                                                                     a.j.ident), _busbw_unknown(a))


def _gap_finding(g: Gap) -> Finding:
    top = g.flagged.row(0, named=True)
    ranks, hosts, gpus = g.where
    return Finding(
        "nccl_algorithm", Severity.WARNING, "Collectives run far slower than NCCL's own prediction",
        f"{g.flagged.height} measured size(s) take >= {g.threshold:g}x NCCL's predicted time; "
        f"worst: {top['size_bytes']} B with {top['algo']}/{top['proto']} took {top['time_us']:.0f} us "
        f"vs {top['predicted_us']:.0f} us predicted ({top['ratio']:.1f}x, {top['measured_by']}). NCCL "
        "assumed bandwidth the fabric did not deliver: suspect the transport, not the choice." + g.unknown,
        "Check the nccl_transport findings, NIC/link health and PCIe placement on the slow path; run "
        "nccl-tests per node pair to find the slow link.",
        ranks=ranks, hosts=hosts, gpus=gpus, key="model_gap", kind=SLOW_COLLECTIVES.name, confidence="high",
        metrics={"worst_ratio": round(top["ratio"], 2), "worst_bytes": top["size_bytes"],
                 "sizes_flagged": g.flagged.height, "predicted_busbw_gbps": g.predicted_busbw},
        evidence=evidence(g.flagged, ("size_bytes", "algo", "proto", "time_us", "predicted_us", "ratio",
                                      "measured_by")),
    )


def check_model_gap(a: _Algo) -> list[Finding]:
    """2. Measured time far above NCCL's own prediction."""
    g = model_gap(a)
    return [] if g is None else [_gap_finding(g)]


@dataclass(frozen=True)
class Cliff:
    """A bus-bandwidth drop between adjacent nccl-tests sizes: the rows after a drop (first one first), the hosts
    of the table, and whether the hardware's cross-node bound is unknown."""

    rows: pl.DataFrame  # size_bytes, prev_size, prev_busbw, busbw_gbps, line
    hosts: tuple[str, ...]
    unknown: str


def busbw_cliff(a: _Algo) -> Cliff | None:
    tests, cfg = a.tests, a.cfg
    if not tests.height:
        return None
    t = (tests.filter(pl.col("placement") == "out-of-place").sort("size_bytes")
         .with_columns(pl.col("busbw_gbps").shift(1).alias("prev_busbw"),
                       pl.col("size_bytes").shift(1).alias("prev_size")))
    cliff = t.filter((pl.col("size_bytes") >= cfg.min_bytes_for_gap) & (pl.col("busbw_gbps") > 0)
                     & (pl.col("prev_busbw") / pl.col("busbw_gbps") >= cfg.min_busbw_cliff))
    if not cliff.height:
        return None
    return Cliff(cliff, tuple(sorted(set(tests["host"].drop_nulls().to_list()))), _busbw_unknown(a))


def _cliff_finding(c: Cliff) -> Finding:
    r = c.rows.row(0, named=True)
    return Finding(
        "nccl_algorithm", Severity.WARNING, "Bus bandwidth collapses above a message size",
        f"nccl-tests busbw falls from {r['prev_busbw']:.2f} GB/s at {r['prev_size']} B to "
        f"{r['busbw_gbps']:.2f} GB/s at {r['size_bytes']} B: a switch of algorithm/protocol or of "
        "path onto a degraded link." + c.unknown,
        "Re-run with NCCL_DEBUG_SUBSYS=TUNING to see the choice at both sizes, and test each "
        "algorithm with NCCL_ALGO to locate the broken path.",
        key="busbw_cliff", kind=SLOW_COLLECTIVES.name, confidence="medium", hosts=c.hosts,
        metrics={"from_gbps": r["prev_busbw"], "to_gbps": r["busbw_gbps"], "at_bytes": r["size_bytes"]},
        evidence=evidence(c.rows, ("size_bytes", "prev_busbw", "busbw_gbps", "line")),
    )


def check_busbw_cliff(a: _Algo) -> list[Finding]:
    """3. A bus-bandwidth cliff between adjacent nccl-tests sizes."""
    c = busbw_cliff(a)
    return [] if c is None else [_cliff_finding(c)]


#: GPUs of one host that make it an 8-GPU HGX/DGX board: with these models that board has NVSwitches
NVSWITCH_BOARD_GPUS = 8


def _nvswitch_node(a: _Algo) -> bool:
    """Whether the logs show an NVSwitch node, the premise of every EXPECTED_BUSBW row: NCCL's topology print names
    an NVSwitch (``NVS/``), NVLS multicast is available (it needs one), or a host holds 8 GPUs (the HGX/DGX board
    of these models; their 4-GPU boards link the GPUs directly, e.g. 4 NVLinks per pair on A100 = 100 GB/s)."""
    ev = a.frames["nccl_events"]
    if ev.filter(((pl.col("kind") == "topo_link") & pl.col("peer").str.starts_with("NVS/"))
                 | ((pl.col("kind") == "nvls_support") & (pl.col("code") == 1))).height:
        return True
    gpus = a.j.ident.filter(pl.col("cuda_dev").is_not_null()).group_by("host").agg(pl.col("cuda_dev").n_unique())
    return bool(gpus.height) and int(cast(int, gpus["cuda_dev"].max())) >= NVSWITCH_BOARD_GPUS


def _table_busbw(a: _Algo) -> tuple[float, str] | None:
    """The EXPECTED_BUSBW row every GPU of the job matches, on an NVSwitch node (the rows' premise), or None."""
    names = list(a.j.archs)
    for rx, gbps, src in EXPECTED_BUSBW if names and _nvswitch_node(a) else ():
        if all(re.search(rx, n) for n in names):
            return gbps, src
    return None


def _nic_busbw(a: _Algo) -> tuple[float, str] | None:
    """What the NICs allow across nodes: per host, the sum of the bandwidths NCCL's topology print gives the NET
    devices (``+ NET[bw] - NET/i``, GB/s) that its logged NET channels use (every listed one on a host whose
    channels are not logged); the slowest host bounds the job. None when no topology print gives a NIC's speed."""
    ev = a.frames["nccl_events"]
    nets = ev.filter((pl.col("kind") == "topo_link") & pl.col("message").str.starts_with("NET NET/")).select(
        "host", pl.col("peer").str.extract(r"([0-9A-Fa-f]+)$").str.to_integer(base=16, strict=False).alias("nic"),
        pl.col("value").alias("gbps")).drop_nulls(["nic", "gbps"]).unique(["host", "nic"], keep="first")
    if not nets.height:
        return None
    ch = a.frames["nccl_channels"]
    used = ch.filter(pl.col("transport") == "NET").select("host", "nic").drop_nulls().unique()
    logged = used.select("host").unique()
    kept = pl.concat([nets.join(used, on=["host", "nic"], how="semi", nulls_equal=True),
                      nets.join(logged, on="host", how="anti", nulls_equal=True)])
    per_host = kept.group_by("host").agg(pl.col("gbps").sum(), pl.len().alias("nics"))
    per_host = per_host.join(_gpu_pcie(a), on="host", how="left", nulls_equal=True).with_columns(
        pl.min_horizontal("gbps", "pcie_gbps").alias("bound")).sort("bound", "host")
    if not per_host.height:
        return None
    low = per_host.row(0, named=True)
    said = (f"{low['nics']} NIC(s) of {low['host'] or 'a host'} at {low['gbps']:g} GB/s in all (NCCL's topology "
            "print): a ring crosses each node once per channel, so a node's NICs bound cross-node busbw "
            "(NVIDIA/nccl#1368, NVIDIA/nccl-tests#352)")
    if low["pcie_gbps"] is not None and low["pcie_gbps"] < low["gbps"]:
        said += (f"; but the job's {low['gpus']} GPU(s) there reach them through PCIe links of {low['gpu_pcie']:g} "
                 f"GB/s each (topology print), {low['pcie_gbps']:g} GB/s in all")
    return float(low["bound"]), said


def _gpu_pcie(a: _Algo) -> pl.DataFrame:
    """Per host, what the job's GPUs there can move to or from the NICs: their count (the rank identities) x the
    slowest PCIe link NCCL's topology print gives a GPU of that host (``+ PCI[bw] - GPU/x``). A GPU's network
    traffic crosses its own PCIe link (GPUDirect RDMA or a host bounce buffer alike), so one GPU per node cannot
    fill four NICs (NVIDIA/nccl-tests#232)."""
    ev = a.frames["nccl_events"]
    link = ev.filter((pl.col("kind") == "topo_link") & pl.col("message").str.starts_with("PCI GPU/")) \
        .group_by("host").agg(pl.col("value").min().alias("gpu_pcie"))
    gpus = a.j.ident.filter(pl.col("cuda_dev").is_not_null()).group_by("host").agg(
        pl.struct("pid", "cuda_dev").n_unique().alias("gpus"))
    return link.join(gpus, on="host", how="inner", nulls_equal=True).with_columns(
        (pl.col("gpus") * pl.col("gpu_pcie")).alias("pcie_gbps"))


def _expected_busbw(a: _Algo) -> tuple[float, str] | None:
    """(GB/s, where the figure comes from) for this job, or None when nothing says what the hardware allows: the
    user's figure; on one node the EXPECTED_BUSBW row of its GPUs; across nodes what the NICs allow (the lower of
    that and the GPUs' row), and no figure at all when the logs do not give the NICs' speed."""
    if a.cfg.expected_busbw_gbps > 0:
        return a.cfg.expected_busbw_gbps, "set by the user (nccl_algorithm.expected_busbw_gbps)"
    table = _table_busbw(a)
    if a.j.single_node:
        return table
    if not _across_nodes(a):
        return None
    nic = _nic_busbw(a)
    return None if nic is None else min(x for x in (nic, table) if x is not None)


def _across_nodes(a: _Algo) -> bool:
    """Whether the job's traffic crosses nodes: several nodes, or NET channels in a job not proven single-node (an
    excerpt of rank 0's log that shows one host)."""
    net = a.frames["nccl_channels"].filter(pl.col("transport") == "NET").height > 0
    return a.j.multi_node or (net and not a.j.single_node)


def _busbw_unknown(a: _Algo) -> str:
    """A sentence for the bandwidth findings of a multi-node job whose NIC speed the logs do not give."""
    if not _across_nodes(a) or a.cfg.expected_busbw_gbps > 0 or _nic_busbw(a) is not None:
        return ""
    return (" What the hardware allows across nodes is unknown: the logs do not give the NICs' speed (NCCL prints "
            "it in its topology with NCCL_DEBUG_SUBSYS=INIT,GRAPH), so the bus bandwidth is not judged against it; "
            "give nccl_algorithm.expected_busbw_gbps to judge it.")


def _measured_busbw(a: _Algo) -> pl.DataFrame:
    """Bus bandwidth of the large messages: nccl-tests rows, and traced collectives (bytes / the fastest rank's
    kernel time x NCCL's bus factor: 2(n-1)/n all-reduce, (n-1)/n all-gather / reduce-scatter, 1 otherwise)."""
    big = pl.col("size_bytes") >= a.cfg.min_busbw_bytes
    rows = [a.tests.filter(big & pl.col("busbw_gbps").is_not_null())
            .select("size_bytes", "busbw_gbps", "line", pl.lit("nccl-tests").alias("measured_by"))]
    if a.frames.has("kernels") and "group_size" in a.frames["kernels"].columns:
        k = a.frames["kernels"].filter((pl.col("class") == "comm") & pl.col("bytes").is_not_null()
                                       & pl.col("seq").is_not_null() & (pl.col("group_size") > 1))
        n = pl.col("group_size").cast(pl.Float64)
        factor = (pl.when(pl.col("collective") == "allreduce").then(2 * (n - 1) / n)
                  .when(pl.col("collective").is_in(["allgather", "reduce_scatter"])).then((n - 1) / n)
                  .otherwise(1.0))
        t = (k.group_by("pg_name", "seq", "collective", "bytes")
             .agg((pl.col("end_ns") - pl.col("start_ns")).min().alias("ns"), pl.col("group_size").first())
             .filter(pl.col("ns") > 0)
             .select(pl.col("bytes").alias("size_bytes"), (pl.col("bytes") / pl.col("ns") * factor).alias("busbw_gbps"),
                     pl.lit(None, pl.Int64).alias("line"), pl.lit("trace").alias("measured_by")))
        rows.append(t.filter(big))
    return pl.concat(rows, how="vertical_relaxed")


def _caps(a: _Algo, built: int | None) -> dict[str, str]:
    """The user's settings that reduce channels or bandwidth (the last value of each); a channel maximum counts only
    where it binds (at or below the channels NCCL built, or those are not logged)."""
    env = {r["var"]: r["value"] for r in a.env.filter(pl.col("origin") != "plugin").sort("line").iter_rows(named=True)}
    caps = {k: v for k, v in env.items() if k in CHANNEL_CAPS and CHANNEL_CAPS[k](str(v).strip('"'))}
    return {k: v for k, v in caps.items()
            if not (k in ("NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS") and built is not None and str(v).strip('"').isdigit()
                    and int(str(v).strip('"')) > built)}


def _channels(a: _Algo) -> tuple[int | None, int | None]:
    """(collective channels NCCL built, channels its ring search found: the `Pattern 4` GRAPH line) from the init
    lines; tree, NVLS and CollNet searches (other patterns) do not bound the ring's channels."""
    ev = a.frames["nccl_events"]
    built = ev.filter(pl.col("kind") == "channels")["value"].drop_nulls()
    if not built.len():  # older logs: the ring listing `Channel 00/02 : 0 1` says how many
        built = ev.filter(pl.col("kind") == "ring_order")["value"].drop_nulls()
    found = ev.filter((pl.col("kind") == "graph_pattern")
                      & pl.col("message").str.starts_with("Pattern 4,"))["code"].drop_nulls()
    return (int(cast(float, built.max())) if built.len() else None,
            int(cast(float, found.max())) if found.len() else None)


@dataclass(frozen=True)
class Busbw:
    """Measured bus bandwidth against what the GPUs and links allow: the large messages measured, their peak, the
    expected figure and its source, the channels NCCL built and found, and the user's settings that cap them."""

    measured: pl.DataFrame  # size_bytes, busbw_gbps, line, measured_by
    peak: float
    expected: float
    source: str
    built: int | None
    found: int | None
    caps: dict[str, str]
    min_bytes: int
    env_rows: pl.DataFrame  # the caps' lines

    @property
    def fraction(self) -> float:
        return self.peak / self.expected


def busbw(a: _Algo) -> Busbw | None:
    """The peak bus bandwidth measured on large messages against the expected figure; None when either is unknown."""
    exp = _expected_busbw(a)
    m = _measured_busbw(a) if exp else pl.DataFrame()
    if exp is None or m.height == 0:
        return None
    built, found = _channels(a)
    caps = _caps(a, built)
    return Busbw(m, float(cast(float, m["busbw_gbps"].max())), exp[0], exp[1], built, found, caps,
                 a.cfg.min_busbw_bytes, a.env.filter(pl.col("var").is_in(list(caps))))


def _shown_caps(b: Busbw) -> tuple[dict[str, str], dict[str, str]]:
    """(settings whose value itself lowers channels or bandwidth, a topology file whose effect the log does not show).
    A topology file lowers them only if it declares less than the hardware has: without the channels NCCL built from
    it, setting one is no evidence (NVIDIA/nccl-tests#256: the file written for a VM raised busbw from 58 to 108 GB/s,
    and unsetting it, as 'likely cause' would advise, halves it)."""
    unshown = {k: v for k, v in b.caps.items() if k == "NCCL_TOPO_FILE" and b.built is None}
    return {k: v for k, v in b.caps.items() if k not in unshown}, unshown


def _busbw_finding(b: Busbw) -> Finding:
    """Bus bandwidth below the expected figure, in words: the channels and the settings named as likely cause."""
    said = [f"Peak bus bandwidth {b.peak:.1f} GB/s over messages of {b.min_bytes >> 20} MiB and more "
            f"({', '.join(sorted(set(b.measured['measured_by'].to_list())))}) is {b.fraction:.0%} of the "
            f"{b.expected:g} GB/s this hardware allows ({b.source})"]
    if b.built is not None:
        said.append(f"NCCL built {b.built} collective channel(s)" + (f" where its ring search found {b.found}"
                                                                     if b.found and b.found > b.built else ""))
    shown, unshown = _shown_caps(b)
    if shown:
        said.append("likely cause, set by the user: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    if unshown:
        said.append("set by the user, its effect not in the log (no channel lines): "
                    + ", ".join(f"{k}={v}" for k, v in unshown.items()))
    return Finding(
        "nccl_algorithm", Severity.WARNING, "Measured bus bandwidth below half of what the hardware allows",
        "; ".join(said) + ".",
        ("Unset " + ", ".join(shown) + " and measure again; " if shown else "")
        + ("Check " + ", ".join(unshown) + " against the hardware (a topology file replaces what NCCL detects); "
           if unshown else "")
        + "check the transport findings, the NVLink/NIC count and speed per GPU, PCIe generation/width and NUMA "
          "placement.",
        key="busbw_peak", kind=SLOW_COLLECTIVES.name, confidence="high" if shown else "medium",
        metrics={"peak_busbw_gbps": round(b.peak, 2), "expected_busbw_gbps": b.expected, "expected_source": b.source,
                 "coll_channels": b.built, "ring_channels_found": b.found,
                 "caps": ",".join(f"{k}={v}" for k, v in shown.items()) or None,
                 "caps_unconfirmed": ",".join(f"{k}={v}" for k, v in unshown.items()) or None},
        evidence=evidence(b.measured.sort("busbw_gbps", descending=True), ("size_bytes", "busbw_gbps", "measured_by",
                                                                           "line"), 3)
        + evidence(b.env_rows, ("host", "line", "var", "value")),
    )


def check_busbw_peak(a: _Algo) -> list[Finding]:
    """3b. Measured bus bandwidth (nccl-tests, traces) against what the GPUs and links allow."""
    b = busbw(a)
    return [_busbw_finding(b)] if b is not None and b.fraction < a.cfg.min_busbw_fraction else []


@dataclass(frozen=True)
class _Wrong:
    """nccl-tests validation failures: result rows with errors, the out-of-bounds check's message, a forced
    protocol."""

    rows: int
    check_message: str | None
    proto: str | None
    evidence: tuple[dict, ...]


def measure_wrong_results(a: _Algo) -> _Wrong | None:
    wrong = a.tests.filter(pl.col("wrong") > 0)
    oob = a.frames["nccl_events"].filter((pl.col("kind") == "nccl_tests_check") & (pl.col("code") > 0))
    if not (wrong.height or oob.height):
        return None
    return _Wrong(wrong.height, oob["message"][0] if oob.height else None, a.j.env.get("NCCL_PROTO"),
                  evidence(wrong, ("size_bytes", "placement", "wrong", "line")) + evidence(oob, ("line", "message")))


def _wrong_words(w: _Wrong) -> str:
    return (f"{w.rows} result row(s) report errors"
            + (f" and `{w.check_message}`" if w.check_message is not None else "")
            + (f"; NCCL_PROTO={w.proto} was forced, which corrupts data on paths NCCL disables it for"
               if w.proto else "") + ".")


def check_wrong_results(a: _Algo) -> list[Finding]:
    """4. nccl-tests validation failures."""
    w = measure_wrong_results(a)
    if w is None:
        return []
    return [Finding(
        "nccl_algorithm", Severity.CRITICAL, "nccl-tests validation failed (wrong results)", _wrong_words(w),
        "Remove NCCL_PROTO/NCCL_ALGO overrides and re-validate; if it persists, test GPUs and links "
        "individually (DCGM diag, nccl-tests per pair).",
        key="wrong_results", kind=WRONG_RESULTS.name, confidence="high",
        metrics={"wrong_rows": w.rows, "forced_proto": w.proto}, evidence=w.evidence,
    )]


@dataclass(frozen=True)
class _Mixed:
    """GPUs of more than one generation in the job's communicators."""

    archs: dict[str, str]  # GPU -> generation
    place: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]  # ranks, hosts, GPUs
    evidence: tuple[dict, ...]


def measure_mixed_gpus(a: _Algo) -> _Mixed | None:
    j = a.j
    if len(set(j.archs.values())) <= 1:
        return None
    comms = a.frames["nccl_comms"].filter(pl.col("gpu_name").is_not_null())
    return _Mixed(dict(j.archs), where(comms, j.ident), evidence(comms, ("host", "rank", "gpu_name")))


def _mixed_words(m: _Mixed) -> str:
    return (f"GPUs {', '.join(sorted(m.archs))} ({', '.join(sorted(set(m.archs.values())))}) share communicators: "
            "NCCL disables LL128 and tunes for the oldest GPU, and the slowest GPU paces every collective.")


def check_mixed_gpus(a: _Algo) -> list[Finding]:
    """5. Mixed GPU generations in one job."""
    m = measure_mixed_gpus(a)
    if m is None:
        return []
    ranks, hosts, gpus = m.place
    return [Finding(
        "nccl_algorithm", Severity.WARNING, "Mixed GPU generations in one job", _mixed_words(m),
        "Run on homogeneous GPUs.",
        ranks=ranks, hosts=hosts, gpus=gpus, key="mixed_gpus", kind=MIXED_GPUS.name, confidence="high",
        evidence=m.evidence,
    )]


CHECKS: tuple[Callable[[_Algo], list[Finding]], ...] = (
    check_forced, check_model_gap, check_busbw_cliff, check_busbw_peak, check_wrong_results, check_mixed_gpus,
)


FORCED_ALGORITHM = FindingKind(
    "forced_algorithm", "an NCCL algorithm, protocol, channel or transport choice forced by the environment",
    Role.CONFIG, "Remove the override unless a benchmark on this cluster shows it is faster at the job's sizes.")
SLOW_COLLECTIVES = FindingKind(
    "slow_collectives", "collectives (or nccl-tests) far below NCCL's own prediction or the hardware's bandwidth",
    Role.SLOWDOWN, "Benchmark the fabric with nccl-tests and compare with the hardware's figures.", stage=4)
WRONG_RESULTS = FindingKind(
    "wrong_results", "nccl-tests validation failed: a collective returned wrong results", Role.FAULT,
    "Drain the hosts involved and run hardware diagnostics before any training.", stage=4)
ALGORITHM_SETTING = FindingKind(
    "algorithm_setting", "an NCCL algorithm, protocol or channel setting in the environment that no logged "
    "collective ran under", Role.CONFIG,
    "Unset it unless a benchmark on this cluster shows it helps; it did not shape the collectives of this run.",
    stage=4)
MIXED_GPUS = FindingKind(
    "mixed_gpus", "GPUs of different generations in one job", Role.CONFIG,
    "Schedule the job on one GPU generation.", stage=4)


DOC = DetectorDoc(
    summary=(
        "NCCL algorithm / protocol choices that cost time: user overrides, model-vs-measurement gaps."
    ),
    detects=(
        "(1) NCCL_ALGO, NCCL_PROTO, channel/thread caps (NCCL_MAX_NCHANNELS, NCCL_MAX_CTAS, NCCL_NTHREADS), "
        "pre-2.5 thresholds and the NVLS/PAT/cuMem switches set by the user (transport switches such as "
        "NCCL_P2P_DISABLE or NCCL_IB_DISABLE are nccl_transport's); where the job's message sizes and "
        "topology are known, the predicted time lost against NCCL's own default choice. (2) Measured "
        "collective time far above NCCL's prediction for the algorithm it chose: nccl-tests rows against the "
        "TUNING per-op predictions, and traced NCCL kernels (transfer time = the minimum duration across "
        "ranks of one matched collective) against the same predictions. (3) A bus-bandwidth cliff between "
        "adjacent nccl-tests sizes, and measured bus bandwidth (nccl-tests rows, traced collectives) below half "
        "of what the hardware allows (one node: the cited EXPECTED_BUSBW table by GPU model; across nodes: the sum of "
        "the speeds NCCL's topology print gives the NICs a node's NET channels use, the slowest node, and no figure "
        "when the logs do not give them; or the user's figure), with the channels NCCL built against those its "
        "ring search found and the environment settings that cap them (NCCL_TOPO_FILE, NCCL_P2P_LEVEL, "
        "NCCL_P2P_DISABLE, NCCL_MIN/MAX_NCHANNELS, NCCL_NCHANNELS_PER_NET_PEER, NCCL_BUFFSIZE, ...) named. (4) "
        "nccl-tests validation failures (wrong results), the typical outcome "
        "of forcing LL128 where it is unsupported. (5) Mixed GPU generations in one job (LL128 off, "
        "oldest-GPU constants)."
    ),
    matters=(
        "A forced algorithm or protocol silently applies to every size; NCCL's model is usually right, and an"
        " override tuned on one cluster is often wrong on the next. A measured time many times NCCL's own "
        "prediction means the path NCCL assumed (bandwidth per channel) is not what the hardware delivers."
    ),
    measures=(
        "nccl_env (ENV echo and NCCL_* assignments on command lines in the log), nccl_calls (TUNING choices "
        "with predicted µs, COLL sizes), nccl_tests, and the cost model in forensics.facts.nccl_cost (argmin "
        "of latency + bytes/bandwidth over Ring/Tree/NVLS/NVLSTree/PAT x LL/LL128/Simple). Judged on what ran: a "
        "forced setting is a warning only when collectives ran under it (COLL or TUNING lines, nccl-tests rows, "
        "traced NCCL collectives or ops the PyTorch watchdog reports, of a collective the forced algorithm "
        "implements) and NCCL's logged choices (TUNING per-op lines) do not all ignore it; otherwise it is "
        "information (kind algorithm_setting) that says no collective ran under it. An algorithm is never "
        "inferred from a kernel name (NCCL's maintainers: a kernel named ..._RING_LL can run any algorithm and "
        "protocol): a traced kernel only shows that its collective ran, and trace kernels are matched to "
        "predictions only at sizes NCCL logged a choice for."
    ),
    todo=(
        "Remove NCCL_ALGO / NCCL_PROTO / channel caps unless a benchmark on this cluster proves them; for a "
        "model-vs-measurement gap, look at the transport (nccl_transport findings, NIC health, PCIe/NUMA "
        "placement) before tuning; never force LL128 on paths NCCL disables it for."
    ),
)


@detector(
    "nccl_algorithm", doc=DOC,
    settings=NcclAlgorithmConfig,
    requires_any=("nccl_env", "nccl_calls", "nccl_tuning", "nccl_tests", "nccl_comms"),
    kinds=(FORCED_ALGORITHM, ALGORITHM_SETTING, SLOW_COLLECTIVES, WRONG_RESULTS, MIXED_GPUS),
    view="nccl-config",
)
def detect(ctx: JobContext, cfg: NcclAlgorithmConfig) -> list[Finding]:
    a = _Algo(ctx.frames, ctx.nccl, cfg)
    out = [f for check in CHECKS for f in check(a)]
    if not out and not a.looked:
        raise Skip("no NCCL environment, TUNING, COLL or nccl-tests lines to judge the algorithm choice from")
    return out
