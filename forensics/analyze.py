"""The pipeline: RUN_DIR -> sources and frames -> detectors -> an :class:`Analysis`.

Library code: no printing. Progress goes through the optional ``progress`` callback.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from forensics import frames as fr
from forensics.context import JobContext
from forensics.detectors import run_detectors
from forensics.errors import UsageError
from forensics.findings import Finding, Skipped, sort_findings
from forensics.frames import JobFrames
from forensics.incidents import Incident, correlate, job_facts
from forensics.parsers.discovery import ParsedSource, discover_and_parse, sources_frame

ProgressFn = Callable[[str, int, int], None]


@dataclass
class Analysis:
    """The result of one analysis: the job's one :class:`JobContext`, and what the detectors found."""

    run_dir: Path
    context: JobContext
    findings: list[Finding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)

    @property
    def frames(self) -> JobFrames:
        return self.context.frames

    @property
    def sources(self) -> pl.DataFrame:
        return self.context.sources

    @property
    def readable(self) -> bool:
        """At least one source yielded data."""
        return self.sources.filter(pl.col("status").is_in(["ok", "partial"])).height > 0


def collect_frames(parsed: list[ParsedSource]) -> tuple[pl.DataFrame, JobFrames]:
    """Merge every usable source's frames into one JobFrames."""
    parts: dict[str, list[pl.DataFrame]] = defaultdict(list)
    for item in parsed:
        if item.result.status in ("ok", "partial"):
            for name, df in item.result.frames.items():
                parts[name].append(df)
    sources = sources_frame(parsed)
    merged = {name: fr.concat(name, dfs) for name, dfs in parts.items()}
    merged["sources"] = sources
    return sources, JobFrames(merged, present=set(parts) | {"sources"})


def load(run_dir: Path, progress: ProgressFn | None = None, workers: int | None = None) -> tuple[pl.DataFrame, JobFrames]:
    if not (run_dir.is_dir() or run_dir.is_file()):
        raise UsageError(f"{run_dir}: no such directory or file")
    return collect_frames(discover_and_parse(run_dir, progress=progress, workers=workers))


def analyze(
    run_dir: Path,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    only: list[str] | None = None,
    progress: ProgressFn | None = None,
    workers: int | None = None,
) -> Analysis:
    _, frames = load(run_dir, progress=progress, workers=workers)
    return analyze_frames(run_dir, frames, overrides, only)


def analyze_frames(
    run_dir: Path,
    frames: JobFrames,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    only: list[str] | None = None,
) -> Analysis:
    """Detectors and incidents over frames already parsed (a run folder's, or an earlier `frames` output)."""
    context = JobContext(frames)  # the one context of this analysis: detectors and reports share it
    findings, skipped = run_detectors(context, overrides=overrides, only=only)
    facts = job_facts(frames, context.world_size, len(context.ranks))
    correlated, incidents = correlate(sort_findings(findings), facts)
    return Analysis(run_dir, context, correlated, skipped, incidents)


def is_frames_output(path: Path) -> bool:
    """A folder `forensics frames` wrote: its sources.parquet is there."""
    return path.is_dir() and (path / "sources.parquet").is_file()


def load_frames_output(path: Path) -> JobFrames:
    """The frames of an earlier `forensics frames --out PATH`, read back from their Parquet files."""
    frames: dict[str, pl.DataFrame] = {}
    for name in fr.FRAME_SPECS:
        file = path / f"{name}.parquet"
        if file.is_file():
            try:
                frames[name] = pl.read_parquet(file)
            except (OSError, pl.exceptions.ComputeError) as exc:
                raise UsageError(f"{file}: not a readable Parquet frame ({exc})") from None
    return JobFrames(frames, present=set(frames))
