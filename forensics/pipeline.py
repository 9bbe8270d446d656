"""The pipeline: RUN_DIR -> sources and frames -> detectors -> an :class:`Analysis`.

Library code: no printing. Progress goes through the optional ``progress`` callback.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from forensics.base import frames as fr
from forensics.base.errors import UsageError
from forensics.base.findings import Finding, Skipped, sort_findings
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.incidents import Incident, correlate, job_facts
from forensics.parsers.discovery import FoundFn, ParsedSource, SharedFrames, discover_and_parse, sources_frame

ProgressFn = Callable[[str, int, int], None]
"""(item, done, total): one parsed file."""
PhaseFn = Callable[[str, str, int, int], None]
"""(phase, item, done, total) for every phase of an analysis: discover (files found), parse (files),
match (NCCL collectives matched across ranks), detect (detectors run). The CLI adds render and write.
discover and detect report each item before they handle it (a file about to be classified, a detector about
to run: what a crash or an interrupt at that moment was handling); parse reports each file once parsed."""


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

    def unreadable_because(self) -> str:
        """Why nothing was usable, in one clause: the most common reason among the recognised sources, if any."""
        return why_unreadable(self.sources)


def why_unreadable(sources: pl.DataFrame) -> str:
    """Why no source was usable, in one clause: the commonest reason among the recognised sources (a known kind),
    else among all files, with how many share it."""
    if sources.height == 0:
        return "no files"
    known = sources.filter(pl.col("kind") != "unknown")
    pool = known if known.height else sources
    message, count = pool.group_by("message").len().sort(["len", "message"], descending=[True, False]).row(0)
    what = "recognised source(s) not used" if known.height else "file(s), none a recognised trace or log"
    if count == pool.height:
        return f"{count} {what}: {message}"
    return f"{pool.height} {what}; the commonest reason ({count}): {message}"


def collect_frames(parsed: list[ParsedSource]) -> tuple[pl.DataFrame, JobFrames]:
    """Merge every usable source's frames into one JobFrames, in path order."""
    usable = {item.file.rel_path for item in parsed if item.result.status in ("ok", "partial")}
    parts: dict[str, list[pl.DataFrame]] = defaultdict(list)
    seen: set[int] = set()
    for item in parsed:
        if item.shared is not None:
            if id(item.shared) not in seen:
                seen.add(id(item.shared))
                _add_shared(parts, item.shared, usable)
            if item.file.rel_path in usable:  # a second scanner's frames of this file (registry.ALSO_READ)
                for name, df in item.result.frames.items():
                    parts[name].append(df)
        elif item.file.rel_path in usable:
            for name, df in item.result.frames.items():
                parts[name].append(df)
    sources = sources_frame(parsed)
    merged = {name: fr.concat(name, dfs) for name, dfs in parts.items()}
    merged["sources"] = sources
    return sources, JobFrames(merged, present=set(parts) | {"sources"})


def _add_shared(parts: dict[str, list[pl.DataFrame]], shared: SharedFrames, usable: set[str]) -> None:
    """Frames shared by a batch of files, less the rows of those set aside since they were parsed
    (a rank claimed twice, a guessed rank beside other traces)."""
    dropped = [s for s in shared.sources if s not in usable]
    if len(dropped) == len(shared.sources):
        return
    for name, df in shared.frames.items():
        # a frame without ``source`` (rows shared by files, e.g. fr_signatures) is kept whole
        parts[name].append(df.filter(~pl.col("source").is_in(dropped)) if dropped and "source" in df.columns else df)


def load(run_dir: Path, progress: ProgressFn | None = None, workers: int | None = None,
         engine: str = "local", ray_address: str | None = None,
         found: FoundFn | None = None) -> tuple[pl.DataFrame, JobFrames]:
    """Parse ``run_dir`` (``engine``, ``found``: see :func:`forensics.parsers.discovery.discover_and_parse`)."""
    if not (run_dir.is_dir() or run_dir.is_file()):
        raise UsageError(f"{run_dir}: no such directory or file")
    parsed = discover_and_parse(run_dir, progress=progress, workers=workers, engine=engine, ray_address=ray_address,
                                found=found)
    return collect_frames(parsed)


def _no_progress(phase: str, item: str, done: int, total: int) -> None:
    return None


def _load_with_phases(run_dir: Path, report: PhaseFn, workers: int | None, engine: str = "local",
                      ray_address: str | None = None) -> JobFrames:
    """load(), telling discover (the files found, known at the first parsed file) apart from parse."""
    report("discover", "", 0, 0)
    found = [-1]

    def parsed(item: str, done: int, total: int) -> None:
        if found[0] < 0:
            found[0] = total
            report("discover", "", total, total)
        report("parse", item, done, total)

    def classifying(item: str, before: int) -> None:
        report("discover", item, before, 0)

    _, frames = load(run_dir, progress=parsed, workers=workers, engine=engine, ray_address=ray_address,
                     found=classifying)
    if found[0] < 0:  # nothing to parse
        report("discover", "", 0, 0)
    return frames


def _match(context: JobContext, report: PhaseFn) -> None:
    """Match the NCCL collectives across ranks now (cached on the context), so its time shows as a phase."""
    report("match", "", 0, 0)
    n = context.match.instances.height if context.frames.has("kernels") else 0
    report("match", "", n, n)


def analyze(
    run_dir: Path,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    only: list[str] | None = None,
    progress: PhaseFn | None = None,
    workers: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
) -> Analysis:
    """Parse ``run_dir`` (in a local process pool, or as Ray tasks: ``engine``), then analyze its frames."""
    report = progress or _no_progress
    frames = _load_with_phases(run_dir, report, workers, engine, ray_address)
    return analyze_frames(run_dir, frames, overrides, only, progress=report)


def analyze_frames(
    run_dir: Path,
    frames: JobFrames,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    only: list[str] | None = None,
    progress: PhaseFn | None = None,
) -> Analysis:
    """Detectors and incidents over frames already parsed (a run folder's, or an earlier `frames` output)."""
    report = progress or _no_progress
    context = JobContext(frames)  # the one context of this analysis: detectors and reports share it
    _match(context, report)
    report("detect", "", 0, 0)
    findings, skipped = run_detectors(context, overrides=overrides, only=only,
                                      progress=lambda name, done, total: report("detect", name, done, total))
    facts = job_facts(frames, context.world_size, len(context.ranks))
    correlated, incidents = correlate(sort_findings(findings), facts)
    return Analysis(run_dir, context, correlated, skipped, incidents)


def derived_tables(frames: JobFrames) -> dict[str, pl.DataFrame]:
    """What `forensics frames` writes beside the canonical frames, from the job's one context (no detectors)."""
    context = JobContext(frames)
    return {"op_categories": context.categories, "op_attribution": context.op_attribution}


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
                version = pl.read_parquet_metadata(file).get(fr.PARQUET_VERSION_KEY, "1")
                frames[name] = pl.read_parquet(file)
            except (OSError, pl.exceptions.ComputeError) as exc:
                raise UsageError(f"{file}: not a readable Parquet frame ({exc})") from None
            if version != str(fr.SCHEMA_VERSION):
                raise UsageError(f"{file}: frame schema {version}, this forensics reads {fr.SCHEMA_VERSION}: run "
                                 "`forensics frames` again on the job")
    return JobFrames(frames, present=set(frames))


def run_header(analysis: Analysis) -> dict[str, Any]:
    """The `run` facts of findings.json beyond path and sources (schema: `run`): the job context's
    ``run`` fact (built once, whatever asks: findings.json, summary.md, report.html, triage)."""
    return dict(analysis.context.run)
