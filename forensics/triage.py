"""Batch triage: the same analysis over many jobs' folders, ranking jobs and recurring bad nodes.

Each job is analysed on its own (in parallel worker processes); the result per job is reduced to a
small picklable summary (its finding records, counts, and the report files an optional renderer made
of it in the worker), so memory stays bounded by one job at a time per worker whatever the number of
jobs. This module computes records only; rendering lives in forensics.reports (the CLI wires them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics.errors import UsageError
from forensics.workers import run_pool

if TYPE_CHECKING:
    from forensics.analyze import Analysis

SEVERITIES = ("critical", "warning", "info")


JobRenderer = Callable[["Analysis"], dict[str, bytes]]
"""Renders one analysed job into its report files (file name -> content); runs in the worker process,
so it must be a module-level function (picklable). The CLI passes one from forensics.reports."""


@dataclass
class JobSummary:
    """What triage keeps of one job: records, plus the files the renderer made of it (if any)."""

    name: str
    path: str
    findings: list[dict[str, Any]] | None
    """Each finding as its findings.json record (:meth:`Finding.to_json`), worst first; None when the job
    could not be analysed at all."""
    damaged_sources: int = 0
    """Files of the job that were read only in part or not at all (status partial or failed)."""
    files: dict[str, bytes] = field(default_factory=dict)
    error: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    top_incident: dict[str, Any] | None = None
    """The job's worst incident (its findings.json record); the job is ranked by it."""

    @property
    def worst(self) -> str | None:
        for sev in SEVERITIES:
            if self.counts.get(sev):
                return sev
        return None

    @property
    def gpu_seconds_lost(self) -> float:
        return float(sum((f.get("impact") or {}).get("gpu_seconds_lost") or 0.0 for f in self.findings or []))


def job_dirs(paths: list[Path]) -> list[Path]:
    """One argument: each immediate subdirectory is a job. Several: each argument is a job."""
    for p in paths:
        if not p.is_dir():
            raise UsageError(f"{p}: no such directory")
    if len(paths) == 1:
        subdirs = sorted(d for d in paths[0].iterdir() if d.is_dir() and not d.is_symlink())
        if not subdirs:
            raise UsageError(f"{paths[0]}: no job folders inside (triage expects one subfolder per job)")
        return subdirs
    return sorted(paths)


def analyze_job(
    path: Path, overrides: Mapping[str, Mapping[str, str]] | None = None, render: JobRenderer | None = None
) -> JobSummary:
    """Analyse one job folder; never raises for a job's bad input (the error is kept instead)."""
    from forensics.analyze import analyze
    from forensics.errors import ForensicsError

    try:
        analysis = analyze(path, overrides=overrides, workers=1)
    except ForensicsError as exc:
        return JobSummary(path.name, str(path), None, error=str(exc))
    error = None if analysis.readable else "no readable trace or log"
    counts = {sev: sum(1 for f in analysis.findings if f.severity.value == sev) for sev in SEVERITIES}
    damaged = analysis.sources.filter(pl.col("status").is_in(["partial", "failed"])).height
    files = render(analysis) if render is not None else {}
    top = analysis.incidents[0].to_json() if analysis.incidents else None
    return JobSummary(path.name, str(path), [f.to_json() for f in analysis.findings], damaged, files, error, counts, top)


def _worker(args: tuple[Path, Mapping[str, Mapping[str, str]] | None, JobRenderer | None]) -> JobSummary:
    return analyze_job(*args)


def triage(
    jobs: list[Path],
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    workers: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    render: JobRenderer | None = None,
) -> list[JobSummary]:
    """Analyse every job (in ``workers`` processes); ``render`` makes each job's report files there."""
    n_workers = workers if workers is not None else min(os.cpu_count() or 1, len(jobs))
    results: list[JobSummary] = []

    def done(_index: int, res: JobSummary) -> None:
        results.append(res)
        if progress:
            progress(res.name, len(results), len(jobs))

    if n_workers > 1 and len(jobs) > 1:
        run_pool(_worker, [(j, overrides, render) for j in jobs], n_workers, _lost, done)
        order = {str(j): i for i, j in enumerate(jobs)}
        results.sort(key=lambda r: order[r.path])
    else:
        for i, job in enumerate(jobs):
            done(i, analyze_job(job, overrides, render))
    return results


def _lost(args: tuple[Path, Any, Any], why: str) -> JobSummary:
    return JobSummary(args[0].name, str(args[0]), None, error=f"not analysed: {why} (out of memory?)")


def job_table(results: list[JobSummary]) -> pl.DataFrame:
    """One row per job, worst first: severity, then the top incident's GPU-hours, then all GPU-seconds lost."""
    order = {sev: i for i, sev in enumerate(SEVERITIES)}
    rows = []
    for r in results:
        inc = r.top_incident  # its root cause names the job's problem, not a symptom
        top = inc["title"] if inc else None
        rows.append(
            {
                "job": r.name,
                "worst": r.worst or ("error" if r.error else "clean"),
                "critical": r.counts.get("critical", 0),
                "warning": r.counts.get("warning", 0),
                "info": r.counts.get("info", 0),
                "gpu_seconds_lost": round(r.gpu_seconds_lost, 3),
                "damaged_sources": r.damaged_sources,
                "top_finding": top or r.error,
                "top_incident": inc["verdict"] if inc else None,
                "top_incident_gpu_hours": inc["gpu_hours_lost"] if inc else None,
                "_order": order.get(r.worst or "", 3 if not r.error else -1),
            }
        )
    if not rows:
        return pl.DataFrame()
    return (
        pl.DataFrame(rows)
        .sort(["_order", "top_incident_gpu_hours", "gpu_seconds_lost", "job"], descending=[False, True, True, False],
              nulls_last=True)
        .drop("_order")
    )


def host_table(results: list[JobSummary]) -> pl.DataFrame:
    """Hosts named by findings in more than one job come first: recurring bad nodes."""
    rows = [
        {"host": host, "job": r.name, "detector": f["detector"], "severity": f["severity"]}
        for r in results
        for f in r.findings or []
        for host in f["hosts"]
    ]
    if not rows:
        return pl.DataFrame(schema={"host": pl.String, "jobs": pl.UInt32, "findings": pl.UInt32,
                                    "critical": pl.UInt32, "detectors": pl.String, "job_names": pl.String})
    return (
        pl.DataFrame(rows)
        .group_by("host")
        .agg(
            pl.col("job").n_unique().alias("jobs"),
            pl.len().alias("findings"),
            (pl.col("severity") == "critical").sum().alias("critical"),
            pl.col("detector").unique().sort().str.join(", ").alias("detectors"),
            pl.col("job").unique().sort().str.join(", ").alias("job_names"),
        )
        .sort(["jobs", "critical", "findings", "host"], descending=[True, True, True, False])
    )
