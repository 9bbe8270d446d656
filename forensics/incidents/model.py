"""The incident model: what correlation produces (incidents and the links between their findings), what the
cost and the verdict read about the job as a whole (:class:`JobFacts`), and the wall-clock helpers they share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import polars as pl

from forensics.base.findings import Severity
from forensics.base.frames import JobFrames
from forensics.facts.job_year import job_year
from forensics.parsers.timestamps import earliest_glog_ns

CONFIDENCES = ("low", "medium", "high")
"""Confidence words, weakest first."""


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



def trace_window(frames: JobFrames) -> tuple[int, int] | None:
    steps = frames["steps"] if frames.has("steps") else None
    if steps is None or steps.height == 0:
        return None
    lo, hi = steps["start_ns"].min(), steps["end_ns"].max()
    return (int(lo), int(hi)) if lo is not None and hi is not None else None  # type: ignore[arg-type]



def fmt_time(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S")


