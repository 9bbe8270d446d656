"""Plain-words text of an incident: the one-line verdict and the longer summary.

Plain text only; the reports escape it for HTML/Markdown and the CLI prints it without markup.
"""

from __future__ import annotations

from forensics.base.findings import Finding
from forensics.detectors import kind_of as declared_kind
from forensics.incidents.cost import Cost, timeout_of
from forensics.incidents.model import Edge, Incident, JobFacts, fmt_time


def _scope(f: Finding) -> str:
    """`on GPU 0000:3b:00.0 of node07 (rank 12)`; counts instead of lists when there are many."""
    gpus, hosts, ranks = sorted(f.gpus), sorted(f.hosts), sorted(f.ranks)
    parts = []
    if len(gpus) == 1 or (gpus and len(hosts) <= 1):  # bus ids repeat across hosts: count them on one host only
        parts.append(f"on GPU {gpus[0]}" if len(gpus) == 1 else f"on {len(gpus)} GPUs")
    else:
        gpus = []
    if hosts:
        word = "of" if gpus else "on"
        parts.append(f"{word} {hosts[0]}" if len(hosts) == 1 else f"{word} {len(hosts)} hosts")
    if ranks:
        parts.append(f"(rank {ranks[0]})" if len(ranks) == 1 else
                     f"(ranks {', '.join(map(str, ranks))})" if len(ranks) <= 4 else f"({len(ranks)} ranks)")
    return " ".join(parts)


def cost_text(cost: Cost) -> str:
    if cost.gpu_seconds is None:
        return "Cost unknown (" + cost.method.split("not computed: ", 1)[-1] + ")"
    hours = cost.gpu_seconds / 3600
    return f"Cost {hours:.2f} GPU-hours" if hours >= 0.01 else f"Cost {cost.gpu_seconds:.3g} GPU-seconds"


def _do(f: Finding) -> str:
    text = (f.remediation or "").strip().rstrip(".")
    first = text.split(". ")[0]
    if len(first) > 200:
        first = first[:197].rsplit(" ", 1)[0] + "..."
    return first[:1].lower() + first[1:] if first else "see the findings"


def _waiters(to: Finding) -> str:
    n = to.cost.waiting_ranks
    return f"the other {n} rank(s)" if n is not None else "the other ranks"


def verdict_line(members: list[Finding], cost: Cost, confidence: str, facts: JobFacts) -> str:
    """One line: what happened, what it cost, what to do, how sure we are."""
    root = members[0]
    to = timeout_of(members)
    if cost.fatal and to is not None:
        when = fmt_time(cost.died_at_ns)
        head = f"Job died{' at ' + when if when else ''}: "
        hang = f" {cost.hang_s:.0f} s" if cost.hang_s is not None else ""
        if root is to and cost.hang_s == 0.0:  # stopped from outside (the scheduler): no hang, nobody waited
            return f"Stopped{' at ' + when if when else ''}: {root.title}. {cost_text(cost)}. Do: {_do(root)}. " \
                   f"(confidence {confidence})"
        if root is to:
            what = (f"{root.title}; rank(s) {', '.join(map(str, sorted(root.ranks))) or '?'} never arrived (no cause "
                    f"in the inputs)")
        else:
            what = f"{root.title} {_scope(root)}".strip()
        text = f"{head}{what}; {_waiters(to)} waited{hang} in NCCL until the watchdog killed the job"
    else:
        # the CLI/report prefix already says the severity
        ends_job = (kind := declared_kind(root)) is not None and kind.ends_job
        lead = "Slowdown: " if cost.method.startswith("slowdown") else "Job died: " if ends_job else ""
        text = f"{lead}{root.title} {_scope(root)}".strip()
        if len(members) > 1:
            text += (f"; it explains {len(members) - 1} other finding(s) "
                     f"({', '.join(sorted({f.detector for f in members[1:]}))})")
    return f"{text}. {cost_text(cost)}. Do: {_do(root)}. (confidence {confidence})"


def incident_summary(members: list[Finding], links: tuple[Edge, ...], cost: Cost) -> str:
    """The story: root cause, what followed and by which rule, the cost and how it was computed, what to do."""
    root = members[0]
    parts = [f"Root cause: {root.title} ({root.detector}{', ' + _scope(root) if _scope(root) else ''})."]
    by_id = {f.id: f for f in members}
    for e in links:
        f = by_id[e.consequence]
        basis = f"; {e.basis}" if e.basis else ""
        parts.append(f"Then: {f.title} ({f.detector}), explained by {by_id[e.cause].detector} [rule {e.rule}, "
                     f"{e.confidence} confidence{basis}].")
    parts.append(f"{cost_text(cost)}: {cost.method}.")
    parts.append(f"Do: {_do(root)}.")
    return " ".join(parts)


def verdict_text(inc: Incident) -> str:
    """The line the CLI prints and the reports open with: severity, then the verdict."""
    return f"{inc.severity.value.upper()}: {inc.verdict}"
