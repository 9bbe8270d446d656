"""The triage dataset: one row per job x incident (docs/triage.md documents every column and its unit),
the jobs ranked by cost, the recurring culprits, and the state file that makes a second run incremental.

Pure data: built from :class:`JobSummary` records, rendered by forensics.reports.triage_*.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import polars as pl

SEVERITIES = ("critical", "warning", "info")
STATE_FILE = "triage-state.json"
STATE_FORMAT = 1
JOB_FILES = ("report.html", "findings.json", "summary.md")


@dataclass
class JobSummary:
    """What triage keeps of one analysed job: small, picklable, JSON-able (it is stored in the state)."""

    job_id: str
    path: str
    fingerprint: str
    status: str  # "ok" or "failed"
    reason: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    world_size: int | None = None
    ranks: int = 0
    hosts: int = 0
    gpus: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    damaged_sources: int = 0
    incidents: list[dict[str, Any]] = field(default_factory=list)
    """Worst first (as in findings.json): id, title, severity, root_cause_detector, culprit_hosts,
    culprit_gpus ("host/pci bus id"), culprit_ranks, gpu_hours_lost, confidence, verdict."""
    files: list[str] = field(default_factory=list)
    """The report files written for it under OUT/jobs/<job_id>/."""
    tool_version: str = ""
    analysed_at_ns: int = 0
    retry: bool = False
    """Lost (its worker died): not kept in the state, so the next run tries it again."""

    @property
    def worst(self) -> str | None:
        return next((s for s in SEVERITIES if self.counts.get(s)), None)

    @property
    def gpu_hours_lost(self) -> float | None:
        costs = [i["gpu_hours_lost"] for i in self.incidents if i.get("gpu_hours_lost") is not None]
        return round(sum(costs), 6) if costs else None

    @property
    def report(self) -> str | None:
        return f"jobs/{self.job_id}/report.html" if "report.html" in self.files else None

    def to_state(self) -> dict[str, Any]:
        return asdict(self)


# --- the dataset ---------------------------------------------------------------------------------

SCHEMA: dict[str, pl.DataType] = {
    "job_id": pl.String(), "job_path": pl.String(), "status": pl.String(), "reason": pl.String(),
    "start_ns": pl.Int64(), "end_ns": pl.Int64(), "world_size": pl.Int32(), "ranks": pl.Int32(),
    "hosts": pl.Int32(), "gpus": pl.Int32(),
    "findings_critical": pl.Int32(), "findings_warning": pl.Int32(), "findings_info": pl.Int32(),
    "damaged_sources": pl.Int32(), "job_gpu_hours_lost": pl.Float64(),
    "incident_id": pl.String(), "incident_rank": pl.Int32(), "incident_title": pl.String(),
    "root_cause_detector": pl.String(), "severity": pl.String(),
    "culprit_hosts": pl.List(pl.String()), "culprit_gpus": pl.List(pl.String()), "culprit_ranks": pl.List(pl.Int32()),
    "gpu_hours_lost": pl.Float64(), "confidence": pl.String(), "verdict": pl.String(),
    "fingerprint": pl.String(), "report": pl.String(), "tool_version": pl.String(), "analysed_at_ns": pl.Int64(),
}

_INCIDENT_KEYS = {
    "incident_id": "id", "incident_title": "title", "root_cause_detector": "root_cause_detector",
    "severity": "severity", "culprit_hosts": "culprit_hosts", "culprit_gpus": "culprit_gpus",
    "culprit_ranks": "culprit_ranks", "gpu_hours_lost": "gpu_hours_lost", "confidence": "confidence",
    "verdict": "verdict",
}


def _job_columns(s: JobSummary) -> dict[str, Any]:
    return {
        "job_id": s.job_id, "job_path": s.path, "status": s.status, "reason": s.reason,
        "start_ns": s.start_ns, "end_ns": s.end_ns, "world_size": s.world_size, "ranks": s.ranks,
        "hosts": s.hosts, "gpus": s.gpus,
        **{f"findings_{sev}": s.counts.get(sev, 0) for sev in SEVERITIES},
        "damaged_sources": s.damaged_sources, "job_gpu_hours_lost": s.gpu_hours_lost,
        "fingerprint": s.fingerprint, "report": s.report, "tool_version": s.tool_version,
        "analysed_at_ns": s.analysed_at_ns,
    }


def dataset(summaries: list[JobSummary]) -> pl.DataFrame:
    """One row per job x incident (worst incident first within a job); a job without incidents, clean
    or failed, is one row with null incident columns. Rows in job id order."""
    rows: list[dict[str, Any]] = []
    for s in sorted(summaries, key=lambda s: s.job_id):
        job = _job_columns(s)
        if not s.incidents:
            rows.append({**job, **dict.fromkeys(_INCIDENT_KEYS), "incident_rank": None})
        for n, inc in enumerate(s.incidents, start=1):
            rows.append({**job, **{col: inc.get(key) for col, key in _INCIDENT_KEYS.items()}, "incident_rank": n})
    return pl.DataFrame(rows, schema=SCHEMA) if rows else pl.DataFrame(schema=SCHEMA)


def job_ranking(data: pl.DataFrame, new_jobs: set[str] | None = None) -> pl.DataFrame:
    """One row per job, most GPU-hours lost first (then worst severity, failed jobs first among equals)."""
    order = {sev: i for i, sev in enumerate(SEVERITIES)}
    first = data.filter(pl.col("incident_rank").is_null() | (pl.col("incident_rank") == 1))
    worst = (
        pl.when(pl.col("status") == "failed").then(pl.lit("failed"))
        .when(pl.col("findings_critical") > 0).then(pl.lit("critical"))
        .when(pl.col("findings_warning") > 0).then(pl.lit("warning"))
        .when(pl.col("findings_info") > 0).then(pl.lit("info"))
        .otherwise(pl.lit("clean"))
    )
    counts = data.group_by("job_id").agg(pl.col("incident_id").drop_nulls().len().alias("incidents"))
    ranked = (
        first.join(counts, on="job_id", how="left")
        .with_columns(worst.alias("worst"), pl.col("job_id").is_in(sorted(new_jobs or ())).alias("new"))
        .with_columns(pl.col("worst").replace_strict({"failed": -1, **order, "clean": 3}, return_dtype=pl.Int8)
                      .alias("_order"))
        .sort(["job_gpu_hours_lost", "_order", "job_id"], descending=[True, False, False], nulls_last=True)
    )
    return ranked.select(
        "job_id", "worst", "job_gpu_hours_lost", "incidents", pl.col("incident_title").alias("top_incident"),
        pl.col("verdict").alias("top_verdict"), "culprit_hosts", "culprit_gpus", "status", "reason", "start_ns",
        "report", "new",
    )


def recurring_culprits(data: pl.DataFrame, min_jobs: int = 2) -> pl.DataFrame:
    """Hosts and GPUs that are the root cause of incidents in at least ``min_jobs`` jobs: drain
    candidates, with the evidence (job, incident, title, report) per incident."""
    parts = []
    for kind, col in (("host", "culprit_hosts"), ("gpu", "culprit_gpus")):
        parts.append(
            data.filter(pl.col("incident_id").is_not_null())
            .select("job_id", "incident_id", "incident_title", "severity", "gpu_hours_lost", "report",
                    pl.col(col).alias("culprit"))
            .explode("culprit")
            .drop_nulls("culprit")
            .with_columns(pl.lit(kind).alias("kind"))
        )
    long = pl.concat(parts)
    evidence = pl.struct("job_id", "incident_id", "incident_title", "severity", "gpu_hours_lost", "report")
    return (
        long.sort("job_id", "incident_id")
        .group_by("kind", "culprit")
        .agg(
            pl.col("job_id").n_unique().alias("jobs"),
            pl.len().alias("incidents"),
            pl.col("gpu_hours_lost").sum().alias("gpu_hours_lost"),
            (pl.col("severity") == "critical").sum().alias("critical"),
            evidence.alias("evidence"),
        )
        .filter(pl.col("jobs") >= min_jobs)
        .sort(["jobs", "gpu_hours_lost", "kind", "culprit"], descending=[True, True, False, False], nulls_last=True)
    )


# --- the state file ------------------------------------------------------------------------------


@dataclass
class State:
    """What an earlier run into the same OUT analysed: the job summaries, keyed by job path."""

    config: dict[str, Any]
    jobs: dict[str, JobSummary]
    note: str | None = None  # why the state was not used (unreadable, other settings or version)


def state_config(tool_version: str, overrides: dict[str, dict[str, str]] | None) -> dict[str, Any]:
    """What makes an earlier result reusable besides the job's files: the tool version and the settings."""
    return {"tool_version": tool_version,
            "settings": {det: dict(sorted(kv.items())) for det, kv in sorted((overrides or {}).items())}}


def load_state(raw: bytes | None, config: dict[str, Any]) -> State:
    if raw is None:
        return State(config, {})
    try:
        doc = orjson.loads(raw)
        jobs = {j["path"]: JobSummary(**j) for j in doc["jobs"]} if doc.get("format") == STATE_FORMAT else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return State(config, {}, f"{STATE_FILE} unreadable: every job analysed again")
    if jobs is None:
        return State(config, {}, f"{STATE_FILE} of another format: every job analysed again")
    if doc.get("config") != config:
        return State(config, {}, "tool version or --set settings changed since the last run: every job analysed again")
    return State(config, jobs)


def dump_state(config: dict[str, Any], summaries: list[JobSummary]) -> bytes:
    jobs = [s.to_state() for s in sorted(summaries, key=lambda s: s.path) if not s.retry]
    return orjson.dumps({"format": STATE_FORMAT, "config": config, "jobs": jobs}, option=orjson.OPT_INDENT_2)
