"""Linking findings: which rule links which pair (the evidence each rule names, its time order), and the one
parent each consequence hangs under. Reads only the findings' typed fields (kind, when, ranks, hosts, GPUs,
waited_for, victims), never their metrics.

Every rule with time order ``cause_first`` or ``any`` refuses a pair whose cause started after the consequence ended
(a cause is never later than its consequence); ``cause_first`` also refuses a cause that started more than its
window before; ``near`` (one event recorded twice) asks both to lie within the window of each other. When a time
is unknown the rule's ``unknown_time`` decides: ``refuse`` the pair; ``place_only``: link it by place alone at low
confidence and say so in the link; ``standing``: a cause that is a setting holding for the whole run is linked
without its own time (the link says so), a consequence of unknown time is refused.
"""

from __future__ import annotations

from collections.abc import Callable

from forensics.base.findings import Finding
from forensics.incidents.model import CONFIDENCES, Edge
from forensics.incidents.rules import RULES, Rule, stage_of


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


def _link_faulted_rank(cause: Finding, cons: Finding) -> str | None:
    """The consequence lies on the faulted rank itself: all its ranks are the cause's, or (a cause that names a GPU
    but no rank) all its GPUs are the cause's and it names no more ranks than GPUs."""
    if cons.ranks and set(cons.ranks) <= set(cause.ranks):
        return "gpu" if set(cons.gpus) & set(cause.gpus) else "rank"
    if cons.gpus and set(cons.gpus) <= set(cause.gpus) and len(cons.ranks) <= len(cons.gpus):
        return "gpu"
    return None


def _link_same_job(cause: Finding, cons: Finding) -> str | None:
    return "job"


def _link_gpu_rank_or_host(cause: Finding, cons: Finding) -> str | None:
    if set(cause.gpus) & set(cons.gpus):
        return "gpu"
    if set(cause.ranks) & set(cons.ranks):
        return "rank"
    return _link_host(cause, cons)


LINK_TESTS: dict[str, Callable[[Finding, Finding], str | None]] = {
    "gpu_or_rank": _link_gpu_or_rank, "waited_for": _link_waited_for, "host": _link_host,
    "communicator": _link_communicator, "faulted_rank": _link_faulted_rank, "same_job": _link_same_job,
    "gpu_rank_or_host": _link_gpu_rank_or_host,
}

# --- time ----------------------------------------------------------------------------------------


def finding_time(f: Finding) -> tuple[int, int] | None:
    """(start, end) wall-clock ns of what the finding describes, as its detector placed it; None when unknown."""
    w = f.when
    return (w.start_ns, w.end_ns) if w.start_ns is not None and w.end_ns is not None else None


def _time_ok(rule: Rule, ct: tuple[int, int] | None, qt: tuple[int, int] | None) -> bool | None:
    """True/False when the times decide, None when a time the rule needs is unknown (see :data:`ORDERS`)."""
    if ct is None and rule.unknown_time == "standing" and qt is not None:
        return True  # a setting holds for the whole run: its time is not asked, the consequence's is
    if ct is None or qt is None:
        return None
    if rule.order == "near":  # one event recorded twice: either may be logged first
        return abs(qt[0] - ct[0]) <= (rule.window_s or 0.0) * 1e9
    if ct[0] > qt[1]:  # a cause is never later than its consequence ("any" included)
        return False
    return rule.order == "any" or rule.window_s is None or qt[0] - ct[0] <= rule.window_s * 1e9


def _edge(rule: Rule, cause: Finding, cons: Finding) -> Edge | None:
    how = LINK_TESTS[rule.link](cause, cons)
    if how is None or (rule.xids and not set(rule.xids) & set(cons.xids)):
        return None
    ok = _time_ok(rule, finding_time(cause), finding_time(cons))
    if ok is False:
        return None
    if ok is None:
        if rule.unknown_time != "place_only":
            return None
        unknown = " and ".join(f"the {f.kind}'s" for f in (cause, cons) if not f.when.known)
        return Edge(cause.id, cons.id, rule.name, "low", f"place only ({how}): {unknown} time is unknown")
    if not cause.when.known:  # a standing setting: linked on place, its time not asked
        return Edge(cause.id, cons.id, rule.name, rule.confidence,
                    f"place ({how}): the {cause.kind} is a setting that holds for the whole run")
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


def parents(findings: list[Finding], edges: list[Edge]) -> dict[str, Edge]:
    """One parent per consequence: the nearest cause (highest stage), then the stronger link, then the stronger
    rule (its own confidence: between two place-only links, the rule that names the rank beats the one that names
    the host), then the rule listed first in RULES, then the id."""
    tier = {f.id: stage_of(f) for f in findings}
    order = {r.name: i for i, r in enumerate(RULES)}
    nominal = {r.name: CONFIDENCES.index(r.confidence) for r in RULES}
    best: dict[str, Edge] = {}
    for e in sorted(edges, key=lambda e: (-tier[e.cause], -CONFIDENCES.index(e.confidence), -nominal[e.rule],
                                          order[e.rule], e.cause)):
        best.setdefault(e.consequence, e)
    return best


def root_of(fid: str, parent: dict[str, Edge]) -> str:
    seen = set()
    while fid in parent and fid not in seen:
        seen.add(fid)
        fid = parent[fid].cause
    return fid


