"""triage.json (the dataset's rows, the jobs ranked by cost, the drain candidates, what was skipped) and
the report files triage writes for each job (the same renderers as ``forensics analyze``)."""

from __future__ import annotations

from typing import Any

import orjson
from forensics.reports import html as html_report
from forensics.reports import json_report, markdown

from forensics import __version__
from forensics.fleet.state import job_ranking, recurring_culprits
from forensics.fleet.triage import TriageRun
from forensics.pipeline import Analysis


def overview(run: TriageRun) -> dict[str, Any]:
    """Counts for the first lines of every triage page."""
    failed = sum(s.status == "failed" for s in run.summaries)
    lost = [s.gpu_hours_lost for s in run.summaries if s.gpu_hours_lost is not None]
    return {
        "jobs": len(run.summaries), "analysed": len(run.analysed), "unchanged": len(run.summaries) - len(run.analysed),
        "failed": failed, "skipped": len(run.found.skipped), "gpu_hours_lost": round(sum(lost), 6),
        "state_note": run.previous.note,
    }


def build(run: TriageRun) -> dict[str, Any]:
    """The triage.json document; ``rows`` holds the same data as triage.parquet (docs/triage.md)."""
    return {
        "schema_version": 2,
        "tool": {"name": "forensics", "version": __version__},
        "overview": overview(run),
        "rows": run.data.to_dicts(),
        "jobs": job_ranking(run.data, run.analysed).to_dicts(),
        "recurring_culprits": recurring_culprits(run.data).to_dicts(),
        "skipped": [{"path": s.path, "reason": s.reason} for s in run.found.skipped],
    }


def render(run: TriageRun) -> bytes:
    return orjson.dumps(build(run), option=orjson.OPT_INDENT_2)


def job_files(analysis: Analysis) -> dict[str, bytes]:
    """A job's report files, exactly as ``forensics analyze`` writes them; runs in the worker process."""
    return {
        "findings.json": json_report.render(analysis),
        "summary.md": markdown.render(analysis).encode("utf-8"),
        "report.html": html_report.render_bytes(analysis),
    }
