"""From findings to incidents: the root cause first, its consequences under it, what it cost, one verdict.

The package in layers, each module importing only those above it in this list:

- :mod:`.model`: incidents, links (:class:`Edge`), the job facts the cost needs, wall-clock helpers;
- :mod:`.rules`: the causal rules as data, over the kinds detectors declare (never detector names);
- :mod:`.linking`: which rule links which pair of findings, on their typed fields, and each one's parent;
- :mod:`.cost`: what an incident cost and how that was computed;
- :mod:`.verdict`: the plain-words verdict line and summary;
- this module: :func:`correlate`, which builds the incidents (each tree of links is one incident, rooted at
  the finding nothing explains).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from forensics.base.findings import Finding
from forensics.incidents.cost import incident_cost
from forensics.incidents.linking import find_edges, parents, root_of
from forensics.incidents.model import CONFIDENCES, Edge, Incident, JobFacts, job_facts, trace_window
from forensics.incidents.rules import RULES, kinds_markdown, rules_markdown
from forensics.incidents.verdict import incident_summary, verdict_line, verdict_text

__all__ = ["RULES", "Edge", "Incident", "JobFacts", "correlate", "job_facts", "kinds_markdown", "rules_markdown",
           "trace_window", "verdict_text"]


def correlate(findings: list[Finding], facts: JobFacts) -> tuple[list[Finding], list[Incident]]:
    """Group findings into incidents; return the findings (``incident`` and ``caused_by`` set) and the
    incidents, worst first."""
    edges = find_edges(findings)
    parent = parents(findings, edges)
    by_id = {f.id: f for f in findings}
    trees: dict[str, list[str]] = {}
    for f in findings:
        trees.setdefault(root_of(f.id, parent), []).append(f.id)
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
                     key=lambda c: CONFIDENCES.index(c) if c in CONFIDENCES else 0)
    cost = incident_cost(ordered, facts)
    iid = "incident-" + hashlib.sha1(root.id.encode()).hexdigest()[:12]
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
