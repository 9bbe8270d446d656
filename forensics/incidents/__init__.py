"""From findings to incidents: the root cause first, its consequences under it, what it cost, one verdict.

The causal rules are data (:data:`RULES`): a cause kind, the consequence kinds it explains, the evidence
that must link the two findings (same GPU or rank, same host, a waiter waiting for the culprit, one
communicator), whether the cause must come first in time and within what window. docs/incidents.md is
generated from this table (:func:`rules_markdown`, :func:`kinds_markdown`; tests/test_incidents.py
checks they match and rewrites the file with FORENSICS_REGEN_DOCS=1).

Every finding gets a kind (:func:`kind_of`) and a tier: causes sit on lower tiers than their
consequences, so links form a forest. Each consequence hangs under one parent (the nearest matching
cause), and each tree is one incident, rooted at the finding nothing explains.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import polars as pl

from forensics.base.findings import Finding, Role, Severity
from forensics.base.frames import JobFrames
from forensics.detectors import declared_kinds, load_all
from forensics.detectors import kind_of as declared_kind
from forensics.facts.job_year import job_year
from forensics.parsers.timestamps import earliest_glog_ns

# --- finding kinds -------------------------------------------------------------------------------

#: the stage of a finding whose kind no detector declares: after every declared one, so nothing links to it
UNDECLARED_STAGE = 99


def kind_of(f: Finding) -> str:
    """What a finding is, in the vocabulary of the rules: the kind its detector declared for it."""
    return f.kind


def stage_of(f: Finding) -> int:
    kind = declared_kind(f)
    return UNDECLARED_STAGE if kind is None else kind.tier


# --- the rules -----------------------------------------------------------------------------------

LINKS: dict[str, str] = {
    "gpu_or_rank": "the consequence names the cause's GPU (PCI bus id) or one of its ranks",
    "waited_for": "the consequence's ranks waited for one of the cause's ranks (its typed `waited_for`), "
                  "or name the same culprit rank",
    "host": "both name the same host (a host fault explains only findings on that host)",
    "communicator": "they share a rank or a host (one communicator), or the cause is job-wide",
}
ORDERS: dict[str, str] = {
    "cause_first": "the cause happened before the consequence ended (a fault after the timeout is not its "
                   "cause); refused when either finding's time is unknown, unless the rule links by place only",
    "any": "no time order required (the two describe the same period)",
}
UNKNOWN_TIME: dict[str, str] = {
    "refuse": "a finding whose time is unknown is not linked",
    "place_only": "a finding whose time is unknown is linked by place alone, at low confidence, and the link says so",
}


@dataclass(frozen=True)
class Rule:
    """One causal link: ``cause`` (detector:kind) explains ``consequence`` when ``link`` holds."""

    name: str
    causes: tuple[str, ...]
    consequences: tuple[str, ...]
    link: str
    order: str
    window_s: float | None
    confidence: str
    why: str
    unknown_time: str = "refuse"


RULES: tuple[Rule, ...] = (
    Rule("gpu_fault_kills_rank", ("gpu_fault",), ("timeout", "desync", "missing_rank", "cuda_failure"),
         "gpu_or_rank", "cause_first", None, "high",
         "a GPU that fell off the bus or hit a fatal Xid stops its rank; its peers hang in NCCL until the watchdog",
         "place_only"),
    Rule("gpu_fault_stalls_peers", ("gpu_fault",), ("spin_wait", "slow_rank"),
         "waited_for", "cause_first", None, "medium",
         "peers of a failing GPU's rank spin in NCCL waiting for it"),
    Rule("host_fault_slows_or_kills", ("host_fault", "platform_error", "nic_fault"),
         ("slow_rank", "timeout", "desync", "missing_rank", "transport_failure"),
         "host", "cause_first", 3600.0, "medium",
         "a storage hang, host memory error, OOM kill or NIC fault stalls or kills the ranks on that host",
         "place_only"),
    Rule("host_fault_kills_rank", ("host_fault",), ("timeout", "desync", "missing_rank", "cuda_failure", "spin_wait"),
         "gpu_or_rank", "cause_first", None, "high",
         "the OOM killer or a hang stopped a rank's process; its peers wait for it in NCCL until the watchdog",
         "place_only"),
    Rule("nic_fault_slows_link", ("nic_fault",), ("slow_transfers",),
         "host", "cause_first", None, "high",
         "a NIC that flapped, fell back to a lower speed or logs errors on the host common to every slow "
         "communicator is why they are slow (a degraded link stays degraded: no time window)", "place_only"),
    Rule("missing_rank_times_out_others", ("desync", "missing_rank", "cuda_failure", "transport_failure"),
         ("timeout",), "communicator", "any", None, "high",
         "a rank that never joins (dead, desynchronised, unreachable) makes the others' collective time out"),
    Rule("hang_stalls_peers", ("timeout", "desync", "missing_rank"), ("spin_wait",),
         "waited_for", "any", None, "high",
         "ranks stuck in the hung collective spin inside NCCL kernels"),
    Rule("straggler_stalls_peers", ("slow_rank",), ("spin_wait", "exposed_communication"),
         "waited_for", "any", None, "high",
         "the peers of a slow rank wait for it inside their collectives"),
    Rule("slow_link_stalls_peers", ("slow_transfers",), ("spin_wait", "exposed_communication"),
         "communicator", "any", None, "medium",
         "every member of a communicator through a slow link waits for its transfers, so more of them is exposed"),
    Rule("slow_stage_bubbles_pipeline", ("slow_rank",), ("pipeline",),
         "waited_for", "any", None, "high",
         "a pipeline stage that computes longer than the others makes the other stages idle in the pipeline"),
    Rule("degraded_transport_slows_comm", ("degraded_transport",), ("exposed_communication", "spin_wait", "slow_rank"),
         "communicator", "any", None, "medium",
         "Socket instead of IB, GDR off or SHM/P2P off make collectives slower, so more of them is exposed"),
    Rule("forced_algorithm_slows_comm", ("forced_algorithm",), ("exposed_communication",),
         "communicator", "any", None, "medium",
         "a forced NCCL_ALGO / NCCL_PROTO slower than NCCL's choice makes collectives slower"),
)

# --- per-finding facts used by the links ---------------------------------------------------------


def waited_for(f: Finding) -> set[int]:
    """Ranks a finding's victims waited for (as its detector measured them), else the finding's own ranks."""
    return set(f.waited_for) or set(f.ranks)


def victims(f: Finding) -> set[int]:
    return set(f.victims)


def _link_gpu_or_rank(cause: Finding, cons: Finding) -> str | None:
    if set(cause.gpus) & set(cons.gpus):
        return "gpu"
    return "rank" if set(cause.ranks) & (set(cons.ranks) | waited_for(cons)) else None


def _link_waited_for(cause: Finding, cons: Finding) -> str | None:
    return "rank" if set(cause.ranks) & waited_for(cons) else None


def _link_host(cause: Finding, cons: Finding) -> str | None:
    return "host" if set(cause.hosts) & set(cons.hosts) else None


def _link_communicator(cause: Finding, cons: Finding) -> str | None:
    if not cause.ranks and not cause.hosts:
        return "job"
    if (set(cause.ranks) | victims(cause)) & (set(cons.ranks) | waited_for(cons)):
        return "rank"
    return "host" if set(cause.hosts) & set(cons.hosts) else None


LINK_TESTS: dict[str, Callable[[Finding, Finding], str | None]] = {
    "gpu_or_rank": _link_gpu_or_rank, "waited_for": _link_waited_for, "host": _link_host,
    "communicator": _link_communicator,
}

# --- time ----------------------------------------------------------------------------------------


def finding_time(f: Finding) -> tuple[int, int] | None:
    """(start, end) wall-clock ns of what the finding describes, as its detector placed it; None when unknown."""
    w = f.when
    return (w.start_ns, w.end_ns) if w.start_ns is not None and w.end_ns is not None else None


def _time_ok(rule: Rule, ct: tuple[int, int] | None, qt: tuple[int, int] | None) -> bool | None:
    """True/False when the order is checked (or the rule needs none), None when a time is unknown."""
    if rule.order == "any":
        return True
    if ct is None or qt is None:
        return None
    if ct[0] > qt[1]:  # a cause is never later than its consequence
        return False
    return rule.window_s is None or qt[0] - ct[0] <= rule.window_s * 1e9


def trace_window(frames: JobFrames) -> tuple[int, int] | None:
    steps = frames["steps"] if frames.has("steps") else None
    if steps is None or steps.height == 0:
        return None
    lo, hi = steps["start_ns"].min(), steps["end_ns"].max()
    return (int(lo), int(hi)) if lo is not None and hi is not None else None  # type: ignore[arg-type]


# --- linking -------------------------------------------------------------------------------------

_CONF = ("low", "medium", "high")


@dataclass(frozen=True)
class Edge:
    cause: str
    consequence: str
    rule: str
    confidence: str
    basis: str = ""  # set when the link rests on less than the rule asks: "place only: ..."

    def to_json(self) -> dict[str, str]:
        out = {"cause": self.cause, "consequence": self.consequence, "rule": self.rule, "confidence": self.confidence}
        if self.basis:
            out["basis"] = self.basis
        return out


def _edge(rule: Rule, cause: Finding, cons: Finding) -> Edge | None:
    how = LINK_TESTS[rule.link](cause, cons)
    if how is None:
        return None
    ok = _time_ok(rule, finding_time(cause), finding_time(cons))
    if ok is False:
        return None
    if ok is None:
        if rule.unknown_time != "place_only":
            return None
        unknown = " and ".join(f"the {f.kind}'s" for f in (cause, cons) if not f.when.known)
        return Edge(cause.id, cons.id, rule.name, "low", f"place only ({how}): {unknown} time is unknown")
    return Edge(cause.id, cons.id, rule.name, rule.confidence)


def find_edges(findings: list[Finding]) -> list[Edge]:
    """Every (cause, consequence) pair some rule links."""
    edges: list[Edge] = []
    for rule in RULES:
        causes = [f for f in findings if f.kind in rule.causes]
        conseqs = [f for f in findings if f.kind in rule.consequences]
        for cause in causes:
            for cons in conseqs:
                if cause.id != cons.id and stage_of(cause) < stage_of(cons):
                    e = _edge(rule, cause, cons)
                    if e is not None:
                        edges.append(e)
    return edges


def _parents(findings: list[Finding], edges: list[Edge]) -> dict[str, Edge]:
    """One parent per consequence: the nearest cause (highest stage), then the stronger link, then the stronger
    rule (its own confidence: between two place-only links, the rule that names the rank beats the one that names
    the host), then the rule listed first in RULES, then the id."""
    tier = {f.id: stage_of(f) for f in findings}
    order = {r.name: i for i, r in enumerate(RULES)}
    nominal = {r.name: _CONF.index(r.confidence) for r in RULES}
    best: dict[str, Edge] = {}
    for e in sorted(edges, key=lambda e: (-tier[e.cause], -_CONF.index(e.confidence), -nominal[e.rule],
                                          order[e.rule], e.cause)):
        best.setdefault(e.consequence, e)
    return best


def _root_of(fid: str, parent: dict[str, Edge]) -> str:
    seen = set()
    while fid in parent and fid not in seen:
        seen.add(fid)
        fid = parent[fid].cause
    return fid


# --- incidents -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Incident:
    id: str
    title: str
    severity: Severity
    root_cause: str
    findings: tuple[str, ...]
    summary: str
    verdict: str
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    gpu_hours_lost: float | None = None
    cost_method: str = ""
    confidence: str = "medium"
    links: tuple[Edge, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "title": self.title, "severity": self.severity.value, "root_cause": self.root_cause,
            "findings": list(self.findings), "summary": self.summary, "verdict": self.verdict,
            "ranks": list(self.ranks), "hosts": list(self.hosts), "gpus": list(self.gpus),
            "gpu_hours_lost": self.gpu_hours_lost, "cost_method": self.cost_method, "confidence": self.confidence,
            "links": [e.to_json() for e in self.links],
        }


@dataclass(frozen=True)
class JobFacts:
    """What the cost and the verdict need about the job as a whole."""

    gpus: int | None
    window: tuple[int, int] | None
    checkpoints_ns: tuple[int, ...] = ()  # wall-clock times of checkpoint-save lines, sorted
    checkpoint_lines: int = 0  # checkpoint-save lines read, timed or not


def job_facts(frames: JobFrames, world_size: int | None, ranks_seen: int) -> JobFacts:
    ck = frames["checkpoints"] if frames.has("checkpoints") else None
    return JobFacts(world_size or (ranks_seen or None), trace_window(frames),
                    checkpoint_times(frames) if ck is not None else (), 0 if ck is None else ck.height)


def checkpoint_times(frames: JobFrames) -> tuple[int, ...]:
    """Checkpoint saves placed in time: dated stamps as parsed, year-less glog stamps with the job's year
    (the same rule as the watchdog lines' time)."""
    ck = frames["checkpoints"]
    times = set(ck["time_ns"].drop_nulls().to_list())
    stamps = ck.filter(pl.col("time_ns").is_null())["stamp"].drop_nulls().to_list()
    year = job_year(frames) if stamps else None
    for stamp in stamps:
        t = earliest_glog_ns([f"[I{stamp}"], year)
        if t is not None:
            times.add(t)
    return tuple(sorted(times))


def correlate(findings: list[Finding], facts: JobFacts) -> tuple[list[Finding], list[Incident]]:
    """Group findings into incidents; return the findings (``incident`` and ``caused_by`` set) and the
    incidents, worst first."""
    edges = find_edges(findings)
    parent = _parents(findings, edges)
    by_id = {f.id: f for f in findings}
    trees: dict[str, list[str]] = {}
    for f in findings:
        trees.setdefault(_root_of(f.id, parent), []).append(f.id)
    incidents = [_incident(by_id[root], [by_id[i] for i in members], parent, facts)
                 for root, members in trees.items()]
    incidents.sort(key=lambda i: (-i.severity.rank, -(i.gpu_hours_lost or 0.0), i.id))
    inc_of = {fid: inc.id for inc in incidents for fid in inc.findings}
    caused = {fid: sorted({e.cause for e in edges if e.consequence == fid and inc_of[e.cause] == inc_of[fid]})
              for fid in by_id}
    out = [replace(f, incident=inc_of[f.id], caused_by=tuple(caused[f.id])) for f in findings]
    return out, incidents


def _order_members(root: Finding, members: list[Finding], parent: dict[str, Edge]) -> list[Finding]:
    """Root first, then by depth under it, then worst first."""
    def depth(f: Finding) -> int:
        d, fid = 0, f.id
        while fid in parent and fid != root.id:
            fid, d = parent[fid].cause, d + 1
        return d

    rest = sorted((f for f in members if f.id != root.id),
                  key=lambda f: (depth(f), -f.severity.rank, -(f.gpu_seconds_lost or 0.0), f.id))
    return [root, *rest]


def _incident(root: Finding, members: list[Finding], parent: dict[str, Edge], facts: JobFacts) -> Incident:
    ordered = _order_members(root, members, parent)
    links = tuple(parent[f.id] for f in ordered[1:])
    severity = max((f.severity for f in ordered), key=lambda s: s.rank)
    confidence = min([root.confidence, *(e.confidence for e in links)],
                     key=lambda c: _CONF.index(c) if c in _CONF else 0)
    cost = incident_cost(ordered, facts)
    iid = "incident-" + hashlib.sha1(root.id.encode()).hexdigest()[:12]
    from forensics.incidents.verdict import incident_summary, verdict_line

    verdict = verdict_line(ordered, cost, confidence, facts)
    return Incident(
        id=iid, title=root.title, severity=severity, root_cause=root.id,
        findings=tuple(f.id for f in ordered),
        summary=incident_summary(ordered, links, cost),
        verdict=verdict,
        ranks=tuple(sorted(root.ranks)), hosts=tuple(sorted(root.hosts)), gpus=tuple(sorted(root.gpus)),
        gpu_hours_lost=None if cost.gpu_seconds is None else round(cost.gpu_seconds / 3600, 6),
        cost_method=cost.method, confidence=confidence, links=links,
    )


# --- cost ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    gpu_seconds: float | None
    method: str
    fatal: bool = False
    died_at_ns: int | None = None
    hang_s: float | None = None


def _timeout(members: list[Finding]) -> Finding | None:
    """The member that killed the job (its cost basis is fatal), if any."""
    return next((f for f in members if f.cost.fatal), None)


def incident_cost(members: list[Finding], facts: JobFacts) -> Cost:
    """Fatal: GPUs x (end of job - fault); slowdown: the detectors' excess time x steps x GPUs."""
    to = _timeout(members)
    if to is not None:
        return _fatal_cost(members[0], to, facts)
    root = members[0]
    if root.gpu_seconds_lost is not None:
        return Cost(root.gpu_seconds_lost, f"slowdown: the {root.detector} finding's excess time x steps x GPUs "
                    f"over the profiled steps = {root.gpu_seconds_lost:.3f} GPU-s")
    measured = [f for f in members if f.gpu_seconds_lost is not None]
    if measured:
        worst = max(measured, key=lambda f: (f.gpu_seconds_lost or 0.0, f.id))
        return Cost(worst.gpu_seconds_lost, f"slowdown: the largest measured consequence ({worst.detector}: excess "
                    f"time x steps x GPUs) = {worst.gpu_seconds_lost:.3f} GPU-s; the root cause itself is not timed")
    return Cost(None, "not computed: no finding of this incident measures lost time")


def _struck(root: Finding) -> int | None:
    """When a root fault struck: the start of its time, for a finding whose declared role is a fault."""
    kind = declared_kind(root)
    return root.when.start_ns if kind is not None and kind.role is Role.FAULT else None


def _fatal_cost(root: Finding, to: Finding, facts: JobFacts) -> Cost:
    died, ran_s = to.cost.died_ns, to.cost.hung_s
    fault = _struck(root) if root is not to else None
    how = ""
    hang_s: float | None = None
    if isinstance(fault, int) and isinstance(died, int) and fault <= died:
        hang_s, how = (died - fault) / 1e9, "from the fault to the watchdog kill"
    elif ran_s is not None:
        hang_s, how = ran_s, "the hung collective's run time until the watchdog killed the job ('ran for'; a lower bound)"
    if hang_s is None or not facts.gpus:
        missing = "the GPU count" if hang_s is not None else "the hang's duration"
        return Cost(None, f"fatal; not computed: the inputs lack {missing}", True, died)
    start = fault if isinstance(fault, int) else (died - int(ran_s * 1e9) if died is not None and ran_s is not None else None)
    lost_s, lost_how = work_lost(start, facts, "the fault" if isinstance(fault, int) else "the hang's start")
    total = facts.gpus * (hang_s + lost_s)
    method = f"fatal: {facts.gpus} GPU(s) x {hang_s:.1f} s {how} = {facts.gpus * hang_s:.1f} GPU-s; {lost_how}"
    if lost_s:
        method += f"; total {total:.1f} GPU-s"
    return Cost(total, method, True, died, hang_s)


def work_lost(fault_ns: int | None, facts: JobFacts, what: str) -> tuple[float, str]:
    """Seconds of work lost since the latest timed checkpoint save before the fault, and how it was found."""
    if not facts.checkpoint_lines:
        return 0.0, "work since the last checkpoint not counted (no checkpoint line read)"
    if not facts.checkpoints_ns:
        return 0.0, (f"work since the last checkpoint not counted ({facts.checkpoint_lines} checkpoint line(s) read, "
                     "none with a wall-clock time)")
    if fault_ns is None:
        return 0.0, "work since the last checkpoint not counted (the fault's wall-clock time is unknown)"
    before = [t for t in facts.checkpoints_ns if t <= fault_ns]
    if not before:
        return 0.0, f"work since the last checkpoint not counted (no timed checkpoint save before {what})"
    gap_s = (fault_ns - before[-1]) / 1e9
    gpus = facts.gpus or 0
    return gap_s, (f"plus work since the last checkpoint: {gpus} GPU(s) x {gap_s:.1f} s from the checkpoint save at "
                   f"{fmt_time(before[-1])} to {what} = {gpus * gap_s:.1f} GPU-s")


def verdict_text(inc: Incident) -> str:
    """The line the CLI prints and the reports open with: severity, then the verdict."""
    return f"{inc.severity.value.upper()}: {inc.verdict}"


def fmt_time(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S")


# --- docs ----------------------------------------------------------------------------------------


def rules_markdown() -> str:
    """The rules table of docs/incidents.md, generated from :data:`RULES`."""
    lines = ["| rule | cause | consequence | linking evidence | time order | unknown time | window | confidence | why |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in RULES:
        window = f"{r.window_s:.0f} s" if r.window_s else "-"
        lines.append(f"| `{r.name}` | {', '.join(f'`{c}`' for c in r.causes)} | "
                     f"{', '.join(f'`{c}`' for c in r.consequences)} | {r.link}: {LINKS[r.link]} | "
                     f"{r.order}: {ORDERS[r.order]} | {r.unknown_time}: {UNKNOWN_TIME[r.unknown_time]} | {window} | "
                     f"{r.confidence} | {r.why} |")
    return "\n".join(lines)


def kinds_markdown() -> str:
    """The kinds table of docs/incidents.md, generated from the detectors' declarations."""
    registry = load_all()
    lines = ["| kind | role | stage | declared by | meaning | default remediation |", "|---|---|---|---|---|---|"]
    for name, kind in sorted(declared_kinds().items(), key=lambda kv: (kv[1].tier, kv[0])):
        by = ", ".join(f"`{d}`" for d, spec in registry.items() if any(k.name == name for k in spec.kinds))
        lines.append(f"| `{name}` | {kind.role.value} | {kind.tier} | {by} | {kind.meaning} | {kind.remediation} |")
    return "\n".join(lines)
