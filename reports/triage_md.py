"""triage.md: ready to paste into a ticket. Every name from the input is escaped (md_text): a job or host
named with | ` < > [ ] stays text, and links to the job reports are URL-quoted."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from forensics.reports.markdown import md_text
from forensics.reports.triage_json import overview

from forensics.fleet.state import job_ranking, recurring_culprits
from forensics.fleet.triage import TriageRun

MAX_ROWS = 100


def _hours(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def _when(ns: int | None) -> str:
    return "" if ns is None else datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _link(path: str | None, label: str) -> str:
    return f"[{label}]({quote(path)})" if path else ""


def _table(head: list[str], rows: list[list[str]], total: int) -> list[str]:
    if not rows:
        return ["_none_", ""]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]
    if total > len(rows):
        out.append(f"\n_{total - len(rows)} more in triage.json_")
    return [*out, ""]


def _culprits(run: TriageRun) -> list[str]:
    rows = []
    table = recurring_culprits(run.data)
    for r in table.head(MAX_ROWS).iter_rows(named=True):
        evidence = "; ".join(f"{md_text(e['job_id'])}: {md_text(e['incident_title'])} "
                             f"{_link(e['report'], 'report')}".strip() for e in r["evidence"][:10])
        rows.append([r["kind"], md_text(r["culprit"]), str(r["jobs"]), str(r["incidents"]),
                     _hours(r["gpu_hours_lost"]), evidence])
    return _table(["kind", "culprit", "jobs", "incidents", "GPU-hours lost", "evidence (job: incident)"], rows,
                  table.height)


def _jobs(run: TriageRun) -> list[str]:
    table = job_ranking(run.data, run.analysed)
    rows = []
    for n, r in enumerate(table.head(MAX_ROWS).iter_rows(named=True), start=1):
        culprits = ", ".join(md_text(c) for c in (r["culprit_gpus"] or r["culprit_hosts"] or []))
        rows.append([str(n), md_text(r["job_id"]), r["worst"], _hours(r["job_gpu_hours_lost"]), str(r["incidents"]),
                     md_text(r["top_incident"] or r["reason"] or ""), culprits, _when(r["start_ns"]),
                     _link(r["report"], "report"), "new" if r["new"] else ""])
    return _table(["#", "job", "worst", "GPU-hours lost", "incidents", "top incident", "culprit", "start",
                   "report", "this run"], rows, table.height)


def _failed_and_skipped(run: TriageRun) -> list[str]:
    bad = [s for s in run.summaries if s.status == "failed"]
    lines = ["## Failed jobs", "",
             *_table(["job", "reason"], [[md_text(s.job_id), md_text(s.reason or "")] for s in bad[:MAX_ROWS]],
                     len(bad))]
    skipped = run.found.skipped
    lines += ["## Skipped (not a job)", "",
              *_table(["path", "why"], [[md_text(s.path), md_text(s.reason)] for s in skipped[:MAX_ROWS]],
                      len(skipped))]
    return lines


def render(run: TriageRun) -> str:
    o: dict[str, Any] = overview(run)
    head = [
        f"# forensics triage: {o['jobs']} job(s)",
        "",
        f"{o['analysed']} analysed by this run, {o['unchanged']} unchanged since the last run; {o['failed']} failed; "
        f"{o['skipped']} path(s) skipped. GPU-hours lost in all: {_hours(o['gpu_hours_lost']) or '0'}.",
        "",
    ]
    if o["state_note"]:
        head += [md_text(o["state_note"]), ""]
    return "\n".join([
        *head,
        "## Drain candidates (root cause in 2 or more jobs)",
        "",
        *_culprits(run),
        "## Jobs by GPU-hours lost",
        "",
        *_jobs(run),
        *_failed_and_skipped(run),
    ])
